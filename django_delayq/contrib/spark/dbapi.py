"""What Spark's executors run against the database: bulk upsert and guarded delete.

This module runs inside Spark's Python workers, possibly on other machines,
so it imports neither Django nor the rest of the project: the connection
parameters, the SQL and its parameters are built on the driver from Django's
own connection (``database.py``) and shipped in small picklable plans.

Both writers are idempotent, which is what makes a retried Spark task
harmless: a partition's rows are upserted on ``(queue, key)``, so a second
attempt finds them and counts them as ignored; a delete names exact row
versions, so a second attempt deletes nothing more.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)

# Rows per transaction: a partition commits every this many rows, so a big
# input never holds one giant transaction and workers start consuming early.
LOAD_BATCH_ROWS = 50_000
DELETE_BATCH_ROWS = 20_000

# grp: each row's ordered group ("" for none), when the load has a group column.
# Created in every transaction and dropped at its end: a temporary table is
# session state, which a pooler in transaction mode (PgBouncer) does not keep
# from one transaction to the next.
_PG_TEMP = (
    "CREATE TEMP TABLE IF NOT EXISTS delayq_load "
    "(ord bigint, key text, payload text, due text, grp text) ON COMMIT DROP"
)
_SQLITE_TEMP = (
    "CREATE TEMP TABLE IF NOT EXISTS delayq_load "
    "(ord INTEGER, key TEXT, payload TEXT, due TEXT, grp TEXT)"
)


@dataclass(frozen=True)
class DbTarget:
    """How an executor connects: the driver's Django connection, minus Django."""

    client: str  # the DB-API module (Features.client): "psycopg", "sqlite3" or "MySQLdb"
    params: dict[str, Any]  # keyword arguments of its connect()
    # Run on connecting: SQLite's PRAGMAs from OPTIONS["init_command"];
    # MariaDB/MySQL's isolation level (Django's is set the same way).
    init_sql: tuple[str, ...] = ()


def connect(target: DbTarget) -> Any:
    if target.client == "psycopg":
        import psycopg

        return psycopg.connect(**target.params)
    if target.client == "MySQLdb":
        import MySQLdb

        conn = MySQLdb.connect(**target.params, autocommit=False)
        cur = conn.cursor()
        for statement in target.init_sql:
            cur.execute(statement)
        cur.close()
        return conn
    conn = sqlite3.connect(**target.params, isolation_level=None)
    for statement in target.init_sql:
        conn.execute(statement)
    return conn


@dataclass(frozen=True)
class LoadPlan:
    """A partition's bulk upsert: temp table in, one ``INSERT ... SELECT`` out."""

    target: DbTarget
    queue: str
    upsert_sql: str
    upsert_params: tuple[Any, ...]
    writer: str  # Features.bulk_writer: "copy", "existing_keys" or "insert_ignore"
    # SQLite only: how many of the loaded keys exist already (created vs updated).
    existing_sql: str = ""
    notify_channel: str | None = None  # PostgreSQL with DELAYQ["NOTIFY"]
    batch_rows: int = LOAD_BATCH_ROWS
    # Grouped loads: rows are (key, payload, due, group), written in the order
    # given; then this statement holds what waits behind its group, in the
    # same transaction (store.groups.hold_back_loaded).
    hold_back_sql: str = ""
    hold_back_params: tuple[Any, ...] = ()
    # MariaDB/MySQL: the temporary table's DDL, and with update the upsert of
    # existing keys (store.loader.bulk_load).
    table_sql: str = ""
    update_sql: str = ""

    @property
    def grouped(self) -> bool:
        return bool(self.hold_back_sql)


@dataclass
class LoadCounts:
    rows: int = 0
    created: int = 0
    updated: int = 0
    transactions: int = 0
    notifies: int = 0

    @property
    def ignored(self) -> int:
        """Rows that changed nothing: their key was there already, or repeated in the batch."""
        return self.rows - self.created - self.updated

    def add(self, rows: int, created: int, updated: int) -> None:
        self.rows += rows
        self.created += created
        self.updated += updated
        self.transactions += 1

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        """``(rows, created, updated, ignored, transactions, notifies)``."""
        return (
            self.rows,
            self.created,
            self.updated,
            self.ignored,
            self.transactions,
            self.notifies,
        )


