"""The queue table.

Every status change goes through ``claim.py`` (claim, ack, fail, retry,
release) or the set-based verbs of ``MessageQuerySet``; nothing else writes
the queue columns, so the indexes below are the ones every query relies on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self, TypeVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_delayq import clock

QUEUE_MAX_LENGTH = 100
KEY_MAX_LENGTH = 255
KIND_MAX_LENGTH = 100
PRIORITY_MIN = -32768
PRIORITY_MAX = 32767
#: Largest ``max_attempts`` accepted: by ``enqueue``, ``@handler``, schedules,
#: the ``MAX_ATTEMPTS`` settings and the admin. The column is a 32-bit integer
#: on PostgreSQL (up to 2,147,483,647) and each snooze (``Retry``) raises a
#: message's ``max_attempts`` by one, so a message can snooze more than two
#: billion times before the column would overflow.
MAX_ATTEMPTS_LIMIT = 1_000_000


# The status values of every table with the queue columns: ``Message`` and
# the models that inherit ``django_delayq.entity.QueueFields``.
ACTIVE_STATUS_VALUES = ("pending", "running")
FINISHED_STATUS_VALUES = ("succeeded", "failed", "cancelled")

_Row = TypeVar("_Row", bound=models.Model)


def active_condition() -> Q:
    """Rows that may still run: waiting, scheduled or leased."""
    return Q(status__in=ACTIVE_STATUS_VALUES)


def due_condition(now: datetime | models.Expression | None = None) -> Q:
    """Rows a worker may claim now.

    A ``running`` row whose lease (``next_attempt_time``) has passed is due
    again: that is how a crashed worker's message comes back.
    """
    return active_condition() & Q(next_attempt_time__lte=clock.now() if now is None else now)


def retrying_condition() -> Q:
    """Pending again after at least one failed attempt."""
    return Q(status="pending", attempt_count__gt=0)


def returned_columns(model: type[models.Model], quote_name: Any) -> str:
    """Every column of ``model``, for ``RETURNING``, in :func:`from_returned_row` order."""
    table = quote_name(model._meta.db_table)
    return ", ".join(f"{table}.{quote_name(f.column)}" for f in model._meta.concrete_fields)


def from_returned_rows(model: type[_Row], connection: Any, rows: Any) -> list[_Row]:
    """Instances from raw rows of :func:`returned_columns`, converted as a query's would be.

    The statements that write and return rows in one round trip (enqueue
    with ``on_conflict="update"``, the claim) bypass the ORM's SELECT, so
    the backend's and the fields' converters (JSON, time zones) run here,
    looked up once per call as the ORM's compiler does.
    """
    fields = model._meta.concrete_fields
    names = [f.attname for f in fields]
    converters = []
    for i, field in enumerate(fields):
        col = field.get_col(model._meta.db_table)
        found = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if found:
            converters.append((i, col, found))
    out = []
    for row in rows:
        values = list(row[: len(fields)])
        for i, col, found in converters:
            value = values[i]
            for converter in found:
                value = converter(value, col, connection)
            values[i] = value
        out.append(model.from_db(connection.alias, names, values))
    return out


class QueueQuerySet(models.QuerySet[_Row]):
    """The queue's filters, for ``Message`` and for any model with ``QueueFields``.

    Written as conditions (above) so that code holding another queryset of
    such a model (the admin's, a custom manager's) filters the same way.
    """

    def active(self) -> Self:
        """Rows that may still run: waiting, scheduled or leased."""
        return self.filter(active_condition())

    def due(self, now: datetime | models.Expression | None = None) -> Self:
        """Rows a worker may claim now (see :func:`due_condition`)."""
        return self.filter(due_condition(now))

    def finished(self) -> Self:
        return self.filter(status__in=FINISHED_STATUS_VALUES)

    def retrying(self) -> Self:
        """Pending again after at least one failed attempt."""
        return self.filter(retrying_condition())


class MessageQuerySet(QueueQuerySet["Message"]):
    def in_queues(self, queues: list[str] | tuple[str, ...] | None) -> MessageQuerySet:
        return self if not queues else self.filter(queue__in=list(queues))


class Message(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    ACTIVE_STATUSES = (Status.PENDING, Status.RUNNING)
    FINISHED_STATUSES = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=QUEUE_MAX_LENGTH)
    key = models.CharField(max_length=KEY_MAX_LENGTH)
    kind = models.CharField(
        max_length=KIND_MAX_LENGTH,
        blank=True,
        default="",
        help_text=_("Type of the payload; selects the handler and validates decoding."),
    )
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    priority = models.SmallIntegerField(default=0, help_text=_("Higher runs first."))
    next_attempt_time = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_(
            "When the message is due; the lease expiry while running; "
            "empty once nothing more will happen."
        ),
    )
    scheduled_time = models.DateTimeField(
        help_text=_("When the message was first scheduled; a later start is a redelivery or retry.")
    )
    attempt_count = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Empty: the handler's or the setting's value.")
    )
    last_attempt_time = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_traceback = models.TextField(blank=True, default="")
    error_fingerprint = models.CharField(
        max_length=64,
        blank=True,
        default="",
        editable=False,
        help_text=_("Digest of the normalised last error (see fingerprint.py); groups failures."),
    )
    lock_token = models.UUIDField(null=True, blank=True, editable=False)
    locked_by = models.CharField(max_length=255, blank=True, default="", editable=False)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = MessageQuerySet.as_manager()

    class Meta:
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        constraints = [
            models.UniqueConstraint(fields=["queue", "key"], name="delayq_message_queue_key"),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN) & Q(priority__lte=PRIORITY_MAX),
                name="delayq_message_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(status__in=["pending", "running", "succeeded", "failed", "cancelled"]),
                name="delayq_message_status_valid",
            ),
        ]
        indexes = [
            # The claim: due rows of some queues, highest priority first.
            # Partial, so finished rows (the bulk of a busy table) cost nothing.
            models.Index(
                fields=["queue", "-priority", "next_attempt_time"],
                name="delayq_claim_idx",
                condition=Q(status__in=["pending", "running"]),
            ),
            # The idle worker's "when is the next message due?" and lag. Status
            # and attempts make it covering for the dashboard's active counts.
            models.Index(
                fields=["queue", "next_attempt_time", "status", "attempt_count"],
                name="delayq_due_idx",
                condition=Q(status__in=["pending", "running"]),
            ),
            # Pruning and the admin's finished views. Partial: a pending or
            # running row is not in it, so an enqueue and a claim maintain one
            # index less, and the planner can never pick it (over the primary
            # key) for an acknowledgement's ``status = 'running'`` filter.
            models.Index(
                fields=["status", "finished_at"],
                name="delayq_finished_idx",
                condition=Q(status__in=["succeeded", "failed", "cancelled"]),
            ),
            # Failure triage: a group's messages, and (covering) the grouping
            # itself. Partial, so rows that never failed (nearly all) are not in it.
            models.Index(
                fields=[
                    "error_fingerprint",
                    "status",
                    "queue",
                    "attempt_count",
                    "last_attempt_time",
                    "id",
                ],
                name="delayq_fingerprint_idx",
                condition=~Q(error_fingerprint=""),
            ),
            # Failed messages per queue (dashboard), without visiting the table.
            models.Index(fields=["queue"], name="delayq_failed_idx", condition=Q(status="failed")),
            # The admin's kind filter: its choices (search.distinct_values) and
            # its rows. Partial, so projects that never set a kind pay nothing.
            models.Index(fields=["kind"], name="delayq_kind_idx", condition=~Q(kind="")),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.key} ({self.status})"

    @property
    def is_redelivery(self) -> bool:
        """True once the message has been started more than once."""
        return self.attempt_count > 1

    def error_summary(self) -> str:
        return self.last_error.splitlines()[0] if self.last_error else ""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.attname) for f in self._meta.concrete_fields}


class QueueState(models.Model):
    """Operator controls of one queue; a queue without a row is active.

    Workers read the paused set at most once per poll interval
    (``queues.paused_queues``) and skip paused queues when claiming.
    """

    queue = models.CharField(max_length=QUEUE_MAX_LENGTH, unique=True)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.CharField(max_length=255, blank=True, default="")
    updated_at = models.DateTimeField(default=clock.now)

    class Meta:
        verbose_name = _("queue state")
        verbose_name_plural = _("queue states")

    def __str__(self) -> str:
        return f"{self.queue} ({'paused' if self.paused else 'active'})"


class WorkerState(models.Model):
    """One ``run_delayq`` process and its heartbeat.

    Each worker writes ``last_seen`` (with the database's clock) every few
    seconds. A worker whose heartbeat is older than ``DELAYQ["WORKER_DEAD_AFTER"]``
    is dead: live workers hand its messages back at once instead of waiting
    for their leases, and ``delayq_status`` and the admin show it as dead.
    """

    name = models.CharField(max_length=255, unique=True, help_text=_("Stored in locked_by."))
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(
        null=True, blank=True, help_text=_("Set by a clean shutdown; empty while running.")
    )

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.name
