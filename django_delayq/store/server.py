"""What the database server must provide, checked at start-up (system checks E050, E051, W050).

* The claim relies on ``SELECT ... FOR UPDATE SKIP LOCKED``: MariaDB 10.6 and
  MySQL 8.0.1 have it (Django 5.2 itself accepts MariaDB 10.5, which would
  claim nothing), and on ``UPDATE ... RETURNING`` on SQLite: 3.35 (Django
  5.2 accepts 3.31).
* Case-sensitive queue names and keys: MariaDB's and MySQL's default
  collations (``utf8mb4_general_ci``, ``utf8mb4_0900_ai_ci``) compare
  ``"Welcome-42"`` and ``"welcome-42"`` as equal (and ``utf8mb4_bin``
  ignores trailing spaces), so the ``(queue, key)`` unique constraint would
  merge two messages. :func:`binary_columns_sql` fixes the columns.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.flow import GROUP_MAX_LENGTH
from django_delayq.models import KEY_MAX_LENGTH, QUEUE_MAX_LENGTH, Message
from django_delayq.store.features import SQLITE_RETURNING, features
from django_delayq.store.sql import statement

MIN_MARIADB: tuple[int, ...] = (10, 6)
MIN_MYSQL: tuple[int, ...] = (8, 0, 1)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


@dataclass(frozen=True)
class Problem:
    """Why a database server cannot run the queue, as a system check reports it."""

    message: str
    hint: str
    check_id: str

    def __str__(self) -> str:
        return self.message


def version_problem(connection: BaseDatabaseWrapper) -> Problem | None:
    """Why this database server cannot run the queue, or None."""
    if connection.vendor == "sqlite":
        if sqlite3.sqlite_version_info >= SQLITE_RETURNING:
            return None
        return Problem(
            f"django-delayq needs SQLite {_dotted(SQLITE_RETURNING)} or later for "
            f"UPDATE ... RETURNING; this Python uses SQLite {sqlite3.sqlite_version}",
            "use a Python built with SQLite 3.35 or later",
            "django_delayq.E051",
        )
    if connection.vendor != "mysql":
        return None
    version = tuple(connection.mysql_version)  # type: ignore[attr-defined]
    if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        name, minimum = "MariaDB", MIN_MARIADB
    else:
        name, minimum = "MySQL", MIN_MYSQL
    if version >= minimum:
        return None
    return Problem(
        f"django-delayq needs {name} {_dotted(minimum)} or later for "
        f"SELECT ... FOR UPDATE SKIP LOCKED; this server is {_dotted(version)}",
        "upgrade to MariaDB 10.6+ or MySQL 8.0.1+",
        "django_delayq.E050",
    )


def column_collations(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """The collation of the queue table's ``queue``, ``key`` and group columns (MariaDB/MySQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            statement("column_collations", features(connection)), [Message._meta.db_table]
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
    if not features(connection).binary_text:
        return []
    return [
        f"{name} ({collation})"
        for name, collation in sorted(column_collations(connection).items())
        if not exact_collation(collation)
    ]


def has_queue_table(connection: BaseDatabaseWrapper) -> bool:
    """Whether the message table exists there: a worker on a database that was never
    migrated would otherwise retry its failing claims forever."""
    with connection.cursor() as cursor:
        return Message._meta.db_table in connection.introspection.table_names(cursor)


def binary_collation(connection: BaseDatabaseWrapper) -> str:
    """Byte-wise and without padding: ``"a"``, ``"A"`` and ``"a "`` are three keys."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]


def binary_columns_sql(connection: BaseDatabaseWrapper) -> str:
    """The ``ALTER TABLE`` giving ``queue``, ``key`` and the group the binary collation."""
    qn = connection.ops.quote_name
    return statement("binary_columns", features(connection)).format(
        table=qn(Message._meta.db_table),
        queue=qn("queue"),
        key=qn("key"),
        group=qn(str(Message._meta.get_field("group").column)),
        queue_length=QUEUE_MAX_LENGTH,
        key_length=KEY_MAX_LENGTH,
        group_length=GROUP_MAX_LENGTH,
        collation=binary_collation(connection),
    )


# Errors after which a transaction may simply be run again: a deadlock, a
# lock wait that timed out, or a serialization failure. MariaDB/MySQL report
# a deadlock met while reserving AUTO_INCREMENT values (concurrent INSERT ...
# SELECT) as 1467, "Failed to read auto-increment value from storage engine".
_TRANSIENT_CODES = {1205, 1213, 1467}
_TRANSIENT_STATES = {"40001", "40P01", "55P03"}


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (a database error) says "run the transaction again"."""
    cause = exc.__cause__ or exc
    diag = getattr(cause, "diag", None)
    state = getattr(cause, "sqlstate", None) or getattr(diag, "sqlstate", None)
    if state in _TRANSIENT_STATES:
        return True
    args: tuple[Any, ...] = getattr(cause, "args", ())
    return bool(args) and args[0] in _TRANSIENT_CODES


# -- functions of ours on SQLite connections ----------------------------------------

_HOST = socket.gethostname()


def process_alive(name: str | None) -> int:
    """Whether the worker named ``name`` (``host:pid``, ``worker_name()``'s form) is a
    live process of this host: 1 or 0, for SQLite.

    On SQLite every worker runs on the host that has the file, so the
    operating system can say for sure which of them live, where a heartbeat
    cannot: none is written while another transaction holds the database's
    write lock, and a long one (a producer's, an atomic handler's) would let
    every worker's heartbeat and leases lapse at once. Any other name
    (another host, a name of one's own) is left to the heartbeat.
    """
    host, _, pid = (name or "").rpartition(":")
    if host != _HOST or not pid.isdigit():
        return 0
    return int(pid_alive(int(pid)))


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has ``pid``."""
    if not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def register_functions(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """``connection_created`` receiver: define ``delayq_process_alive`` on SQLite connections
    (the claim asks it, ``queries.claimable_condition``)."""
    if connection.vendor == "sqlite":
        connection.connection.create_function(
            "delayq_process_alive", 1, process_alive, deterministic=False
        )
