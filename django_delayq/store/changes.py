"""Every state change of a queued row, each a named function.

A worker's changes (claim, ack, fail, snooze, release, extend) are
compare-and-set statements on ``(id, lock_token)`` with ``status =
'running'``: a worker whose lease expired, and whose row was claimed again
by someone else, can no longer change it. An operator's changes (run now,
retry, cancel, reschedule, reprioritise, delete) are set-based updates of a
queryset whose condition the caller chose (``operations.py`` decides who
is eligible). Cron, pruning, dead workers and the Tasks backend's payload
writes are here too: no other module writes the queue columns.

Every function takes the table as ``model`` (or a queryset of it):
``Message``, or a model with ``entity.QueueFields``, whose rows are the
messages. Such a model has the columns of ``models.QueueColumns`` but none
of the message's bookkeeping (``updated_at``, ``finished_at``,
``error_fingerprint``, ``queue``, ``priority``) unless it declares them:
each change names every column a message gets, and :func:`fit` keeps
those the table has.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any, cast

from django.db import OperationalError, connections, transaction
from django.db.models import (
    BooleanField,
    Case,
    DateTimeField,
    Exists,
    Expression,
    ExpressionWrapper,
    F,
    Field,
    Func,
    Min,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Greatest
from django.db.models.sql.subqueries import UpdateQuery

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.exceptions import DelayQError
from django_delayq.fingerprint import fingerprint
from django_delayq.flow import continuing_queues, failure_blocks
from django_delayq.models import Message, QueueColumns
from django_delayq.routers import model_alias, queue_alias
from django_delayq.status import ACTIVE, FINISHED, Status
from django_delayq.store.features import features
from django_delayq.store.queries import claimable_condition, held_condition
from django_delayq.store.rows import returned_columns, rows_from
from django_delayq.store.sql import statement

# Matches delayq_claim_idx, so PostgreSQL reads the first rows off the index
# instead of sorting every due row (adding "id" here forces that sort).
CLAIM_ORDER = ("-priority", "next_attempt_time")

# The most values of a list that can grow without bound (ids, groups) one
# statement binds: every database limits a statement's parameters (65,535 on
# PostgreSQL with server-side binding, 32,766 on SQLite since 3.32 and 999
# before, MariaDB's packet size), so longer lists go in batches of this many.
IN_BATCH = 500


def _db(using: str | None, model: type[Model] = Message) -> str:
    return model_alias(model, using)


@cache
def _columns(model: type[Model]) -> frozenset[str]:
    return frozenset(f.name for f in model._meta.concrete_fields)


def fit(model: type[Model], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` without the columns ``model`` does not have."""
    columns = _columns(model)
    return {name: value for name, value in changes.items() if name in columns}


def has_column(model: type[Model], name: str) -> bool:
    return name in _columns(model)


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def _quoted(model: type[Model], connection: Any, *names: str) -> dict[str, str]:
    """The quoted table and column names of ``model`` for this backend (kept)."""
    key = (model, type(connection), names)
    found = _quoted_names.get(key)
    if found is None:
        qn = connection.ops.quote_name
        found = {name: qn(str(_field(model, name).column)) for name in names}
        found["table"] = qn(model._meta.db_table)
        _quoted_names[key] = found
    return found


_quoted_names: dict[tuple[Any, ...], dict[str, str]] = {}


def batches(values: Sequence[Any], size: int = IN_BATCH) -> Iterable[list[Any]]:
    """``values`` in consecutive lists of at most ``size`` (see ``IN_BATCH``)."""
    for start in range(0, len(values), size):
        yield list(values[start : start + size])


# -- claim ------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A batch of rows claimed together; they share one lock token."""

    token: uuid.UUID
    # Messages, or rows of the ``QueueFields`` model that was claimed.
    messages: list[Any]


def claim_order(model: type[Model]) -> tuple[str, ...]:
    """Highest priority first where the table has one, then by due time."""
    return CLAIM_ORDER if has_column(model, "priority") else ("next_attempt_time",)


def _lease_expression(
    leases: Mapping[tuple[str, str | None], timedelta], default: timedelta
) -> Expression:
    """The database's ``now() + lease``, where the lease depends on queue and kind."""
    whens = []
    # Kind-specific handlers must win over their queue's catch-all.
    for (queue, kind), lease in sorted(leases.items(), key=lambda item: item[0][1] is None):
        if lease == default:
            continue
        condition = Q(queue=queue) if kind is None else Q(queue=queue, kind=kind)
        whens.append(When(condition, then=clock.sql_now_plus(lease)))
    default_value = clock.sql_now_plus(default)
    if not whens:
        return default_value
    return Case(*whens, default=default_value, output_field=DateTimeField())


@dataclass(frozen=True)
class _ClaimKey:
    """Everything a claim statement depends on but its lock token."""

    model: type[Model]
    alias: str
    queues: tuple[str, ...] | None  # None: the model is the queue
    limit: int
    worker: str
    lease: timedelta
    leases: frozenset[tuple[tuple[str, str | None], timedelta]]
    # Only these kinds (True) or all but these (False); None: every kind.
    kinds: tuple[frozenset[str], bool] | None = None
    # WORKER_DEAD_AFTER: a running row is taken only from a worker gone this long.
    dead_after: timedelta = timedelta(seconds=30)


