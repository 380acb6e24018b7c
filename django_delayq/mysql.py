"""What MariaDB and MySQL need that PostgreSQL and SQLite do not.

* The version the claim relies on: ``SELECT ... FOR UPDATE SKIP LOCKED``
  exists from MariaDB 10.6 and MySQL 8.0.1 (Django 5.2 itself accepts
  MariaDB 10.5, which would claim nothing). ``version_problem`` is the
  system check ``django_delayq.E050`` and ``run_delayq`` refuses to start on
  such a server.
* Case-sensitive queue names and keys: MariaDB's and MySQL's default
  collations (``utf8mb4_general_ci``, ``utf8mb4_0900_ai_ci``) compare
  ``"Welcome-42"`` and ``"welcome-42"`` as equal (and ``utf8mb4_bin``
  ignores trailing spaces), so the ``(queue, key)`` unique constraint would
  merge two messages. ``collation_problems`` is the warning
  ``django_delayq.W050``; ``binary_columns_sql`` fixes the columns.
* Batch enqueue without ``INSERT ... RETURNING`` (MySQL has none): the new
  keys travel as one JSON document expanded by ``JSON_TABLE`` (MariaDB 10.6,
  MySQL 8.0.4), so one small statement inserts thousands of messages, and the
  outcomes stay exact (see ``write``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.models import KEY_MAX_LENGTH, Message

MIN_MARIADB: tuple[int, ...] = (10, 6)
MIN_MYSQL: tuple[int, ...] = (8, 0, 1)

# Rows per INSERT, and payload text per INSERT: well under the default
# max_allowed_packet (16 MiB on MariaDB, 64 MiB on MySQL) even when JSON
# escaping doubles the text.
CHUNK_ROWS = 5000
CHUNK_BYTES = 4 * 1024 * 1024

# A concurrent producer that commits one of our new keys between our read
# and our insert makes us read again; each round locks what it read.
MAX_ROUNDS = 10


def version_problem(connection: BaseDatabaseWrapper) -> str | None:
    """Why this MariaDB/MySQL server cannot run the claim, or None."""
    if connection.vendor != "mysql":
        return None
    version = tuple(connection.mysql_version)  # type: ignore[attr-defined]
    if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        name, minimum = "MariaDB", MIN_MARIADB
    else:
        name, minimum = "MySQL", MIN_MYSQL
    if version >= minimum:
        return None
    return (
        f"django-delayq needs {name} {'.'.join(map(str, minimum))} or later for "
        f"SELECT ... FOR UPDATE SKIP LOCKED; this server is "
        f"{'.'.join(map(str, version))}"
    )


def column_collations(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """The collation of the queue table's ``queue`` and ``key`` columns."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = %s "
            "AND column_name IN ('queue', 'key')",
            [Message._meta.db_table],
        )
        return {str(name): str(collation) for name, collation in cursor.fetchall()}


def exact_collation(collation: str) -> bool:
    """True for a collation that tells every two different strings apart.

    Case- and accent-sensitive (``_bin``, ``_cs``) is not enough: the PAD
    SPACE collations (``utf8mb4_bin`` among them) ignore trailing spaces.
    MariaDB's ``nopad`` collations and MySQL 8's ``_0900_`` ones do not.
    """
    sensitive = collation.endswith(("_bin", "_cs"))
    return sensitive and ("_nopad_" in collation or "_0900_" in collation)


def collation_problems(connection: BaseDatabaseWrapper) -> list[str]:
    """Columns of the queue table whose collation merges different keys (none before migrate)."""
    if connection.vendor != "mysql":
        return []
    return [
        f"{name} ({collation})"
        for name, collation in sorted(column_collations(connection).items())
        if not exact_collation(collation)
    ]


