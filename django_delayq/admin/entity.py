"""``QueueAdminMixin``: the queue's filters and actions on your own model's changelist.

For a model with ``django_delayq.entity.QueueFields``::

    from django.contrib import admin
    from django_delayq.admin import QueueAdminMixin

    @admin.register(Invoice)
    class InvoiceAdmin(QueueAdminMixin, admin.ModelAdmin):
        list_display = ("number", "customer")

The changelist gains the queue columns, the status / retrying / overdue
filters of the message changelist, and its actions (run now, retry, cancel,
reschedule, and change priority if the model has a ``priority`` column),
with the same intermediate page: the filters are ``admin/filters.py``'s and
every action calls ``django_delayq.operations``, so a running row whose
worker holds the lease is refused exactly as a running message is. The queue
columns are read-only on the change page: they change through the actions
(or the worker), never by editing a field under a worker's feet. Saving the
change form writes only the fields the form changed: a worker that claimed
the row, recorded its outcome or wrote the row's own columns between the
page's load and its save keeps what it wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.utils.translation import gettext as _

from django_delayq.admin import actions
from django_delayq.admin.filters import OverdueFilter, RetryingFilter
from django_delayq.entity import QueueFields
from django_delayq.operations import has_priority
from django_delayq.store import operators, queue_fields

#: The actions the mixin adds, by name (``actions.OPERATIONS``).
QUEUE_ACTIONS = ("run_now", "retry_failed", "cancel", "reschedule", "reprioritise")

#: Columns a worker writes; shown read-only on the change page.
QUEUE_COLUMNS = (
    "status",
    "next_attempt_time",
    "attempt_count",
    "max_attempts",
    "last_attempt_time",
    "last_error",
    "last_traceback",
    "lock_token",
    "locked_by",
)


class QueueAdminMixin:
    """Mix into a ``ModelAdmin`` of a ``QueueFields`` model, before ``admin.ModelAdmin``."""

    #: Appended to ``list_display`` (those not already in it).
    queue_list_display: Sequence[str] = (
        "status",
        "next_attempt_time",
        "attempt_count",
        "last_attempt_time",
        "error_summary",
    )
    #: Appended to ``list_filter``.
    queue_list_filter: Sequence[Any] = ("status", RetryingFilter, OverdueFilter)

    def __init__(self, model: Any, admin_site: Any) -> None:
        if not (isinstance(model, type) and issubclass(model, QueueFields)):
            raise TypeError(
                f"QueueAdminMixin is for models that inherit QueueFields, not {model!r}"
            )
        super().__init__(model, admin_site)  # type: ignore[call-arg]
        wanted = [name for name in QUEUE_ACTIONS if name != "reprioritise" or has_priority(model)]
        own = list(getattr(self, "actions", None) or [])
        queue_actions = [getattr(actions, name) for name in wanted]
        self.actions = [*own, *(a for a in queue_actions if a not in own)]

    def get_list_display(self, request: HttpRequest) -> Sequence[Any]:
        shown = list(super().get_list_display(request))  # type: ignore[misc]
        return [*shown, *(c for c in self.queue_list_display if c not in shown)]

    def get_list_filter(self, request: HttpRequest) -> Sequence[Any]:
        filters = list(super().get_list_filter(request))  # type: ignore[misc]
        return [*filters, *(f for f in self.queue_list_filter if f not in filters)]

    def response_action(
        self, request: HttpRequest, queryset: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """Refuse a selection holding something that is not one of the model's keys,
        with a message (Django's ``pk__in`` raised ValidationError: a 500)."""
        pk = self.model._meta.pk  # type: ignore[attr-defined]
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                pk.to_python(value)
            except (ValidationError, ValueError):
                self.message_user(  # type: ignore[attr-defined]
                    request,
                    _("Nothing was changed: %(value)s is not a key of %(model)s.")
                    % {"value": repr(value[:40]), "model": self.model._meta.verbose_name},  # type: ignore[attr-defined]
                    level="ERROR",
                )
                return None
        return super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Sequence[str]:
        fields = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        return [*fields, *(c for c in QUEUE_COLUMNS if c not in fields)]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """A new row whole; an existing one only in the columns the form changed, and
        never its queue columns (the form's fields were loaded with the page)."""
        if not change:
            super().save_model(request, obj, form, change)  # type: ignore[misc]
            return
        own = {f.name for f in obj._meta.concrete_fields} - queue_fields.QUEUE_COLUMN_NAMES
        operators.edit(
            obj, [name for name in form.changed_data if name in own], using=obj._state.db
        )

    @admin.display(description="last error")
    def error_summary(self, obj: QueueFields) -> str:
        return obj.error_summary()