def claim(
    queues: Collection[str],
    limit: int,
    *,
    worker: str,
    lease: timedelta,
    leases: Mapping[tuple[str, str | None], timedelta] | None = None,
    using: str | None = None,
    model: type[Model] = Message,
    kinds: tuple[Collection[str], bool] | None = None,
) -> Claim:
    """Claim up to ``limit`` due rows of ``queues``, highest priority first.

    Due means pending with ``next_attempt_time <= now``, or running with an
    expired lease (the redelivery of a crashed worker's message). Claimed
    rows become ``running`` with a fresh token, one more attempt, and a lease
    of ``now + lease``. For a ``QueueFields`` model, ``queues`` and
    ``leases`` are ignored (the model is the queue) and every row gets ``lease``.
    ``kinds``: ``(kinds, True)`` claims only messages of those kinds,
    ``(kinds, False)`` all but those (a limited kind's claims are separate).
    """
    alias = _db(using, model)
    token = uuid.uuid4()
    lanes: tuple[str, ...] | None = tuple(queues)
    if not has_column(model, "queue"):
        lanes, leases = None, None
    elif not lanes:
        return Claim(token, [])  # no queue given: nothing to claim (not "every queue")
    key = _ClaimKey(
        model,
        alias,
        lanes,
        limit,
        worker[:255],
        lease,
        frozenset((leases or {}).items()),
        None if kinds is None else (frozenset(kinds[0]), kinds[1]),
        to_timedelta(get_config()["WORKER_DEAD_AFTER"]),
    )
    if features(connections[alias]).limit_in_subquery:
        messages = _claim_in_one_statement(key, token)
        # RETURNING has no order: run them highest priority first, then oldest.
        if has_column(model, "priority"):
            messages.sort(key=lambda m: (-m.priority, m.pk))
        else:
            messages.sort(key=lambda m: m.pk)
        return Claim(token, messages)
    # MariaDB/MySQL: no UPDATE ... RETURNING, and no LIMIT in an IN
    # subquery: lock the rows we pick (skipping those other workers are
    # picking, so claimers never wait on each other), mark them, read them.
    rows = model._base_manager.using(alias)
    connection = connections[alias]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(*_pick(key))
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return Claim(token, [])
        rows.filter(pk__in=ids).update(**_claim_changes(key), lock_token=token)
    messages = list(rows.filter(lock_token=token, status="running").order_by(*claim_order(model)))
    return Claim(token, messages)


def _pick(key: _ClaimKey) -> tuple[str, tuple[Any, ...]]:
    """The locking pick of the first ``limit`` due rows (their keys), compiled.

    Over several queues, each queue's first rows are picked from its own
    range of ``delayq_claim_idx`` and the first ``limit`` of those taken:
    one pick of ``queue IN (...)`` cannot read that index in claim order,
    so it read every due row of the queues and sorted them (2 s at 100,000
    due rows on PostgreSQL, where a queue of its own took 5 ms). A queue's
    rows beyond the ``limit`` taken stay locked until the claim's statement
    (or transaction) ends: another claim skips them meanwhile, as it skips
    rows being claimed. Called inside a transaction (Django writes ``FOR
    UPDATE`` only there).
    """
    connection = connections[key.alias]
    if key.queues is None or len(key.queues) < 2:
        picked = _picked(key).select_for_update(skip_locked=True)
        one_sql, one_params = picked.query.get_compiler(key.alias).as_sql()
        return one_sql, tuple(one_params)
    # The lanes' columns under names of their own: a name of the table's
    # ("id") would also resolve to the UPDATE's row where a lane lacked it.
    order = claim_order(key.model)
    columns = {"delayq_pk": F("pk")}
    columns.update((f"delayq_by{n}", F(name.lstrip("-"))) for n, name in enumerate(order))
    lanes: list[str] = []
    params: list[Any] = []
    for number, queue in enumerate(key.queues):
        lane = replace(key, queues=(queue,))
        picked = _picked(lane, columns).select_for_update(skip_locked=True)
        lane_sql, lane_params = picked.query.get_compiler(key.alias).as_sql()
        lanes.append(
            statement("claim_lane", features(connection)).format(picked=lane_sql, number=number)
        )
        params.extend(lane_params)
    sql = statement("claim_lanes", features(connection)).format(
        lanes=" UNION ALL ".join(lanes),
        pk="delayq_pk",
        order=", ".join(
            f"delayq_by{n}" + (" DESC" if name.startswith("-") else "")
            for n, name in enumerate(order)
        ),
        limit=int(key.limit),
    )
    return sql, tuple(params)


def _picked(key: _ClaimKey, columns: Mapping[str, F] | None = None) -> QuerySet[Any]:
    """The first ``limit`` due rows of the queues, in claim order (their keys, or
    ``columns``: names and the fields they read).

    A grouped message is picked only if its group lets it run
    (:func:`group_clear`); the condition is evaluated for grouped rows
    alone, so other messages cost nothing more.
    """
    now = clock.sql_now()
    connection = connections[key.alias]
    condition = claimable_condition(
        now,
        key.dead_after,
        # The workers' heartbeats are in the queue's database: a model's table
        # elsewhere is taken back on its leases alone.
        liveness=key.alias == queue_alias(),
        function=features(connection).group_function,
        pids=connection.vendor == "sqlite",
    )
    due = key.model._base_manager.using(key.alias).filter(condition)
    if key.queues is not None:
        due = due.filter(queue__in=list(key.queues))
    if key.kinds is not None:
        kinds, only = key.kinds
        due = due.filter(kind__in=list(kinds)) if only else due.exclude(kind__in=list(kinds))
    if has_column(key.model, "group"):
        due = due.filter(group_clear(key.model, key.queues or (), now, using=key.alias))
    due = due.order_by(*claim_order(key.model))
    return (due.values(**columns) if columns else due.values("pk"))[: key.limit]


def _claim_changes(key: _ClaimKey) -> dict[str, Any]:
    """What a claim writes, but the lock token.

    A row whose newer version was waiting (its previous attempt's lease ran
    out) starts that version's first attempt.
    """
    now = clock.sql_now()
    changes: dict[str, Any] = {
        "status": Status.RUNNING,
        "locked_by": key.worker,
        "attempt_count": F("attempt_count") + 1,
        "last_attempt_time": now,
        "next_attempt_time": _lease_expression(dict(key.leases), key.lease),
        "updated_at": now,
    }
    if has_column(key.model, "superseded_at"):
        changes["attempt_count"] = Case(
            When(superseded_at__isnull=False, then=Value(1)),
            default=F("attempt_count") + 1,
            output_field=_field(key.model, "attempt_count"),
        )
        changes["superseded_at"] = None
    return fit(key.model, changes)


