"""Queue columns on your own model: the row is the message.

When the thing to process is already a row (an invoice to send, a shipment
to book), a separate message pointing at it is a second source of truth.
Instead, inherit :class:`QueueFields`: the model gets the queue columns
(``status``, ``next_attempt_time``, ``attempt_count``, ``max_attempts``,
``last_attempt_time``, ``last_error``, ``last_traceback``, ``lock_token``,
``locked_by``) and the claim index, and a handler registered with
``@handler("invoices", model=Invoice)`` is run by ``run_delayq`` with the
same claim, lease, retry, time-limit and shutdown rules as messages
(``store/`` and ``worker/`` take the model as a parameter)::

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

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, models, router, transaction
from django.db.models import Q, QuerySet

from django_delayq import clock
from django_delayq.exceptions import DelayQError
from django_delayq.models import ACTIVE_STATUS_VALUES, FINISHED_STATUS_VALUES, QueueColumns
from django_delayq.status import FINISHED, Status
from django_delayq.store import queue_fields, row_steps
from django_delayq.store.queries import QueueQuerySet
from django_delayq.store.wakeup import notify


def queue_of(model: type[models.Model]) -> str | None:
    """The queue of the handler registered for ``model``, or None."""
    from django_delayq.registry import registry

    spec = registry.for_model(model)
    return None if spec is None else spec.queue


def _notify(model: type[models.Model], alias: str, when: datetime) -> None:
    """Wake idle workers (PostgreSQL NOTIFY, delivered when the transaction commits)."""
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
        after: Iterable[Any] | None = None,
        on_parent_failure: str = "cancel",
    ) -> int:
        """Queue the selected rows to run at ``run_at`` or after ``delay`` (now if neither).

        One ``UPDATE``. Rows a worker holds (running under a valid lease) are
        left alone, as the admin's operations do: the worker's outcome would
        overwrite the new schedule. Returns how many rows were queued.

        ``after``: the rows are workflow steps: each waits until every parent
        has finished (messages, what ``enqueue`` returned, ``(queue, key)``
        pairs, or rows of ``QueueFields`` models), then runs at ``run_at`` or
        after ``delay`` from then; ``on_parent_failure`` as for ``enqueue``.
        """
        from django_delayq.enqueuing import resolve_run_at

        when = resolve_run_at(run_at, delay, clock.now())
        alias = self.db
        if after is not None:
            return len(_make_steps(self, after, on_parent_failure, when, alias))
        with transaction.atomic(using=alias):
            again = row_steps.finished_rows(self)
            changed = queue_fields.schedule(self, when)
            if changed:
                _notify(self.model, alias, when)
                row_steps.queued_again(self.model, again, alias)
        return changed


def _make_steps(
    rows: QuerySet[Any], after: Iterable[Any], policy: str, when: datetime, alias: str
) -> list[Any]:
    """``schedule(after=...)``: the rows wait for their parents (``row_steps.make_steps``)."""
    from django_delayq.workflows import check_policy, parent_ids

    policy = check_policy(policy)
    with transaction.atomic(using=alias):
        parents = parent_ids(after, alias)
        if not parents:
            raise ValueError("after must name at least one parent")
        return row_steps.make_steps(rows, parents, policy, when, using=alias)


class QueueFields(QueueColumns):
    """The queue columns and the claim index, for a model whose rows are processed.

    Declare your own ``Meta`` as ``class Meta(QueueFields.Meta):`` to keep
    the claim index (its name is ``<app label>_<model>_dq_claim``; Django
    limits index names to 30 characters, so a long app or model name needs
    its own ``indexes`` entry built by :func:`claim_index`).
    """

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

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the row; on an existing row, every column but the queue columns.

        The queue columns are where the row stands in the queue, and only the
        store writes them: a row loaded before a worker claimed it (or
        recorded its outcome) still holds the old values, and saving them
        back would clear the claim's lock token (its outcome lost) or send a
        finished row back to running. Name queue columns in
        ``update_fields`` to write them anyway, or change them with
        :meth:`schedule`, the admin's actions or ``django_delayq.operations``.
        A new row, a forced insert and a copy to another database are saved
        whole; an existing row deleted meanwhile raises ``DatabaseError``
        rather than coming back with its old queue state.
        """
        if kwargs.get("update_fields") is None and not args and not kwargs.get("force_insert"):
            using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
            if not self._state.adding and using == self._state.db:
                kwargs["update_fields"] = queue_fields.plain_save_fields(self)
        super().save(*args, **kwargs)
        queue_fields.saved(self)

    def schedule(
        self,
        *,
        run_at: datetime | None = None,
        delay: timedelta | int | float | None = None,
        save: bool = True,
        using: str | None = None,
        after: Iterable[Any] | None = None,
        on_parent_failure: str = "cancel",
    ) -> None:
        """Queue this row to run at ``run_at`` or after ``delay`` (now if neither).

        Sets ``status`` to pending and ``next_attempt_time``, saves (a new row
        whole; an existing one only those columns) and, on PostgreSQL, wakes
        idle workers when the transaction commits. A row a worker holds
        (running under a valid lease) is refused with ``RowHeld``: its
        outcome would overwrite the new schedule. Inside the row's own
        handler, raise ``Retry`` instead.

        ``after``: the row is a workflow step: it waits until every parent has
        finished (messages, what ``enqueue`` returned, ``(queue, key)`` pairs,
        or other rows), then runs at ``run_at`` or after ``delay`` from then.
        ``on_parent_failure`` as for ``enqueue``. Not with ``save=False``.
        """
        from django_delayq.enqueuing import resolve_run_at

        when = resolve_run_at(run_at, delay, clock.now())
        model = type(self)
        if after is not None and not save:
            raise ValueError("schedule(after=...) saves the row: save=False cannot wait")
        if not save:
            queue_fields.mark_scheduled(self, when)
            return
        alias = using or router.db_for_write(model, instance=self)
        with transaction.atomic(using=alias):
            if after is not None:
                if self._state.adding:
                    self.save(using=alias)
                rows = model._base_manager.using(alias).filter(pk=self.pk)
                if not _make_steps(rows, after, on_parent_failure, when, alias):
                    raise RowHeld(
                        f"{model._meta.label} {self.pk} is running under a worker's lease"
                    )
                self.refresh_from_db(using=alias, fields=list(queue_fields.QUEUE_COLUMN_NAMES))
                return
            finished = not self._state.adding and getattr(self, "status", None) in FINISHED
            if not queue_fields.schedule_row(self, when, using=alias):
                raise RowHeld(
                    f"{model._meta.label} {self.pk} is running under a worker's lease "
                    "(or was deleted); raise Retry(delay=...) in its handler to run it "
                    "again later"
                )
            _notify(model, alias, when)
            if finished:
                row_steps.queued_again(model, [self.pk], alias)


def row_of(message: Any) -> models.Model | None:
    """The row a workflow parent stands for, or None (any other message, or a row gone).

    A ``QueueFields`` row in a workflow is a message of its own queue there,
    its stand-in: ``message.parents()`` gives it, and this reads the row.
    """
    from django_delayq.enqueuing import EnqueueResult

    if isinstance(message, EnqueueResult):
        message = message.message
    return row_steps.row_of(message)


class RowHeld(DelayQError):
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
    return issubclass(model, QueueColumns)


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
    "row_of",
]