def write_partition(plan: LoadPlan, rows: Iterable[Any]) -> Iterator[tuple[int, ...]]:
    """Upsert one partition's ``(key, payload_json, due_text)`` rows; yield its counts.

    One connection for the whole task; one transaction per ``batch_rows``
    rows. Within a batch a repeated key is written once (the first
    occurrence with ``ignore``, the last with ``update``) and the others are
    counted as ignored, like ``enqueue_many``.

    A grouped plan takes ``(key, payload_json, due_text, group)`` rows and
    writes them in the order it gets them, batch after batch, so the ids of
    a group's rows follow that order; each batch's transaction then holds
    the rows that an earlier message of their group holds back (written by
    this batch, an earlier one, or anyone before), as ``enqueue_many`` does.
    """
    writer = _WRITERS[plan.writer]
    yield writer(plan, map(_as_enqueue_writes, rows)).as_tuple()


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict, or :class:`_RepeatedKey` if a key comes twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return obj


_LINE_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs)


def parse_line(line: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)``: one JSON line as an object, or ``(None, reason)``.

    Python's own parser, as ``json.loads`` reads a payload's text, with the
    depth bounded first (``payload.check_text_depth``). An object that names
    a key twice is refused: which of its values the line means is a guess
    (Spark's reader stopped the whole run at it; ``json.loads`` keeps the
    last).
    """
    from django_delayq.payload import MAX_PAYLOAD_DEPTH, check_text_depth

    try:
        check_text_depth(line)
        value = _LINE_DECODER.decode(line)
    except _RepeatedKey as exc:
        return None, f"the line repeats the key {exc.key!r} in one object"
    except RecursionError:  # not reached: the depth is bounded above
        return None, f"the line is nested deeper than MAX_PAYLOAD_DEPTH ({MAX_PAYLOAD_DEPTH})"
    except ValueError as exc:
        if "MAX_PAYLOAD_DEPTH" in str(exc):
            return None, str(exc)
        return None, f"malformed JSON line: {exc}"
    if not isinstance(value, dict):
        return None, f"malformed JSON line: a {type(value).__name__}, not an object"
    return value, None


def json_kind(value: Any) -> str:
    """What JSON calls ``value``'s type: object, array, string, number, boolean or null."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


# What a JSON line's key, group, order and run-at column may hold; what else
# it holds makes the row a rejected row, with why.
_PLAIN_KINDS = {
    "key": ({"string", "number", "boolean", "null"}, "a key must be text or a number"),
    "group": ({"string", "number", "boolean", "null"}, "a group must be text or a number"),
    "order": (
        {"string", "number", "boolean", "null"},
        "rows are ordered by a number, text, a date or a timestamp",
    ),
    "run-at": ({"string", "null"}, "it must hold ISO 8601 text"),
    "after": (
        {"string", "number", "boolean", "array", "null"},
        "it must hold a parent's key (text or a number) or an array of them",
    ),
}
_PARENT_KINDS = {"string", "number", "boolean"}


