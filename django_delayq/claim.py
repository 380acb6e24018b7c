"""Claiming and settling messages: every status change a worker makes.

Each function here is one set-based statement (or one short transaction),
so a worker can claim and settle whole batches in a round trip, and each
settling statement is a compare-and-set on ``(id, lock_token)`` with
``status = 'running'``: a worker whose lease expired, and whose message was
claimed again by someone else, can no longer change it.

Every function takes the table as ``model``: ``Message`` by default, or a
model with the queue columns of ``entity.QueueFields`` (the row is the
message). Such a model has no queue, kind or priority column unless it
declares them, and none of the message's bookkeeping columns
(``updated_at``, ``finished_at``, ``error_fingerprint``): each change
below names every column a message gets, and :func:`_fit` keeps those the
table has.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Collection, Hashable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    Case,
    DateTimeField,
    Expression,
    F,
    Field,
    Model,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.functions import Greatest
from django.db.models.sql.subqueries import UpdateQuery

from django_delayq import clock
from django_delayq.fingerprint import fingerprint
from django_delayq.models import Message, due_condition, from_returned_rows, returned_columns

# Matches delayq_claim_idx, so PostgreSQL reads the first rows off the index
# instead of sorting every due row (adding "id" here forces that sort).
CLAIM_ORDER = ("-priority", "next_attempt_time")


@dataclass(frozen=True)
class Claim:
    """A batch of messages claimed together; they share one lock token."""

    token: uuid.UUID
    # Messages, or rows of the ``QueueFields`` model that was claimed.
    messages: list[Any]


def _db(using: str | None, model: type[Model] = Message) -> str:
    return using or router.db_for_write(model)


@cache
def _columns(model: type[Model]) -> frozenset[str]:
    return frozenset(f.name for f in model._meta.concrete_fields)


def _fit(model: type[Model], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` without the columns ``model`` does not have."""
    columns = _columns(model)
    return {name: value for name, value in changes.items() if name in columns}


def claim_order(model: type[Model]) -> tuple[str, ...]:
    """Highest priority first where the table has one, then by due time."""
    return CLAIM_ORDER if "priority" in _columns(model) else ("next_attempt_time",)


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


def claim(
    queues: Collection[str],
    limit: int,
    *,
    worker: str,
    lease: timedelta,
    leases: Mapping[tuple[str, str | None], timedelta] | None = None,
    using: str | None = None,
    model: type[Model] = Message,
) -> Claim:
    """Claim up to ``limit`` due messages of ``queues``, highest priority first.

    Due means pending with ``next_attempt_time <= now``, or running with an
    expired lease (the redelivery of a crashed worker's message). Claimed
    rows become ``running`` with a fresh token, one more attempt, and a lease
    of ``now + lease``. For a ``QueueFields`` model, ``queues`` and
    ``leases`` are ignored (the model is the queue) and every row gets ``lease``.
    """
    alias = _db(using, model)
    token = uuid.uuid4()
    lanes: tuple[str, ...] | None = tuple(queues)
    if "queue" not in _columns(model):
        lanes, leases = None, None
    elif not lanes:
        return Claim(token, [])  # no queue given: nothing to claim (not "every queue")
    key = _ClaimKey(model, alias, lanes, limit, worker[:255], lease, _frozen(leases))
    if _returns_updated_rows(connections[alias].vendor):
        messages = _claim_returning(key, token)
        # RETURNING has no order: run them highest priority first, then oldest.
        if "priority" in _columns(model):
            messages.sort(key=lambda m: (-m.priority, m.pk))
        else:
            messages.sort(key=lambda m: m.pk)
        return Claim(token, messages)
    # MariaDB/MySQL: no UPDATE ... RETURNING, and no LIMIT in an IN
    # subquery: lock the rows we pick (skipping those other workers are
    # picking, so claimers never wait on each other), mark them, read them.
    rows = model._base_manager.using(alias)
    with transaction.atomic(using=alias):
        ids = list(_picked(key).select_for_update(skip_locked=True).values_list("pk", flat=True))
        if not ids:
            return Claim(token, [])
        rows.filter(pk__in=ids).update(**_claim_changes(key), lock_token=token)
    messages = list(rows.filter(lock_token=token, status="running").order_by(*claim_order(model)))
    return Claim(token, messages)


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