def binary_collation(connection: BaseDatabaseWrapper) -> str:
    """Byte-wise and without padding: ``"a"``, ``"A"`` and ``"a "`` are three keys."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]


def binary_columns_sql(connection: BaseDatabaseWrapper) -> str:
    """The ``ALTER TABLE`` giving ``queue`` and ``key`` the binary collation."""
    qn = connection.ops.quote_name
    collation = binary_collation(connection)
    columns = ", ".join(
        f"MODIFY {qn(name)} varchar({length}) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
        for name, length in (
            ("queue", Message._meta.get_field("queue").max_length),
            ("key", KEY_MAX_LENGTH),
        )
    )
    return f"ALTER TABLE {qn(Message._meta.db_table)} {columns}"


# -- batch enqueue ---------------------------------------------------------------


class _Raced(Exception):
    """A concurrent producer committed one of our new keys: read again."""

    def __init__(self, existing: int) -> None:
        super().__init__(existing)
        self.existing = existing  # how many of the chunk's keys were found


def chunks(keys: list[str], encoded: dict[str, str]) -> Iterator[list[str]]:
    """``keys`` in groups that fit one statement (by count and by payload size)."""
    chunk: list[str] = []
    size = 0
    for key in keys:
        length = len(encoded[key]) + len(key)
        if chunk and (len(chunk) >= CHUNK_ROWS or size + length > CHUNK_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(key)
        size += length
    if chunk:
        yield chunk


def write(
    connection: BaseDatabaseWrapper,
    template: Message,
    keys: list[str],
    encoded: dict[str, str],
    payloads: dict[str, Any],
    on_conflict: str,
) -> dict[str, tuple[Any, Message]]:
    """Enqueue ``keys`` (distinct) on MariaDB/MySQL; the outcome and row of each key.

    Per chunk, inside a savepoint: read the existing rows (locked when they
    may be updated), ``INSERT IGNORE`` the others from one JSON document, and
    read back their ids. The insert's row count says whether every new key
    was ours: InnoDB makes an insert wait for a concurrent uncommitted insert
    of the same key, so a short count means another producer committed it
    first. Then the savepoint is rolled back and the chunk read again, in a
    way that sees that row (``_read``), so a message reported CREATED was
    created by this call and no other. A round that finds no more rows than
    the previous one means the column's collation merged two different keys
    (``django_delayq.W050``): that is an error, not a race.

    Keys are inserted in sorted order, so producers whose batches overlap
    take the key locks in the same order and do not deadlock each other.
    """
    out: dict[str, tuple[Any, Message]] = {}
    for chunk in chunks(sorted(keys), encoded):
        seen = -1
        for round_ in range(MAX_ROUNDS):
            try:
                with transaction.atomic(using=connection.alias):
                    out.update(
                        _write_chunk(
                            connection,
                            template,
                            chunk,
                            encoded,
                            payloads,
                            on_conflict,
                            lock="update" if on_conflict == "update" else round_ > 0,
                        )
                    )
                break
            except _Raced as raced:
                if raced.existing == seen:
                    # Nobody added a row since the last round: the unique
                    # index calls two of our different keys equal.
                    raise ImproperlyConfigured(
                        f"keys of queue {template.queue!r} collide with stored keys that "
                        "differ only in case or trailing spaces: the key column's collation "
                        "is not exact (see the check django_delayq.W050: manage.py check "
                        f"--database {connection.alias})"
                    ) from None
                seen = raced.existing
        else:
            raise RuntimeError(
                f"enqueue_many: concurrent producers kept inserting the same keys of queue "
                f"{template.queue!r}; gave up after {MAX_ROUNDS} rounds"
            )
    return out


def _write_chunk(
    connection: BaseDatabaseWrapper,
    template: Message,
    keys: list[str],
    encoded: dict[str, str],
    payloads: dict[str, Any],
    on_conflict: str,
    *,
    lock: bool | str,
) -> dict[str, tuple[Any, Message]]:
    from django_delayq.producer import Outcome, _apply_update, _row, _same_content

    qs = Message.objects.using(connection.alias)
    existing = {m.key: m for m in _read(connection, template.queue, keys, lock)}
    new = [k for k in keys if k not in existing]
    out: dict[str, tuple[Any, Message]] = {}
    if new:
        if _insert_ignore(connection, template, new, encoded) != len(new):
            raise _Raced(len(existing))
        ids = dict(qs.filter(queue=template.queue, key__in=new).values_list("key", "id"))
        for key in new:
            message = _row(template, key, payloads[key], ids[key])
            message._state.db = connection.alias
            out[key] = (Outcome.CREATED, message)
    changed: list[Message] = []
    for key, current in existing.items():
        row = _row(template, key, payloads[key])
        if on_conflict != "update" or _same_content(current, row):
            out[key] = (Outcome.IGNORED, current)
            continue
        _apply_update(current, row)
        changed.append(current)
        out[key] = (Outcome.UPDATED, current)
    if changed:
        qs.bulk_update(changed, _UPDATED_FIELDS)
    return out


def _read(
    connection: BaseDatabaseWrapper, queue: str, keys: list[str], lock: bool | str
) -> list[Message]:
    """The existing rows of ``keys``: locked for update, read fresh, or plainly read.

    ``lock="update"`` locks them (they may be rewritten). ``lock=True`` (a
    round after a race) must see rows committed since this transaction's
    snapshot: under READ COMMITTED, Django's default, a plain read does;
    under REPEATABLE READ a shared-lock read does. Neither takes exclusive
    locks, so producers that all waited on the same new key do not deadlock
    upgrading their shared locks.
    """
    qs = Message.objects.using(connection.alias).filter(queue=queue, key__in=keys)
    if lock == "update":
        return list(qs.select_for_update())
    isolation = getattr(connection, "isolation_level", None) or "repeatable read"
    if lock and isolation not in ("read committed", "read uncommitted"):
        # Compiled for this connection: sql_with_params() would compile it for
        # the default alias, whose backend (and quoting) may be another.
        sql, params = qs.query.get_compiler(using=connection.alias).as_sql()
        return list(
            Message.objects.raw(f"{sql} LOCK IN SHARE MODE", params, using=connection.alias)
        )
    return list(qs)


_UPDATED_FIELDS = [
    "payload",
    "kind",
    "priority",
    "max_attempts",
    "scheduled_time",
    "updated_at",
    "next_attempt_time",
    "attempt_count",
    "last_error",
    "last_traceback",
    "finished_at",
    "lock_token",
    "status",
]


def _insert_ignore(
    connection: BaseDatabaseWrapper, template: Message, keys: list[str], encoded: dict[str, str]
) -> int:
    """Insert ``keys`` in one statement; returns how many rows were inserted.

    ``IGNORE`` only has duplicate keys to skip here: every other value was
    validated before the first statement (key length, priority range, JSON).
    """
    from django_delayq.producer import _INSERT_FIELDS

    qn = connection.ops.quote_name
    columns: list[str] = []
    values: list[str] = []
    params: list[Any] = []
    for field in _INSERT_FIELDS:
        columns.append(qn(str(field.column)))
        if field.name == "key":
            values.append("u.k")
        elif field.name == "payload":
            values.append("u.p")
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(getattr(template, field.attname), connection))
    params.append(json.dumps([[k, encoded[k]] for k in keys]))
    sql = (
        f"INSERT IGNORE INTO {qn(Message._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM JSON_TABLE(%s, '$[*]' COLUMNS ("
        f"k VARCHAR({KEY_MAX_LENGTH}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', "
        f"p LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) AS u"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)
