"""Reading the queue tables: the QuerySet verbs every part of the app filters with.

``Message.objects`` and the manager of every ``QueueFields`` model are built
from these classes, so the admin, the worker, the dashboard, cron and the
commands all ask for "due", "held by", "failing" the same way, and each verb
says which index answers it. Conditions are also exposed as ``Q`` objects,
for code that holds another queryset of such a model (the admin's own).

This module does not import the models (they import it for their
managers): it works on ``self.model`` and the status values of
``django_delayq.status``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any, Self, TypeVar, cast

from django.db import connections, models
from django.db.models import Count, Exists, Expression, F, Func, Max, Min, OuterRef, Q, Value
from django.db.models.expressions import Col
from django.db.models.functions import TruncMinute

from django_delayq import clock
from django_delayq.routers import queue_alias
from django_delayq.status import ACTIVE, FINISHED, Status
from django_delayq.store.features import features
from django_delayq.store.sql import statement

_Row = TypeVar("_Row", bound=models.Model)

Now = datetime | Expression


def active_condition() -> Q:
    """Rows that may still run: waiting, scheduled or leased."""
    return Q(status__in=ACTIVE)


def due_condition(now: Now | None = None) -> Q:
    """Rows a worker may claim now.

    A ``running`` row whose lease (``next_attempt_time``) has passed is due
    again: that is how a crashed worker's message comes back.
    """
    return active_condition() & Q(next_attempt_time__lte=clock.sql_now() if now is None else now)


def claimable_condition(
    now: Now,
    dead_after: timedelta,
    *,
    liveness: bool = True,
    function: bool = False,
    pids: bool = False,
) -> Q:
    """Rows a worker's claim may take now: due, but never from a live worker.

    A ``running`` row whose lease passed is due again only if the worker
    holding it is gone: its last heartbeat's promise (``alive_until``) has
    passed (for a worker of an older version, which makes none: no heartbeat
    for ``dead_after``, ``WORKER_DEAD_AFTER``), it stopped, or it is unknown.
    A live worker's lease can lapse without the worker losing the message:
    another transaction held the row's lock (a producer's upsert of its key,
    an operator's bulk change, the Spark loader), so its keeper could not
    extend it, and the instant that transaction ended another worker's claim
    would have run the message a second time, beside the first. Its keeper
    extends the lease at its next round; a worker that really died breaks its
    promise within a few heartbeats, so its messages still come back when
    their leases run out.

    ``liveness=False``: the lease alone (a ``QueueFields`` table on another
    database than the workers'). ``function``: the test is the server-side
    function ``delayq_holder_gone`` (PostgreSQL, migration 0011), whose plan
    the server keeps. ``pids``: a worker of this host whose process lives is
    live, whatever its heartbeat (SQLite: every worker is on the host that has
    the file, and no heartbeat can be written while a transaction holds the
    database's write lock, so a long one, a producer's or an atomic
    handler's, would break every worker's promise at once; a worker that
    stops cleanly says so, ``delayq_process_alive``, ``server.py``).
    """
    due = due_condition(now)
    if not liveness:
        return due
    since = clock.sql_now_plus(-dead_after) if not isinstance(now, datetime) else now - dead_after
    if function:
        at = now if not isinstance(now, datetime) else Value(now, models.DateTimeField())
        gone = Q(HolderGone(F("locked_by"), at, Value(dead_after, models.DurationField())))
    else:
        from django_delayq.models import WorkerState

        promise = Q(alive_until__gt=now) | Q(alive_until__isnull=True, last_seen__gt=since)
        if pids:
            promise |= Q(ProcessAlive(F("name")))
        live = WorkerState._base_manager.filter(
            promise, name=OuterRef("locked_by"), stopped_at__isnull=True
        )
        gone = Q(~Exists(live))
    return due & (Q(status=Status.PENDING) | gone)


class HolderGone(Func):
    """``delayq_holder_gone(locked_by, now, dead_after)`` (PostgreSQL)."""

    function = "delayq_holder_gone"
    output_field = models.BooleanField()


class ProcessAlive(Func):
    """``delayq_process_alive(name)``: a process of this host has that worker name's pid
    (SQLite only, where ``server.register_functions`` defines it)."""

    function = "delayq_process_alive"
    output_field = models.BooleanField()


def held_condition(now: Now | None = None) -> Q:
    """Rows a worker holds: running under a lease that has not expired (database clock)."""
    return Q(status=Status.RUNNING, next_attempt_time__gt=clock.sql_now() if now is None else now)


def retrying_condition() -> Q:
    """Pending again after at least one failed attempt."""
    return Q(status=Status.PENDING, attempt_count__gt=0)


#: The figures of ``MessageQuerySet.finished_by_queue``.
FINISHED_WINDOWS = (
    "succeeded_short",
    "failed_short",
    "succeeded_long",
    "failed_long",
    "cancelled_long",
)


def failing_condition() -> Q:
    """Failed, or pending again after a recorded error (what triage shows)."""
    return ~Q(error_fingerprint="") & (
        Q(status=Status.FAILED) | Q(status=Status.PENDING, attempt_count__gt=0)
    )


def categories(now: Now | None = None) -> dict[str, Q]:
    """Disjoint conditions covering every row, by what an operator may do with it.

    Judged on the database's clock (``now`` defaults to it), the clock every
    lease is written with: a web server whose clock runs ahead must not take
    a live lease for an expired one.
    """
    now = clock.sql_now() if now is None else now
    not_later = Q(next_attempt_time__lte=now) | Q(next_attempt_time__isnull=True)
    return {
        "pending_due": Q(status=Status.PENDING, next_attempt_time__lte=now),
        # A pending row without a due time would never be claimed: "run now" fixes it.
        "pending_later": Q(status=Status.PENDING)
        & (Q(next_attempt_time__gt=now) | Q(next_attempt_time__isnull=True)),
        "running": held_condition(now),
        "lease_expired": Q(status=Status.RUNNING) & not_later,
        "succeeded": Q(status=Status.SUCCEEDED),
        "failed": Q(status=Status.FAILED),
        "cancelled": Q(status=Status.CANCELLED),
    }


class QueueQuerySet(models.QuerySet[_Row]):
    """The queue's verbs, for ``Message`` and for any model with ``QueueFields``."""

    def active(self) -> Self:
        """Rows that may still run (the partial claim indexes hold only these)."""
        return self.filter(active_condition())

    def due(self, now: Now | None = None) -> Self:
        """Rows a worker may claim now (see :func:`due_condition`)."""
        return self.filter(due_condition(now))

    def held(self, now: Now | None = None) -> Self:
        """Rows a worker holds under a lease that runs (see :func:`held_condition`)."""
        return self.filter(held_condition(now))

    def finished(self) -> Self:
        return self.filter(status__in=FINISHED)

    def retrying(self) -> Self:
        """Pending again after at least one failed attempt."""
        return self.filter(retrying_condition())

    def held_by(self, workers: Collection[str]) -> Self:
        """Running rows claimed by these workers (``locked_by``).

        The claim indexes' status condition is said too: no index holds
        ``locked_by``, and without it the live workers' look for a dead one's
        messages, every heartbeat until the dead one is forgotten a day later,
        read the whole table, finished messages included. With it, they read
        the partial indexes of the messages still to run.
        """
        return self.filter(status__in=ACTIVE).filter(
            status=Status.RUNNING, locked_by__in=list(workers)
        )

    def categorised(self, now: Now | None = None) -> dict[str, int]:
        """How many rows fall in each of :func:`categories`, in one statement."""
        conditions = categories(now)
        counts = self.order_by().aggregate(
            **{name: Count("pk", filter=q) for name, q in conditions.items()}
        )
        return {name: counts[name] or 0 for name in conditions}

    def expired(self, cutoff: datetime) -> Self:
        """Finished rows that finished before ``cutoff`` (what pruning deletes)."""
        return self.finished().filter(finished_at__lt=cutoff)


class MessageQuerySet(QueueQuerySet[Any]):
    """``Message``'s verbs: per queue, by key, and the figures of the dashboard."""

    def in_queues(self, queues: Collection[str] | None) -> Self:
        return self if not queues else self.filter(queue__in=list(queues))

    def failing(self) -> Self:
        """Failed, or pending again after an error (``delayq_fingerprint_idx``)."""
        return self.filter(failing_condition())

    def ticks(self, queues: Collection[str], prefix: str) -> Self:
        """Active rows of ``queues`` whose key starts with ``prefix`` (cron ticks; due index)."""
        return self.active().filter(queue__in=sorted(set(queues)), key__startswith=prefix)

    def untouched(self) -> Self:
        """Pending and never attempted: what a cron installer may delete or cancel."""
        return self.filter(status=Status.PENDING, attempt_count=0)

    # -- per-queue figures ----------------------------------------------------
    #
    # Counting a column of the index at hand (``status``, ``queue``), not
    # ``id``, lets PostgreSQL answer from the index alone (an index-only scan).

    def depth_by_queue(self, now: datetime) -> dict[str, dict[str, Any]]:
        """Per queue: pending/running counts, split by due time, and the oldest due time.

        Filtering on the active statuses first lets the database read only the
        rows of the partial indexes, however many finished rows the table holds.
        """
        due = Q(next_attempt_time__lte=now)
        future = Q(next_attempt_time__gt=now)
        rows = (
            self.active()
            .values("queue")
            .order_by()
            .annotate(
                pending=Count("status", filter=Q(status=Status.PENDING)),
                running=Count("status", filter=Q(status=Status.RUNNING)),
                due=Count("status", filter=due),
                scheduled=Count(
                    "status", filter=Q(status=Status.PENDING, attempt_count=0) & future
                ),
                retrying=Count(
                    "status", filter=Q(status=Status.PENDING, attempt_count__gt=0) & future
                ),
                leased=Count("status", filter=Q(status=Status.RUNNING) & future),
                oldest_due=Min("next_attempt_time", filter=due),
            )
        )
        return {row.pop("queue"): row for row in rows}

    def waiting_by_queue(self) -> dict[str, int]:
        """Workflow steps waiting for their parents, per queue: those of the held rows
        (pending, no due time: ``delayq_held_idx``) that their parents have not let
        go (``dependencies.waiting_rows``; not a released step its ordered group
        holds)."""
        from django_delayq.store.dependencies import waiting_rows

        rows = self.filter(waiting_rows()).values("queue").order_by().annotate(n=Count("queue"))
        return {row["queue"]: row["n"] for row in rows}

    def failed_by_queue(self, cap: int | None = None) -> dict[str, int]:
        """Failed rows still kept, per queue (``delayq_failed_idx``); with ``cap``, each
        queue's counted only up to ``cap + 1``.

        Why the cap: an exact count reads every failed row kept, and a week of
        retention at a few percent of failures is hundreds of thousands of them
        (a quarter of a second of the dashboard's time at ten million kept
        messages). Capped, each queue is one probe of the index for its name
        (the next name after the last: a skip over the index) and a read of at
        most ``cap + 1`` entries.
        """
        failed = self.filter(status=Status.FAILED)
        if cap is None:
            rows = failed.values("queue").order_by().annotate(n=Count("queue"))
            return {row["queue"]: row["n"] for row in rows}
        names = failed.order_by("queue").values_list("queue", flat=True)
        counts = {}
        name = names.first()
        while name is not None:
            counts[name] = failed.filter(queue=name).order_by()[: cap + 1].count()
            name = names.filter(queue__gt=name).first()
        return counts

    def finished_by_queue(self, since: datetime, recent: datetime) -> dict[str, dict[str, Any]]:
        """Per queue: rows finished since ``since``, and since ``recent``, from
        ``delayq_finished_idx`` alone (it holds the queue).

        Two ranges of the index: succeeded and failed, then cancelled.
        ``status IN`` all three finished statuses is the index's own condition,
        so PostgreSQL would drop it and read the whole index for the
        ``finished_at`` range; one condition per status (a bitmap OR of three
        ranges) cannot be answered from the index alone, and read a page of
        the table per row.
        """
        short = Q(finished_at__gte=recent)
        figures: dict[str, dict[str, Any]] = {}
        for statuses, counts in (
            (
                (Status.SUCCEEDED, Status.FAILED),
                {
                    "succeeded_short": Count("status", filter=Q(status=Status.SUCCEEDED) & short),
                    "failed_short": Count("status", filter=Q(status=Status.FAILED) & short),
                    "succeeded_long": Count("status", filter=Q(status=Status.SUCCEEDED)),
                    "failed_long": Count("status", filter=Q(status=Status.FAILED)),
                },
            ),
            ((Status.CANCELLED,), {"cancelled_long": Count("status")}),
        ):
            rows = (
                self.filter(status__in=statuses, finished_at__gte=since)
                .values("queue")
                .order_by()
                .annotate(**counts)
            )
            for row in rows:
                figures.setdefault(row.pop("queue"), dict.fromkeys(FINISHED_WINDOWS, 0)).update(row)
        return figures

    def finished_per_minute(self, since: datetime) -> dict[tuple[datetime, str], int]:
        """Succeeded and failed rows per minute (UTC) and status since ``since``."""
        rows = (
            self.filter(status__in=(Status.SUCCEEDED, Status.FAILED), finished_at__gte=since)
            .annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
            .values("minute", "status")
            .order_by()
            .annotate(n=Count("status"))
        )
        return {(minute(row["minute"]), row["status"]): row["n"] for row in rows}

    def failure_groups(self, since: datetime | None = None) -> list[dict[str, Any]]:
        """Failing rows grouped by (fingerprint, queue), from a covering index alone:
        ``delayq_fingerprint_idx`` for all of them, ``delayq_failing_idx`` for
        those whose last attempt was ``since`` or later."""
        rows = self.failing()
        if since is not None:
            rows = rows.filter(last_attempt_time__gte=since)
        return list(
            rows.values("error_fingerprint", "queue")
            .order_by()
            .annotate(
                failed=Count("id", filter=Q(status=Status.FAILED)),
                retrying=Count("id", filter=Q(status=Status.PENDING)),
                first_seen=Min("last_attempt_time"),
                last_seen=Max("last_attempt_time"),
                sample_id=Max("id"),
            )
        )

    # -- ordered groups ---------------------------------------------------------

    def waiting_for_group(self) -> Self:
        """Messages held behind an earlier message of their group: pending, with no
        due time (it stays in ``scheduled_time``), and a group.

        ``delayq_group_idx`` answers per queue: its range of the queue's grouped
        pending rows (the held ones, and the first of each group), each checked
        for its due time. The cost follows the held messages, not the table.
        """
        return self.filter(status=Status.PENDING, next_attempt_time__isnull=True).exclude(group="")

    def blocked_group_heads(self, continuing: Collection[str] = ()) -> Self:
        """The first message of each *blocked* group: one that is failing.

        A group's first message is its lowest id among the pending, running and
        failed ones (failed only where failures block: every queue but those of
        ``continuing``, ``GROUP_AFTER_FAILURE: "continue"``). Its group is blocked
        while it waits for a retry after an error (pending, attempted, with an
        error fingerprint) or has failed (where that blocks).

        ``delayq_group_idx`` answers: the grouped pending and failed rows of the
        queue, and for each failing one a probe of its group's range for an
        earlier message that would come first. The cost follows the failing
        grouped messages, not the table.
        """
        failed = Q(status=Status.FAILED)
        # The probe names the index's own condition (a grouped row of one of its
        # statuses), so that PostgreSQL may use the partial index for it.
        earlier = self.model._base_manager.filter(
            ~Q(group=""),
            status__in=[*ACTIVE, Status.FAILED],
            queue=OuterRef("queue"),
            group=OuterRef("group"),
            pk__lt=OuterRef("pk"),
        )
        if continuing:
            failed &= ~Q(queue__in=sorted(continuing))
            earlier = earlier.exclude(status=Status.FAILED, queue__in=sorted(continuing))
        retrying = Q(status=Status.PENDING, attempt_count__gt=0) & ~Q(error_fingerprint="")
        return self.exclude(group="").filter(retrying | failed).filter(~Exists(earlier))

    def created_bounds(self) -> tuple[datetime, datetime] | None:
        """``created_at`` of the oldest and the newest row, read off the primary key.

        Ids grow with creation time, so the first and last rows by id bound the
        dates without an index on ``created_at`` (whose ``MIN``/``MAX`` would read
        the whole table).
        """
        rows = self.values_list("created_at", flat=True)
        first = rows.order_by("pk").first()
        last = rows.order_by("-pk").first()
        if first is None or last is None:
            return None
        return min(first, last), max(first, last)


# -- cheap figures for big tables ---------------------------------------------------

# Columns that lead an index, with that index's condition: queue (the
# (queue, key) unique constraint) and kind (delayq_kind_idx, partial: without
# the empty kind, which distinct_values() never returns).
DISTINCT_COLUMNS = {"queue": "1 = 1", "kind": "NOT ({col} = '')"}


def _message_model() -> Any:
    from django.apps import apps

    return apps.get_model("django_delayq", "Message")


def distinct_values(column: str, *, limit: int = 200, using: str | None = None) -> list[str]:
    """Up to ``limit`` distinct values of ``queue`` or ``kind``, in order, without a full scan.

    The empty kind is left out: it is not in the kind index, and the admin's
    kind filter offers it anyway.
    """
    if column not in DISTINCT_COLUMNS:
        raise ValueError(f"column must be one of {tuple(DISTINCT_COLUMNS)}, got {column!r}")
    message = _message_model()
    alias = queue_alias(using, read=True)
    connection = connections[alias]
    can = features(connection)
    if not can.loose_index_scan:
        # MySQL/MariaDB plan this DISTINCT as a loose index scan themselves.
        rows = message.objects.using(alias).exclude(**{column: ""}).order_by(column)
        return list(rows.values_list(column, flat=True).distinct()[:limit])
    col = connection.ops.quote_name(column)
    sql = statement("distinct_values", can).format(
        col=col,
        table=connection.ops.quote_name(message._meta.db_table),
        where=DISTINCT_COLUMNS[column].format(col=col),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


def estimated_count(using: str | None = None) -> int | None:
    """The database's own estimate of the message table's rows.

    PostgreSQL's ``pg_class.reltuples`` or InnoDB's ``table_rows``: reading
    it costs nothing, while an exact ``COUNT(*)`` reads the whole table.
    None on SQLite, and while there is no estimate yet.
    """
    message = _message_model()
    connection = connections[queue_alias(using, read=True)]
    can = features(connection)
    if can.row_estimate is None:
        return None
    table = message._meta.db_table
    if can.row_estimate == "pg_class":
        table = connection.ops.quote_name(table)
    with connection.cursor() as cursor:
        cursor.execute(statement("row_estimate", can), [table])
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:
        return None
    return int(row[0])


def _field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    return cast("models.Field[Any, Any]", model._meta.get_field(name))


def _column(model: type[models.Model], name: str) -> str:
    return cast(str, _field(model, name).column)


_next_due_statements: dict[tuple[type[models.Model], str, tuple[str, ...] | None, bool], Any] = {}


def next_due(
    model: type[models.Model],
    queues: Collection[str] | None,
    *,
    using: str,
    since: datetime | None = None,
) -> datetime | None:
    """The earliest due time of ``model``'s active rows (of ``queues``; None: every row),
    at or after ``since`` (a worker's floor: ``worker/floors.py``).

    An idle worker reads it after most wake-ups, so its statement is built
    once per model, database and queues: building the aggregate with the
    ORM cost about a millisecond of CPU, more than the query's round trip,
    and on the claimer's thread that delayed the start of the handler a
    claim had just handed over (the handler waits for the interpreter lock).
    """
    key = (model, using, None if queues is None else tuple(sorted(set(queues))), since is not None)
    compiled = _next_due_statements.get(key)
    connection = connections[using]
    if compiled is None:
        quote = connection.ops.quote_name
        field = _field(model, "next_attempt_time")
        names = key[2]
        sql = statement("next_due", features(connection)).format(
            due=quote(_column(model, "next_attempt_time")),
            table=quote(model._meta.db_table),
            status=quote(_column(model, "status")),
            queues=""
            if names is None
            else f" AND {quote(_column(model, 'queue'))} IN ({', '.join(['%s'] * len(names))})",
        )
        if key[3]:
            sql += f" AND {quote(_column(model, 'next_attempt_time'))} >= %s"
        column = Col(model._meta.db_table, field)
        converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        compiled = _next_due_statements[key] = (sql, list(names or ()), column, converters)
    sql, params, column, converters = compiled
    if since is not None:
        params = [*params, since]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    value = None if row is None else row[0]
    if value is None:
        return None
    for convert in converters:
        value = convert(value, column, connection)
    return value  # type: ignore[no-any-return]


def minute(moment: datetime) -> datetime:
    """The UTC minute ``moment`` falls in."""
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


__all__ = [
    "MessageQuerySet",
    "QueueQuerySet",
    "active_condition",
    "categories",
    "distinct_values",
    "due_condition",
    "estimated_count",
    "failing_condition",
    "held_condition",
    "minute",
    "next_due",
    "retrying_condition",
]
