"""Producing messages: validation, ``on_conflict`` outcomes, batched upserts, wake-up.

Everything is written through the caller's connection and transaction, so a
message enqueued inside ``transaction.atomic()`` exists exactly when the
business data that caused it does. Validation happens before the first
statement: a bad argument raises and writes nothing.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache, partial
from typing import Any, Literal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState
from django.utils import timezone

from django_delayq import clock, signals
from django_delayq.conf import check_delay, get_config, to_timedelta
from django_delayq.exceptions import DuplicateMessage
from django_delayq.models import (
    KEY_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    Message,
    from_returned_rows,
    returned_columns,
)
from django_delayq.payload import encode_payload
from django_delayq.registry import validate_kind, validate_max_attempts, validate_queue_name

OnConflict = Literal["ignore", "update", "error"]
ON_CONFLICT_CHOICES = ("ignore", "update", "error")
NOTIFY_CHANNEL = "django_delayq"

# Rows per INSERT statement: 16 columns x 2,000 rows stays under both
# PostgreSQL's 65,535 and SQLite's 32,766 bound parameters.
CHUNK_SIZE = 2000


class Outcome(enum.StrEnum):
    """What an enqueue did (seed 002's offer outcomes)."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


@dataclass(frozen=True)
class EnqueueResult:
    outcome: Outcome
    message: Message


# -- validation ---------------------------------------------------------------


def _check_key(key: object, where: str = "") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{where}key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError(f"{where}key must not be empty (pass None for a generated key)")
    if len(key) > KEY_MAX_LENGTH:
        raise ValueError(f"{where}key is {len(key)} characters, over {KEY_MAX_LENGTH}")
    if "\x00" in key:
        raise ValueError(f"{where}key contains a NUL character (\\x00)")
    return key


#: The range of ``run_at`` (its wall-clock time, in whatever time zone it is):
#: MariaDB's DATETIME holds the years 1000 to 9999, and a time at either end of
#: Python's ``datetime`` cannot be shown in every time zone (the admin's pages).
RUN_AT_RANGE = (datetime(1000, 1, 2), datetime(9999, 1, 1))


def resolve_run_at(
    run_at: datetime | None, delay: timedelta | int | float | None, now: datetime
) -> datetime:
    """The due time from ``run_at`` or ``delay`` (at most one of them)."""
    if run_at is not None and delay is not None:
        raise ValueError("pass either run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise TypeError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if settings.USE_TZ and timezone.is_naive(run_at):
            raise ValueError(
                "run_at is a naive datetime while USE_TZ is True; pass an aware datetime "
                "(e.g. django.utils.timezone.now() + timedelta(...))"
            )
        earliest, latest = RUN_AT_RANGE
        if not earliest <= run_at.replace(tzinfo=None) < latest:
            raise ValueError(
                f"run_at {run_at.isoformat()} is out of range: it must be from "
                f"{earliest.date()} to {latest.date()}"
            )
        return run_at
    if delay is not None:
        return now + check_delay(delay, "delay")
    return now


def _check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(f"priority {priority} is out of range [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    return priority


# Public name for the other writers of the queue columns (operations.py).
check_priority = _check_priority


def _check_on_conflict(on_conflict: object) -> str:
    if on_conflict not in ON_CONFLICT_CHOICES:
        raise ValueError(
            f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}; got {on_conflict!r}"
        )
    return str(on_conflict)


# -- public API ---------------------------------------------------------------


def enqueue(
    queue: str,
    payload: Any = None,
    *,
    key: str | None = None,
    kind: str = "",
    run_at: datetime | None = None,
    delay: timedelta | int | float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    on_conflict: OnConflict = "ignore",
    using: str | None = None,
) -> EnqueueResult:
    """Put one message on ``queue``, due at ``run_at`` / after ``delay`` / now.

    ``key`` de-duplicates within the queue: an existing key is left alone
    (``ignore``), replaced (``update``: a pending message gets the new payload
    and schedule, a finished one is delivered again), or refused (``error``,
    raising :class:`DuplicateMessage`).
    """
    return enqueue_many(
        queue,
        [payload],
        keys=None if key is None else [key],
        kind=kind,
        run_at=run_at,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
        on_conflict=on_conflict,
        using=using,
    )[0]


def enqueue_many(
    queue: str,
    payloads: Iterable[Any],
    *,
    keys: Sequence[str] | None = None,
    kind: str = "",
    run_at: datetime | None = None,
    delay: timedelta | int | float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    on_conflict: OnConflict = "ignore",
    using: str | None = None,
) -> list[EnqueueResult]:
    """Enqueue many messages in a few statements; one result per payload, in order.

    ``keys=None`` gives each message a fresh unique key. Repeated keys within
    one call count as conflicts with the first occurrence (``update`` keeps
    the last payload). The whole call is one transaction (or part of the
    caller's): either every message is written or none is.
    """
    validate_queue_name(queue)
    validate_kind(kind)
    payloads = list(payloads)
    if keys is None:
        key_list = [uuid.uuid4().hex for _ in payloads]
    else:
        if isinstance(keys, str):
            raise TypeError("keys must be a sequence of str, not a single str")
        key_list = list(keys)
        if len(key_list) != len(payloads):
            raise ValueError(f"got {len(payloads)} payloads but {len(key_list)} keys")
    many = len(payloads) > 1
    encoded: list[str] = []
    for i, (k, p) in enumerate(zip(key_list, payloads, strict=True)):
        where = f"message {i}: " if many else ""
        _check_key(k, where)
        encoded.append(encode_payload(p, where))
    _check_priority(priority)
    max_attempts = validate_max_attempts(max_attempts)
    _check_on_conflict(on_conflict)
    now = clock.now()
    due = resolve_run_at(run_at, delay, now)
    if not payloads:
        return []

    # Repeated keys in one call: the database may only touch a row once per
    # statement, so collapse them here and report the repeats as conflicts.
    first_index: dict[str, int] = {}
    for i, k in enumerate(key_list):
        if k in first_index:
            if on_conflict == "error":
                raise DuplicateMessage(queue, [k])
            if on_conflict == "update":
                payloads[first_index[k]] = payloads[i]
                encoded[first_index[k]] = encoded[i]
        else:
            first_index[k] = i

    template = message_template(
        queue, kind=kind, priority=priority, due=due, max_attempts=max_attempts, now=now
    )
    alias = using or router.db_for_write(Message)
    connection = connections[alias]
    outcomes: dict[str, tuple[Outcome, Message]] = {}
    wake = _notify_body(connection, queue, due)
    if (
        on_conflict == "ignore"
        and wake is not None
        and len(first_index) <= FAST_CHUNK_SIZE
        and not connection.in_atomic_block
        and not signals.message_enqueued.receivers
    ):
        # One statement does it all (insert, NOTIFY): in autocommit it is its
        # own transaction, one round trip instead of BEGIN, INSERT, NOTIFY,
        # COMMIT. Only the read of ignored duplicates may follow, and it writes
        # nothing.
        keys_in_order = sorted(first_index)
        outcomes = _insert_new(
            connection,
            template,
            keys_in_order,
            [encoded[first_index[k]] for k in keys_in_order],
            [payloads[first_index[k]] for k in keys_in_order],
            wake=wake,
        )
        return _results(key_list, first_index, outcomes, on_conflict)
    with transaction.atomic(using=alias, savepoint=on_conflict == "error"):
        if connection.vendor == "mysql":
            # No RETURNING: JSON_TABLE inserts, exact outcomes (mysql.write).
            from django_delayq import mysql

            outcomes.update(
                mysql.write(
                    connection,
                    template,
                    list(first_index),
                    {k: encoded[i] for k, i in first_index.items()},
                    {k: payloads[i] for k, i in first_index.items()},
                    on_conflict,
                )
            )
        elif on_conflict != "update" and _supports_upsert_returning(connection):
            # Sorted: producers whose batches overlap take the key locks in the
            # same order, so they wait for each other instead of deadlocking.
            keys_in_order = sorted(first_index)
            for start in range(0, len(keys_in_order), FAST_CHUNK_SIZE):
                chunk = keys_in_order[start : start + FAST_CHUNK_SIZE]
                outcomes.update(
                    _insert_new(
                        connection,
                        template,
                        chunk,
                        [encoded[first_index[k]] for k in chunk],
                        [payloads[first_index[k]] for k in chunk],
                        # The NOTIFY rides on the insert: one round trip less.
                        wake=wake if on_conflict == "ignore" else None,
                    )
                )
            if on_conflict == "ignore":
                wake = None
        else:
            rows = [_row(template, k, payloads[i]) for k, i in first_index.items()]
            for start in range(0, len(rows), CHUNK_SIZE):
                chunk_rows = rows[start : start + CHUNK_SIZE]
                outcomes.update(_write_chunk(connection, chunk_rows, on_conflict))
        if on_conflict == "error":
            clashes = [k for k, (o, _) in outcomes.items() if o is Outcome.IGNORED]
            if clashes:
                raise DuplicateMessage(queue, clashes)
        if wake is not None and any(o is not Outcome.IGNORED for o, _ in outcomes.values()):
            notify(connection, queue, due)
        if signals.message_enqueued.receivers:
            # On commit of the caller's transaction: a message rolled back
            # with the business data that caused it is never announced.
            changed = [(o, m) for o, m in outcomes.values() if o is not Outcome.IGNORED]
            transaction.on_commit(partial(_announce, changed, alias), using=alias)

    return _results(key_list, first_index, outcomes, on_conflict)


def _results(
    key_list: list[str],
    first_index: dict[str, int],
    outcomes: dict[str, tuple[Outcome, Message]],
    on_conflict: OnConflict,
) -> list[EnqueueResult]:
    """One result per requested key, in order; a key repeated in the call is a conflict."""
    results: list[EnqueueResult] = []
    for i, k in enumerate(key_list):
        outcome, message = outcomes[k]
        if first_index[k] != i:
            outcome = Outcome.UPDATED if on_conflict == "update" else Outcome.IGNORED
        results.append(EnqueueResult(outcome, message))
    return results


def _announce(changed: Sequence[tuple[Outcome, Message]], using: str) -> None:
    for outcome, message in changed:
        signals.send(signals.message_enqueued, message=message, outcome=outcome, using=using)


async def aenqueue(
    queue: str,
    payload: Any = None,
    *,
    key: str | None = None,
    kind: str = "",
    run_at: datetime | None = None,
    delay: timedelta | int | float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    on_conflict: OnConflict = "ignore",
    using: str | None = None,
) -> EnqueueResult:
    """``enqueue`` for async code (async views, ASGI consumers); same arguments.

    Django runs database work of async code in a thread (``sync_to_async``
    with ``thread_sensitive=True``, as the ORM's async methods do), and a
    transaction cannot span ``await``: the message is written and committed
    in a transaction of its own, like ``Model.objects.acreate``. When it must
    commit together with other writes, put them and ``enqueue`` in one sync
    function under ``transaction.atomic()`` and await that function through
    ``sync_to_async``.
    """
    return await sync_to_async(enqueue, thread_sensitive=True)(
        queue,
        payload,
        key=key,
        kind=kind,
        run_at=run_at,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
        on_conflict=on_conflict,
        using=using,
    )


async def aenqueue_many(
    queue: str,
    payloads: Iterable[Any],
    *,
    keys: Sequence[str] | None = None,
    kind: str = "",
    run_at: datetime | None = None,
    delay: timedelta | int | float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    on_conflict: OnConflict = "ignore",
    using: str | None = None,
) -> list[EnqueueResult]:
    """``enqueue_many`` for async code; one transaction of its own (see ``aenqueue``)."""
    return await sync_to_async(enqueue_many, thread_sensitive=True)(
        queue,
        list(payloads),
        keys=keys,
        kind=kind,
        run_at=run_at,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
        on_conflict=on_conflict,
        using=using,
    )


# -- writing ------------------------------------------------------------------

# Rows per statement on the fast path, where rows travel as two arrays (or one
# JSON document) rather than as bound parameters each.
FAST_CHUNK_SIZE = 5000


def message_template(
    queue: str, *, kind: str, priority: int, due: datetime, max_attempts: int | None, now: datetime
) -> Message:
    """What every message of one enqueue shares: everything but its key and payload.

    Also the template of the Spark pipeline's bulk enqueue
    (``contrib/spark/database.py``), so both write the same columns. Built
    from a blank message made once: ``Model.__init__`` costs more than the
    rest of a single enqueue's Python work.
    """
    template = _row(_blank(), "", None)
    template.queue = queue
    template.kind = kind
    template.priority = priority
    template.next_attempt_time = template.scheduled_time = due
    template.max_attempts = max_attempts
    template.created_at = template.updated_at = now
    return template


@cache
def _blank() -> Message:
    # The times are set by message_template; the epoch only stands in.
    epoch = datetime.fromtimestamp(0, tz=UTC)
    return Message(
        queue="",
        key="",
        payload=None,
        status=Message.Status.PENDING,
        scheduled_time=epoch,
        created_at=epoch,
        updated_at=epoch,
    )


def _row(template: Message, key: str, payload: Any, pk: int | None = None) -> Message:
    """A copy of ``template`` for one message, without running ``Model.__init__``."""
    message = Message.__new__(Message)
    message.__dict__.update(template.__dict__)
    message._state = state = ModelState()
    message.key = key
    message.payload = payload
    if pk is not None:
        message.id = pk
        state.adding = False
    return message


# The template's columns that differ between calls (message_template's
# arguments); every other column of a new message is the same for all.
_PER_CALL_FIELDS = frozenset(
    {"queue", "kind", "priority", "next_attempt_time", "scheduled_time", "max_attempts"}
    | {"created_at", "updated_at"}
)


@dataclass(frozen=True)
class _NewRowsStatement:
    """The INSERT of new keys for one database backend, built once per process.

    Building it (quoting, column types) costs more than sending it; only the
    parameters are computed per call: first ``per_call`` from the template,
    then ``constants`` (prepared once), then the rows themselves.
    """

    sql: str
    per_call: tuple[Any, ...]
    constants: tuple[Any, ...]

    def params(self, template: Message, connection: BaseDatabaseWrapper) -> list[Any]:
        params = [
            field.get_db_prep_save(getattr(template, field.attname), connection)
            for field in self.per_call
        ]
        params.extend(self.constants)
        return params


_statements: dict[tuple[type, bool], _NewRowsStatement] = {}


def _new_rows_statement(connection: BaseDatabaseWrapper, wake: bool) -> _NewRowsStatement:
    cache_key = (type(connection), wake)
    statement = _statements.get(cache_key)
    if statement is None:
        statement = _statements[cache_key] = _build_new_rows_statement(connection, wake)
    return statement


def _build_new_rows_statement(connection: BaseDatabaseWrapper, wake: bool) -> _NewRowsStatement:
    qn = connection.ops.quote_name
    postgres = connection.vendor == "postgresql"
    columns: list[str] = []
    values: list[str] = []
    per_call = [f for f in _INSERT_FIELDS if f.name in _PER_CALL_FIELDS]
    constant = [f for f in _INSERT_FIELDS if f.name not in _PER_CALL_FIELDS | {"key", "payload"}]
    for field in [*per_call, *constant]:
        columns.append(qn(str(field.column)))
        values.append(f"%s::{field.db_type(connection)}" if postgres else "%s")
    columns += [qn("key"), qn("payload")]
    if postgres:
        values += ["u.value->>0", "u.value->1"]
        source = "jsonb_array_elements(%s::jsonb) AS u(value)"
    else:
        values += ["json_extract(u.value, '$[0]')", "json_extract(u.value, '$[1]')"]
        source = "json_each(%s) AS u"
    sql = (
        f"INSERT INTO {qn(Message._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM {source} "
        # SQLite needs a WHERE to tell the upsert clause from a join condition.
        f"{'' if postgres else 'WHERE true '}"
        f"ON CONFLICT ({qn('queue')}, {qn('key')}) DO NOTHING RETURNING {qn('id')}, {qn('key')}"
    )
    if wake and postgres:
        # pg_notify is evaluated once (a materialised CTE), only if a row was
        # created; like any NOTIFY it is delivered when the transaction commits.
        sql = (
            f"WITH ins AS ({sql}), "
            "wake AS MATERIALIZED (SELECT pg_notify(%s, %s) WHERE EXISTS (SELECT 1 FROM ins)) "
            "SELECT ins.* FROM ins LEFT JOIN wake ON true"
        )
    blank = _blank()
    return _NewRowsStatement(
        sql,
        tuple(per_call),
        tuple(f.get_db_prep_save(getattr(blank, f.attname), connection) for f in constant),
    )


def _insert_new(
    connection: BaseDatabaseWrapper,
    template: Message,
    keys: list[str],
    encoded: list[str],
    payloads: list[Any],
    wake: str | None = None,
) -> dict[str, tuple[Outcome, Message]]:
    """Insert the keys that are new, in one statement; existing keys are IGNORED.

    Only the key and the payload differ between the messages of one call, so
    they travel as one JSON document (PostgreSQL ``jsonb_array_elements``,
    SQLite ``json_each``) and every other column is a single parameter: the
    statement stays small whatever the batch size, its text is the same for
    every call (built once, and prepared by psycopg where the connection
    allows it), and neither Django nor the driver handles thousands of
    placeholders.

    With ``wake`` (PostgreSQL), the same statement sends the NOTIFY when it
    created at least one row.
    """
    wake = wake if connection.vendor == "postgresql" else None
    statement = _new_rows_statement(connection, wake is not None)
    params = statement.params(template, connection)
    # One JSON document [[key, payload], ...], joined from the payloads'
    # checked text: one parameter to send, however many messages.
    params.append(
        "["
        + ",".join(
            f"[{json.dumps(k, ensure_ascii=False)},{e}]" for k, e in zip(keys, encoded, strict=True)
        )
        + "]"
    )
    if wake is not None:
        params += [NOTIFY_CHANNEL, wake]
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, params)
        created = dict((key, pk) for pk, key in cursor.fetchall())
    out: dict[str, tuple[Outcome, Message]] = {}
    for key, payload in zip(keys, payloads, strict=True):
        if key in created:
            out[key] = (Outcome.CREATED, _row(template, key, payload, created[key]))
            out[key][1]._state.db = connection.alias
    missing = [k for k in keys if k not in created]
    if missing:
        found = Message.objects.using(connection.alias).filter(
            queue=template.queue, key__in=missing
        )
        for message in found:
            out[message.key] = (Outcome.IGNORED, message)
    return out


_INSERT_FIELDS = [f for f in Message._meta.concrete_fields if not f.primary_key]
_FINISHED_SQL = "('succeeded', 'failed', 'cancelled')"


def _supports_upsert_returning(connection: BaseDatabaseWrapper) -> bool:
    if connection.vendor == "postgresql":
        return True
    return connection.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)


