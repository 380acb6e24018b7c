"""``MessageAdmin``: the changelist, the change page and the hook for extra admin pages.

Built for a table of millions of rows: the counts are capped or estimated
(``MessagePaginator``), the queue and kind filters list their choices by a
loose index scan (``store.queries.distinct_values``), the date hierarchy reads its
bounds off the primary key (``templatetags/delayq_admin.py``), and the list
query leaves the payload and the traceback in the database. Every change an
operator makes goes through ``django_delayq.operations`` (see ``actions.py``).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.forms.fields import InvalidJSONInput
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_delayq import clock, durations, operations, search
from django_delayq.admin import actions
from django_delayq.cron.spec import KEY_PREFIX
from django_delayq.exceptions import HandlerNotFound
from django_delayq.flow import continuing_queues
from django_delayq.models import MAX_ATTEMPTS_LIMIT, PRIORITY_MAX, PRIORITY_MIN, Message
from django_delayq.payload import check_payload, check_text_depth
from django_delayq.registry import max_attempts_of, registry
from django_delayq.status import Status
from django_delayq.store import operators, queries
from django_delayq.store.queries import due_condition, retrying_condition
from django_delayq.values import escape_surrogates

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

S = Message.Status

# -- the hook for extra admin pages ---------------------------------------------------

#: Extra pages under the message changelist's URL (``.../django_delayq/message/<route>``).
#: Each entry is called with the ``MessageAdmin`` and returns a URL pattern; the
#: patterns are placed before the admin's own, so ``"dashboard/"`` is not taken
#: for an object id. Append at import time, from a module that
#: ``django_delayq/admin/__init__.py`` imports, e.g.::
#:
#:     EXTRA_URLS.append(schedules_urlpattern)    # (model_admin) -> path("schedules/", ...)
#:
#: or use :func:`register_view`, which also wraps the view in ``admin_view``
#: (login, CSRF, no caching) and checks a permission.
EXTRA_URLS: list[Callable[[MessageAdmin], URLPattern]] = []

#: Buttons in the changelist's object tools (top right): ``(label, url name)``,
#: the url name without the ``admin:`` namespace, e.g.
#: ``("Dashboard", "django_delayq_message_dashboard")``.
OBJECT_TOOLS: list[tuple[StrOrPromise, str]] = []

ExtraView = Callable[..., HttpResponseBase]


def register_view(
    route: str,
    view: ExtraView,
    name: str,
    *,
    label: StrOrPromise | None = None,
    permission: str = "view",
) -> None:
    """Add ``view(request, model_admin, **url_kwargs)`` at ``<changelist>/<route>``.

    The URL is named ``admin:django_delayq_message_<name>``; the user needs
    the ``permission`` (view, change, delete) on messages. With ``label``, a
    button to it appears on the changelist.
    """
    url_name = f"django_delayq_message_{name}"

    def pattern(model_admin: MessageAdmin) -> URLPattern:
        def checked(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
            if not getattr(model_admin, f"has_{permission}_permission")(request):
                raise PermissionDenied
            return view(request, model_admin, **kwargs)

        return path(route, model_admin.admin_site.admin_view(checked), name=url_name)

    EXTRA_URLS.append(pattern)
    if label:
        OBJECT_TOOLS.append((label, url_name))


# -- display helpers --------------------------------------------------------------------


def span(delta: timedelta) -> str:
    """A duration the way the list shows it: ``40 s``, ``5 min``, ``2 h``, ``3 d``."""
    return durations.human(delta.total_seconds(), durations.LIST, whole=True)


def waits_for_group(message: Message) -> bool:
    """Held behind an earlier message of its group: pending, no due time, a group."""
    return message.status == S.PENDING and message.next_attempt_time is None and bool(message.group)


def describe_due(message: Message, now: datetime | None = None) -> str:
    """``in 5 min``, ``overdue 2 h``, ``lease ends in 40 s``, ``waiting for its group``...;
    empty when nothing is due."""
    when = message.next_attempt_time
    if when is None:
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


# -- changelist plumbing ----------------------------------------------------------------


class MessagePaginator(Paginator):
    """Counts that stay cheap on a table of millions of messages.

    Without filters, on PostgreSQL and MariaDB/MySQL, the count is the database's estimate
    (``store.queries.estimated_count``) once the table is over ``ESTIMATE_ABOVE``
    rows. Otherwise the first page is read first (``per_page + 1`` rows): if
    that is all there is, it is the count and the page at once, so a search
    that finds a few messages reads the table once instead of twice; if not,
    it is still the first page when that is the one shown. Beyond a page the
    count is exact up to ``CAP`` and "more than CAP" after, by
    ``SELECT COUNT(*) FROM (... LIMIT CAP + 1)``, which stops reading at the
    cap. Either way the pages stop at CAP rows: deep ``OFFSET`` pages of a
    huge table are slow anyway, and a filter or the search narrows faster.
    """

    CAP = 10_000
    ESTIMATE_ABOVE = 100_000

    estimated: int | None = None
    capped = False
    #: The first ``per_page + 1`` rows, read while counting.
    first: list[Message] | None = None

    @cached_property
    def count(self) -> int:
        queryset = cast(QuerySet[Message], self.object_list)
        if not queryset.query.where:
            estimate = queries.estimated_count(queryset.db)
            if estimate is not None and estimate > self.ESTIMATE_ABOVE:
                self.estimated = estimate
                return self.CAP + 1
        self.first = list(queryset[: self.per_page + 1])
        if len(self.first) <= self.per_page:
            return len(self.first)
        count = queryset.order_by()[: self.CAP + 1].count()
        self.capped = count > self.CAP
        return count

    def page(self, number: Any) -> Any:
        number = self.validate_number(number)
        if number == 1 and self.first is not None:
            return Page(self.first[: self.per_page], number, self)
        return super().page(number)

    @property
    def count_label(self) -> str:
        count = self.count
        if self.estimated is not None:
            rounded = round(self.estimated, 2 - len(str(self.estimated)))
            return _("about %s") % formats.number_format(rounded, force_grouping=True)
        if self.capped:
            return _("more than %s") % formats.number_format(self.CAP, force_grouping=True)
        return formats.number_format(count, force_grouping=True)


# The list shows neither; a payload may be a megabyte.
LIST_DEFERRED = ("payload", "last_traceback")


def refuse_nul(request: HttpRequest) -> None:
    """PostgreSQL cannot take NUL in text, not even as a parameter to compare
    with: a filter or search holding one is refused like any bad lookup
    (Django redirects to the list with ?e=1)."""
    if any("\x00" in value for _, values in request.GET.lists() for value in values):
        raise IncorrectLookupParameters("a parameter contains NUL (\\x00)")


def offered_lookups(model_admin: admin.ModelAdmin, request: HttpRequest | None) -> set[str]:
    """The query parameters of the changelist's own filters and date hierarchy."""
    names: set[str] = set()
    list_filter = (
        model_admin.get_list_filter(request) if request is not None else model_admin.list_filter
    )
    for item in list_filter:
        if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
            names.add(str(item.parameter_name))
        else:
            field = item[0] if isinstance(item, (list, tuple)) else item
            names |= {f"{field}__exact", f"{field}__isnull"}
    if model_admin.date_hierarchy:
        names |= {f"{model_admin.date_hierarchy}__{part}" for part in ("year", "month", "day")}
    return names


