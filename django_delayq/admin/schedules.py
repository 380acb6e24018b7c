"""The admin's schedules page: every cron schedule, its next runs and its last run.

The data comes from :func:`django_delayq.cron.install.schedule_overview`; this
module only checks the permission and renders
``admin/django_delayq/schedules.html``. Registered under the message
changelist through the ``EXTRA_URLS`` hook when ``django_delayq.admin``
imports it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy

from django_delayq.admin.messages import EXTRA_URLS, OBJECT_TOOLS

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

URL_NAME = "django_delayq_message_schedules"
TEMPLATE = "admin/django_delayq/schedules.html"


def _changelist_url(model_admin: ModelAdmin[Any]) -> str | None:
    opts = model_admin.model._meta
    try:
        return reverse(
            f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"
        )
    except NoReverseMatch:
        return None


def _late(late_by: timedelta | None) -> str:
    """``late by 3m 12s``, or empty when the last run started within a second of its time."""
    if late_by is None or late_by < timedelta(seconds=1):
        return ""
    seconds = int(late_by.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{hours}h"] if hours else []
    parts += [f"{minutes}m"] if minutes else []
    parts += [f"{seconds}s"] if seconds or not parts else []
    return " ".join(parts)


def schedules_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> TemplateResponse:
    """Render the schedules page; needs the admin "view" permission on Message."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    changelist = _changelist_url(model_admin)
    rows = []
    from django_delayq.cron.install import schedule_overview  # only when the page is shown

    for overview in schedule_overview():
        link = None
        if changelist is not None:
            link = f"{changelist}?{urlencode({'key__startswith': overview.key_prefix})}"
        rows.append(
            {"schedule": overview, "messages_url": link, "late": _late(overview.last_late_by)}
        )
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Schedules"),
        "opts": model_admin.model._meta,
        "changelist_url": changelist,
        "rows": rows,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def schedules_urlpattern(model_admin: ModelAdmin[Any]) -> URLPattern:
    """``<changelist>/schedules/``, named ``admin:django_delayq_message_schedules``."""

    def view(request: HttpRequest) -> TemplateResponse:
        return schedules_view(request, model_admin)

    return path("schedules/", model_admin.admin_site.admin_view(view), name=URL_NAME)


EXTRA_URLS.append(schedules_urlpattern)
OBJECT_TOOLS.append((_lazy("Schedules"), URL_NAME))
