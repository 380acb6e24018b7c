"""The admin dashboard: per-queue figures, flow control, a throughput chart, pausing queues.

Thin by design: the figures come from :func:`django_delayq.stats.dashboard`
and :func:`django_delayq.flowstats.flow_stats` (indexed queries only, no
count of the whole table), pausing from
``django_delayq.queues``; this module checks permissions, builds the links
to the filtered changelist and draws the chart as inline SVG (no script, no
CDN: the admin works offline). Its pages join ``MessageAdmin.get_urls()``
through the ``EXTRA_URLS`` hook when ``django_delayq.admin`` imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy
from django.views.decorators.http import require_POST

from django_delayq import flowstats, stats
from django_delayq.admin.display import span
from django_delayq.admin.messages import EXTRA_URLS, OBJECT_TOOLS
from django_delayq.queues import pause_queue, queue_states, resume_queue
from django_delayq.routers import queue_alias
from django_delayq.store import pressure

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

URL_NAME = "django_delayq_message_dashboard"
QUEUE_STATE_URL_NAME = "django_delayq_message_queue_state"
TEMPLATE = "admin/django_delayq/dashboard.html"

logger = logging.getLogger("django_delayq.admin")


def admin_url(model_admin: ModelAdmin[Any], suffix: str, *args: object) -> str:
    opts = model_admin.model._meta
    return reverse(
        f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_{suffix}", args=args
    )


def changelist_url(
    model_admin: ModelAdmin[Any], params: Mapping[str, object], base: str | None = None
) -> str:
    """The changelist filtered by plain field lookups (``status__exact=failed``...).

    ``base``: the changelist's URL, when the caller has it already (a page of
    many links saves a ``reverse()`` per link).
    """
    query = urlencode({k: _param(v) for k, v in params.items() if v is not None})
    base = base or admin_url(model_admin, "changelist")
    return base + (f"?{query}" if query else "")


def _param(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _cells(
    model_admin: ModelAdmin[Any], figures: stats.QueueFigures
) -> dict[str, dict[str, object]]:
    """Each number of a row, formatted, with a link to the messages it counts."""
    now = figures.now
    short = {"finished_at__gte": now - stats.WINDOW_SHORT}
    long = {"finished_at__gte": now - stats.WINDOW_LONG}
    later = {"next_attempt_time__gt": now}
    columns: list[tuple[str, dict[str, object]]] = [
        ("pending", {"status__exact": "pending"}),
        ("due", {"status__in": "pending,running", "next_attempt_time__lte": now}),
        ("scheduled", {"status__exact": "pending", "attempt_count": 0, **later}),
        ("retrying", {"status__exact": "pending", "attempt_count__gt": 0, **later}),
        ("waiting", {"workflow": "waiting"}),
        ("running", {"status__exact": "running"}),
        ("failed", {"status__exact": "failed"}),
        ("succeeded_short", {"status__exact": "succeeded", **short}),
        ("failed_short", {"status__exact": "failed", **short}),
        ("succeeded_long", {"status__exact": "succeeded", **long}),
        ("failed_long", {"status__exact": "failed", **long}),
        ("cancelled_long", {"status__exact": "cancelled", **long}),
    ]
    queue = {"queue": figures.queue or None}  # the changelist's QueueFilter
    base = admin_url(model_admin, "changelist")
    cells = {}
    for name, params in columns:
        value = getattr(figures, name)
        more = name == "failed" and figures.failed_more  # counted up to stats.FAILED_CAP
        cells[name] = {
            "value": value,
            "text": f"{value:,}+" if more else f"{value:,}",
            "url": changelist_url(model_admin, {**queue, **params}, base),
        }
    return cells


def _row(model_admin: ModelAdmin[Any], figures: stats.QueueFigures) -> dict[str, Any]:
    rate = figures.failure_rate
    return {
        "queue": figures.queue,
        "figures": figures,
        "cells": _cells(model_admin, figures),
        "lag": span(figures.lag),
        "failure_rate": "–" if rate is None else f"{rate:.1%}",
        "queue_url": changelist_url(model_admin, {"queue": figures.queue or None}),
    }


# -- flow control ---------------------------------------------------------------------


def _flow_row(
    model_admin: ModelAdmin[Any], flow: flowstats.QueueFlow, now: datetime
) -> dict[str, Any]:
    """A queue's limits, how close it is to them, its held messages and blocked groups,
    each with a link to the messages concerned."""
    queue = {"queue": flow.queue}
    due = {"status__in": "pending,running", "next_attempt_time__lte": now}
    scopes = [
        {
            "kind": s.kind,
            "label": _("kind %(kind)s") % {"kind": s.kind} if s.kind else _("whole queue"),
            "limits": s.limits_text,
            "window": s.window_text,
            "running": s.running_text,
            "window_full": s.window_full,
            "at_cap": s.at_cap,
            "throttled": s.throttled,
            "due_url": changelist_url(
                model_admin, {**queue, **({"kind": s.kind} if s.kind else {}), **due}
            ),
        }
        for s in flow.scopes
    ]
    return {
        "queue": flow.queue,
        "flow": flow,
        "queue_url": changelist_url(model_admin, queue),
        "scopes": scopes or [{"kind": "", "label": "", "limits": ""}],
        "span": max(1, len(scopes)),
        "held_url": changelist_url(model_admin, {**queue, "group_state": "held"}),
        "blocked_url": changelist_url(model_admin, {**queue, "group_state": "blocked"}),
        "blocked_groups": [
            (name, changelist_url(model_admin, {**queue, "group": name}))
            for name in flow.blocked_groups
        ],
        "more_blocked": flow.blocked - len(flow.blocked_groups),
    }


# -- the chart --------------------------------------------------------------------

CHART_BAR = 12
CHART_HEIGHT = 140
CHART_LEFT = 44
CHART_BOTTOM = 20
CHART_TOP = 8


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50... at least ``value``."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def throughput_svg(points: list[stats.ThroughputPoint]) -> SafeString:
    """A bar per minute (succeeded stacked under failed), drawn server-side."""
    top = _nice_ceiling(max((p.total for p in points), default=0) or 1)
    width = CHART_LEFT + CHART_BAR * len(points) + 4
    height = CHART_TOP + CHART_HEIGHT + CHART_BOTTOM
    base = CHART_TOP + CHART_HEIGHT
    bars = []
    labels = []
    for i, point in enumerate(points):
        x = CHART_LEFT + i * CHART_BAR
        ok = round(point.succeeded / top * CHART_HEIGHT, 1)
        bad = round(point.failed / top * CHART_HEIGHT, 1)
        local = timezone.localtime(point.minute)
        tip = _("%(time)s: %(succeeded)s succeeded, %(failed)s failed") % {
            "time": local.strftime("%H:%M"),
            "succeeded": point.succeeded,
            "failed": point.failed,
        }
        bars.append(
            format_html(
                '<g class="bar"><title>{}</title>'
                '<rect class="hit" x="{}" y="{}" width="{}" height="{}"></rect>'
                '<rect class="ok" x="{}" y="{}" width="{}" height="{}"></rect>'
                '<rect class="bad" x="{}" y="{}" width="{}" height="{}"></rect></g>',
                tip,
                x,
                CHART_TOP,
                CHART_BAR,
                CHART_HEIGHT,
                x + 1,
                base - ok,
                CHART_BAR - 2,
                ok,
                x + 1,
                base - ok - bad,
                CHART_BAR - 2,
                bad,
            )
        )
        if local.minute % 15 == 0:
            labels.append(
                format_html(
                    '<text class="x" x="{}" y="{}">{}</text>',
                    x + CHART_BAR / 2,
                    height - 5,
                    local.strftime("%H:%M"),
                )
            )
    total_ok = sum(p.succeeded for p in points)
    total_bad = sum(p.failed for p in points)
    summary = _(
        "Messages finished per minute over the last hour: %(succeeded)s succeeded, "
        "%(failed)s failed"
    ) % {"succeeded": total_ok, "failed": total_bad}
    grid = format_html_join(
        "",
        '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"></line>'
        '<text class="y" x="{}" y="{}">{}</text>',
        (
            (CHART_LEFT, width, y, y, CHART_LEFT - 4, y + 4, value)
            for value, y in ((top, CHART_TOP), (top // 2, CHART_TOP + CHART_HEIGHT / 2), (0, base))
            if value or y == base
        ),
    )
    return format_html(
        '<svg class="delayq-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        'viewBox="0 0 {} {}" width="{}" height="{}" aria-label="{}">{}{}{}</svg>',
        width,
        height,
        width,
        height,
        summary,
        grid,
        SafeString("".join(bars)),
        SafeString("".join(labels)),
    )


# -- views ------------------------------------------------------------------------


def dashboard_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> TemplateResponse:
    """Per-queue figures and the last hour's throughput; needs the "view" permission."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    data = stats.dashboard()
    states = queue_states()
    flows = flowstats.flow_stats([figures.queue for figures in data.queues])
    throttled = {flow.queue for flow in flows if flow.throttled}
    rows = [_row(model_admin, figures) for figures in data.queues]
    for row in rows:
        state = states.get(row["queue"])
        row["state"] = state if state is not None and state.paused else None
        row["throttled"] = row["queue"] in throttled
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Queue dashboard"),
        "opts": model_admin.model._meta,
        "dashboard": data,
        "rows": rows,
        "totals": _row(model_admin, data.totals),
        "flow_rows": [_flow_row(model_admin, flow, data.now) for flow in flows],
        "chart": throughput_svg(data.throughput),
        "can_change": model_admin.has_change_permission(request),
        "changelist_url": admin_url(model_admin, "changelist"),
        "failures_url": admin_url(model_admin, "failures"),
        "queue_state_url": admin_url(model_admin, "queue_state"),
        "window_short": int(stats.WINDOW_SHORT.total_seconds() // 60),
        "database_problems": _database_problems(),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def _database_problems() -> list[pressure.Check] | None:
    """The database checks that found a problem (``delayq_status --health``); None
    if the server's statistics could not be read (a role without the right)."""
    alias = queue_alias()
    try:
        with transaction.atomic(using=alias):  # a failed read must not spoil the request's
            checks = pressure.health(alias)
    except DatabaseError:
        logger.warning("could not read the database's statistics", exc_info=True)
        return None
    return [check for check in checks if check.problem]


def queue_state_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> HttpResponse:
    """POST ``queue`` and ``action`` (pause/resume, with a ``reason``); needs "change"."""
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    queue = request.POST.get("queue", "").strip()
    action = request.POST.get("action")
    reason = request.POST.get("reason", "").strip()
    back = admin_url(model_admin, "dashboard")
    try:
        if action == "pause":
            changed = pause_queue(queue, by=request.user.get_username(), reason=reason)
            text = _("Queue “%(queue)s” paused: workers stop claiming from it.")
            unchanged = _("Queue “%(queue)s” was already paused.")
        elif action == "resume":
            changed = resume_queue(queue)
            text = _("Queue “%(queue)s” resumed.")
            unchanged = _("Queue “%(queue)s” was not paused.")
        else:
            raise ValueError(_("Unknown action."))
    except ValueError as exc:
        model_admin.message_user(request, str(exc), messages.ERROR)
        return HttpResponseRedirect(back)
    level = messages.SUCCESS if changed else messages.WARNING
    model_admin.message_user(request, (text if changed else unchanged) % {"queue": queue}, level)
    return HttpResponseRedirect(back)


def dashboard_urlpattern(model_admin: ModelAdmin[Any]) -> URLPattern:
    """``<changelist>/dashboard/``, named ``admin:django_delayq_message_dashboard``."""

    def view(request: HttpRequest) -> HttpResponse:
        return dashboard_view(request, model_admin)

    return path("dashboard/", model_admin.admin_site.admin_view(view), name=URL_NAME)


def queue_state_urlpattern(model_admin: ModelAdmin[Any]) -> URLPattern:
    """``<changelist>/queues/state/`` (POST only): pause or resume a queue."""

    @require_POST
    def view(request: HttpRequest) -> HttpResponse:
        return queue_state_view(request, model_admin)

    return path("queues/state/", model_admin.admin_site.admin_view(view), name=QUEUE_STATE_URL_NAME)


# Registered with MessageAdmin (its get_urls() puts extra pages before its own).
EXTRA_URLS.extend([dashboard_urlpattern, queue_state_urlpattern])
OBJECT_TOOLS.append((_lazy("Dashboard"), URL_NAME))
