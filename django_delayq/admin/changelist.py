"""The message changelist's plumbing, for a table of millions of rows.

``MessagePaginator`` keeps the counts cheap (capped, or the database's
estimate), ``MessageChangeList`` reads the page without the payload and the
traceback, and ``SafeChangeList`` and ``refuse_nul`` answer a bad parameter
with Django's "incorrect lookup" (?e=1) instead of a 500; the workers' list
(``workers.py``) uses them too.
"""

from __future__ import annotations

import re
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import formats
from django.utils.functional import cached_property
from django.utils.translation import gettext as _

from django_delayq.models import Message
from django_delayq.store import queries


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


_ID = re.compile(r"[0-9]{1,19}")


def is_message_id(value: str) -> bool:
    """A whole number a message's id can be (ASCII digits, within 64 bits)."""
    return bool(_ID.fullmatch(value)) and 0 < int(value) <= 2**63 - 1