class SafeChangeList(ChangeList):
    """A changelist whose bad parameters are Django's "incorrect lookup" (?e=1), not a 500."""

    def get_filters(self, request: HttpRequest) -> Any:
        try:
            return super().get_filters(request)
        except OverflowError as exc:
            # The date hierarchy: ?created_at__year=9999 asks for the year after 9999.
            raise IncorrectLookupParameters(exc) from exc
        except ValueError as exc:  # the same, from datetime.replace()
            raise IncorrectLookupParameters(exc) from exc

    def get_results(self, request: HttpRequest) -> None:
        # A value Django accepted when building the query but that cannot be
        # sent (a time that is out of range once converted to UTC).
        try:
            super().get_results(request)
        except (OverflowError, ValueError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class MessageChangeList(SafeChangeList):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # reads the page (get_results)
        for message in self.result_list:
            message.delayq_link = self.link_for(message)  # type: ignore[attr-defined]

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        queryset = super().get_queryset(request, exclude_parameters)
        return queryset.defer(*LIST_DEFERRED)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        first = getattr(self.paginator, "first", None)
        if first is not None and not self.multi_page:
            # The paginator read the whole (one-page) result while counting.
            self.result_list = first

    def link_for(self, message: Message) -> tuple[str, str | None]:
        """The change page's URL as Django's own list links give it (the filters kept
        for the way back) and, in a popup, the value the link hands to the opener:
        the key column links there as the id column does."""
        url = add_preserved_filters(
            {"preserved_filters": self.preserved_filters, "opts": self.opts},
            self.url_for_result(message),
        )
        opener = None
        if self.is_popup:
            opener = str(message.serializable_value(str(self.to_field or self.pk_attname)))
        return url, opener


# -- filters ---------------------------------------------------------------------------


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
        "error_fingerprint",
        "key__startswith",
    }
)