def _write_chunk(
    connection: BaseDatabaseWrapper, rows: list[Message], on_conflict: str
) -> dict[str, tuple[Outcome, Message]]:
    if _supports_upsert_returning(connection):
        return _upsert_returning(connection, rows, on_conflict)
    return _select_then_write(connection, rows, on_conflict)


def _upsert_returning(
    connection: BaseDatabaseWrapper, rows: list[Message], on_conflict: str
) -> dict[str, tuple[Outcome, Message]]:
    """One ``INSERT ... ON CONFLICT ... RETURNING`` per chunk (PostgreSQL, SQLite).

    ``update`` only rewrites rows that differ (same content is IGNORED, as in
    seed 002). A running message that is updated loses its lease token, so
    the running attempt can no longer acknowledge it, but it stays invisible
    until that lease expires: the new version never runs beside the old one.
    """
    qn = connection.ops.quote_name
    table = qn(Message._meta.db_table)
    cols = [qn(str(f.column)) for f in _INSERT_FIELDS]
    placeholder = "(" + ", ".join(["%s"] * len(cols)) + ")"
    params: list[Any] = []
    for row in rows:
        params.extend(
            f.get_db_prep_save(getattr(row, f.attname), connection) for f in _INSERT_FIELDS
        )
    sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES " + ", ".join([placeholder] * len(rows))
    sql += f" ON CONFLICT ({qn('queue')}, {qn('key')}) "
    existing: set[str] = set()
    if on_conflict == "update":
        sql += _update_clause(connection, table)
        if connection.vendor != "postgresql":
            # Without xmax, tell inserts from updates by what was there before;
            # SQLite serialises writers, so this cannot race within our write.
            existing = set(
                Message.objects.using(connection.alias)
                .filter(queue=rows[0].queue, key__in=[r.key for r in rows])
                .values_list("key", flat=True)
            )
    else:
        sql += "DO NOTHING"
    returning = returned_columns(Message, qn)
    if connection.vendor == "postgresql":
        returning += ", (xmax = 0)"
    sql += f" RETURNING {returning}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()

    out: dict[str, tuple[Outcome, Message]] = {}
    for values, message in zip(
        fetched, from_returned_rows(Message, connection, fetched), strict=True
    ):
        if connection.vendor == "postgresql":
            inserted = bool(values[-1])
        else:
            inserted = message.key not in existing
        out[message.key] = (Outcome.CREATED if inserted else Outcome.UPDATED, message)
    missing = [r.key for r in rows if r.key not in out]
    if missing:
        found = Message.objects.using(connection.alias).filter(queue=rows[0].queue, key__in=missing)
        for message in found:
            out[message.key] = (Outcome.IGNORED, message)
    return out


