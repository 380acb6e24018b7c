from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DelayQConfig(AppConfig):
    name = "django_delayq"
    verbose_name = _("Delayed queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed
        from django.utils.module_loading import autodiscover_modules

        from django_delayq import checks  # noqa: F401  (registers the checks)
        from django_delayq.conf import clear_cache

        setting_changed.connect(clear_cache, dispatch_uid="django_delayq.conf")
        # Like admin.py for the admin: every installed app's handlers.py is
        # imported, so @handler registrations exist before a worker starts.
        autodiscover_modules("handlers")