def _frozen(
    leases: Mapping[tuple[str, str | None], timedelta] | None,
) -> frozenset[tuple[tuple[str, str | None], timedelta]]:
    return frozenset((leases or {}).items())


def _picked(key: _ClaimKey) -> QuerySet[Any]:
    """The first ``limit`` due rows of the queues, in claim order (their keys)."""
    due = key.model._base_manager.using(key.alias).filter(due_condition(clock.sql_now()))
    if key.queues is not None:
        due = due.filter(queue__in=list(key.queues))
    return due.order_by(*claim_order(key.model)).values("pk")[: key.limit]


def _claim_changes(key: _ClaimKey) -> dict[str, Any]:
    """What a claim writes, but the lock token."""
    now = clock.sql_now()
    changes = {
        "status": Message.Status.RUNNING,
        "locked_by": key.worker,
        "attempt_count": F("attempt_count") + 1,
        "last_attempt_time": now,
        "next_attempt_time": _lease_expression(dict(key.leases), key.lease),
        "updated_at": now,
    }
    return _fit(key.model, changes)


_claim_statements: dict[_ClaimKey, tuple[str, tuple[Any, ...], tuple[Any, ...]]] = {}


def _claim_returning(key: _ClaimKey, token: uuid.UUID) -> list[Any]:
    """Pick, mark and read the claimed rows in one statement (PostgreSQL, SQLite).

    ``UPDATE ... WHERE pk IN (<the first due rows> FOR UPDATE SKIP LOCKED)
    RETURNING *``: one round trip, and in autocommit its own transaction.
    On PostgreSQL the subquery locks the rows it picks and skips those other
    workers are picking, so claimers never wait on each other and never pick
    the same row; SQLite has no row locks, but runs one write statement at
    a time, which serialises claims just as well. The statement is compiled
    once per worker, lane and size (while the clock is the database's): only
    the lock token changes from one claim to the next, and compiling it cost
    as much as running it.
    """
    model, alias = key.model, key.alias
    connection = connections[alias]
    statement = None if clock.is_overridden() else _claim_statements.get(key)
    if statement is None:
        qn = connection.ops.quote_name
        picked_sql, picked_params = _picked(key).query.get_compiler(alias).as_sql()
        if connection.vendor == "postgresql":
            picked_sql += " FOR UPDATE SKIP LOCKED"
        query = UpdateQuery(model)
        query.add_update_values(_claim_changes(key))
        set_sql, set_params = query.get_compiler(alias).as_sql()
        sql = (
            f"{set_sql}, {qn(str(_field(model, 'lock_token').column))} = %s "
            f"WHERE {qn(str(_field(model, 'pk').column))} IN ({picked_sql}) "
            f"RETURNING {returned_columns(model, qn)}"
        )
        statement = (sql, tuple(set_params), tuple(picked_params))
        if not clock.is_overridden():
            _claim_statements[key] = statement
    sql, set_params, picked_params = statement
    token_param = _field(model, "lock_token").get_db_prep_value(token, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*set_params, token_param, *picked_params])
        return from_returned_rows(model, connection, cursor.fetchall())


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(field, Field)
    return field


# The compare-and-set every settling statement shares, per table and database:
# the rows of some ids that are still running under one lock token.
_held_conditions: dict[tuple[type[Model], str], str] = {}


