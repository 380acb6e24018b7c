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
    # existing keys (store.write.bulk_load).
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


def payload_of_line(names: tuple[str, ...], line: str) -> tuple[str | None, str | None]:
    """``(payload JSON text, None)`` from one JSON line's ``names``, or ``(None, reason)``.

    Parsed and checked as ``enqueue`` checks a payload (``payload.py``: the
    same types, floats, depth, lone surrogates); the size is checked in the
    JVM with the other rows' sizes. Runs on the executors, without Django's
    settings.
    """
    from django_delayq.payload import MAX_PAYLOAD_DEPTH, check_text_depth, encode_payload

    try:
        check_text_depth(line)
        value = json.loads(line)
    except RecursionError:  # not reached: the depth is bounded above
        return None, f"the line is nested deeper than MAX_PAYLOAD_DEPTH ({MAX_PAYLOAD_DEPTH})"
    except ValueError as exc:
        if "MAX_PAYLOAD_DEPTH" in str(exc):
            return None, str(exc)
        return None, f"malformed JSON line: {exc}"
    if not isinstance(value, dict):
        return None, f"malformed JSON line: a {type(value).__name__}, not an object"
    try:
        return encode_payload({n: value.get(n) for n in names}, max_size=0), None
    except (TypeError, ValueError) as exc:
        return None, str(exc)


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