# What an attempt's end leaves when a newer version of its message waits
# (enqueue with on_conflict="update" while it ran): that version, due at its
# scheduled time, from its first attempt. Whatever the attempt's outcome,
# the message is not finished: it has a version still to run.
_NEWER_VERSION: dict[str, Any] = {
    "status": Status.PENDING,
    "next_attempt_time": F("scheduled_time"),
    "attempt_count": 0,
    "max_attempts": F("max_attempts"),
    "finished_at": None,
    "lock_token": None,
    "superseded_at": None,
}


def _ending(model: type[Model], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` that end an attempt, made to leave a waiting newer version due."""
    out = dict(changes)
    if "status" not in changes or not has_column(model, "superseded_at"):
        return out
    waiting = Q(superseded_at__isnull=False)
    for name, newer in _NEWER_VERSION.items():
        field = _field(model, name)
        out[name] = Case(
            When(waiting, then=_as_expression(newer, field)),
            default=_as_expression(changes.get(name, F(name)), field),
            output_field=field,
        )
    # superseded_at last: MySQL evaluates SET assignments in order, and every
    # CASE above must see the column as it was.
    out["superseded_at"] = out.pop("superseded_at")
    return out


def _lease_until(model: type[Model], expiry: Expression) -> Expression:
    """A lease ending at ``expiry``, written so that a waiting newer version keeps its time.

    ``next_attempt_time`` is when a row may next be claimed. While a newer
    version waits (``superseded_at``), that is the later of the lease and the
    new version's due time (``scheduled_time``, as enqueue's update wrote it):
    an extension must not pull it back to the lease alone, or a worker killed
    after it would have the new version run as soon as the lease lapsed.
    """
    if not has_column(model, "superseded_at"):
        return expiry
    return Case(
        When(
            Q(superseded_at__isnull=False, scheduled_time__gt=expiry),
            then=F("scheduled_time"),
        ),
        default=expiry,
        output_field=_field(model, "next_attempt_time"),
    )


def _as_expression(value: Any, field: Field[Any, Any]) -> Any:
    return value if hasattr(value, "resolve_expression") else Value(value, output_field=field)


_claim_statements: dict[_ClaimKey, tuple[str, tuple[Any, ...], tuple[Any, ...]]] = {}


def forget_compiled_claims() -> None:
    """Compile claims again (the settings they depend on changed)."""
    _claim_statements.clear()


def _claim_in_one_statement(key: _ClaimKey, token: uuid.UUID) -> list[Any]:
    """Pick, mark and read the claimed rows in one statement (PostgreSQL, SQLite).

    ``UPDATE ... WHERE pk IN (<the first due rows> FOR UPDATE SKIP LOCKED)
    RETURNING *``: one round trip, and in autocommit its own transaction.
    The pick is the ORM's ``select_for_update(skip_locked=True)``: on
    PostgreSQL it locks the rows it picks and skips those other workers are
    picking, so claimers never wait on each other and never pick the same
    row; SQLite has no row locks (Django leaves the clause out) but runs one
    write statement at a time, which serialises claims just as well. The
    statement is compiled once per worker, lane and size (while the clock
    is the database's): only the lock token changes from one claim to the
    next, and compiling it cost as much as running it.
    """
    model, alias = key.model, key.alias
    connection = connections[alias]
    compiled = None if clock.is_overridden() else _claim_statements.get(key)
    if compiled is None:
        # Django writes FOR UPDATE only inside a transaction; the claim runs
        # as one statement, which is a transaction of its own.
        locks = connection.features.has_select_for_update
        with transaction.atomic(using=alias, savepoint=False) if locks else nullcontext():
            picked_sql, picked_params = _pick(key)
        query = UpdateQuery(model)
        query.add_update_values(_claim_changes(key))
        set_sql, set_params = query.get_compiler(alias).as_sql()
        cache = not clock.is_overridden()
        if cache:
            set_sql, set_params = _inlined(connection, set_sql, set_params)
            picked_sql, picked_params = _inlined(connection, picked_sql, picked_params)
        sql = statement("claim", features(connection)).format(
            set=set_sql,
            picked=picked_sql,
            columns=returned_columns(model, connection.ops.quote_name),
            **_quoted(model, connection, "pk", "lock_token"),
        )
        compiled = (sql, tuple(set_params), tuple(picked_params))
        if cache:
            _claim_statements[key] = compiled
    sql, set_params, picked_params = compiled
    token_param = _field(model, "lock_token").get_db_prep_value(token, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*set_params, token_param, *picked_params])
        return rows_from(model, connection, cursor.fetchall())


# -- ordered groups -------------------------------------------------------------------
#
# The messages of a group run one at a time, in the order of their ids. The
# claim itself enforces it (group_clear, in its pick): a grouped message is
# picked only when no earlier message of its group may still run (or, where
# the queue blocks on failure, failed) and no other message of its group is
# running under a live lease.
#
# That condition alone would make every claim visit each message waiting
# behind a blocked group: a group with 100,000 messages behind a failing one
# would cost every claim of its queue 100,000 probes. So a message that
# waits behind its group is *held*: pending with no due time (its due time
# stays in scheduled_time), which keeps it out of every range the claim and
# the next-due time read. hold_back holds new messages behind their group;
# release_groups lets the next message of a group go once the one before it
# is done (the worker after each outcome, the operations after theirs, and a
# sweep of every group now and then, for what a crash left undone).


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
    running = _of_its_group(model).filter(held_condition(now))
    return Q(group="") | (~Exists(earlier) & ~Exists(running))


def install_holder_function(connection: Any, *, remove: bool = False) -> None:
    """Create (or, ``remove``, drop) ``delayq_holder_gone`` where the database uses it."""
    from django_delayq.models import WorkerState

    can = features(connection)
    if not can.group_function:
        return
    qn = connection.ops.quote_name
    names = ("name", "stopped_at", "last_seen", "alive_until")
    fields = {f: qn(str(_field(WorkerState, f).column)) for f in names}
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
    names = _quoted(Message, connection, "queue", "group", "status", "id", "next_attempt_time")
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
        found = list(pending.filter(Exists(earlier)).values_list("pk", flat=True))
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
    alias = _db(using)
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
    held = Q(status=Status.PENDING, next_attempt_time__isnull=True)
    firsts = (
        grouped.filter(_blockers(None if queue is None else [queue]))
        .order_by()
        .values("queue", "group")
        .annotate(head=Min("pk"), first_held=Min("pk", filter=held))
        .filter(head=F("first_held"))
        .values_list("head", "queue")
    )
    free = list(firsts)
    if not free:
        return 0
    now = clock.sql_now()
    released = 0
    for chunk in batches([pk for pk, _ in free]):
        released += rows.filter(
            pk__in=chunk, status=Status.PENDING, next_attempt_time__isnull=True
        ).update(next_attempt_time=Greatest(F("scheduled_time"), now), updated_at=now)
    if released:
        wake({q for _, q in free}, using=alias)
    return released


def wake(queues: Collection[str], *, using: str | None = None) -> None:
    """Tell idle workers of ``queues`` that messages are due now (PostgreSQL's NOTIFY,
    sent when the caller's transaction commits): nothing else would, before their
    next poll."""
    from django_delayq.store.write import notify

    when = clock.now()
    connection = connections[_db(using)]
    for queue in sorted(queues):
        notify(connection, queue, when)


def groups_of(rows: QuerySet[Any]) -> set[tuple[str, str]]:
    """The (queue, group) pairs of the grouped rows of ``rows`` (before they change)."""
    if not has_column(rows.model, "group"):
        return set()
    found = rows.exclude(group="").order_by().values_list("queue", "group").distinct()
    return set(found)


# -- outcomes of held rows: compare-and-set on (id, lock_token, running) ---------------


def _update_held(
    ids: Iterable[Any],
    token: uuid.UUID,
    changes: Mapping[str, Any],
    *,
    using: str | None,
    model: type[Model],
    returning: bool = False,
    same_as: Hashable = None,
    skip_locked: bool = False,
) -> Any:
    """Apply ``changes`` to the rows of ``ids`` still held under ``token``, in one statement.

    Returns how many rows changed, or with ``returning`` the set of their
    ids. Django compiles the SET clause (field preparation, the database
    clock, ``F()``); the WHERE clause (``held_rows``) is written once per
    table, because building it with the ORM cost more CPU than the whole
    round trip: a profile of ``atomic=True`` handlers put half of the
    worker's CPU per message in ``QuerySet.filter`` and its compilation for
    the acknowledgement. ``same_as`` names changes that are the same on
    every call (an acknowledgement), so their compiled SET clause is kept.
    ``skip_locked`` leaves out rows another transaction has locked instead
    of waiting for them: the worker's own housekeeping must never wait for
    a group of atomic handlers to commit.
    """
    ids = list(ids)
    if not ids:
        return set() if returning else 0
    alias = _db(using, model)
    connection = connections[alias]
    can = features(connection)
    locks = connection.features.has_select_for_update
    no_wait = skip_locked and can.no_wait and not returning
    if (returning and not can.returning) or (
        skip_locked and locks and not can.skip_locked_subquery and not no_wait
    ):
        # MariaDB/MySQL: lock the rows still held (skipping those another
        # transaction holds, if asked), then change exactly those.
        with transaction.atomic(using=alias):
            held = model._base_manager.using(alias).filter(
                pk__in=ids, lock_token=token, status=Status.RUNNING
            )
            mine = set(held.select_for_update(skip_locked=skip_locked).values_list("pk", flat=True))
            if mine:
                _update_held(mine, token, changes, using=alias, model=model, same_as=same_as)
        return mine if returning else len(mine)
    sql, set_params = _set_clause(model, alias, changes, same_as)
    if can.array_parameters:
        id_params: list[Any] = [ids]
    else:
        pk = _field(model, "pk")
        id_params = [pk.get_db_prep_value(i, connection) for i in ids]
    where = _held_where(
        model,
        connection,
        0 if can.array_parameters else len(ids),
        unlocked=skip_locked and can.skip_locked_subquery,
        returning=returning,
    )
    params = [
        *set_params,
        *id_params,
        _field(model, "lock_token").get_db_prep_value(token, connection),
    ]
    sql += where
    if no_wait:
        return _without_waiting(connection, sql, params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if returning:
            return {row[0] for row in cursor.fetchall()}
        return cursor.rowcount


def _without_waiting(connection: Any, sql: str, params: list[Any]) -> int:
    """Run ``sql`` (an ``UPDATE``) unless a row it would change is locked by another
    transaction: then nothing changes and it returns 0, as for rows no longer held
    (MariaDB/MySQL: a lock wait timeout of 0 for this one statement).

    The caller tells the two apart by reading the rows (:func:`states`).
    """
    can = features(connection)
    if connection.mysql_is_mariadb:
        text = statement("no_wait_mariadb", can).format(sql=sql)
    else:
        verb, rest = sql.split(" ", 1)
        text = statement("no_wait_mysql", can).format(verb=verb, rest=rest)
    try:
        with connection.cursor() as cursor:
            cursor.execute(text, params)
            return int(cursor.rowcount)
    except OperationalError as exc:
        if exc.args and exc.args[0] == LOCK_WAIT_TIMEOUT:
            return 0
        raise


# MariaDB's and MySQL's error "Lock wait timeout exceeded".
LOCK_WAIT_TIMEOUT = 1205


def _held_where(
    model: type[Model], connection: Any, ids: int, *, unlocked: bool, returning: bool
) -> str:
    """`` WHERE <held_rows> [RETURNING pk]`` (``ids`` placeholders; 0: one array), kept."""
    key = (model, type(connection), ids, unlocked, returning)
    text = _held_wheres.get(key)
    if text is None:
        quoted = _quoted(model, connection, "pk", "lock_token", "status")
        name = "held_rows_unlocked" if unlocked else "held_rows"
        condition = statement(name, features(connection)).format(
            ids=", ".join(["%s"] * ids), **quoted
        )
        text = f" WHERE {condition}" + (f" RETURNING {quoted['pk']}" if returning else "")
        if len(_held_wheres) < 1024:  # one per batch size where ids are placeholders
            _held_wheres[key] = text
    return text


_held_wheres: dict[tuple[Any, ...], str] = {}


_set_clauses: dict[tuple[Hashable, type[Model], str], tuple[str, tuple[Any, ...]]] = {}


def _set_clause(
    model: type[Model], alias: str, changes: Mapping[str, Any], same_as: Hashable
) -> tuple[str, tuple[Any, ...]]:
    """``UPDATE <table> SET ...`` and its parameters, compiled by Django.

    Kept under ``same_as`` while the clock is the database's (a replaced
    clock puts its time into the parameters).
    """
    key = (same_as, model, alias)
    if same_as is not None and not clock.is_overridden() and key in _set_clauses:
        return _set_clauses[key]
    query = UpdateQuery(model)
    query.add_update_values(_ending(model, fit(model, changes)))
    sql, params = query.get_compiler(alias).as_sql()
    if same_as is not None and not clock.is_overridden():
        sql, params = _inlined(connections[alias], sql, params)
        _set_clauses[key] = (sql, tuple(params))
    return sql, tuple(params)


def _inlined(connection: Any, sql: str, params: Any) -> tuple[str, tuple[Any, ...]]:
    """A statement kept for reuse, with its constant parameters written into its text.

    Where the driver binds on the client (psycopg's default), every
    parameter is adapted on every call: a cached statement's constants
    (statuses, the worker's name, the lease) are adapted once instead, and
    only what changes (the lock token, the ids) is sent as a parameter.
    """
    if not features(connection).inline_constants or not params:
        return sql, tuple(params)
    text = connection.ops.compose_sql(sql, tuple(params))
    return text.replace("%", "%%"), ()


def _succeeded() -> dict[str, Any]:
    """What an acknowledgement writes."""
    now = clock.sql_now()
    return {
        "status": Status.SUCCEEDED,
        "next_attempt_time": None,
        "lock_token": None,
        "finished_at": now,
        "updated_at": now,
    }


def ack(
    ids: Iterable[Any],
    token: uuid.UUID,
    *,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
) -> int:
    """Mark rows succeeded; returns how many were still ours (``skip_locked``: and
    not locked by another transaction, see :func:`_update_held`)."""
    return int(
        _update_held(
            ids,
            token,
            _succeeded(),
            using=using,
            model=model,
            same_as="succeeded",
            skip_locked=skip_locked,
        )
    )


def ack_held(
    held: Mapping[uuid.UUID, Collection[Any]],
    *,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
) -> set[tuple[Any, uuid.UUID]]:
    """Mark the rows of several claims succeeded at once; returns the (id, token) still ours.

    One statement per lock token, in one transaction when there are several,
    so the caller learns exactly which acknowledgements took (the others
    were claimed again after their lease expired). Judged per attempt: a
    worker may hold one row under two tokens (it claimed it again after
    losing its lease), and only the attempt whose token the row carries is
    acknowledged. ``skip_locked``: rows another transaction has locked are
    left out too, rather than waited for (the caller reads which of those
    are still held, :func:`states`, and tries them again later).
    """
    alias = _db(using, model)
    if not held:
        return set()
    connection = connections[alias]
    if len(held) > 1 and features(connection).array_parameters:
        return _ack_pairs(held, alias, model, skip_locked=skip_locked)
    mine: set[tuple[Any, uuid.UUID]] = set()
    with transaction.atomic(using=alias) if len(held) > 1 else nullcontext():
        for token, ids in held.items():
            kept = _update_held(
                ids,
                token,
                _succeeded(),
                using=alias,
                model=model,
                returning=True,
                same_as="succeeded",
                skip_locked=skip_locked,
            )
            mine.update((pk, token) for pk in kept)
    return mine


def _ack_pairs(
    held: Mapping[uuid.UUID, Collection[Any]],
    alias: str,
    model: type[Model],
    *,
    skip_locked: bool = False,
) -> set[tuple[Any, uuid.UUID]]:
    """``ack_held`` of several claims in one statement (PostgreSQL): the (id, token)
    pairs as two arrays. A worker's acknowledgements at a low rate span about
    as many claims as messages, and a statement per claim was most of their cost."""
    connection = connections[alias]
    sql, set_params = _set_clause(model, alias, _succeeded(), "succeeded")
    name = "held_pairs_unlocked" if skip_locked else "held_pairs"
    where = statement(name, features(connection)).format(
        **_quoted(model, connection, "pk", "lock_token", "status")
    )
    prepared = {t: _field(model, "lock_token").get_db_prep_value(t, connection) for t in held}
    ids = [pk for pks in held.values() for pk in pks]
    tokens = [prepared[t] for t, pks in held.items() for _ in pks]
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} {where}", [*set_params, ids, tokens])
        token_of = {value: t for t, value in prepared.items()}
        return {(pk, token_of.get(value, value)) for pk, value in cursor.fetchall()}


def fail(
    message_id: Any,
    token: uuid.UUID,
    *,
    error: str,
    traceback: str = "",
    retry_at: datetime | None,
    retry_in: timedelta | None = None,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
) -> int:
    """Record a failed attempt: reschedule, or give up if both times are None.

    ``retry_in`` is measured on the database's clock (what the worker uses);
    ``retry_at`` is an absolute instant.
    """
    now = clock.sql_now()
    changes: dict[str, object] = {
        "last_error": error,
        "error_fingerprint": fingerprint(error),
        "last_traceback": traceback,
        "lock_token": None,
        "updated_at": now,
    }
    if retry_in is not None:
        changes.update(status=Status.PENDING, next_attempt_time=clock.sql_now_plus(retry_in))
    elif retry_at is None:
        changes.update(status=Status.FAILED, next_attempt_time=None, finished_at=now)
    else:
        changes.update(status=Status.PENDING, next_attempt_time=retry_at)
    return int(
        _update_held(
            [message_id], token, changes, using=using, model=model, skip_locked=skip_locked
        )
    )


def snooze(
    message_id: Any,
    token: uuid.UUID,
    *,
    run_at: datetime | timedelta,
    max_attempts: int,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
) -> int:
    """Reschedule without spending an attempt (``Retry``): raise the cap by one.

    ``run_at`` is an instant, or a delay measured on the database's clock.
    """
    when = clock.sql_now_plus(run_at) if isinstance(run_at, timedelta) else run_at
    changes = {
        "status": Status.PENDING,
        "next_attempt_time": when,
        "lock_token": None,
        "max_attempts": max_attempts,
        "updated_at": clock.sql_now(),
    }
    return int(
        _update_held(
            [message_id], token, changes, using=using, model=model, skip_locked=skip_locked
        )
    )


def release(
    ids: Iterable[Any],
    token: uuid.UUID,
    *,
    started: bool,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Give rows back for immediate redelivery (shutdown).

    Rows that were claimed but never started get their attempt back. A row
    locked by an open transaction (a group of atomic handlers still running
    past the shutdown grace) is left alone: its transaction ends with the
    process, and the row comes back when its lease expires.
    """
    now = clock.sql_now()
    changes: dict[str, object] = {
        "status": Status.PENDING,
        "next_attempt_time": now,
        "lock_token": None,
        "updated_at": now,
    }
    if not started:
        # Not GREATEST(attempt_count - 1, 0): on MariaDB/MySQL the column is
        # unsigned, and 0 - 1 is an error there before GREATEST sees it.
        changes["attempt_count"] = Case(
            When(attempt_count__gt=0, then=F("attempt_count") - 1), default=Value(0)
        )
    return int(_update_held(ids, token, changes, using=using, model=model, skip_locked=True))


def extend(
    ids: Iterable[Any],
    token: uuid.UUID,
    lease: timedelta,
    *,
    model: type[Model] = Message,
    using: str | None = None,
    wait: bool = False,
) -> set[Any]:
    """Push the lease of rows still held; returns the ids extended.

    Rows locked by another transaction are skipped rather than waited for,
    so the lease keeper never stalls behind an open transaction; ``wait``
    waits for them instead (the keeper's waiters, one row each: while one
    waits for a lock, no other worker's claim can take that row, which
    skips locked rows, and the extension lands the moment the lock goes).
    """
    changes = {
        "next_attempt_time": _lease_until(model, clock.sql_now_plus(lease)),
        "updated_at": clock.sql_now(),
    }
    return set(
        _update_held(
            ids,
            token,
            changes,
            using=using,
            model=model,
            same_as=("extend", lease),
            skip_locked=not wait,
            returning=True,
        )
    )


def held_ids(
    ids: Iterable[Any], token: uuid.UUID, *, using: str | None = None, model: type[Model] = Message
) -> set[Any]:
    """Which of ``ids`` are still running under ``token`` (a plain read, no lock)."""
    rows = model._base_manager.using(_db(using, model))
    held = rows.filter(pk__in=list(ids), lock_token=token, status=Status.RUNNING)
    return set(held.values_list("pk", flat=True))


@dataclass(frozen=True)
class RowState:
    """What a row says of the attempt that last claimed it (a plain read, no lock)."""

    status: str
    lock_token: uuid.UUID | None
    last_attempt_time: datetime | None

    def holds(self, token: uuid.UUID) -> bool:
        """Still running under ``token``: an outcome under it can still be written."""
        return self.status == Status.RUNNING and self.lock_token == token

    def ended(self, token: uuid.UUID, attempted_at: datetime | None) -> bool:
        """Ended by the attempt that was claimed at ``attempted_at`` (not claimed again
        since: a claim moves ``last_attempt_time``): its outcome was written, though its
        writer never heard back (a connection lost with the commit's reply)."""
        return (
            self.status != Status.RUNNING
            and self.lock_token != token
            and self.last_attempt_time is not None
            and self.last_attempt_time == attempted_at
        )


def states(
    ids: Iterable[Any], *, using: str | None = None, model: type[Model] = Message
) -> dict[Any, RowState]:
    """The :class:`RowState` of each of ``ids`` that still exists."""
    rows = model._base_manager.using(_db(using, model)).filter(pk__in=list(ids))
    found = rows.values_list("pk", "status", "lock_token", "last_attempt_time")
    return {pk: RowState(status, token, at) for pk, status, token, at in found}


def write_payload(
    message_id: int, token: uuid.UUID, payload: object, *, using: str | None = None
) -> int:
    """Replace the payload of a message still held; returns 1 if it was ours.

    The Django Tasks backend keeps a task's outcome (return value, errors)
    beside its call in the payload; like every write of a worker, it is a
    compare-and-set on the lock token.
    """
    changes = {"payload": payload, "updated_at": clock.now()}
    return int(_update_held([message_id], token, changes, using=using, model=Message))


def release_workers(names: Collection[str], *, using: str | None = None) -> dict[str, int]:
    """Hand back the running messages of these (dead) workers; returns counts by worker.

    The messages become due at once and keep their attempt count (the
    attempt was spent: a message that kills every worker that runs it still
    stops at ``max_attempts``). Clearing the lock token fences off the
    "dead" worker should it only have been frozen.
    """
    alias = _db(using)
    released: dict[str, int] = {}
    for name in names:
        handed_back = {
            "status": Status.PENDING,
            "next_attempt_time": clock.sql_now(),
            "lock_token": None,
            "updated_at": clock.sql_now(),
        }
        rows = Message.objects.using(alias).held_by([name])
        queues = set(rows.order_by().values_list("queue", flat=True).distinct())
        count = rows.update(**_ending(Message, handed_back))
        if count:
            released[name] = count
            wake(queues, using=alias)
    return released


# -- operators' changes: set-based, on rows the caller found eligible -----------------


def run_now(rows: QuerySet[Any], now: datetime | Expression) -> int:
    """Make pending rows due now."""
    return rows.update(**fit(rows.model, {"next_attempt_time": now, "updated_at": now}))


def retry(rows: QuerySet[Any], extra_attempts: int, now: datetime | Expression) -> int:
    """Send finished rows back to pending, due now, with ``extra_attempts`` more attempts."""
    max_attempts = F("attempt_count") + extra_attempts
    return _set_status(rows, Status.PENDING, now, now, max_attempts=max_attempts, finished_at=None)


def cancel(rows: QuerySet[Any], now: datetime | Expression) -> int:
    """Finish waiting rows as ``cancelled``."""
    return _set_status(rows, Status.CANCELLED, None, now, finished_at=now)


def reschedule(rows: QuerySet[Any], when: datetime, now: datetime | Expression) -> int:
    """Make waiting rows pending, due at ``when``."""
    return _set_status(rows, Status.PENDING, when, now)


def _set_status(
    rows: QuerySet[Any],
    status: Status,
    due: datetime | Expression | None,
    now: datetime | Expression,
    **more: Any,
) -> int:
    """Give rows ``status``, due at ``due``, and ``more``: held by no worker (no lock
    token) and with no newer version waiting (``superseded_at``)."""
    changes = {
        "status": status,
        "next_attempt_time": due,
        **more,
        "lock_token": None,
        "superseded_at": None,
        "updated_at": now,
    }
    return rows.update(**fit(rows.model, changes))


def reprioritise(rows: QuerySet[Any], priority: int, now: datetime | Expression) -> int:
    """Set the priority of rows (inert while one runs; the worker never writes it)."""
    return rows.update(**fit(rows.model, {"priority": priority, "updated_at": now}))


def delete(rows: QuerySet[Any]) -> int:
    """Delete rows; returns how many of the queue table went."""
    _, per_model = rows.delete()
    return per_model.get(rows.model._meta.label, 0)


#: The columns that choose a message's handler and the limits it counts against
#: (a global concurrency cap counts the running messages of a queue, or of a
#: queue and kind): a running message's must not change under its worker.
SCOPE_COLUMNS = frozenset({"queue", "kind"})


class EditRefused(DelayQError):
    """An edit of :data:`SCOPE_COLUMNS` of a message that is running (or gone)."""


def edit(message: Model, fields: Collection[str], *, using: str | None = None) -> None:
    """Write an operator's edit of a message's content (not its state), and only those columns,
    so a concurrent worker's changes are kept.

    ``message``: a ``Message``, or a row of a ``QueueFields`` model (the
    admin's change form of either). An edit of its ``SCOPE_COLUMNS`` is one
    ``UPDATE`` that leaves a running message alone, and raises
    :class:`EditRefused` then, writing nothing: moved to another kind while
    it runs, a message would leave its kind's global concurrency cap a place
    free while its handler still runs (and take one in the other's), so the
    cap could be exceeded.
    """
    if not fields:
        return
    written = list(fields)
    if has_column(type(message), "updated_at"):
        message.updated_at = clock.now()  # type: ignore[attr-defined]
        written.append("updated_at")
    if not SCOPE_COLUMNS & set(fields):
        message.save(using=using, update_fields=written)
        return
    alias = using or message._state.db or _db(None, type(message))
    rows = type(message)._base_manager.using(alias).filter(pk=message.pk)
    values = {name: getattr(message, name) for name in written}
    if not rows.exclude(status=Status.RUNNING).update(**values):
        raise EditRefused(
            f"message {message.pk} is running (or was deleted): its "
            f"{' and '.join(sorted(SCOPE_COLUMNS & set(fields)))} cannot change while it runs"
        )


def replace_failed_payload(message_id: int, payload: Any, *, using: str) -> bool:
    """Replace a failed message's payload; False if it is not ``failed`` (any more)."""
    rows = Message.objects.using(using).filter(pk=message_id, status=Status.FAILED)
    return bool(rows.update(payload=payload, updated_at=clock.now()))


# -- rows of QueueFields models: queued by the application ----------------------------


def _scheduled(when: datetime) -> dict[str, Any]:
    return {
        "status": Status.PENDING,
        "next_attempt_time": when,
        "lock_token": None,
        "locked_by": "",
    }


def _rerun(value: Any, field: Field[Any, Any]) -> Case:
    """``value`` for a finished row, else the column as it is: a finished row queued
    again starts a new round of attempts (its last error goes with the old round)."""
    return Case(
        When(status__in=FINISHED, then=Value(value, output_field=field)),
        default=F(field.name),
        output_field=field,
    )


def schedule(rows: QuerySet[Any], when: datetime) -> int:
    """Queue the selected rows to run at ``when``, but the ones a worker holds.

    A finished row starts again from its first attempt: with its old
    attempt count it would be claimed and given up at once, its handler
    never run.
    """
    model = rows.model
    restart = {
        name: _rerun(value, _field(model, name))
        for name, value in (("attempt_count", 0), ("last_error", ""), ("last_traceback", ""))
    }
    # The restart first: MariaDB/MySQL evaluate SET from left to right, each
    # assignment seeing the ones before it, so after "status = 'pending'" no
    # row would look finished any more.
    return rows.exclude(held_condition()).order_by().update(**restart, **_scheduled(when))


def mark_scheduled(row: Model, when: datetime) -> None:
    """Set a row's queue columns to "queued at ``when``", for the caller's own save
    (which then writes them: see :func:`plain_save_fields`)."""
    marked = row.__dict__.setdefault(_MARKED, set())
    marked.update(_set_scheduled(row, when))


def _set_scheduled(row: Model, when: datetime) -> list[str]:
    """Set a row's queue columns to "queued at ``when``" in memory; their names."""
    changed = list(_scheduled(when))
    if getattr(row, "status", None) in FINISHED:
        row.attempt_count, row.last_error, row.last_traceback = 0, "", ""  # type: ignore[attr-defined]
        changed += ["attempt_count", "last_error", "last_traceback"]
    for name, value in _scheduled(when).items():
        setattr(row, name, value)
    return changed


def schedule_row(row: Model, when: datetime, *, using: str) -> bool:
    """Queue one row at ``when``; False if a worker holds it (or it is gone).

    A new row is saved whole; an existing one gets only the queue columns,
    with the same condition as :func:`schedule` (the row in memory then shows
    them, but a later plain save does not write them again: a worker may have
    claimed it by then).
    """
    if row._state.adding:
        mark_scheduled(row, when)
        row.save(using=using)
        return True
    if not schedule(type(row)._base_manager.using(using).filter(pk=row.pk), when):
        return False
    _set_scheduled(row, when)
    return True


# The attribute of a row naming the queue columns its caller's own save is to
# write (mark_scheduled).
_MARKED = "_delayq_queue_columns_to_save"

#: The columns of ``models.QueueColumns``: a row's place in the queue, written by
#: the store alone (a ``QueueFields`` row's plain ``save()`` leaves them out).
QUEUE_COLUMN_NAMES = frozenset(f.name for f in QueueColumns._meta.fields)


def plain_save_fields(row: Model) -> list[str]:
    """What a plain ``save()`` of an existing ``QueueFields`` row writes: its loaded
    columns but the queue columns (``QUEUE_COLUMN_NAMES``).

    The row in memory holds the queue columns as they were when it was
    loaded; a worker may have claimed or settled it since, and writing them
    back would undo that (the claim's token cleared, so its outcome is lost;
    a finished row running again). The queue columns that
    :func:`mark_scheduled` set for the caller's own save are written.
    """
    marked = row.__dict__.get(_MARKED, set())
    deferred = row.get_deferred_fields()
    return [
        field.name
        for field in type(row)._meta.concrete_fields
        if not field.primary_key
        and field.attname not in deferred
        and (field.name not in QUEUE_COLUMN_NAMES or field.name in marked)
    ]


def saved(row: Model) -> None:
    """The row was saved: what :func:`mark_scheduled` set is written."""
    row.__dict__.pop(_MARKED, None)


# -- retention and cron -------------------------------------------------------------


def prune(
    cutoff: datetime,
    *,
    batch_size: int,
    max_batches: int | None = None,
    queues: Collection[str] | None = None,
    using: str | None = None,
) -> int:
    """Delete finished messages that finished before ``cutoff``, ``batch_size`` at a time.

    Deletes go in bounded batches by primary key, so pruning a large backlog
    never holds long locks or one huge transaction on a table workers claim
    from (``delayq_finished_idx`` finds them). A batch larger than a
    statement binds (``PRUNE_BATCH_SIZE`` is any positive number) is deleted
    ``IN_BATCH`` ids at a time, in one transaction.
    """
    alias = _db(using)
    expired = Message.objects.using(alias).in_queues(queues).expired(cutoff)
    total = rounds = 0
    while max_batches is None or rounds < max_batches:
        ids = list(expired.order_by().values_list("id", flat=True)[:batch_size])
        if not ids:
            break
        with transaction.atomic(using=alias):
            for chunk in batches(ids):
                total += expired.filter(id__in=chunk).delete()[0]
        rounds += 1
    return total


def archived_delete(connection: Any) -> dict[str, str]:
    """The statements that delete archived rows still at their archived version (Spark)."""
    can = features(connection)
    table = connection.ops.quote_name(Message._meta.db_table)
    if can.array_parameters:
        return {
            "delete_sql": statement("delete_archived", can).format(table=table),
            "count_sql": statement("count_ids", can).format(table=table),
        }
    return {
        "delete_sql": statement("delete_ids", can).format(table=table),
        "select_sql": statement("archived_versions", can).format(table=table),
    }


def delete_ticks(ids: Collection[int], *, using: str) -> int:
    """Delete cron ticks that are still pending and were never attempted.

    The condition is in the statement: a tick a worker claimed meanwhile
    (now running) is left alone.
    """
    if not ids:
        return 0
    rows = Message.objects.using(using).untouched()
    with transaction.atomic(using=using):
        return sum(rows.filter(id__in=chunk).delete()[0] for chunk in batches(list(ids)))


def miss_tick(message_id: int, token: uuid.UUID, *, reason: str, using: str) -> int:
    """Cancel a cron tick a worker claimed past its grace, instead of running it;
    returns 1 if it was still held under ``token``.

    It ends as :func:`cancel_ticks` leaves a missed tick: never attempted
    (the claim's attempt is given back, and its start time, which was this
    claim's), so the schedule's last run stays the last one that ran.
    """
    now = clock.sql_now()
    changes = {
        "status": Status.CANCELLED,
        "next_attempt_time": None,
        "finished_at": now,
        "updated_at": now,
        "last_error": reason,
        "lock_token": None,
        "attempt_count": 0,
        "last_attempt_time": None,
    }
    return int(_update_held([message_id], token, changes, using=using, model=Message))


def cancel_ticks(ids: Collection[int], *, reason: str, now: datetime, using: str) -> int:
    """Cancel cron ticks that are still pending and were never attempted (missed ticks)."""
    rows = Message.objects.using(using).untouched()
    changes = {
        "status": Status.CANCELLED,
        "next_attempt_time": None,
        "finished_at": now,
        "updated_at": now,
        "last_error": reason,
    }
    with transaction.atomic(using=using):
        return sum(rows.filter(id__in=chunk).update(**changes) for chunk in batches(list(ids)))