def _held_condition(model: type[Model], connection: BaseDatabaseWrapper) -> str:
    key = (model, connection.vendor)
    condition = _held_conditions.get(key)
    if condition is None:
        qn = connection.ops.quote_name
        pk, token, status = (
            qn(str(_field(model, name).column)) for name in ("pk", "lock_token", "status")
        )
        ids = f"{pk} = ANY(%s)" if connection.vendor == "postgresql" else f"{pk} IN (%s)"
        condition = _held_conditions[key] = f"{ids} AND {token} = %s AND {status} = %s"
    return condition


def _returns_updated_rows(vendor: str) -> bool:
    # UPDATE ... RETURNING: PostgreSQL, and SQLite since 3.35 (Django 5.2 needs 3.31).
    return vendor == "postgresql" or (vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35))


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

    Returns how many rows changed, or with ``returning`` the set of their ids. Django compiles the
    SET clause (field preparation, the database clock, ``F()``); the WHERE
    clause is written here once per table, because building it with the ORM
    cost more CPU than the whole round trip: a profile of ``atomic=True``
    handlers put half of the worker's CPU per message in ``QuerySet.filter``
    and its compilation for the acknowledgement. ``same_as`` names changes
    that are the same on every call (an acknowledgement), so their compiled
    SET clause is kept. ``skip_locked`` (PostgreSQL) leaves out rows another
    transaction has locked instead of waiting for it: the worker's own
    housekeeping must never wait for a group of atomic handlers to commit.
    """
    ids = list(ids)
    if not ids:
        return set() if returning else 0
    alias = _db(using, model)
    connection = connections[alias]
    if returning and not _returns_updated_rows(connection.vendor):
        # MariaDB/MySQL: lock the rows still held (skipping those another
        # transaction holds, if asked), then change exactly those.
        with transaction.atomic(using=alias):
            held = model._base_manager.using(alias).filter(
                pk__in=ids, lock_token=token, status=Message.Status.RUNNING
            )
            mine = set(held.select_for_update(skip_locked=skip_locked).values_list("pk", flat=True))
            if mine:
                _update_held(mine, token, changes, using=alias, model=model, same_as=same_as)
        return mine
    sql, set_params = _set_clause(model, alias, changes, same_as)
    condition = _held_condition(model, connection)
    if connection.vendor == "postgresql":
        id_params: list[Any] = [ids]
    else:
        pk = _field(model, "pk")
        id_params = [pk.get_db_prep_value(i, connection) for i in ids]
        condition = condition.replace("IN (%s)", f"IN ({', '.join(['%s'] * len(ids))})", 1)
    params = [
        *set_params,
        *id_params,
        _field(model, "lock_token").get_db_prep_value(token, connection),
        Message.Status.RUNNING.value,
    ]
    pk_column = connection.ops.quote_name(str(_field(model, "pk").column))
    if skip_locked and connection.vendor == "postgresql":
        table = connection.ops.quote_name(model._meta.db_table)
        condition = (
            f"{pk_column} IN (SELECT {pk_column} FROM {table} WHERE {condition} "
            "FOR UPDATE SKIP LOCKED)"
        )
    sql = f"{sql} WHERE {condition}"
    if returning:
        sql += f" RETURNING {pk_column}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if returning:
            return {row[0] for row in cursor.fetchall()}
        return cursor.rowcount


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
    query.add_update_values(_fit(model, changes))
    sql, params = query.get_compiler(alias).as_sql()
    if same_as is not None and not clock.is_overridden():
        _set_clauses[key] = (sql, tuple(params))
    return sql, tuple(params)


# What an acknowledgement writes.
def _succeeded() -> dict[str, Any]:
    now = clock.sql_now()
    return {
        "status": Message.Status.SUCCEEDED,
        "next_attempt_time": None,
        "lock_token": None,
        "finished_at": now,
        "updated_at": now,
    }


def ack(
    ids: Iterable[Any], token: uuid.UUID, *, using: str | None = None, model: type[Model] = Message
) -> int:
    """Mark messages succeeded; returns how many were still ours."""
    return int(
        _update_held(ids, token, _succeeded(), using=using, model=model, same_as="succeeded")
    )


def ack_held(
    held: Mapping[uuid.UUID, Collection[Any]],
    *,
    using: str | None = None,
    model: type[Model] = Message,
) -> set[tuple[Any, uuid.UUID]]:
    """Mark messages of several claims succeeded at once; returns the (id, token) still ours.

    One statement per lock token, in one transaction when there are several,
    so the caller learns exactly which acknowledgements took (the others
    were claimed again after their lease expired). Judged per attempt: a
    worker may hold one row under two tokens (it claimed it again after
    losing its lease), and only the attempt whose token the row carries is
    acknowledged.
    """
    alias = _db(using, model)
    if not held:
        return set()
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
            )
            mine.update((pk, token) for pk in kept)
    return mine


def fail(
    message_id: int,
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
        changes.update(
            status=Message.Status.PENDING, next_attempt_time=clock.sql_now_plus(retry_in)
        )
    elif retry_at is None:
        changes.update(status=Message.Status.FAILED, next_attempt_time=None, finished_at=now)
    else:
        changes.update(status=Message.Status.PENDING, next_attempt_time=retry_at)
    return int(
        _update_held(
            [message_id], token, changes, using=using, model=model, skip_locked=skip_locked
        )
    )


def snooze(
    message_id: int,
    token: uuid.UUID,
    *,
    run_at: datetime | timedelta,
    max_attempts: int,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Reschedule without spending an attempt (``Retry``): raise the cap by one.

    ``run_at`` is an instant, or a delay measured on the database's clock.
    """
    when = clock.sql_now_plus(run_at) if isinstance(run_at, timedelta) else run_at
    changes = {
        "status": Message.Status.PENDING,
        "next_attempt_time": when,
        "lock_token": None,
        "max_attempts": max_attempts,
        "updated_at": clock.sql_now(),
    }
    return int(_update_held([message_id], token, changes, using=using, model=model))


