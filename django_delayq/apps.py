from __future__ import annotations

import sys

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DelayQConfig(AppConfig):
    name = "django_delayq"
    verbose_name = _("Delayed queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        from django_delayq import checks  # noqa: F401  (registers the checks)
        from django_delayq.store.server import register_functions

        setting_changed.connect(_settings_changed, dispatch_uid="django_delayq.conf")
        connection_created.connect(register_functions, dispatch_uid="django_delayq.functions")
        # Like admin.py for the admin: every installed app's handlers.py is
        # imported, so @handler registrations exist before a worker starts.
        autodiscover_modules("handlers")
        _install_task_backends()


def _settings_changed(**kwargs: object) -> None:
    """Drop what was derived from ``DELAYQ`` (tests' ``override_settings``).

    Wired here, at the top, so that ``conf`` (the ground floor, which every
    module reads) imports none of the modules that keep such caches.
    """
    if kwargs.get("setting") not in (None, "DELAYQ"):
        return
    from django_delayq import conf, retry
    from django_delayq.store import claim

    conf.clear_cache(**kwargs)
    retry.get_default_policy.cache_clear()
    # Compiled claims depend on the queues' settings (GROUP_AFTER_FAILURE).
    claim.forget_compiled_claims()


def _install_task_backends() -> None:
    """Give the queues of each ``TASKS`` backend that is a DelayQBackend their runner.

    Importing the configured backend paths is what tells: when one of them is
    (a subclass of) ``django_delayq.backends.DelayQBackend``, that module is
    loaded, and without Django's Tasks framework it fails here, at start-up,
    saying what to install.
    """
    from django.conf import settings
    from django.utils.module_loading import import_string

    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return
    for params in tasks.values():
        try:
            import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            pass  # the framework's own checks name a bad backend
    backends = sys.modules.get("django_delayq.backends")
    if backends is not None:
        backends.install_task_backends(tasks)
