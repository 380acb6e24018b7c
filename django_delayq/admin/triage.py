"""The admin's failure triage: failure groups, group actions, edit payload and retry.

Thin like the rest of the admin: the groups come from
:func:`django_delayq.triage.failure_groups`, the group actions are the
set-based operations of ``operations.py`` (one count and one ``UPDATE``
whatever the group's size), and the payload edit is
:func:`django_delayq.triage.edit_payload_and_retry`. Pages need the "view"
permission, actions the "change" permission; every action is a POST
(confirmed on an intermediate page, like ``delete_selected``) under the
admin's login and CSRF protection. The pages join ``MessageAdmin.get_urls()``
through the ``EXTRA_URLS`` hook when ``django_delayq.admin`` imports this module.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy
from django.utils.translation import gettext_noop

from django_delayq import clock, operations, triage
from django_delayq.admin.dashboard import admin_url, changelist_url
from django_delayq.admin.messages import EXTRA_URLS, OBJECT_TOOLS
from django_delayq.admin.payload import UndecodablePayload, pretty_json
from django_delayq.fingerprint import normalise
from django_delayq.models import QUEUE_MAX_LENGTH, Message
from django_delayq.values import escape_surrogates

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

FAILURES_URL_NAME = "django_delayq_message_failures"
GROUP_URL_NAME = "django_delayq_message_failure_group"
EDIT_PAYLOAD_URL_NAME = "django_delayq_message_edit_payload"
ACTIONS = ("retry", "cancel")
TITLES = {
    "retry": gettext_noop("Retry a failure group"),
    "cancel": gettext_noop("Cancel a failure group"),
}


def _queue_filter(request: HttpRequest) -> str | None:
    queue = request.GET.get("queue", "").strip()
    if "\x00" in queue:  # no queue has one; PostgreSQL cannot even compare with it
        raise Http404("no such queue")
    return queue[:QUEUE_MAX_LENGTH] or None


#: The failures page's windows: the failing messages whose last attempt was in it.
#: The last day by default: "all" reads every failure retention keeps.
WINDOWS: dict[str, tuple[timedelta | None, str]] = {
    "1h": (timedelta(hours=1), gettext_noop("last hour")),
    "24h": (timedelta(days=1), gettext_noop("last 24 hours")),
    "7d": (timedelta(days=7), gettext_noop("last 7 days")),
    "all": (None, gettext_noop("all kept")),
}
DEFAULT_WINDOW = "24h"


def _window(request: HttpRequest) -> str:
    """The window asked for; an unknown one is the default (a hand-edited URL)."""
    seen = request.GET.get("seen", DEFAULT_WINDOW)
    return seen if seen in WINDOWS else DEFAULT_WINDOW


def _queue_query(queue: str | None) -> str:
    return f"?{urlencode({'queue': queue})}" if queue else ""


def _context(request: HttpRequest, model_admin: ModelAdmin[Any], title: str) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "changelist_url": admin_url(model_admin, "changelist"),
        "dashboard_url": admin_url(model_admin, "dashboard"),
        "failures_url": admin_url(model_admin, "failures"),
    }


def _group_links(
    model_admin: ModelAdmin[Any],
    group: triage.FailureGroup,
    queue: str | None,
    since: datetime | None = None,
) -> dict[str, str]:
    """The group's messages counted on the page (those of the window), its newest
    one, and its actions, which act on the whole group."""
    base = {"error_fingerprint": group.fingerprint, "queue": queue, "last_attempt_time__gte": since}
    action_query = _queue_query(queue)
    return {
        # As triage.failing(): failed, or pending again after a failed attempt
        # (a failed message has always been attempted).
        "all": changelist_url(
            model_admin, {**base, "status__in": "failed,pending", "attempt_count__gt": 0}
        ),
        "failed": changelist_url(model_admin, {**base, "status__exact": "failed"}),
        "retrying": changelist_url(
            model_admin, {**base, "status__exact": "pending", "attempt_count__gt": 0}
        ),
        "sample": admin_url(model_admin, "change", group.sample_id),
        "retry": admin_url(model_admin, "failure_group", group.fingerprint, "retry") + action_query,
        "cancel": admin_url(model_admin, "failure_group", group.fingerprint, "cancel")
        + action_query,
    }


def failures_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> TemplateResponse:
    """Failed and retrying messages grouped by error fingerprint; needs "view"."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    queue = _queue_filter(request)
    seen = _window(request)
    window = WINDOWS[seen][0]
    since = clock.now() - window if window is not None else None
    groups = triage.failure_groups([queue] if queue else None, since=since)
    context = {
        **_context(request, model_admin, _("Failures")),
        "queue": queue,
        "seen": seen,
        "windows": [
            {
                "value": value,
                "label": _(label),
                "url": "?" + urlencode({"seen": value, **({"queue": queue} if queue else {})}),
            }
            for value, (_span, label) in WINDOWS.items()
        ],
        "groups": [
            {"group": g, "links": _group_links(model_admin, g, queue, since)} for g in groups
        ],
        "can_change": model_admin.has_change_permission(request),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/django_delayq/failures.html", context)


def _extra_attempts(request: HttpRequest) -> int:
    raw = request.POST.get("extra_attempts", "1")
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= operations.MAX_EXTRA_ATTEMPTS:
        raise ValueError(
            _("Extra attempts must be a whole number from 1 to %(max)s.")
            % {"max": operations.MAX_EXTRA_ATTEMPTS}
        )
    return value


def group_action_view(
    request: HttpRequest, model_admin: ModelAdmin[Any], fingerprint: str, action: str
) -> HttpResponse:
    """Retry or cancel a whole group: GET confirms (with a dry run), POST acts; needs "change"."""
    if action not in ACTIONS or "\x00" in fingerprint:  # no fingerprint holds NUL
        raise Http404
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    queue = _queue_filter(request)
    queues = [queue] if queue else None
    group = triage.group_messages(fingerprint, queues)
    back = admin_url(model_admin, "failures") + _queue_query(queue)
    error = ""
    if request.method == "POST":
        try:
            if action == "retry":
                result = triage.retry_group(
                    fingerprint, queues, extra_attempts=_extra_attempts(request)
                )
                text = _("Retried %(changed)s message(s) of the group.")
            else:
                result = triage.cancel_group(fingerprint, queues)
                text = _("Cancelled %(changed)s message(s) of the group.")
        except ValueError as exc:
            error = str(exc)
        else:
            model_admin.message_user(
                request, _summary(text % {"changed": result.changed}, result), messages.SUCCESS
            )
            return HttpResponseRedirect(back)
    sample = group.order_by("-id").values_list("last_error", flat=True).first()
    if sample is None and not error:
        model_admin.message_user(
            request, _("No failed or retrying message has this error any more."), messages.WARNING
        )
        return HttpResponseRedirect(back)
    if action == "retry":
        preview = triage.retry_group(fingerprint, queues, dry_run=True)
    else:
        preview = triage.cancel_group(fingerprint, queues, dry_run=True)
    context = {
        **_context(request, model_admin, _(TITLES[action])),
        "action": action,
        "queue": queue,
        "fingerprint": fingerprint,
        "normalised": normalise(sample or ""),
        "preview": preview,
        "skipped": [(operations.REASONS.get(r, r), n) for r, n in preview.skipped.items()],
        "error": error,
        "back_url": back,
        "extra_attempts": request.POST.get("extra_attempts", "1"),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/django_delayq/failure_group_confirm.html", context)


def _summary(text: str, result: operations.OperationResult) -> str:
    if not result.skipped:
        return text
    reasons = "; ".join(
        f"{n} {operations.REASONS.get(reason, reason)}" for reason, n in result.skipped.items()
    )
    return f"{text} " + _("Skipped %(count)s: %(reasons)s.") % {
        "count": result.skipped_total,
        "reasons": reasons,
    }


def edit_payload_view(
    request: HttpRequest, model_admin: ModelAdmin[Any], object_id: str
) -> HttpResponse:
    """Edit a failed message's JSON payload and retry it; needs "change"."""
    # The permission before the lookup: without it, every id gets the same 403.
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    message = model_admin.get_object(request, unquote(object_id))
    if message is None:
        raise Http404
    if not model_admin.has_change_permission(request, message):
        raise PermissionDenied
    change_url = admin_url(model_admin, "change", message.pk)
    error = ""
    text = pretty_json(message.payload)
    if isinstance(message.payload, UndecodablePayload):
        text = str(message.payload)
    text = escape_surrogates(text)
    if request.method == "POST":
        text = request.POST.get("payload", "")
        try:
            payload = triage.parse_payload(text)
            extra = _extra_attempts(request)
        except ValueError as exc:
            error = str(exc)
        else:
            if triage.edit_payload_and_retry(message.pk, payload, extra_attempts=extra):
                model_admin.message_user(
                    request,
                    _("Payload saved; message %(id)s is pending again, due now.")
                    % {"id": message.pk},
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(change_url)
            message.refresh_from_db()
            error = _(
                "Nothing was saved: the message is no longer failed (it is %(status)s now)."
            ) % {"status": message.status}
    context = {
        **_context(request, model_admin, _("Edit payload and retry")),
        "original": message,
        "change_url": change_url,
        "payload_text": text,
        "error": error,
        "is_failed": message.status == Message.Status.FAILED,
        "extra_attempts": request.POST.get("extra_attempts", "1"),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/django_delayq/edit_payload.html", context)


def failures_urlpattern(model_admin: ModelAdmin[Any]) -> URLPattern:
    """``<changelist>/failures/``, named ``admin:django_delayq_message_failures``."""

    def view(request: HttpRequest) -> HttpResponse:
        return failures_view(request, model_admin)

    return path("failures/", model_admin.admin_site.admin_view(view), name=FAILURES_URL_NAME)


def failure_group_urlpattern(model_admin: ModelAdmin[Any]) -> URLPattern:
    """``<changelist>/failures/<fingerprint>/<retry|cancel>/``."""

    def view(request: HttpRequest, fingerprint: str, action: str) -> HttpResponse:
        return group_action_view(request, model_admin, fingerprint, action)

    return path(
        "failures/<str:fingerprint>/<str:action>/",
        model_admin.admin_site.admin_view(view),
        name=GROUP_URL_NAME,
    )


def edit_payload_urlpattern(model_admin: ModelAdmin[Any]) -> URLPattern:
    """``<changelist>/<id>/edit-payload/``."""

    def view(request: HttpRequest, object_id: str) -> HttpResponse:
        return edit_payload_view(request, model_admin, object_id)

    return path(
        "<path:object_id>/edit-payload/",
        model_admin.admin_site.admin_view(view),
        name=EDIT_PAYLOAD_URL_NAME,
    )


# Registered with MessageAdmin (its get_urls() puts extra pages before its own).
EXTRA_URLS.extend([failures_urlpattern, failure_group_urlpattern, edit_payload_urlpattern])
OBJECT_TOOLS.append((_lazy("Failures"), FAILURES_URL_NAME))
