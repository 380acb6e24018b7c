"""Queue columns on your own model: the row is the message (seed 001).

When the thing to process is already a row (an invoice to send, a shipment
to book), a separate message pointing at it is a second source of truth.
Instead, inherit :class:`QueueFields`: the model gets the queue columns
(``status``, ``next_attempt_time``, ``attempt_count``, ``max_attempts``,
``last_attempt_time``, ``last_error``, ``last_traceback``, ``lock_token``,
``locked_by``) and the claim index, and a handler registered with
``@handler("invoices", model=Invoice)`` is run by ``run_delayq`` with the
same claim, lease, retry, time-limit and shutdown rules as messages
(``claim.py`` and ``worker.py`` take the model as a parameter)::

    from django_delayq import handler
    from django_delayq.entity import QueueFields

    class Invoice(QueueFields):
        number = models.CharField(max_length=20)

    @handler("invoices", model=Invoice, max_attempts=5)
    def send_invoice(invoice: Invoice) -> None: ...

    invoice = Invoice.objects.create(number="F-1")
    invoice.schedule()                       # due now; or run_at= / delay=
    Invoice.objects.filter(...).schedule(delay=60)

A row is queued while ``next_attempt_time`` is set (the seed's rule): new
rows, and the existing rows of a table that gains these columns, are
``pending`` with no due time and wait until something schedules them.
``QueueAdminMixin`` (``django_delayq.admin``) gives the model's own
changelist the queue's filters and actions.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.db import connections, models, router, transaction
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_delayq import clock
from django_delayq.models import (
    ACTIVE_STATUS_VALUES,
    FINISHED_STATUS_VALUES,
    Message,
    QueueQuerySet,
)

#: The statuses an entity row goes through: the same as a message's.
Status = Message.Status


def queue_of(model: type[models.Model]) -> str | None:
    """The queue of the handler registered for ``model``, or None."""
    from django_delayq.registry import registry

    spec = registry.for_model(model)
    return None if spec is None else spec.queue


def _notify(model: type[models.Model], alias: str, when: datetime) -> None:
    """Wake idle workers (PostgreSQL NOTIFY, delivered when the transaction commits)."""
    from django_delayq.producer import notify

    queue = queue_of(model)
    if queue is not None:
        notify(connections[alias], queue, when)


class EntityQuerySet(QueueQuerySet[Any]):
    """``QueueQuerySet`` plus the set-based way to queue rows."""

    def schedule(
        self,
        *,
        run_at: datetime | None = None,
        delay: timedelta | int | float | None = None,
    ) -> int:
        """Queue the selected rows to run at ``run_at`` or after ``delay`` (now if neither).

        One ``UPDATE``. Rows a worker holds (running under a valid lease) are
        left alone, as the admin's operations do: the worker's outcome would
        overwrite the new schedule. Returns how many rows were queued.
        """
        from django_delayq.producer import resolve_run_at

        now = clock.now()
        when = resolve_run_at(run_at, delay, now)
        alias = self.db
        held = Q(status=Status.RUNNING, next_attempt_time__gt=now)
        with transaction.atomic(using=alias):
            changed = (
                self.exclude(held)
                .order_by()
                .update(
                    status=Status.PENDING,
                    next_attempt_time=when,
                    lock_token=None,
                    locked_by="",
                )
            )
            if changed:
                _notify(self.model, alias, when)
        return changed


class QueueFields(models.Model):
    """The queue columns and the claim index, for a model whose rows are processed.

    Declare your own ``Meta`` as ``class Meta(QueueFields.Meta):`` to keep
    the claim index (its name is ``<app label>_<model>_dq_claim``; Django
    limits index names to 30 characters, so a long app or model name needs
    its own ``indexes`` entry built by :func:`claim_index`).
    """

    Status: ClassVar[type[Message.Status]] = Message.Status
    ACTIVE_STATUSES = (Status.PENDING, Status.RUNNING)
    FINISHED_STATUSES = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    status = models.CharField(
        _("queue status"), max_length=16, choices=Status.choices, default=Status.PENDING
    )
    next_attempt_time = models.DateTimeField(
        _("next attempt"),
        null=True,
        blank=True,
        help_text=_(
            "When the row is due; the lease expiry while running; empty while nothing is scheduled."
        ),
    )
    attempt_count = models.PositiveIntegerField(_("attempts"), default=0)
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Empty: the handler's or the setting's value.")
    )
    last_attempt_time = models.DateTimeField(_("last attempt"), null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_traceback = models.TextField(blank=True, default="")
    lock_token = models.UUIDField(null=True, blank=True, editable=False)
    locked_by = models.CharField(max_length=255, blank=True, default="", editable=False)

    objects = EntityQuerySet.as_manager()

    class Meta:
        abstract = True
        indexes = [
            # The claim and the idle worker's "next due": partial, so rows
            # that are done (or were never queued) cost nothing.
            models.Index(
                fields=["next_attempt_time"],
                name="%(app_label)s_%(class)s_dq_claim",
                condition=Q(status__in=list(ACTIVE_STATUS_VALUES)),
            ),
        ]

    # Read-only descriptions, so that the worker's logs, signals and metrics
    # describe a row as they describe a message. A model with its own field
    # of one of these names keeps its field.
    @property
    def queue(self) -> str:
        """The queue of the handler registered for this model."""
        return queue_of(type(self)) or type(self)._meta.label_lower

    @property
    def key(self) -> str:
        return str(self.pk)

    @property
    def kind(self) -> str:
        return ""

    @property
    def is_redelivery(self) -> bool:
        """True once the row has been started more than once."""
        return self.attempt_count > 1

    def error_summary(self) -> str:
        return self.last_error.splitlines()[0] if self.last_error else ""

    def schedule(
        self,
        *,
        run_at: datetime | None = None,
        delay: timedelta | int | float | None = None,
        save: bool = True,
        using: str | None = None,
    ) -> None:
        """Queue this row to run at ``run_at`` or after ``delay`` (now if neither).

        Sets ``status`` to pending and ``next_attempt_time``, saves (a new row
        whole; an existing one only those columns) and, on PostgreSQL, wakes
        idle workers when the transaction commits. A row a worker holds
        (running under a valid lease) is refused with ``RowHeld``: its
        outcome would overwrite the new schedule. Inside the row's own
        handler, raise ``Retry`` instead.
        """
        from django_delayq.producer import resolve_run_at

        now = clock.now()
        when = resolve_run_at(run_at, delay, now)
        changes = {
            "status": Status.PENDING,
            "next_attempt_time": when,
            "lock_token": None,
            "locked_by": "",
        }
        if not save:
            for name, value in changes.items():
                setattr(self, name, value)
            return
        model = type(self)
        alias = using or router.db_for_write(model, instance=self)
        with transaction.atomic(using=alias):
            if self._state.adding:
                for name, value in changes.items():
                    setattr(self, name, value)
                self.save(using=alias)
            else:
                held = Q(status=Status.RUNNING, next_attempt_time__gt=now)
                rows = model._base_manager.using(alias).filter(pk=self.pk).exclude(held)
                if not rows.update(**changes):
                    raise RowHeld(
                        f"{model._meta.label} {self.pk} is running under a worker's lease "
                        "(or was deleted); raise Retry(delay=...) in its handler to run it "
                        "again later"
                    )
                for name, value in changes.items():
                    setattr(self, name, value)
            _notify(model, alias, when)


class RowHeld(Exception):
    """``schedule()`` of a row that a worker holds (or that no longer exists)."""


def claim_index(name: str, *, priority: bool = False) -> models.Index:
    """The claim index under a name of your choice (for ``Meta.indexes``).

    ``priority=True`` for a model with a ``priority`` column: the claim then
    orders by it first, and this index serves that order.
    """
    return models.Index(
        fields=["-priority", "next_attempt_time"] if priority else ["next_attempt_time"],
        name=name,
        condition=Q(status__in=list(ACTIVE_STATUS_VALUES)),
    )


def is_queue_model(model: type[models.Model]) -> bool:
    """True for ``Message`` and the models that inherit :class:`QueueFields`."""
    return model is Message or issubclass(model, QueueFields)


__all__ = [
    "ACTIVE_STATUS_VALUES",
    "FINISHED_STATUS_VALUES",
    "EntityQuerySet",
    "QueueFields",
    "RowHeld",
    "Status",
    "claim_index",
    "is_queue_model",
    "queue_of",
]
