"""The claim: due rows taken by a worker, under one new lock token per claim.

A claimed row is ``running`` with the claim's lock token, one more attempt
and a lease (its ``next_attempt_time``). Every later change of the worker's
(``settle``, ``leases``) is a compare-and-set on that token: a worker whose
lease expired, and whose row was claimed again by someone else, can no
longer change it. A grouped row is claimed only when its group lets it run
(``groups.group_clear``); rate limits and concurrency caps wrap the claim
(``limits``).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, DateTimeField, Expression, F, Model, Q, QuerySet, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.sql.subqueries import UpdateQuery

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.models import Message
from django_delayq.routers import queue_alias
from django_delayq.status import Status
from django_delayq.store import direct
from django_delayq.store.columns import db_alias, fit, has_column, inlined, model_field, quote_names
from django_delayq.store.features import features
from django_delayq.store.groups import group_clear
from django_delayq.store.queries import claimable_condition
from django_delayq.store.rows import returned_columns, rows_from
from django_delayq.store.sql import statement

# Matches delayq_claim_idx, so PostgreSQL reads the first rows off the index
# instead of sorting every due row (adding "id" here forces that sort).
CLAIM_ORDER = ("-priority", "next_attempt_time")

# Where a floored claim's bound goes in its compiled text (replaced by a
# parameter once the constants around it are written in: _claim_in_one_statement).
_FLOOR_MARK = "delayq_floor_mark"


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
    # Only rows due at or after a bound given with each claim (``since``).
    floored: bool = False


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
    since: datetime | None = None,
) -> Claim:
    """Claim up to ``limit`` due rows of ``queues``, highest priority first.

    Due means pending with ``next_attempt_time <= now``, or running with an
    expired lease (the redelivery of a crashed worker's message). Claimed
    rows become ``running`` with a fresh token, one more attempt, and a lease
    of ``now + lease``. For a ``QueueFields`` model, ``queues`` and
    ``leases`` are ignored (the model is the queue) and every row gets ``lease``.
    ``kinds``: ``(kinds, True)`` claims only messages of those kinds,
    ``(kinds, False)`` all but those (a limited kind's claims are separate).

    ``since``: only rows due at or after it (the worker's floor, see
    ``worker/floors.py``), so that the claim's index scan starts there and
    never visits the entries of rows claimed and finished before it. Those
    entries are dead, but while a transaction holds PostgreSQL's vacuum
    horizon nothing removes them and every claim that starts below them
    visits each one's row. Honoured on PostgreSQL, ignored elsewhere.
    """
    alias = db_alias(using, model)
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
        since is not None and connections[alias].vendor == "postgresql",
    )
    if features(connections[alias]).limit_in_subquery:
        claimed = _claim_in_one_statement(key, token, since)
        return Claim(token, _in_running_order(model, claimed))
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
    messages = list(rows.filter(lock_token=token, status="running"))
    return Claim(token, _in_running_order(model, messages))


def claimable_below(
    queues: Collection[str],
    floor: datetime,
    *,
    using: str | None = None,
    model: type[Model] = Message,
    kinds: tuple[Collection[str], bool] | None = None,
    dead_after: timedelta | None = None,
) -> bool:
    """Whether a claim of ``queues`` (and ``kinds``) could take a row due before ``floor``.

    A read, without locks: a row another transaction locks counts, and the
    claim that follows skips it again (it is looked for again later).
    """
    alias = db_alias(using, model)
    key = _ClaimKey(
        model,
        alias,
        tuple(queues),
        1,
        "",
        timedelta(0),
        frozenset(),
        None if kinds is None else (frozenset(kinds[0]), kinds[1]),
        dead_after or to_timedelta(get_config()["WORKER_DEAD_AFTER"]),
    )
    return _picked(key, before=floor).exists()


def _in_running_order(model: type[Model], messages: list[Any]) -> list[Any]:
    """A claimed batch in the order its rows run: highest priority first, then oldest.

    The claim has overwritten every row's due time with its lease, so the
    rows can no longer be sorted by it (ties, or one kind's shorter lease
    first): their keys keep the order they were enqueued in on every database.
    """
    if has_column(model, "priority"):
        return sorted(messages, key=lambda m: (-m.priority, m.pk))
    return sorted(messages, key=lambda m: m.pk)


def _in_claim_order(sql: str, model: type[Model], connection: Any) -> str:
    """On SQLite, the pick of the message table read off ``delayq_claim_idx``.

    SQLite's planner prefers ``delayq_due_idx`` for the due time's range, then
    reads every due row of the queue, tests each against its group and sorts
    them all for the first few: 390 ms a claim with 100,000 messages due,
    holding the database's write lock. Read in claim order, the pick stops at
    its ``LIMIT`` (under a millisecond). Its constants must be written into
    the statement (:func:`columns.inlined`): the index is partial.
    """
    if connection.vendor != "sqlite" or model is not Message:
        return sql
    table = connection.ops.quote_name(model._meta.db_table)
    index = connection.ops.quote_name("delayq_claim_idx")
    return sql.replace(f"FROM {table} WHERE", f"FROM {table} INDEXED BY {index} WHERE")


def _pick(key: _ClaimKey, floor: Expression | None = None) -> tuple[str, tuple[Any, ...]]:
    """The locking pick of the first ``limit`` due rows (their keys), compiled.

    Over several queues, each queue's first rows are picked from its own
    range of ``delayq_claim_idx`` and the first ``limit`` of those taken:
    one pick of ``queue IN (...)`` cannot read that index in claim order,
    so it read every due row of the queues and sorted them (2 s at 100,000
    due rows on PostgreSQL, where a queue of its own took 5 ms). A queue's
    rows beyond the ``limit`` taken stay locked until the claim's statement
    (or transaction) ends: another claim skips them meanwhile, as it skips
    rows being claimed. Called inside a transaction (Django writes ``FOR
    UPDATE`` only there). ``floor``: the least due time picked (:func:`claim`'s ``since``).
    """
    connection = connections[key.alias]
    if key.queues is None or len(key.queues) < 2:
        picked = _picked(key, floor=floor).select_for_update(skip_locked=True)
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
        picked = _picked(lane, columns, floor).select_for_update(skip_locked=True)
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


def _picked(
    key: _ClaimKey,
    columns: Mapping[str, F] | None = None,
    floor: Expression | None = None,
    *,
    before: datetime | None = None,
) -> QuerySet[Any]:
    """The first ``limit`` due rows of the queues, in claim order (their keys, or
    ``columns``: names and the fields they read), none due before ``floor``
    (or only those due before ``before``).

    A grouped message is picked only if its group lets it run
    (:func:`groups.group_clear`); the condition is evaluated for grouped rows
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
    if floor is not None:
        due = due.filter(next_attempt_time__gte=floor)
    if before is not None:
        due = due.filter(next_attempt_time__lt=before)
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
            output_field=model_field(key.model, "attempt_count"),
        )
        changes["superseded_at"] = None
    return fit(key.model, changes)


_claim_statements: dict[_ClaimKey, tuple[str, tuple[Any, ...], tuple[Any, ...], int]] = {}


#: How many rows the last claim of each statement took.
_last_taken: dict[_ClaimKey, int] = {}


def forget_compiled_claims() -> None:
    """Compile claims again (the settings they depend on changed)."""
    _claim_statements.clear()
    _last_taken.clear()


def _claim_in_one_statement(
    key: _ClaimKey, token: uuid.UUID, since: datetime | None = None
) -> list[Any]:
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
    next (and a floored claim's ``since``), and compiling it cost as much as
    running it.
    """
    model, alias = key.model, key.alias
    connection = connections[alias]
    cache = not clock.is_overridden()
    compiled = _claim_statements.get(key) if cache else None
    if compiled is None:
        floor: Expression | None = None
        if key.floored:
            # Kept: a mark, made a parameter once the constants are written in.
            # Built anew: the bound itself.
            floor = RawSQL(_FLOOR_MARK, ()) if cache else Value(since, DateTimeField())
        # Django writes FOR UPDATE only inside a transaction; the claim runs
        # as one statement, which is a transaction of its own.
        locks = connection.features.has_select_for_update
        with transaction.atomic(using=alias, savepoint=False) if locks else nullcontext():
            picked_sql, picked_params = _pick(key, floor)
        query = UpdateQuery(model)
        query.add_update_values(_claim_changes(key))
        set_sql, set_params = query.get_compiler(alias).as_sql()
        floors = 0
        if cache:
            set_sql, set_params = inlined(connection, set_sql, set_params)
            picked_sql, picked_params = inlined(connection, picked_sql, picked_params)
            picked_sql = _in_claim_order(picked_sql, model, connection)
            # PostgreSQL's constants are all written in: the bounds are the
            # only parameters after the lock token, in the order they appear.
            floors = picked_sql.count(f"({_FLOOR_MARK})")
            if floors and picked_params:  # kept under python -O, unlike an assert
                raise RuntimeError("a floored claim's statement kept parameters besides its floor")
            picked_sql = picked_sql.replace(f"({_FLOOR_MARK})", "%s")
        sql = statement("claim", features(connection)).format(
            set=set_sql,
            picked=picked_sql,
            columns=returned_columns(model, connection.ops.quote_name),
            **quote_names(model, connection, "pk", "lock_token"),
        )
        compiled = (sql, tuple(set_params), tuple(picked_params), floors)
        if cache:
            _claim_statements[key] = compiled
    sql, set_params, picked_params, floors = compiled
    token_param = model_field(model, "lock_token").get_db_prep_value(token, connection)
    if floors:
        picked_params = (*picked_params, *[since] * floors)
    # Prepared while it takes few rows (an idle worker's pickup, a chain's next
    # step), where planning is most of its cost; planned at each call while it
    # drains a backlog (direct.PREPARED_ROWS).
    few = _last_taken.get(key, 0) <= direct.PREPARED_ROWS
    rows = direct.fetch(connection, sql, [*set_params, token_param, *picked_params], prepare=few)
    _last_taken[key] = len(rows)
    return rows_from(model, connection, rows)