def decode_line(
    payload: tuple[str, ...],
    plain: tuple[tuple[str, str], ...],
    columns: tuple[str, ...] | None,
    line: str,
) -> tuple[str | None, str | None, str | None]:
    """``(payload JSON text, None, row)`` from one JSON line, or ``(None, reason, None)``.

    ``payload``: the names of the payload's columns; ``plain``: ``(name,
    role)`` of the key, group, order, run-at and after columns, whose values must
    be of a kind their role takes (``_PLAIN_KINDS``); ``columns``: every
    column of the data set, to give ``row``, the whole row's JSON text (every
    column, null where the line has none, as ``enqueue`` writes it), which
    keys a row without a key column; None: no ``row``.

    Checked as ``enqueue`` checks a payload (``payload.py``: the same types,
    floats, depth, lone surrogates); the size is checked in the JVM with the
    other rows' sizes. Runs on the executors, without Django's settings.
    """
    from django_delayq.payload import dumps, encode_payload
    from django_delayq.values import SURROGATE, escape_surrogates

    value, reason = parse_line(line)
    if value is None:
        return None, reason, None
    for name, role in plain:
        found = value.get(name)
        kind = json_kind(found)
        kinds, why = _PLAIN_KINDS[role]
        if kind not in kinds:
            article = "an" if kind[0] in "aeiou" else "a"
            return None, f"{role} column {name!r} holds {article} {kind}; {why}", None
        if isinstance(found, list):  # the after column's parents
            inner = next((json_kind(v) for v in found if json_kind(v) not in _PARENT_KINDS), None)
            if inner is not None:
                article = "an" if inner[0] in "aeiou" else "a"
                return None, f"{role} column {name!r} holds {article} {inner} parent; {why}", None
        # Spark would write it as "?": a JSON escape (\ud800) is the only way in.
        lone = SURROGATE.search(found) if isinstance(found, str) else None
        if lone is not None:
            return (
                None,
                f"{role} column {name!r} contains a lone surrogate "
                f"({escape_surrogates(lone.group())} at character {lone.start()}), which is "
                "no UTF-8 text and no database stores",
                None,
            )
    try:
        text = encode_payload({n: value.get(n) for n in payload}, max_size=0)
    except (TypeError, ValueError) as exc:
        return None, str(exc), None
    row = None
    if columns is not None:  # escaped: a column left out of the payload may hold one
        row = escape_surrogates(dumps({n: value.get(n) for n in columns}))
    return text, None, row


# Spark's type for a JSON number of each kind (scan_lines), as its schema
# inference gives one: an integer is a bigint, or a decimal(38,0) past a
# bigint, or a double past 38 digits; a number with a fraction or an
# exponent is a double.
_INTEGER_KINDS = ((2**63, "bigint"), (10**38, "decimal"))


def _number_kind(value: Any) -> str:
    if isinstance(value, int):
        for bound, kind in _INTEGER_KINDS:
            if -bound <= value < bound:
                return kind
    return "double"


def scan_lines(order: str | None, rows: Iterable[Any]) -> Iterator[tuple[list[str], list[str]]]:
    """One partition of JSON lines: (its column names, the kinds of value of ``order``).

    The names are every top-level key of every line that is an object (as
    ``parse_line`` reads it), first seen first; the kinds (``json_kind``,
    with numbers as ``bigint``, ``decimal`` or ``double``) are those of the
    order column's values, from which its type is chosen
    (``sources.order_type``).
    """
    names: dict[str, None] = {}
    kinds: set[str] = set()
    for (line,) in rows:
        value, _ = parse_line(line)
        if value is None:
            continue
        names.update(dict.fromkeys(value))
        if order is not None:
            kind = json_kind(value.get(order))
            kinds.add(_number_kind(value[order]) if kind == "number" else kind)
    yield list(names), sorted(kinds)


# A number in exponent notation as Java writes one (1.0E16, 4.9E-324); a
# string's text may match too, which only costs a second encoding.
_JAVA_EXPONENT = re.compile(r"[0-9]E-?[0-9]")


def _as_enqueue_writes(row: Any) -> Any:
    """The row, its payload's floats written as ``enqueue`` writes them.

    ``to_json`` writes a double of 10**7 or more, or under 10**-3, with an
    exponent, and PostgreSQL's jsonb keeps the digits, not the notation:
    ``1.0E16`` came back as the int 10**16.
    """
    payload = row[1]
    if payload is None or not _JAVA_EXPONENT.search(payload):
        return row
    from django_delayq.payload import dumps

    return (row[0], dumps(json.loads(payload)), *row[2:])


