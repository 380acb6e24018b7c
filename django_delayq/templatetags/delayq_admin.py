"""Template tags of the message admin (``{% load delayq_admin %}``)."""

from __future__ import annotations

import calendar
import datetime
import inspect
from typing import Any

from django import template
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.contrib.admin.views.main import ChangeList
from django.template.base import Parser, Token
from django.utils import formats, timezone
from django.utils.text import capfirst
from django.utils.translation import gettext as _

from django_delayq.models import Message

register = template.Library()


def date_hierarchy(cl: ChangeList) -> dict[str, Any]:
    """Django's date hierarchy, with choices from the table's date bounds.

    Django's own runs ``MIN``/``MAX`` and ``SELECT DISTINCT`` of the truncated
    dates over the filtered rows on every page load: several full scans of a
    large table. Here the bounds are the oldest and newest message, read off
    the primary key (``MessageQuerySet.created_bounds``), and every year, month or day
    between them is offered; one with no messages leads to an empty list.
    The same links, the same query parameters, the same template.
    """
    field_name = str(cl.date_hierarchy)
    year_field = f"{field_name}__year"
    month_field = f"{field_name}__month"
    day_field = f"{field_name}__day"
    bounds = Message.objects.using(cl.queryset.db).created_bounds()
    if bounds is None:
        return {"show": False}
    first, last = (timezone.localtime(b).date() for b in bounds)

    def link(filters: dict[str, Any]) -> str:
        return cl.get_query_string(filters, [f"{field_name}__"])

    try:
        year = int(cl.params[year_field]) if cl.params.get(year_field) else None
        month = int(cl.params[month_field]) if cl.params.get(month_field) else None
        day = int(cl.params[day_field]) if cl.params.get(day_field) else None
    except (TypeError, ValueError):
        return {"show": False}
    if year is None and month is None and day is None and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month

    if year and month and day:
        chosen = datetime.date(year, month, day)
        return {
            "show": True,
            "back": {
                "link": link({year_field: year, month_field: month}),
                "title": capfirst(formats.date_format(chosen, "YEAR_MONTH_FORMAT")),
            },
            "choices": [{"title": capfirst(formats.date_format(chosen, "MONTH_DAY_FORMAT"))}],
        }
    if year and month:
        days = [
            datetime.date(year, month, d) for d in range(1, calendar.monthrange(year, month)[1] + 1)
        ]
        return {
            "show": True,
            "back": {"link": link({year_field: year}), "title": str(year)},
            "choices": [
                {
                    "link": link({year_field: year, month_field: month, day_field: d.day}),
                    "title": capfirst(formats.date_format(d, "MONTH_DAY_FORMAT")),
                }
                for d in days
                if first <= d <= last
            ],
        }
    if year:
        months = [datetime.date(year, m, 1) for m in range(1, 13)]
        return {
            "show": True,
            "back": {"link": link({}), "title": _("All dates")},
            "choices": [
                {
                    "link": link({year_field: year, month_field: m.month}),
                    "title": capfirst(formats.date_format(m, "YEAR_MONTH_FORMAT")),
                }
                for m in months
                if (first.year, first.month) <= (m.year, m.month) <= (last.year, last.month)
            ],
        }
    return {
        "show": True,
        "back": None,
        "choices": [
            {"link": link({year_field: str(y)}), "title": str(y)}
            for y in range(first.year, last.year + 1)
        ],
    }


# Django 6 added the tag's name as InclusionAdminNode's first argument.
_NODE_TAKES_NAME = "name" in inspect.signature(InclusionAdminNode.__init__).parameters


@register.tag(name="delayq_date_hierarchy")
def date_hierarchy_tag(parser: Parser, token: Token) -> InclusionAdminNode:
    # (django-stubs describes an older signature of InclusionAdminNode.)
    leading = ("delayq_date_hierarchy",) if _NODE_TAKES_NAME else ()
    return InclusionAdminNode(  # type: ignore[call-arg,misc]
        *leading,
        parser,  # type: ignore[arg-type]
        token,  # type: ignore[arg-type]
        func=date_hierarchy,
        template_name="date_hierarchy.html",
        takes_context=False,
    )