_ID = re.compile(r"[0-9]{1,19}")


def is_message_id(value: str) -> bool:
    """A whole number a message's id can be (ASCII digits, within 64 bits)."""
    return bool(_ID.fullmatch(value)) and 0 < int(value) <= 2**63 - 1


# -- the change form -------------------------------------------------------------------


#: Levels of a payload indented on the pages; deeper levels are written on one line.
PRETTY_DEPTH = 32


def _scalar(value: Any, encoder: type[json.JSONEncoder] | None) -> str:
    text = json.dumps(value, ensure_ascii=False, cls=encoder)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, or the page could not be sent
        text = json.dumps(value, cls=encoder)
    return text


def pretty_json(
    value: Any, *, depth: int = PRETTY_DEPTH, encoder: type[json.JSONEncoder] | None = None
) -> str:
    """``json.dumps(value, indent=2, ensure_ascii=False)``, without recursion.

    ``json.dumps`` with an indent is written in Python and recursive: a payload
    nested about 330 levels deep (well within what ``enqueue`` and the C encoder
    accept) raised ``RecursionError`` and the message's pages answered 500. This
    walks the value with a stack of its own, indents the first ``depth`` levels
    and writes deeper ones on one line, so the page stays readable and its
    width bounded whatever the nesting. The text reads back as the same value.
    """
    out: list[str] = []
    stack: list[Any] = [(value, 0)]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        current, level = item
        if isinstance(current, dict):
            pairs: list[tuple[Any, Any]] = list(current.items())
            opening, closing = "{", "}"
        elif isinstance(current, (list, tuple)):
            pairs = [(None, v) for v in current]
            opening, closing = "[", "]"
        else:
            out.append(_scalar(current, encoder))
            continue
        if not pairs:
            out.append(opening + closing)
            continue
        if level < depth:
            inner = "\n" + "  " * (level + 1)
            parts: list[Any] = [opening + inner]
            separator, end = "," + inner, "\n" + "  " * level + closing
        else:
            parts, separator, end = [opening], ", ", closing
        for i, (key, child) in enumerate(pairs):
            if i:
                parts.append(separator)
            if opening == "{":
                name = key if isinstance(key, str) else json.dumps(key)
                parts.append(_scalar(name, None) + ": ")
            parts.append((child, level + 1))
        parts.append(end)
        stack.extend(reversed(parts))
    return "".join(out)


TOO_DEEP = gettext_lazy("not valid JSON: nested too deeply")


class UndecodablePayload(str):
    """A payload's JSON text that even a fresh stack could not decode: shown as
    text, read-only."""


def decode_on_a_fresh_stack(text: str) -> Any:
    """``json.loads(text)`` in a new thread.

    The C decoder counts the calls already on the stack against the recursion
    limit: a payload that ``enqueue`` encoded from a shallow stack (980 levels)
    could not be decoded under an admin page's 150 or so frames. A new thread
    starts with an empty stack.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = json.loads(text)
        except RecursionError:
            outcome["value"] = UndecodablePayload(text)

    thread = threading.Thread(target=run, name="delayq-admin-json", daemon=True)
    thread.start()
    thread.join()
    return outcome["value"]


def load_deep_payload(message: Message) -> Any:
    """The payload of a message whose row could not be read with it (RecursionError)."""
    text = (
        Message.objects.using(message._state.db)
        .filter(pk=message.pk)
        .values_list(Cast("payload", TextField()), flat=True)
        .get()
    )
    return decode_on_a_fresh_stack(text)


class PrettyJSONField(forms.JSONField):
    """The payload, indented for reading and editing."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, InvalidJSONInput):
            return value
        # A lone surrogate (refused on save) is shown escaped: a page cannot hold one.
        return escape_surrogates(pretty_json(value, encoder=self.encoder))

    def to_python(self, value: Any) -> Any:
        # The depth is checked before the parser recurses into the text;
        # json.loads still raises ValueError on an integer of over 4,300
        # digits, and Django only expects JSONDecodeError.
        if isinstance(value, str):
            try:
                check_text_depth(value)
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(TOO_DEEP, code="invalid") from None
        except ValueError as exc:
            raise forms.ValidationError(
                _("not valid JSON: %s") % exc, code="invalid", params={"value": value}
            ) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if isinstance(data, str):
            try:
                check_text_depth(data)
            except ValueError:
                return InvalidJSONInput(data)  # shown again as it was sent
        try:
            return super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return InvalidJSONInput(data)

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return super().has_changed(initial, data)
        except RecursionError:  # json.dumps of the initial value, under a deep stack
            return True