def _update_clause(connection: BaseDatabaseWrapper, table: str) -> str:
    qn = connection.ops.quote_name

    def c(name: str) -> str:
        return qn(name)

    distinct = "IS DISTINCT FROM" if connection.vendor == "postgresql" else "IS NOT"
    finished = f"{table}.{c('status')} IN {_FINISHED_SQL}"
    sets = {
        "payload": f"excluded.{c('payload')}",
        "kind": f"excluded.{c('kind')}",
        "priority": f"excluded.{c('priority')}",
        "max_attempts": f"excluded.{c('max_attempts')}",
        "scheduled_time": f"excluded.{c('scheduled_time')}",
        "updated_at": f"excluded.{c('updated_at')}",
        "next_attempt_time": (
            f"CASE WHEN {table}.{c('status')} = 'running' AND {table}.{c('next_attempt_time')} "
            f"> excluded.{c('next_attempt_time')} THEN {table}.{c('next_attempt_time')} "
            f"ELSE excluded.{c('next_attempt_time')} END"
        ),
        "attempt_count": f"CASE WHEN {finished} THEN 0 ELSE {table}.{c('attempt_count')} END",
        "last_error": f"CASE WHEN {finished} THEN '' ELSE {table}.{c('last_error')} END",
        "last_traceback": f"CASE WHEN {finished} THEN '' ELSE {table}.{c('last_traceback')} END",
        "finished_at": "NULL",
        "lock_token": "NULL",
        "status": "'pending'",
    }
    # SQLite keeps JSON as text: compare the minified forms, not the spelling.
    payload_cmp = (
        f"{table}.{c('payload')} {distinct} excluded.{c('payload')}"
        if connection.vendor == "postgresql"
        else f"json({table}.{c('payload')}) IS NOT json(excluded.{c('payload')})"
    )
    changed = " OR ".join(
        [f"{table}.{c('status')} <> 'pending'", payload_cmp]
        + [
            f"{table}.{c(name)} {distinct} excluded.{c(name)}"
            for name in ("kind", "priority", "max_attempts", "next_attempt_time")
        ]
    )
    assignments = ", ".join(f"{c(k)} = {v}" for k, v in sets.items())
    return f"DO UPDATE SET {assignments} WHERE {changed}"


