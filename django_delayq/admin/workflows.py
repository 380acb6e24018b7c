"""The admin's workflow page: a message's graph of parents and children, drawn.

``<changelist>/<id>/workflow/`` shows the workflow a message belongs to (its
ancestors and descendants, up to ``MAX_NODES``) as an SVG picture: one box
per step, coloured by status, each a link to its change page, an arrow per
``after=`` edge, laid out in columns by depth. Under it, the steps that
block the workflow (waiting for a parent that failed, or failed themselves)
and two buttons: retry the failed steps (which reopens the steps their
failure cancelled) and cancel the steps still waiting. The message's change
page shows its parents, children and result, with a link here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import messages as flash
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from django_delayq import operations
from django_delayq.admin.messages import register_view
from django_delayq.models import Dependency, Message
from django_delayq.store import dependencies

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: The most steps the page draws (the nearest to the message first).
MAX_NODES = 300
URL_NAME = "django_delayq_message_workflow"

# Status colours, the dashboard's.
COLOURS = {
    "pending": "#e6f0fa",
    "running": "#fff4d6",
    "succeeded": "#e3f4e1",
    "failed": "#fbe3e1",
    "cancelled": "#ececec",
}
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 190, 46, 60, 16, 12


@dataclass
class Step:
    message: Message
    depth: int = 0
    row: int = 0
    url: str = ""

    @property
    def waiting(self) -> bool:
        return dependencies.waits(self.message)


def workflow_of(message: Message, limit: int = MAX_NODES) -> tuple[dict[int, Step], list[Any]]:
    """The steps around ``message`` (breadth first through parents and children, at most
    ``limit``) and the edges between them, as (parent, child) ids."""
    alias = message._state.db or "default"
    seen = {message.pk}
    queue: deque[int] = deque([message.pk])
    edges: set[tuple[int, int]] = set()
    rows = Dependency.objects.using(alias)
    while queue and len(seen) < limit:
        batch = [queue.popleft() for _ in range(min(len(queue), 100))]
        found = rows.filter(child_id__in=batch) | rows.filter(parent_id__in=batch)
        for parent, child in found.values_list("parent_id", "child_id")[: limit * 4]:
            edges.add((parent, child))
            for pk in (parent, child):
                if pk not in seen and len(seen) < limit:
                    seen.add(pk)
                    queue.append(pk)
    found_rows = Message._base_manager.using(alias).in_bulk(list(seen))
    steps = {pk: Step(row) for pk, row in found_rows.items()}
    kept = [(p, c) for p, c in sorted(edges) if p in steps and c in steps]
    _layout(steps, kept)
    return steps, kept


def _layout(steps: dict[int, Step], edges: list[tuple[int, int]]) -> None:
    """Depth: the longest path from a step without parents (a topological pass);
    row: the order within a depth, by id."""
    parents: dict[int, list[int]] = {pk: [] for pk in steps}
    children: dict[int, list[int]] = {pk: [] for pk in steps}
    for parent, child in edges:
        parents[child].append(parent)
        children[parent].append(child)
    left = {pk: len(parents[pk]) for pk in steps}
    ready = deque(sorted(pk for pk, n in left.items() if n == 0))
    while ready:
        pk = ready.popleft()
        for child in children[pk]:
            steps[child].depth = max(steps[child].depth, steps[pk].depth + 1)
            left[child] -= 1
            if left[child] == 0:
                ready.append(child)
    rows: dict[int, int] = {}
    for pk in sorted(steps):
        step = steps[pk]
        step.row = rows.get(step.depth, 0)
        rows[step.depth] = step.row + 1


def svg(steps: dict[int, Step], edges: list[tuple[int, int]], focus: int, link: Any) -> SafeString:
    """The picture: ``link(pk)`` is each box's URL; ``focus`` gets a thicker border."""
    if not steps:
        return SafeString("")
    width = PAD * 2 + (max(s.depth for s in steps.values()) + 1) * (BOX_W + GAP_X) - GAP_X
    height = PAD * 2 + (max(s.row for s in steps.values()) + 1) * (BOX_H + GAP_Y) - GAP_Y

    def x(step: Step) -> int:
        return PAD + step.depth * (BOX_W + GAP_X)

    def y(step: Step) -> int:
        return PAD + step.row * (BOX_H + GAP_Y)

    arrows = format_html_join(
        "",
        '<path class="dq-edge dq-edge-{}" d="M{},{} C{},{} {},{} {},{}" '
        'marker-end="url(#dq-arrow)"/>',
        (
            (
                steps[parent].message.status,
                x(steps[parent]) + BOX_W,
                y(steps[parent]) + BOX_H // 2,
                x(steps[parent]) + BOX_W + GAP_X // 2,
                y(steps[parent]) + BOX_H // 2,
                x(steps[child]) - GAP_X // 2,
                y(steps[child]) + BOX_H // 2,
                x(steps[child]) - 2,
                y(steps[child]) + BOX_H // 2,
            )
            for parent, child in edges
        ),
    )
    boxes = format_html_join(
        "",
        '<a href="{}" class="dq-node" data-id="{}" data-status="{}"><title>{}</title>'
        '<rect x="{}" y="{}" width="{}" height="{}" rx="6" fill="{}" '
        'stroke="{}" stroke-width="{}"/>'
        '<text x="{}" y="{}" class="dq-node-key">{}</text>'
        '<text x="{}" y="{}" class="dq-node-status">{}</text></a>',
        (
            (
                link(pk),
                pk,
                s.message.status,
                f"#{pk} {s.message.queue}/{s.message.key}: {s.message.status}",
                x(s),
                y(s),
                BOX_W,
                BOX_H,
                COLOURS.get(s.message.status, "#fff"),
                "#333" if pk == focus else "#999",
                3 if pk == focus else 1,
                x(s) + 8,
                y(s) + 19,
                _short(f"{s.message.queue}/{s.message.key}"),
                x(s) + 8,
                y(s) + 36,
                _("waiting for its parents") if s.waiting else s.message.get_status_display(),
            )
            for pk, s in sorted(steps.items())
        ),
    )
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="dq-workflow" width="{}" height="{}" '
        'viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<defs><marker id="dq-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>{}{}</svg>',
        width,
        height,
        width,
        height,
        _("The workflow's steps and their dependencies"),
        arrows,
        boxes,
    )


