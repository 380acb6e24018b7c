"""How the admin shows a message.

The helpers (a duration the way the list writes it, when a message is due, a
timestamp in the current time zone, the status badge) and
``MessageDisplayAdmin``: the message list's columns and the change page's
read-only fields, which ``MessageAdmin`` (``messages.py``) inherits.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_delayq import clock, durations
from django_delayq.admin.payload import UndecodablePayload, pretty_json
from django_delayq.exceptions import HandlerNotFound
from django_delayq.models import Message
from django_delayq.registry import max_attempts_of, registry
from django_delayq.store import dependencies
from django_delayq.values import escape_surrogates

S = Message.Status


def span(delta: timedelta) -> str:
    """A duration the way the list shows it: ``40 s``, ``5 min``, ``2 h``, ``3 d``."""
    return durations.human(delta.total_seconds(), durations.LIST, whole=True)


def waits_for_group(message: Message) -> bool:
    """Held behind an earlier message of its group: pending, no due time, a group."""
    return (
        message.status == S.PENDING
        and message.next_attempt_time is None
        and bool(message.group)
        and not dependencies.waits(message)
    )


def describe_due(message: Message, now: datetime | None = None) -> str:
    """``in 5 min``, ``overdue 2 h``, ``lease ends in 40 s``, ``waiting for its group``...;
    empty when nothing is due."""
    when = message.next_attempt_time
    if when is None:
        if dependencies.waits(message):
            return _("waiting for its parents")
        return _("waiting for its group") if waits_for_group(message) else ""
    delta = when - (now or clock.now())
    if message.status == S.RUNNING:
        if delta > timedelta(0):
            return _("lease ends in %s") % span(delta)
        return _("lease expired %s ago") % span(delta)
    if delta > timedelta(0):
        return _("in %s") % span(delta)
    if delta > -timedelta(seconds=1):
        return _("due now")
    return _("overdue %s") % span(delta)


def local_time(value: datetime) -> str:
    """A timestamp as the admin shows them: in the current time zone, localised."""
    return formats.date_format(timezone.localtime(value), "DATETIME_FORMAT")


def effective_max_attempts(message: Message) -> int:
    """The cap a worker applies: the message's own, its handler's, or the settings'."""
    try:
        spec = registry.lookup(message.queue, message.kind)
    except HandlerNotFound:
        spec = None
    return max_attempts_of(message, spec)


def status_badge(message: Message) -> SafeString:
    return format_html(
        '<span class="dq-badge dq-{}">{}</span>', message.status, message.get_status_display()
    )


def compact_time(value: datetime) -> SafeString:
    """A timestamp on two short lines (date, then time), the full one in the title."""
    local = timezone.localtime(value)
    return format_html(
        '<span class="dq-when" title="{}">{}<br>{}</span>',
        local_time(value),
        formats.date_format(local, "SHORT_DATE_FORMAT"),
        formats.time_format(local, "TIME_FORMAT"),
    )


#: The parents and children the change page lists (the workflow page draws them all).
STEPS_SHOWN = 20


def _step_rows(model_admin: admin.ModelAdmin, steps: list[Message]) -> SafeString:
    """One line per step: its link, its status badge, and its result, cut short."""
    if not steps:
        return SafeString(_("none left"))
    return format_html_join(
        "",
        '<div class="dq-step"><a href="{}">#{} {}/{}</a> {} <code>{}</code></div>',
        (
            (
                reverse(
                    f"{model_admin.admin_site.name}:django_delayq_message_change",
                    args=[quote(step.pk)],
                ),
                step.pk,
                step.queue,
                step.key,
                status_badge(step),
                _cut(pretty_json(step.result)) if step.result is not None else "",
            )
            for step in steps
        ),
    )