def _write_copy(plan: LoadPlan, rows: Iterator[Any]) -> LoadCounts:
    """PostgreSQL: ``COPY`` into the temporary table, then one upsert that returns
    what it created and updated, and the first due time (for ``NOTIFY``)."""
    counts = LoadCounts()
    with connect(plan.target) as conn:
        cur = conn.cursor()
        while True:
            loaded = 0
            cur.execute(_PG_TEMP)
            with cur.copy(f"COPY delayq_load ({_columns(plan)}) FROM STDIN") as copy:
                for loaded, row in enumerate(islice(rows, plan.batch_rows), 1):
                    copy.write_row((loaded, *row))
            if not loaded:
                conn.rollback()
                break
            cur.execute(plan.upsert_sql, plan.upsert_params)
            created, updated, first_due = cur.fetchone()
            if plan.grouped:
                cur.execute(plan.hold_back_sql, plan.hold_back_params)
            if plan.notify_channel and (created or updated):
                # Delivered on commit: one wake-up per transaction, not per row.
                body = json.dumps({"queue": plan.queue, "due": first_due.timestamp()})
                cur.execute("SELECT pg_notify(%s, %s)", [plan.notify_channel, body])
                counts.notifies += 1
            conn.commit()
            counts.add(loaded, created, updated)
    return counts


def _write_existing_keys(plan: LoadPlan, rows: Iterator[Any]) -> LoadCounts:
    """SQLite: the rows go into the temporary table and the upsert runs in one
    ``BEGIN IMMEDIATE`` transaction; created are the loaded keys that were not
    there before it, updated the rest of its changes."""
    counts = LoadCounts()
    conn = connect(plan.target)
    try:
        conn.execute(_SQLITE_TEMP)
        while True:
            batch = list(islice(rows, plan.batch_rows))
            if not batch:
                break
            # IMMEDIATE: the write lock from the start, so the count of
            # existing keys below cannot change before the upsert.
            conn.execute("BEGIN IMMEDIATE")
            try:
                columns = _columns(plan)
                marks = ", ".join("?" * (columns.count(",") + 1))
                conn.executemany(
                    f"INSERT INTO temp.delayq_load ({columns}) VALUES ({marks})",
                    ((i, *r) for i, r in enumerate(batch)),
                )
                distinct = conn.execute("SELECT count(DISTINCT key) FROM temp.delayq_load")
                keys = distinct.fetchone()[0]
                existing = conn.execute(plan.existing_sql, [plan.queue]).fetchone()[0]
                before = conn.total_changes
                conn.execute(plan.upsert_sql, plan.upsert_params)
                written = conn.total_changes - before
                if plan.grouped:
                    conn.execute(plan.hold_back_sql, plan.hold_back_params)
                conn.execute("DELETE FROM temp.delayq_load")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            created = keys - existing
            counts.add(len(batch), created, written - created)
    finally:
        conn.close()
    return counts


def _write_insert_ignore(plan: LoadPlan, rows: Iterator[Any]) -> LoadCounts:
    """MariaDB/MySQL: multi-row INSERTs into the temporary table, then INSERT IGNORE
    (its row count: the keys it created) and, with update, the same rows with
    ON DUPLICATE KEY UPDATE (2 per row it changed, 0 per row left alone: the
    connection does not ask for found rows). Each batch is one transaction, the
    temporary table's rows included, so a failed batch leaves nothing behind."""
    counts = LoadCounts()
    conn = connect(plan.target)
    try:
        cur = conn.cursor()
        cur.execute(plan.table_sql)
        columns = _columns(plan).replace("key", "`key`")
        marks = ", ".join(["%s"] * (columns.count(",") + 1))
        load = f"INSERT INTO delayq_load ({columns}) VALUES ({marks})"
        while batch := list(islice(rows, plan.batch_rows)):
            try:
                cur.executemany(load, [(i, *r) for i, r in enumerate(batch)])
                cur.execute(plan.upsert_sql, plan.upsert_params)
                created, updated = cur.rowcount, 0
                if plan.update_sql:
                    cur.execute(plan.update_sql, plan.upsert_params)
                    updated = cur.rowcount // 2
                if plan.grouped:
                    cur.execute(plan.hold_back_sql, plan.hold_back_params)
                cur.execute("DELETE FROM delayq_load")
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            counts.add(len(batch), created, updated)
    finally:
        conn.close()
    return counts


_WRITERS = {
    "copy": _write_copy,
    "existing_keys": _write_existing_keys,
    "insert_ignore": _write_insert_ignore,
}