# Why a running message's kind is not changed (the change form's messages).
KIND_LOCKED = gettext_lazy(
    "the message started running, and its kind cannot change while it runs (the kind "
    "chooses its handler and the limits it counts against); change it once this attempt "
    "has ended"
)


class MessageForm(forms.ModelForm):
    # Bounded here, not only by the database: SQLite checks no integer range,
    # and a value past the column's range must be a form error, not a 500.
    priority = forms.IntegerField(
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        help_text=Message._meta.get_field("priority").help_text,
    )
    max_attempts = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_ATTEMPTS_LIMIT,
        help_text=Message._meta.get_field("max_attempts").help_text,
    )
    payload = PrettyJSONField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 16, "cols": 100, "class": "vLargeTextField"}),
        help_text=gettext_lazy("JSON; takes effect at the next attempt."),
    )

    class Meta:
        model = Message
        fields = ["kind", "priority", "max_attempts", "payload"]

    def clean_payload(self) -> Any:
        value = self.cleaned_data.get("payload")
        try:
            check_payload(value)
        except (TypeError, ValueError) as exc:
            raise forms.ValidationError(str(exc)) from exc
        return value


SEARCH_HELP = mark_safe(  # noqa: S308 - a constant
    "Words match the key or group (exact or prefix), kind, queue, error text or id; "
    '<code>"connection refused"</code> keeps the spaces. '
    "<code>field=value</code> matches a payload field: <code>companyId=3345</code>, "
    "nested <code>customer.id=7</code>, list items <code>items.0.sku=A1</code>. "
    "Unquoted numbers, <code>true</code>, <code>false</code> and <code>null</code> also match "
    'their string form; quoted values match exactly: <code>name="Jane Doe"</code>. '
    "All terms must match: <code>companyId=3345 status=new</code>."
)

