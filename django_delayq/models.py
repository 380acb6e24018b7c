"""The queue tables: their columns, constraints and indexes, and nothing else.

Every read and write of the queue columns goes through ``store/`` (the
QuerySet verbs of ``store.queries``, the state changes of its modules by
concern: ``store.claim``, ``store.settle``, ``store.leases``,
``store.groups``, ..., new messages through ``store.write``), so the
indexes below are reviewed against one set of statements. ``QueueColumns`` is the one definition of
the columns a queued row has: ``Message`` and the models that inherit
``entity.QueueFields`` both build on it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_delayq import clock
from django_delayq.flow import GROUP_MAX_LENGTH
from django_delayq.status import ACTIVE, FINISHED, Status
from django_delayq.store.queries import MessageQuerySet

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
#: ``enqueue(..., on_parent_failure=)``: what a parent that ends failed, cancelled
#: or discarded does to the messages waiting for it.
PARENT_FAILURE_POLICIES = ("cancel", "wait", "run")
#: Where the queue of a row's stand-in begins (``store/row_steps.py``): a
#: ``QueueFields`` row in a workflow is a message of ``delayq.row:<app>.<model>``;
#: no handler may consume such a queue.
STAND_IN_PREFIX = "delayq.row:"
#: A worker's name (``run_delayq --name``): ``WorkerState.name`` and ``locked_by``.
WORKER_NAME_MAX_LENGTH = 255

# The status values of every table with the queue columns, for index conditions.
ACTIVE_STATUS_VALUES = ACTIVE
FINISHED_STATUS_VALUES = FINISHED


class QueueColumns(models.Model):
    """The columns of a queued row: where it stands, when it runs next, who holds it.

    ``status`` and ``next_attempt_time`` decide what a worker may claim
    (``next_attempt_time`` is the lease expiry while running); ``lock_token``
    is the claim's fence: every outcome is a compare-and-set on it.
    """

    Status: ClassVar[type[Status]] = Status
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
    locked_by = models.CharField(
        max_length=WORKER_NAME_MAX_LENGTH, blank=True, default="", editable=False
    )

    class Meta:
        abstract = True

    @property
    def is_redelivery(self) -> bool:
        """True once the row has been started more than once."""
        return self.attempt_count > 1

    def error_summary(self) -> str:
        return self.last_error.splitlines()[0] if self.last_error else ""


class _PayloadEncoder(json.JSONEncoder):
    def encode(self, o: Any) -> str:
        from django_delayq.payload import dumps

        return dumps(o)


class PayloadField(models.JSONField):
    """A ``JSONField`` that writes ``None`` as JSON ``null``, not SQL NULL.

    A payload is any JSON value, ``null`` included (``enqueue("q")``), and
    the column is NOT NULL. Django's ``JSONField`` writes ``None`` as SQL
    NULL (JSON ``null`` only as ``Value(None, JSONField())``), so a save,
    an ``update()`` or a ``bulk_update()`` of a ``None`` payload (the
    admin's edit, the triage's edit and retry, MariaDB's re-enqueue) was
    refused by the database. Reading is unchanged.

    Migrations see a plain ``JSONField`` (``deconstruct``): the column is
    the same, and a migration changing only the field's class would buy
    nothing (on SQLite, Django would rebuild the whole table for it).
    """

    def get_db_prep_save(self, value: Any, connection: Any) -> Any:
        if value is None:
            return self.get_db_prep_value(None, connection)
        return super().get_db_prep_save(value, connection)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        # Written as enqueue writes a payload (payload.dumps): a float keeps
        # its type on PostgreSQL (jsonb would read 1e+16 back as an int).
        if not prepared:
            value = self.get_prep_value(value)
        return connection.ops.adapt_json_value(value, _PayloadEncoder)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


class Message(QueueColumns):
    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=QUEUE_MAX_LENGTH)
    key = models.CharField(max_length=KEY_MAX_LENGTH)
    kind = models.CharField(
        max_length=KIND_MAX_LENGTH,
        blank=True,
        default="",
        help_text=_("Type of the payload; selects the handler and validates decoding."),
    )
    payload = PayloadField(default=dict, blank=True)
    group = models.CharField(
        max_length=GROUP_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
        db_column="message_group",
        help_text=_(
            "Messages of one group in one queue run one at a time, in the order they "
            "were enqueued; empty: no group."
        ),
    )
    priority = models.SmallIntegerField(default=0, help_text=_("Higher runs first."))
    scheduled_time = models.DateTimeField(
        help_text=_("When the message was first scheduled; a later start is a redelivery or retry.")
    )
    error_fingerprint = models.CharField(
        max_length=64,
        blank=True,
        default="",
        editable=False,
        help_text=_("Digest of the normalised last error (see fingerprint.py); groups failures."),
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True)
    superseded_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=_(
            "Set while a newer version (enqueue with on_conflict='update') waits for the "
            "running attempt to end; it is then due at its scheduled time."
        ),
    )

    # Workflows (store/dependencies.py): what a handler returned, and this
    # message's part in a graph of messages.
    result = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("What the handler returned (JSON), stored when it succeeded."),
    )
    on_parent_failure = models.CharField(
        max_length=8,
        blank=True,
        default="",
        db_default="",
        editable=False,
        choices=[(p, p) for p in PARENT_FAILURE_POLICIES],
        help_text=_(
            "Empty: no parents. What a parent's failure does: cancel this message, "
            "keep it waiting, or run it anyway."
        ),
    )
    # How many of its parents have not ended yet, and how many ended failed
    # or cancelled: a parent's end changes its edge and these, in one
    # statement, and the change that brings the first to 0 releases it.
    parents_waiting = models.PositiveIntegerField(default=0, db_default=0, editable=False)
    parents_failed = models.PositiveIntegerField(default=0, db_default=0, editable=False)
    has_children = models.BooleanField(
        default=False,
        db_default=False,
        editable=False,
        help_text=_("Messages wait for this one (enqueued with after=)."),
    )
    # Somebody waits for its end (wait(), await_result()): on PostgreSQL a
    # trigger then sends a NOTIFY when it ends (store/ended.py).
    waited = models.BooleanField(default=False, db_default=False, editable=False)

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
                condition=Q(status__in=[*ACTIVE, *FINISHED]),
                name="delayq_message_status_valid",
            ),
        ]
        indexes = [
            # The claim: due rows of some queues, highest priority first.
            # Partial, so finished rows (the bulk of a busy table) cost nothing.
            models.Index(
                fields=["queue", "-priority", "next_attempt_time"],
                name="delayq_claim_idx",
                condition=Q(status__in=list(ACTIVE)),
            ),
            # The idle worker's "when is the next message due?" and lag. Status
            # and attempts make it covering for the dashboard's active counts.
            models.Index(
                fields=["queue", "next_attempt_time", "status", "attempt_count"],
                name="delayq_due_idx",
                condition=Q(status__in=list(ACTIVE)),
            ),
            # Pruning and the admin's finished views. Partial: a pending or
            # running row is not in it, so an enqueue and a claim maintain one
            # index less, and the planner can never pick it (over the primary
            # key) for an acknowledgement's ``status = 'running'`` filter. The
            # queue makes it covering for the dashboard's counts per queue of
            # the last hour (read from the table, they were the bulk of its
            # time beside ten million kept messages).
            models.Index(
                fields=["status", "finished_at", "queue"],
                name="delayq_finished_idx",
                condition=Q(status__in=list(FINISHED)),
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
            # Failure triage of a recent window (the admin's failures page: the
            # last day by default), covering. Partial: failed and retrying rows
            # only, so a success costs nothing and a failure one entry.
            models.Index(
                fields=[
                    "last_attempt_time",
                    "error_fingerprint",
                    "queue",
                    "status",
                    "attempt_count",
                    "id",
                ],
                name="delayq_failing_idx",
                condition=~Q(error_fingerprint="") & Q(status__in=["failed", "pending"]),
            ),
            # Ordered groups: whether an earlier message of a group still holds
            # a later one back, and whether one of the group runs (the claim's
            # probes, one range each). Partial: only grouped messages that may
            # still run or block are in it, so other messages cost nothing.
            models.Index(
                fields=["queue", "group", "status", "id"],
                name="delayq_group_idx",
                condition=~Q(group="") & Q(status__in=[*ACTIVE, "failed"]),
            ),
            # Failed messages per queue (dashboard), without visiting the table.
            models.Index(fields=["queue"], name="delayq_failed_idx", condition=Q(status="failed")),
            # Held messages per queue: workflow steps waiting for their parents
            # and ordered-group members waiting for their turn (pending, no due
            # time). The dashboard, delayq_status, the metrics and the admin's
            # filter count them; without it each count read the whole table
            # (1 s at 10 million kept messages). Claims and acknowledgements
            # never write a row into it.
            models.Index(
                fields=["queue"],
                name="delayq_held_idx",
                condition=Q(status="pending", next_attempt_time__isnull=True),
            ),
            # The admin's kind filter: its choices (search.distinct_values) and
            # its rows. Partial, so projects that never set a kind pay nothing.
            models.Index(fields=["kind"], name="delayq_kind_idx", condition=~Q(kind="")),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.key} ({self.status})"

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.attname) for f in self._meta.concrete_fields}

    def parents(self) -> list[Message]:
        """The messages this one was enqueued ``after=``, in that order (read now)."""
        from django_delayq.store.dependencies import parents_of

        return parents_of(self)

    @property
    def parent_results(self) -> list[Any]:
        """The parents' results (``Message.result``), in the order of ``after=``.

        Read once per instance: a handler reading it twice costs one query.
        A parent that did not succeed (``on_parent_failure="run"``), or whose
        row is gone (archived), gives None.
        """
        cached = self.__dict__.get("_parent_results")
        if cached is None:
            from django_delayq.store.dependencies import parents_by_place

            cached = self.__dict__["_parent_results"] = [
                parent.result if parent is not None and parent.status == Status.SUCCEEDED else None
                for parent in parents_by_place(self)
            ]
        return list(cached)

    @property
    def waiting_for_parents(self) -> bool:
        """Pending, with no due time, until its parents have finished (read now)."""
        from django_delayq.store.dependencies import waiting

        return bool(self.on_parent_failure) and waiting(self)


class Dependency(models.Model):
    """One edge of a workflow: ``child`` runs only once ``parent`` has finished.

    ``parent_ended`` is empty while the parent may still run, then the
    status it ended with: a child whose edges are all ended is released
    (or cancelled, by its ``on_parent_failure``) by ``store.dependencies``,
    once, under the child's row lock. Neither key is a database constraint
    nor cascades in Django: the Spark archive deletes finished rows with
    plain statements, and deleting messages must stay one statement per
    batch (pruning), so the deletes that can meet edges remove them
    themselves (``store.dependencies.forget``).
    """

    child = models.ForeignKey(
        Message, on_delete=models.DO_NOTHING, related_name="parent_edges", db_constraint=False
    )
    parent = models.ForeignKey(
        Message,
        on_delete=models.DO_NOTHING,
        related_name="child_edges",
        db_constraint=False,
        db_index=False,
    )
    #: The parent's place in ``after=`` (``Message.parent_results``' order).
    position = models.PositiveIntegerField(default=0)
    parent_ended = models.CharField(max_length=16, blank=True, default="")
    #: The parent's failure cancelled the child (a retry of the parent reopens it).
    cancelled_child = models.BooleanField(default=False)

    class Meta:
        verbose_name = _("dependency")
        verbose_name_plural = _("dependencies")
        constraints = [
            models.UniqueConstraint(fields=["parent", "child"], name="delayq_dependency_edge")
        ]
        indexes = [
            # The children still waiting for a parent (the child's unended
            # edges, and the sweep's). Partial: ended edges cost nothing.
            models.Index(
                fields=["child"], name="delayq_dependency_open_idx", condition=Q(parent_ended="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.parent_id} -> {self.child_id}"


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


class FlowState(models.Model):
    """One global limit's row: what a claim of its scope locks, so that the workers'
    claims of a limited queue (or kind) take turns and never overshoot together.

    ``kind`` is empty for a queue-wide limit.
    """

    queue = models.CharField(max_length=QUEUE_MAX_LENGTH)
    kind = models.CharField(max_length=KIND_MAX_LENGTH, blank=True, default="")
    # Written by every limited claim: the write is what takes the row lock
    # (on SQLite too, where it takes the database's write lock first, so a
    # claim never has to upgrade a read lock).
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("flow state")
        verbose_name_plural = _("flow states")
        constraints = [
            models.UniqueConstraint(fields=["queue", "kind"], name="delayq_flowstate_scope")
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.kind}" if self.kind else self.queue


class FlowStart(models.Model):
    """A start counted by a rate limit: the log of its sliding window.

    Rows older than two periods (and a minute) are deleted by a later claim
    of the same scope, at most once per period in each worker process.
    """

    flow = models.ForeignKey(FlowState, on_delete=models.CASCADE, db_index=False)
    started_at = models.DateTimeField()

    class Meta:
        verbose_name = _("flow start")
        verbose_name_plural = _("flow starts")
        indexes = [models.Index(fields=["flow", "started_at"], name="delayq_flowstart_idx")]

    def __str__(self) -> str:
        return f"{self.flow_id} at {self.started_at.isoformat()}"


class WorkerState(models.Model):
    """One ``run_delayq`` process and its heartbeat.

    Each worker writes ``last_seen`` (with the database's clock) every few
    seconds. A worker whose heartbeat is older than ``DELAYQ["WORKER_DEAD_AFTER"]``
    is dead: live workers hand its messages back at once instead of waiting
    for their leases, and ``delayq_status`` and the admin show it as dead.
    """

    name = models.CharField(
        max_length=WORKER_NAME_MAX_LENGTH, unique=True, help_text=_("Stored in locked_by.")
    )
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)
    # Its heartbeat's promise: the worker extends its leases at least this
    # often, so while this has not passed, a lease of its that lapsed was
    # not lost (another transaction held the row): no claim takes it.
    alive_until = models.DateTimeField(
        null=True, blank=True, help_text=_("Moved forward by every heartbeat.")
    )
    stopped_at = models.DateTimeField(
        null=True, blank=True, help_text=_("Set by a clean shutdown; empty while running.")
    )
    # Which process holds the name now (a random id per run): two live
    # workers under one name would each take the other's messages for its
    # own lost ones and hand them back (liveness.register).
    instance = models.UUIDField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("Which run of the worker holds the name."),
    )

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.name