def _select_then_write(
    connection: BaseDatabaseWrapper, rows: list[Message], on_conflict: str
) -> dict[str, tuple[Outcome, Message]]:
    """Portable path for databases without ``ON CONFLICT ... RETURNING``.

    The existing keys are read with ``FOR UPDATE`` so that, on InnoDB, the
    unique index's gap locks keep a concurrent producer from slipping the
    same key in between the read and the write.
    """
    qs = Message.objects.using(connection.alias)
    queue = rows[0].queue
    existing = {
        m.key: m for m in qs.select_for_update().filter(queue=queue, key__in=[r.key for r in rows])
    }
    new = [r for r in rows if r.key not in existing]
    qs.bulk_create(new)
    created = {m.key: m for m in qs.filter(queue=queue, key__in=[r.key for r in new])}
    out: dict[str, tuple[Outcome, Message]] = {k: (Outcome.CREATED, m) for k, m in created.items()}
    for row in rows:
        current = existing.get(row.key)
        if current is None:
            continue
        if on_conflict != "update" or _same_content(current, row):
            out[row.key] = (Outcome.IGNORED, current)
            continue
        _apply_update(current, row)
        current.save(using=connection.alias)
        out[row.key] = (Outcome.UPDATED, current)
    return out


def _same_content(current: Message, row: Message) -> bool:
    return current.status == Message.Status.PENDING and all(
        getattr(current, f) == getattr(row, f)
        for f in ("payload", "kind", "priority", "max_attempts", "next_attempt_time")
    )