def _short(text: str, size: int = 26) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


def workflow_view(
    request: HttpRequest, model_admin: ModelAdmin[Any], object_id: str
) -> HttpResponse:
    """The page (GET), and its two buttons (POST ``retry`` / ``cancel``)."""
    # The permission before the lookup: every id, existing or not, gets the same 403.
    if request.method == "POST" and not model_admin.has_change_permission(request):
        raise PermissionDenied
    message = model_admin.get_object(request, object_id)
    if message is None:
        raise Http404(_("No message with id %s.") % object_id)
    steps, edges = workflow_of(message)
    site = model_admin.admin_site.name
    here = reverse(f"{site}:{URL_NAME}", args=[message.pk])
    if request.method == "POST":
        ids = list(steps)
        chosen = Message.objects.filter(pk__in=ids)
        if request.POST.get("operation") == "retry":
            result = operations.retry_failed(chosen.filter(status__in=["failed", "cancelled"]))
            flash.success(request, _("Retry: %s.") % result)
        elif request.POST.get("operation") == "cancel":
            result = operations.cancel(chosen.filter(status="pending"))
            flash.success(request, _("Cancel: %s.") % result)
        return HttpResponseRedirect(here)

    def link(pk: int) -> str:
        return reverse(f"{site}:django_delayq_message_change", args=[pk])

    ordered = sorted(steps.values(), key=lambda s: (s.depth, s.row))
    for step in ordered:
        step.url = link(step.message.pk)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Workflow of %(message)s") % {"message": f"{message.queue}/{message.key}"},
        "opts": Message._meta,
        "changelist_url": reverse(f"{site}:django_delayq_message_changelist"),
        "original": message,
        "original_url": link(message.pk),
        "picture": svg(steps, edges, message.pk, link),
        "blocked": [s for s in ordered if s.waiting],
        "failed": [s for s in ordered if s.message.status in ("failed", "cancelled")],
        "counts": {
            status: sum(1 for s in steps.values() if s.message.status == status)
            for status in COLOURS
        },
        "truncated": len(steps) >= MAX_NODES,
        "max_nodes": MAX_NODES,
        "can_change": model_admin.has_change_permission(request),
    }
    request.current_app = site
    return TemplateResponse(request, "admin/django_delayq/workflow.html", context)


register_view("<path:object_id>/workflow/", workflow_view, "workflow")