# The change page's timeline: its own fieldset, and all read-only.
TIMELINE = (
    "created_at",
    "first_scheduled",
    "due_display",
    "attempts",
    "redelivery",
    "last_attempt_time",
    "finished_at",
    "updated_at",
)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    form = MessageForm
    # Seven columns, so that the list fits a laptop's screen beside the admin's
    # sidebar and the filters: the key over its queue, kind and group; the
    # status over the attempts; the long texts cut by the stylesheet (admin.css),
    # whole in their title.
    list_display = (
        "id",
        "key_display",
        "status_display",
        "priority",
        "next_attempt",
        "error",
        "created",
    )
    list_display_links = ("id",)
    list_filter = (
        "status",
        QueueFilter,
        KindFilter,
        GroupFilter,
        GroupStateFilter,
        RetryingFilter,
        OverdueFilter,
        RedeliveredFilter,
        TicksFilter,
    )
    # The search box appears because search_fields is set; get_search_results
    # implements the syntax of django_delayq.search instead of Django's.
    search_fields = ("key", "kind", "group", "queue", "last_error")
    search_help_text = SEARCH_HELP
    date_hierarchy = "created_at"
    ordering = ("-id",)
    list_per_page = 100
    list_max_show_all = 500
    show_full_result_count = False
    # Facets count every filter choice over the filtered rows: full scans.
    show_facets = admin.ShowFacets.NEVER
    paginator = MessagePaginator
    actions = actions.ACTIONS
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "queue",
                    "key",
                    "kind",
                    "group",
                    "status_badge_display",
                    "priority",
                    "max_attempts",
                )
            },
        ),
        (gettext_lazy("Payload"), {"fields": ("payload",)}),
        (gettext_lazy("Timeline"), {"fields": TIMELINE}),
        (gettext_lazy("Worker"), {"fields": ("lock_display",)}),
        (gettext_lazy("Last error"), {"fields": ("error_display", "traceback_display")}),
    )
    # Everything but kind, priority, max_attempts and payload: the queue
    # columns belong to the worker (and to the operations, which guard them).
    readonly_fields = (
        "queue",
        "key",
        "group",
        "status_badge_display",
        *TIMELINE,
        "lock_display",
        "error_display",
        "traceback_display",
        "payload_display",
    )

    class Media:
        css = {"all": ["django_delayq/admin.css"]}

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

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        undecodable = obj is not None and isinstance(obj.payload, UndecodablePayload)
        if self.has_change_permission(request, obj) and not undecodable:
            return fieldsets
        # Read-only: the pretty <pre> instead of Django's one-line JSON.
        return [
            (
                name,
                {
                    **opts,
                    "fields": ["payload_display" if f == "payload" else f for f in opts["fields"]],
                },
            )
            for name, opts in fieldsets
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The kind, too, while the message runs: it chooses the handler and the limits
        (a kind's global concurrency cap) the running attempt counts against."""
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and obj.status == S.RUNNING:
            fields += ("kind",)
        if obj is not None and isinstance(obj.payload, UndecodablePayload):
            # Out of the form altogether: a save must not write the text back as a string.
            fields += ("payload",)
        return fields

    def save_model(self, request: HttpRequest, obj: Message, form: Any, change: bool) -> None:
        """Write only the edited columns, so a concurrent worker's changes are kept.

        A kind sent for a message that runs by now (the page was loaded before
        its claim) is not written: the form left it out, or the edit is refused
        whole if the claim came while this request ran (``operators.EditRefused``).
        """
        sent = request.POST.get("kind")
        if "kind" not in form.fields and sent is not None and sent != obj.kind:
            self.message_user(
                request, _("The kind was not changed: %s.") % KIND_LOCKED, level="WARNING"
            )
        try:
            operators.edit(obj, [f for f in form.changed_data if f in MessageForm.Meta.fields])
        except operators.EditRefused:
            request._delayq_edit_refused = True  # type: ignore[attr-defined]
            self.message_user(request, _("Nothing was saved: %s.") % KIND_LOCKED, level="ERROR")

    def response_change(self, request: HttpRequest, obj: Message) -> HttpResponse:
        if getattr(request, "_delayq_edit_refused", False):
            # Back to the page, which shows the message as it is now (running).
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    # -- loading ----------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        queryset = super().get_queryset(request)
        if getattr(request, "_delayq_defer_payload", False):
            queryset = queryset.defer("payload")
        return queryset

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Message | None:
        """The message, whatever its payload's nesting (``decode_on_a_fresh_stack``).

        ``?_to_field=`` (empty) means the primary key: Django skips its check of
        an empty value, then asked the model for a field named "" (a 500).
        """
        from_field = from_field or None
        try:
            return super().get_object(request, object_id, from_field)
        except RecursionError:
            pass
        request._delayq_defer_payload = True  # type: ignore[attr-defined]
        try:
            obj = super().get_object(request, object_id, from_field)
        finally:
            request._delayq_defer_payload = False  # type: ignore[attr-defined]
        if obj is not None:
            obj.payload = load_deep_payload(obj)
        return obj

    # -- permissions ----------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Messages are produced by enqueue() (validation, de-duplication, NOTIFY).
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and operations.holds_lease(obj):
            return False  # a worker holds it: deleting would pull it from under the worker
        return super().has_delete_permission(request, obj)

    # -- changelist -------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return MessageChangeList

    def get_sortable_by(self, request: HttpRequest) -> tuple[str, ...]:
        """Columns whose ordering stays cheap on a big table.

        Id (the primary key; ids follow creation) and status (an index) always;
        next attempt and priority once the list is narrowed to messages that
        may still run, a small share of a busy table (sorting every finished
        message by them would read the whole table).
        """
        columns: tuple[str, ...] = ("id", "status_display")
        active = request.GET.get("status__exact") in ("pending", "running")
        if active or request.GET.get("retrying") or request.GET.get("overdue"):
            columns += ("next_attempt", "priority")
        return columns

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        refuse_nul(request)
        return super().get_changelist_instance(request)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Only the filters the page offers and those its own links use.

        Django allows any lookup on the model's own columns: ``?key__regex=(``
        (an error on SQLite), ``?payload__contains=1`` or a lookup on the
        traceback were 500s or full scans. Another parameter is refused
        (400, "Filtering by ... not allowed").
        """
        return lookup in offered_lookups(self, request) or lookup in LINKED_LOOKUPS

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Message], search_term: str
    ) -> tuple[QuerySet[Message], bool]:
        parsed = search.parse(search_term)
        if (parsed.errors or parsed.refused) and not getattr(
            request, "_delayq_search_warned", False
        ):
            request._delayq_search_warned = True  # type: ignore[attr-defined]
            if parsed.refused:
                self.message_user(
                    request,
                    _("Search: nothing is shown: %s.") % parsed.refused,
                    level="ERROR",
                )
            for error in parsed.errors:
                self.message_user(request, _("Search: %s") % error, level="WARNING")
        return search.apply(queryset, parsed), False

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Refuse a selection holding something that is not a message id, with a message
        (Django's ``pk__in`` raised ValueError: a 500)."""
        bad = [
            value
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            if not is_message_id(value)
        ]
        if bad:
            self.message_user(
                request,
                _("Nothing was changed: %(value)s is not a message id.")
                % {"value": repr(bad[0][:40])},
                level="ERROR",
            )
            return None
        # Django 6.1 passes where the action bar is (action_location).
        return super().response_action(request, queryset, *args, **kwargs)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions are shown (action_location);
        # Django 5.2 has no such argument.
        if action_location is None:
            found = super().get_actions(request)
        else:
            found = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg]
        # Django's own lists every object on its confirmation page and
        # deletes running messages; ours is one DELETE that spares them.
        found.pop("delete_selected", None)
        return found

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and "action" in request.POST:
            chosen = actions.chosen_action(request)
            if chosen in actions.ACTION_NAMES and chosen not in self.get_actions(request):
                raise PermissionDenied
        context = {**(extra_context or {}), "delayq_object_tools": self._object_tools()}
        return super().changelist_view(request, context)

    def _object_tools(self) -> list[tuple[StrOrPromise, str]]:
        tools = []
        for label, url_name in OBJECT_TOOLS:
            tools.append((label, reverse(f"{self.admin_site.name}:{url_name}")))
        return tools

    # -- change page --------------------------------------------------------------------

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Message | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context["delayq_operations"] = self._operations_for(request, obj)
            context["delayq_holds_lease"] = operations.holds_lease(obj)
            context["delayq_kind_locked"] = obj.status == S.RUNNING
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _operations_for(self, request: HttpRequest, obj: Message) -> list[dict[str, Any]]:
        buttons = []
        for name in operations.applicable(obj):
            spec = actions.OPERATIONS.get(name)
            if spec is None or spec.permission != "change":
                continue  # delete: Django's own Delete link, guarded above
            if not self.has_change_permission(request, obj):
                continue
            url = reverse(
                f"{self.admin_site.name}:django_delayq_message_operation",
                args=[obj.pk, spec.name],
            )
            buttons.append({"spec": spec, "url": url, "immediate": spec.form_class is None})
        return buttons

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        # Django looks the object up before the permission: without this, a user
        # without it got 403 for an id that exists and a redirect for one that does not.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return super().history_view(request, object_id, extra_context)

    def operation_view(self, request: HttpRequest, object_id: str, name: str) -> HttpResponseBase:
        """One operation on one message: the change page's buttons post here."""
        if request.method != "POST":
            return HttpResponse(status=405, headers={"Allow": "POST"})
        spec = actions.OPERATIONS.get(name)
        if spec is None:
            return HttpResponse(status=404)
        permitted = getattr(self, f"has_{spec.permission}_permission")
        # The permission before the lookup: without it, every id gets the same 403.
        if not permitted(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(_("No message with id %s.") % object_id)
        if not permitted(request, obj):
            raise PermissionDenied
        queryset = self.get_queryset(request).filter(pk=obj.pk)
        response = actions.run_operation(self, request, queryset, spec)
        if response is not None:
            return response
        change_url = reverse(f"{self.admin_site.name}:django_delayq_message_change", args=[obj.pk])
        if spec.name == "delete" and not Message.objects.filter(pk=obj.pk).exists():
            change_url = reverse(f"{self.admin_site.name}:django_delayq_message_changelist")
        return HttpResponseRedirect(change_url)

    def get_urls(self) -> list[Any]:
        own = [
            path(
                "<path:object_id>/operation/<str:name>/",
                self.admin_site.admin_view(self.operation_view),
                name="django_delayq_message_operation",
            ),
        ]
        # Extra pages first: the admin's last pattern takes any path as an object id.
        extra = [make(self) for make in EXTRA_URLS]
        return [*extra, *own, *super().get_urls()]