def release(
    ids: Iterable[Any],
    token: uuid.UUID,
    *,
    started: bool,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Give messages back for immediate redelivery (shutdown).

    Messages that were claimed but never started get their attempt back.
    A row locked by an open transaction (a group of atomic handlers still
    running past the shutdown grace) is left alone: its transaction ends
    with the process, and the row comes back when its lease expires.
    """
    now = clock.sql_now()
    changes: dict[str, object] = {
        "status": Message.Status.PENDING,
        "next_attempt_time": now,
        "lock_token": None,
        "updated_at": now,
    }
    if not started:
        changes["attempt_count"] = Greatest(F("attempt_count") - 1, Value(0))
    return int(_update_held(ids, token, changes, using=using, model=model, skip_locked=True))


def extend(
    ids: Iterable[Any],
    token: uuid.UUID,
    lease: timedelta,
    *,
    using: str | None = None,
    model: type[Model] = Message,
) -> set[Any]:
    """Push the lease of messages still held; returns the ids extended.

    Rows locked by another transaction are skipped rather than waited for,
    so the lease keeper never stalls behind an open transaction.
    """
    changes = {"next_attempt_time": clock.sql_now_plus(lease), "updated_at": clock.sql_now()}
    return set(
        _update_held(
            ids,
            token,
            changes,
            using=using,
            model=model,
            same_as=("extend", lease),
            skip_locked=True,
            returning=True,
        )
    )


def held_ids(
    ids: Iterable[Any], token: uuid.UUID, *, using: str | None = None, model: type[Model] = Message
) -> set[Any]:
    """Which of ``ids`` are still running under ``token`` (a plain read, no lock)."""
    rows = model._base_manager.using(_db(using, model))
    return set(
        rows.filter(pk__in=list(ids), lock_token=token, status=Message.Status.RUNNING).values_list(
            "pk", flat=True
        )
    )


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