def _apply_update(current: Message, row: Message) -> None:
    """Python twin of ``_update_clause`` for the portable path."""
    if current.status in Message.FINISHED_STATUSES:
        current.attempt_count = 0
        current.last_error = current.last_traceback = ""
    if not (
        current.status == Message.Status.RUNNING
        and current.next_attempt_time
        and row.next_attempt_time
        and current.next_attempt_time > row.next_attempt_time
    ):
        current.next_attempt_time = row.next_attempt_time
    for name in ("payload", "kind", "priority", "max_attempts", "scheduled_time", "updated_at"):
        setattr(current, name, getattr(row, name))
    current.finished_at = None
    current.lock_token = None
    current.status = Message.Status.PENDING


# -- wake-up ------------------------------------------------------------------


def _notify_body(connection: BaseDatabaseWrapper, queue: str, due: datetime) -> str | None:
    """The NOTIFY payload for a wake-up, or None where there is no NOTIFY.

    It carries the due time so that a worker sleeping until a later message
    shortens its sleep for a sooner one. A message due after the next poll
    needs none: an idle worker sleeps at most ``POLL_INTERVAL`` and then
    looks up the next due time, so it learns of the message before it is
    due (and the NOTIFY would cost every commit a global lock for nothing).
    """
    config = get_config()
    if connection.vendor != "postgresql" or not config["NOTIFY"]:
        return None
    if due - clock.now() > to_timedelta(config["POLL_INTERVAL"]):
        return None
    return json.dumps({"queue": queue, "due": due.timestamp()})


def notify(connection: BaseDatabaseWrapper, queue: str, due: datetime) -> None:
    """Wake idle workers on PostgreSQL; sent on commit, dropped on rollback."""
    body = _notify_body(connection, queue, due)
    if body is None:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, body])