def _columns(plan: LoadPlan) -> str:
    return "ord, key, payload, due, grp" if plan.grouped else "ord, key, payload, due"


# -- the archive's delete -------------------------------------------------------


@dataclass(frozen=True)
class DeletePlan:
    """Delete archived rows, each only if it is still the version archived.

    The statements come from the data-access layer (``store/sql``):
    PostgreSQL deletes matching versions in one statement and counts what
    is left (``delete_sql``, ``count_sql``); SQLite and MariaDB/MySQL read
    the current versions (``select_sql``: MariaDB/MySQL lock them), compare
    them here and delete by id.
    """

    target: DbTarget
    delete_sql: str
    # Features.archive_delete: "one_statement", "lock_rows" or "lock_database".
    deleter: str
    count_sql: str = ""
    select_sql: str = ""
    finished: tuple[str, ...] = ("succeeded", "failed", "cancelled")
    batch_rows: int = DELETE_BATCH_ROWS


def delete_partition(plan: DeletePlan, rows: Iterable[Any]) -> Iterator[tuple[int, int]]:
    """Delete ``(id, status, attempt_count, updated_us, finished_us)`` rows; yield (deleted, kept).

    A row is deleted only if it is still finished with the same status,
    attempt count, ``updated_at`` and ``finished_at`` as the archived copy:
    every writer of the queue columns bumps ``updated_at``, so a message
    retried from the admin since it was read (even one that has finished
    again) no longer matches, and stays. ``kept`` counts such rows.
    """
    deleter = _delete_one_statement if plan.deleter == "one_statement" else _delete_checked
    deleted = kept = 0
    it = iter(rows)
    conn = connect(plan.target)
    try:
        while batch := list(islice(it, plan.batch_rows)):
            d, k = deleter(plan, conn, batch)
            deleted += d
            kept += k
    finally:
        conn.close()
    yield deleted, kept


def _delete_one_statement(plan: DeletePlan, conn: Any, batch: list[Any]) -> tuple[int, int]:
    ids, statuses, attempts, updated, finished = (list(col) for col in zip(*batch, strict=True))
    with conn.transaction():
        cur = conn.cursor()
        # Re-checked by the DELETE itself: a row updated concurrently is
        # re-evaluated against its new version (READ COMMITTED) and skipped.
        cur.execute(plan.delete_sql, [ids, statuses, attempts, updated, finished])
        deleted = cur.rowcount
        cur.execute(plan.count_sql, [ids])
        kept = cur.fetchone()[0]
    return deleted, kept


def _micros(value: Any) -> int | None:
    """Microseconds since the epoch of a datetime Django stored without a zone, in UTC:
    text on SQLite, a naive ``datetime`` from MariaDB/MySQL's DATETIME(6)."""
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - EPOCH) // MICROSECOND


def _delete_checked(plan: DeletePlan, conn: Any, batch: list[Any]) -> tuple[int, int]:
    wanted = {row[0]: tuple(row[1:]) for row in batch}
    ids = json.dumps(list(wanted))
    whole = plan.deleter == "lock_database"
    if whole:
        # One writer at a time (SQLite): between this IMMEDIATE transaction's
        # read of the current versions and its DELETE, nothing else can write.
        conn.execute("BEGIN IMMEDIATE")
    # Else ("lock_rows", MariaDB/MySQL): the read locks the rows (FOR UPDATE)
    # until the commit.
    cur = conn.cursor()
    try:
        cur.execute(plan.select_sql, [ids])
        current = cur.fetchall()
        matching = [
            pk
            for pk, status, attempts, updated_at, finished_at in current
            if status in plan.finished
            and (status, attempts, _micros(updated_at), _micros(finished_at)) == wanted[pk]
        ]
        cur.execute(plan.delete_sql, [json.dumps(matching)])
        if whole:
            conn.execute("COMMIT")
        else:
            conn.commit()
    except BaseException:
        if whole:
            conn.execute("ROLLBACK")
        else:
            conn.rollback()
        raise
    return len(matching), len(current) - len(matching)