def _cut(text: str, size: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= size else text[: size - 1] + "…"


class MessageDisplayAdmin(admin.ModelAdmin):
    """The message list's columns and the change page's read-only fields."""

    # -- columns --------------------------------------------------------------------

    @admin.display(description=gettext_lazy("key, queue, kind"))
    def key_display(self, obj: Message) -> SafeString:
        """The key, linking to the message; under it its queue and kind, and its
        group, linking to the group's messages (``?queue=...&group=...``)."""
        link = getattr(obj, "delayq_link", None)
        if link is None:  # not from the changelist: no filters to keep
            opts = self.opts
            change = f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change"
            link = (reverse(change, args=[quote(obj.pk)]), None)
        url, opener = link
        key = obj.key or self.get_empty_value_display()
        parts = [
            format_html(
                '<a class="dq-key" href="{}"{} title="{}">{}</a>',
                url,
                format_html(' data-popup-opener="{}"', opener) if opener is not None else "",
                key,
                key,
            )
        ]
        where = f"{obj.queue} · {obj.kind}" if obj.kind else obj.queue
        title = (
            _("queue %(queue)s, kind %(kind)s") % {"queue": obj.queue, "kind": obj.kind}
            if obj.kind
            else _("queue %(queue)s") % {"queue": obj.queue}
        )
        parts.append(format_html('<span class="dq-where" title="{}">{}</span>', title, where))
        if obj.group:
            parts.append(
                format_html(
                    '<span class="dq-group" title="{}">{} {}</span>',
                    _("group %(group)s") % {"group": obj.group},
                    _("group"),
                    self.group_display(obj),
                )
            )
        return SafeString("".join(parts))

    @admin.display(description=gettext_lazy("status, attempts"), ordering="status")
    def status_display(self, obj: Message) -> SafeString:
        """The badge, and under it the attempts made against the cap a worker applies."""
        made, cap = obj.attempt_count, effective_max_attempts(obj)
        return format_html(
            '{}<span class="dq-attempts" title="{}">{} / {}</span>',
            status_badge(obj),
            _("%(made)s attempts of at most %(cap)s") % {"made": made, "cap": cap},
            made,
            cap,
        )

    @admin.display(description=gettext_lazy("status"))
    def status_badge_display(self, obj: Message) -> SafeString:
        return status_badge(obj)

    @admin.display(description=gettext_lazy("group"))
    def group_display(self, obj: Message) -> SafeString | str:
        """The group, linking to its messages (``?queue=...&group=...``)."""
        if not obj.group:
            return ""
        query = urlencode({"queue": obj.queue, "group": obj.group})
        return format_html('<a href="?{}">{}</a>', query, obj.group)

    @admin.display(description=gettext_lazy("next attempt"), ordering="next_attempt_time")
    def next_attempt(self, obj: Message) -> SafeString | str:
        text = describe_due(obj)
        if waits_for_group(obj):
            scheduled = local_time(obj.scheduled_time)
            return format_html('<span class="dq-held" title="{}">{}</span>', scheduled, text)
        if not text or obj.next_attempt_time is None:
            return self.get_empty_value_display()
        when = local_time(obj.next_attempt_time)
        return format_html('<span title="{}">{}</span>', when, text)

    @admin.display(description=gettext_lazy("attempts"))
    def attempts(self, obj: Message) -> str:
        return f"{obj.attempt_count} / {effective_max_attempts(obj)}"

    @admin.display(description=gettext_lazy("last error"))
    def error(self, obj: Message) -> SafeString | str:
        line = obj.error_summary()
        if not line:
            return ""
        # The stylesheet shows what fits the column (up to three lines).
        short = line if len(line) <= 160 else line[:159] + "…"
        return format_html('<span class="dq-error-line" title="{}">{}</span>', line, short)

    @admin.display(description=gettext_lazy("created"))
    def created(self, obj: Message) -> SafeString:
        return compact_time(obj.created_at)

    # -- change page fields ---------------------------------------------------------

    @admin.display(description=gettext_lazy("payload"))
    def payload_display(self, obj: Message) -> SafeString:
        if isinstance(obj.payload, UndecodablePayload):
            return format_html(
                '<p>{}</p><pre class="dq-pre">{}</pre>',
                _("Nested too deeply to decode here; its JSON text:"),
                escape_surrogates(str(obj.payload)),
            )
        return format_html(
            '<pre class="dq-pre">{}</pre>', escape_surrogates(pretty_json(obj.payload))
        )

    @admin.display(description=gettext_lazy("first scheduled"))
    def first_scheduled(self, obj: Message) -> str:
        return local_time(obj.scheduled_time)

    @admin.display(description=gettext_lazy("next attempt"))
    def due_display(self, obj: Message) -> SafeString | str:
        if dependencies.waits(obj):
            return format_html(
                '<span class="dq-held">{}</span> ({})',
                describe_due(obj),
                _("once its parents let it go, not before %(time)s")
                % {"time": local_time(obj.scheduled_time)},
            )
        if waits_for_group(obj):
            return format_html(
                '<span class="dq-held">{}</span> ({})',
                describe_due(obj),
                _("after the earlier messages of its group, not before %(time)s")
                % {"time": local_time(obj.scheduled_time)},
            )
        if obj.next_attempt_time is None:
            return self.get_empty_value_display()
        when = local_time(obj.next_attempt_time)
        return format_html("{} ({})", when, describe_due(obj))

    @admin.display(description=gettext_lazy("stands for"))
    def row_display(self, obj: Message) -> SafeString | str:
        """A stand-in's row (``store/row_steps.py``), linked to its own admin page."""
        from django_delayq.store.row_steps import model_for, row_of

        model = model_for(obj.queue)
        if model is None:
            return self.get_empty_value_display()
        row = row_of(obj)
        if row is None:
            return _("%(model)s %(key)s (deleted)") % {
                "model": model._meta.verbose_name,
                "key": obj.key,
            }
        text = f"{model._meta.verbose_name} {row}"
        if model in self.admin_site._registry:
            opts = model._meta
            url = reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
                args=[quote(row.pk)],
            )
            return format_html(
                '<a href="{}">{}</a> <small>{}</small>', url, text, _("(its status is this one's)")
            )
        return text

    @admin.display(description=gettext_lazy("result"))
    def result_display(self, obj: Message) -> SafeString | str:
        if obj.result is None:
            return self.get_empty_value_display()
        return format_html(
            '<pre class="dq-pre">{}</pre>', escape_surrogates(pretty_json(obj.result))
        )

    @admin.display(description=gettext_lazy("parents"))
    def parents_display(self, obj: Message) -> SafeString | str:
        if not obj.on_parent_failure:
            return self.get_empty_value_display()
        rows = _step_rows(self, obj.parents())
        summary = _("on_parent_failure=%(policy)s; %(waiting)s waiting, %(failed)s failed") % {
            "policy": obj.on_parent_failure,
            "waiting": obj.parents_waiting,
            "failed": obj.parents_failed,
        }
        return format_html("{}<br><small>{}</small>", rows, summary)

    @admin.display(description=gettext_lazy("children"))
    def children_display(self, obj: Message) -> SafeString | str:
        if not obj.has_children:
            return self.get_empty_value_display()
        from django_delayq.store.dependencies import children_of

        found = list(children_of(obj).order_by("pk")[: STEPS_SHOWN + 1])
        more = len(found) > STEPS_SHOWN
        rows = _step_rows(self, found[:STEPS_SHOWN])
        if more:
            return format_html("{}<br><small>{}</small>", rows, _("and more: see the workflow"))
        return rows

    @admin.display(description=gettext_lazy("workflow"))
    def workflow_link(self, obj: Message) -> SafeString | str:
        if not (obj.on_parent_failure or obj.has_children):
            return self.get_empty_value_display()
        url = reverse(
            f"{self.admin_site.name}:django_delayq_message_workflow", args=[quote(obj.pk)]
        )
        return format_html('<a href="{}">{}</a>', url, _("Show the workflow as a graph"))

    @admin.display(description=gettext_lazy("redelivery"), boolean=True)
    def redelivery(self, obj: Message) -> bool:
        return obj.is_redelivery

    @admin.display(description=gettext_lazy("lock owner"))
    def lock_display(self, obj: Message) -> SafeString | str:
        if obj.status != S.RUNNING:
            if obj.locked_by:
                return _("not running (last worker: %s)") % obj.locked_by
            return _("not running")
        state = describe_due(obj)
        return format_html(
            "{}<br><small>{}: {} · {}</small>",
            obj.locked_by or "?",
            _("lock token"),
            obj.lock_token or "",
            state,
        )

    @admin.display(description=gettext_lazy("error"))
    def error_display(self, obj: Message) -> SafeString | str:
        if not obj.last_error:
            return self.get_empty_value_display()
        return format_html('<pre class="dq-pre dq-error">{}</pre>', obj.last_error)

    @admin.display(description=gettext_lazy("traceback"))
    def traceback_display(self, obj: Message) -> SafeString | str:
        if not obj.last_traceback:
            return self.get_empty_value_display()
        return format_html('<pre class="dq-pre">{}</pre>', obj.last_traceback)
