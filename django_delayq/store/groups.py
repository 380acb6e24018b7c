"""Ordered groups: the messages of a group run one at a time, in the order of their ids.

The claim itself enforces it (:func:`group_clear`, in its pick): a grouped
message is picked only when no earlier message of its group may still run
(or, where the queue blocks on failure, failed) and no other message of its
group is running under a live lease.

That condition alone would make every claim visit each message waiting
behind a blocked group: a group with 100,000 messages behind a failing one
would cost every claim of its queue 100,000 probes. So a message that
waits behind its group is *held*: pending with no due time (its due time
stays in scheduled_time), which keeps it out of every range the claim and
the next-due time read. hold_back holds new messages behind their group;
release_groups lets the next message of a group go once the one before it
is done (the worker after each outcome, the operations after theirs, and a
sweep of every group now and then, for what a crash left undone), and wakes
the idle workers of its queue (:func:`wake`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from django.db import connections
from django.db.models import (
    BooleanField,
    DateTimeField,
    Exists,
    Expression,
    ExpressionWrapper,
    F,
    Func,
    Min,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Value,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Greatest
from django.db.models.sql.subqueries import UpdateQuery

from django_delayq import clock
from django_delayq.flow import continuing_queues, failure_blocks
from django_delayq.models import Message
from django_delayq.status import ACTIVE, Status
from django_delayq.store.columns import (
    IN_BATCH,
    batches,
    db_alias,
    has_column,
    model_field,
    quote_names,
    rows_with_literals,
)
from django_delayq.store.dependencies import not_waiting
from django_delayq.store.features import features
from django_delayq.store.queries import held_condition
from django_delayq.store.sql import statement
from django_delayq.store.wakeup import notify


def _blockers(queues: Collection[str] | None) -> Q:
    """The statuses of an earlier message that keep a later one of its group waiting,
    for messages of ``queues`` (failed ones only where the queue blocks on failure).

    ``None``: of every queue, judged by the configuration (the queues that go
    on after a failure are the configured ones), so that the condition names
    no more queues than the settings do, however many the table holds.
    """
    if queues is None:
        continuing = continuing_queues()
        if not continuing:
            return Q(status__in=[*ACTIVE, Status.FAILED])
        return Q(status__in=ACTIVE) | (Q(status=Status.FAILED) & ~Q(queue__in=continuing))
    blocking = [q for q in queues if failure_blocks(q)]
    if len(blocking) == len(queues) and queues:
        return Q(status__in=[*ACTIVE, Status.FAILED])
    return Q(status__in=ACTIVE) | Q(status=Status.FAILED, queue__in=blocking)


def _of_its_group(model: type[Model]) -> QuerySet[Any]:
    # "group <> ''" is implied for a grouped row, but the probe must say it for
    # PostgreSQL to use the partial delayq_group_idx: without it, each probe
    # read the primary key's range below the row (every older message).
    return model._base_manager.exclude(group="").filter(
        queue=OuterRef("queue"), group=OuterRef("group")
    )


def group_clear(
    model: type[Model], queues: Collection[str], now: Expression | datetime, *, using: str
) -> Q:
    """Rows their group lets run: ungrouped, or nothing earlier of the group blocks them
    and nothing of it runs (``delayq_group_idx`` answers both, a range each).

    On PostgreSQL the grouped row's test is the function ``delayq_group_clear``
    (the same two probes, migration 0010), whose plan the server keeps: as
    subqueries they were planned with every claim, and that planning was most
    of an idle worker's claim.
    """
    if features(connections[using]).group_function:
        blocking = [q for q in queues if failure_blocks(q)]
        failed_blocks: Any = (
            Value(bool(blocking))
            if not blocking or len(blocking) == len(queues)
            else ExpressionWrapper(Q(queue__in=blocking), output_field=BooleanField())
        )
        at = now if hasattr(now, "resolve_expression") else Value(now, DateTimeField())
        clear = GroupClear(F("queue"), F("group"), F("pk"), at, failed_blocks)
        return Q(group="") | Q(clear)
    earlier = _of_its_group(model).filter(_blockers(queues), pk__lt=OuterRef("pk"))
    # The index's own status condition, said again: SQLite uses a partial index
    # only for a condition that contains its own ("running" alone is not seen
    # to be one of the three), and read the queue's every row per probe.
    running = _of_its_group(model).filter(held_condition(now), status__in=[*ACTIVE, Status.FAILED])
    return Q(group="") | (~Exists(earlier) & ~Exists(running))


def install_holder_function(connection: Any, *, remove: bool = False) -> None:
    """Create (or, ``remove``, drop) ``delayq_holder_gone`` where the database uses it."""
    from django_delayq.models import WorkerState

    can = features(connection)
    if not can.group_function:
        return
    qn = connection.ops.quote_name
    names = ("name", "stopped_at", "last_seen", "alive_until")
    fields = {f: qn(str(model_field(WorkerState, f).column)) for f in names}
    sql = statement("drop_holder_gone" if remove else "create_holder_gone", can).format(
        workers=qn(WorkerState._meta.db_table), **fields
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)


class GroupClear(Func):
    """``delayq_group_clear(queue, group, id, now, failed_blocks)`` (PostgreSQL)."""

    function = "delayq_group_clear"
    output_field = BooleanField()


def install_group_function(connection: Any, *, remove: bool = False) -> None:
    """Create (or, ``remove``, drop) ``delayq_group_clear`` where the database uses it."""
    can = features(connection)
    if not can.group_function:
        return
    names = quote_names(Message, connection, "queue", "group", "status", "id", "next_attempt_time")
    sql = statement("drop_group_clear" if remove else "create_group_clear", can).format(
        table=names["table"],
        queue=names["queue"],
        group=names["group"],
        status=names["status"],
        id=names["id"],
        due=names["next_attempt_time"],
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)


def hold_back(messages: Mapping[Any, Any], *, using: str) -> set[Any]:
    """Hold the new (or rewritten) grouped messages of ``messages`` (by id) that an
    earlier message of their group holds back; returns their ids.

    Run in the transaction that wrote them, after the write: it sees the
    messages the same call wrote before them in their group.
    """
    if not messages:
        return set()
    queues = {m.queue for m in messages.values()}
    earlier = _of_its_group(Message).filter(_blockers(queues), pk__lt=OuterRef("pk"))
    held: set[Any] = set()
    rows = Message._base_manager.using(using)
    for ids in batches(list(messages)):
        pending = rows.filter(pk__in=ids, status=Status.PENDING)
        # With its constants written in on SQLite: bound, they kept each probe
        # from delayq_group_idx, and enqueueing into a queue of groups read the
        # whole queue per message.
        found = [
            pk
            for (pk,) in rows_with_literals(
                pending.filter(Exists(earlier)).values_list("pk"), using
            )
        ]
        if found:
            rows.filter(pk__in=found).update(next_attempt_time=None)
            held.update(found)
    return held


def hold_back_loaded(
    connection: Any, queue: str, loaded_keys: str, written_at: datetime
) -> tuple[str, tuple[Any, ...]]:
    """:func:`hold_back` as one ``UPDATE`` for the Spark loader, with its parameters.

    The loader's executors run it with plain drivers, in the transaction of
    the insert it follows: it holds the messages of ``queue`` that the
    insert wrote (keys from the subquery ``loaded_keys``, rows whose
    ``updated_at`` is the load's ``written_at``: created or rewritten, not
    left alone) and that an earlier message of their group holds back. The
    condition is :func:`hold_back`'s, compiled by Django here, so the two
    cannot drift apart.
    """
    earlier = _of_its_group(Message).filter(_blockers([queue]), pk__lt=OuterRef("pk"))
    rows = (
        Message._base_manager.filter(
            queue=queue,
            key__in=RawSQL(loaded_keys, ()),
            status=Status.PENDING,
            updated_at=written_at,
        )
        .exclude(group="")
        .filter(Exists(earlier))
    )
    query = cast(UpdateQuery, rows.query.chain(UpdateQuery))
    query.add_update_values({"next_attempt_time": None})
    sql, params = query.get_compiler(connection=connection).as_sql()
    return sql, tuple(params)


def release_groups(
    groups: Collection[tuple[str, str]] | None = None, *, using: str | None = None
) -> int:
    """Let the next message of each group go, if the one before it is done.

    ``groups``: (queue, group) pairs; None: every group (the sweep). The
    next message is the group's first that may still run or block; if it is
    held, it becomes due at its scheduled time (or now, if that has passed).
    Returns how many messages were let go.

    No statement binds more than ``IN_BATCH`` groups or ids: the first
    messages of the groups are found per queue (or for every queue) by one
    aggregate, and changed by id in batches. The first message of every
    blocked group as one list of parameters failed for ever beyond 65,535
    groups on PostgreSQL with server-side binding (32,766 on SQLite), and the
    held messages a crash had left behind were never let go.
    """
    alias = db_alias(using)
    if groups is None:
        return _release_held(alias, None, None)
    by_queue: dict[str, set[str]] = {}
    for queue, group in groups:
        by_queue.setdefault(queue, set()).add(group)
    released = 0
    for queue, names in sorted(by_queue.items()):
        # More groups than a statement should name: the whole queue's groups
        # in one statement (letting go a group nobody named is the sweep's
        # work anyway, done early) rather than a statement per batch.
        chosen = sorted(names) if len(names) <= IN_BATCH else None
        released += _release_held(alias, queue, chosen)
    return released


def _release_held(alias: str, queue: str | None, groups: Sequence[str] | None) -> int:
    """Let go the held messages of ``groups`` of ``queue`` that no earlier message of
    their group holds back, and wake their queues' workers. ``groups`` None: every
    group of ``queue``; ``queue`` None: of every queue.

    A group's first message is the lowest id among those that may still run
    or block, and it is held if it is also the lowest held id: one aggregate
    over the groups' range of ``delayq_group_idx`` returns only the firsts
    that are held, with no join (a join of the held messages with the
    groups' firsts, or a probe per held message, was planned as a nested
    loop that went quadratic on a table the planner had no statistics for).
    They are then changed by id, ``IN_BATCH`` at a time (MariaDB/MySQL
    cannot update a table with a subquery on itself); the change repeats the
    held condition, so a message let go meanwhile is not changed twice.
    """
    rows = Message._base_manager.using(alias)
    grouped = rows.exclude(group="")
    if queue is not None:
        grouped = grouped.filter(queue=queue)
    if groups is not None:
        grouped = grouped.filter(group__in=list(groups))
    # A held message that waits for its parents (a workflow's step) is not
    # the group's to let go: store.dependencies releases it.
    held = Q(status=Status.PENDING, next_attempt_time__isnull=True) & not_waiting()
    firsts = (
        grouped.filter(_blockers(None if queue is None else [queue]))
        .order_by()
        .values("queue", "group")
        .annotate(head=Min("pk"), first_held=Min("pk", filter=held))
        .filter(head=F("first_held"))
        .values_list("head", "queue")
    )
    # On SQLite with its constants written in: bound, they kept it from the
    # partial delayq_group_idx, and each success of a grouped message read
    # every row of its queue to let the next one go.
    free = rows_with_literals(firsts, alias)
    if not free:
        return 0
    now = clock.sql_now()
    released = 0
    for chunk in batches([pk for pk, _ in free]):
        released += rows.filter(
            not_waiting(), pk__in=chunk, status=Status.PENDING, next_attempt_time__isnull=True
        ).update(next_attempt_time=Greatest(F("scheduled_time"), now), updated_at=now)
    if released:
        wake({q for _, q in free}, using=alias)
    return released


def wake(queues: Collection[str], *, using: str | None = None) -> None:
    """Tell idle workers of ``queues`` that messages are due now (PostgreSQL's NOTIFY,
    sent when the caller's transaction commits): nothing else would, before their
    next poll."""
    when = clock.now()
    connection = connections[db_alias(using)]
    for queue in sorted(queues):
        notify(connection, queue, when)


def groups_of(rows: QuerySet[Any]) -> set[tuple[str, str]]:
    """The (queue, group) pairs of the grouped rows of ``rows`` (before they change)."""
    if not has_column(rows.model, "group"):
        return set()
    found = rows.exclude(group="").order_by().values_list("queue", "group").distinct()
    return set(found)
