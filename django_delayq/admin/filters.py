"""The message changelist's filters, and the other lookups its links use.

The queue and kind filters list their choices by a loose index scan
(``store.queries.distinct_values``); ``RetryingFilter`` and ``OverdueFilter``
serve the changelist of a model with ``QueueFields`` too (``entity.py``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_delayq import clock
from django_delayq.admin.display import span
from django_delayq.cron.spec import KEY_PREFIX
from django_delayq.flow import continuing_queues
from django_delayq.models import Message
from django_delayq.registry import registry
from django_delayq.status import Status
from django_delayq.store import queries
from django_delayq.store.dependencies import waiting_rows
from django_delayq.store.queries import due_condition, retrying_condition


class ColumnFilter(admin.SimpleListFilter):
    """Messages whose column named like the parameter equals the chosen value."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        value = self.value()
        return queryset if value is None else queryset.filter(**{str(self.parameter_name): value})


class QueueFilter(ColumnFilter):
    """Queues from the table (a loose index scan) and from the registered handlers."""

    title = gettext_lazy("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        queues = set(queries.distinct_values("queue")) | set(registry.queues())
        return [(q, q) for q in sorted(queues)]


class KindFilter(ColumnFilter):
    """Kinds from the kind index, plus messages without a kind."""

    title = gettext_lazy("kind")
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        kinds = set(queries.distinct_values("kind"))
        kinds |= {spec.kind for spec in registry.all() if spec.kind}
        return [("", _("(no kind)")), *((k, k) for k in sorted(kinds))]


class RetryingFilter(admin.SimpleListFilter):
    """Pending again after a failed attempt (``QueueQuerySet.retrying``).

    Messages, or the rows of a ``QueueFields`` model (``QueueAdminMixin``).
    """

    title = gettext_lazy("retrying")
    parameter_name = "retrying"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", _("Yes"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        if self.value() == "yes":
            return queryset.filter(retrying_condition())
        return queryset


class OverdueFilter(admin.SimpleListFilter):
    """Due, and not picked up by a worker for longer than a threshold.

    Served by the partial indexes on the active statuses (``delayq_due_idx``,
    or a ``QueueFields`` model's claim index).
    """

    title = gettext_lazy("overdue")
    parameter_name = "overdue"
    THRESHOLDS = (60, 300, 3600, 86400)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (str(s), _("by more than %s") % span(timedelta(seconds=s))) for s in self.THRESHOLDS
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        value = self.value()
        if value is None:
            return queryset
        try:
            clock.now() - timedelta(seconds=int(value))  # refused before the year 1
            overdue = timedelta(seconds=int(value))
        except (ValueError, OverflowError) as exc:  # not a number, or before the year 1
            raise IncorrectLookupParameters(exc) from exc
        # On the database's clock, like every due time.
        return queryset.filter(due_condition(clock.sql_now_plus(-overdue)))


class RedeliveredFilter(admin.SimpleListFilter):
    """Started more than once (``Message.is_redelivery``)."""

    title = gettext_lazy("redelivered")
    parameter_name = "redelivered"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        if self.value() == "yes":
            return queryset.filter(attempt_count__gt=1)
        if self.value() == "no":
            return queryset.filter(attempt_count__lte=1)
        return queryset


class TicksFilter(admin.SimpleListFilter):
    """The schedules' ticks (keys ``cron:...``): a fast schedule keeps its next
    ticks installed ahead (``every=5``: 24 rows waiting), which would
    otherwise fill the top of the list. "Not due yet" hides those that wait
    for their time; the ticks that are due, running or done stay listed."""

    title = gettext_lazy("schedule ticks")
    parameter_name = "ticks"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("due", _("Hide those not due yet")), ("only", _("Only ticks"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        ticks = Q(key__startswith=KEY_PREFIX)
        if self.value() == "due":
            waiting = ticks & Q(status=Status.PENDING, next_attempt_time__gt=clock.sql_now())
            return queryset.exclude(waiting)
        if self.value() == "only":
            return queryset.filter(ticks)
        return queryset


class GroupFilter(admin.SimpleListFilter):
    """Messages of one group (``?group=order-42``): a text box, as groups are too
    many to list. With ``?queue=`` it is one group's messages, in their order."""

    title = gettext_lazy("group")
    parameter_name = "group"
    template = "admin/django_delayq/message/text_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Any:
        # The other parameters go along as hidden fields (as the search box's do).
        name = str(self.parameter_name)
        yield {
            "name": name,
            "value": self.value() or "",
            "hidden": [(k, v) for k, v in changelist.params.items() if k != name],
            "clear_url": changelist.get_query_string(remove=[name]),
            "selected": self.value() is None,
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        value = self.value()
        return queryset.filter(group=value) if value else queryset


class GroupStateFilter(admin.SimpleListFilter):
    """Ordered groups: the first message of each blocked group (failing: waiting for
    a retry, or failed where that blocks the group), or the messages held behind
    an earlier one of their group."""

    title = gettext_lazy("ordered groups")
    parameter_name = "group_state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("blocked", _("Blocked groups (their first message)")),
            ("held", _("Waiting for their group")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        if self.value() == "blocked":
            return queryset.blocked_group_heads(continuing_queues())  # type: ignore[attr-defined, no-any-return]
        if self.value() == "held":
            return queryset.waiting_for_group()  # type: ignore[attr-defined, no-any-return]
        return queryset


class WorkflowFilter(admin.SimpleListFilter):
    """Workflows: the steps waiting for their parents, every step (a message with
    parents), and the parents (messages others wait for)."""

    title = gettext_lazy("workflows")
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("waiting", _("Waiting for their parents")),
            ("steps", _("Steps (enqueued after= others)")),
            ("parents", _("Parents (others wait for them)")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> QuerySet[Message]:
        if self.value() == "waiting":
            return queryset.filter(waiting_rows())
        if self.value() == "steps":
            return queryset.exclude(on_parent_failure="")
        if self.value() == "parents":
            return queryset.filter(has_children=True)
        return queryset


#: Changelist parameters beside the filters' own: the dashboard's, the failures
#: page's and the schedules page's links use them.
LINKED_LOOKUPS = frozenset(
    {
        "status__in",
        "attempt_count",
        "attempt_count__gt",
        "next_attempt_time__lte",
        "next_attempt_time__gt",
        "finished_at__gte",
        "last_attempt_time__gte",
        "error_fingerprint",
        "key__startswith",
    }
)
