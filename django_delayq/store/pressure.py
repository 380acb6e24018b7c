"""What the database does to the queue's tables: ``delayq_status --health`` and the dashboard.

A queue that updates its rows on every claim and acknowledgement leaves a
dead row version behind each time. The database reclaims them only when no
transaction can still see them, so what hurts a database queue in
production is seldom the queue itself: a transaction left open for an hour
(an ``idle in transaction`` session, a report under ``REPEATABLE READ``, a
forgotten replication slot) pins the horizon, and every claim then steps
over more dead versions than live ones. These checks say which of those is
happening now, and what to do about it, on each database:

* PostgreSQL: transactions, prepared transactions and replication slots
  holding the xmin horizon; dead tuples, size and autovacuum of each of the
  app's tables; the ``LISTEN``/``NOTIFY`` queue's usage.
* MariaDB/MySQL: transactions open for long (they hold back InnoDB's purge),
  the purge's history list, and the free space inside the tables.
* SQLite: free pages in the file, and a write-ahead log that a reader keeps
  from being checkpointed.

Each check is one cheap read of the server's statistics, never a scan of
the queue's tables: it is safe to run every minute against a busy database.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.registry import registry
from django_delayq.routers import model_alias, queue_alias

#: A transaction open longer than this holds the horizon long enough to matter:
#: at 200 messages a second a minute leaves 24,000 dead row versions or more.
LONG_TRANSACTION = timedelta(seconds=60)
#: Dead row versions worth a word: more than this many, and more than
#: ``DEAD_SHARE`` of the table's live rows.
DEAD_TUPLES = 10_000
DEAD_SHARE = 0.2
#: Autovacuum is late when a table is past its threshold and was not vacuumed
#: for this long.
VACUUM_LAG = timedelta(minutes=10)
#: The share of PostgreSQL's notification queue in use that is worth a word
#: (``NOTIFY`` fails when it is full).
NOTIFY_USAGE = 0.5
#: InnoDB's history list (undo records the purge has not removed) worth a word.
HISTORY_LENGTH = 100_000
#: A share of free space inside a table (or a SQLite file) worth a word, past
#: ``FREE_BYTES``.
FREE_SHARE = 0.5
FREE_BYTES = 64 * 1024 * 1024
#: Long transactions named, oldest first.
SHOWN = 10
#: A SQLite write-ahead log this large is not being checkpointed.
WAL_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """The thresholds the checks compare against (the defaults above)."""

    long_transaction: timedelta = LONG_TRANSACTION
    dead_tuples: int = DEAD_TUPLES
    dead_share: float = DEAD_SHARE
    vacuum_lag: timedelta = VACUUM_LAG
    notify_usage: float = NOTIFY_USAGE
    history_length: int = HISTORY_LENGTH
    free_bytes: int = FREE_BYTES
    free_share: float = FREE_SHARE
    wal_bytes: int = WAL_BYTES


@dataclass(frozen=True)
class Check:
    """One finding: what was looked at, what it is, and what to do when it is a problem."""

    name: str
    value: str
    problem: bool = False
    advice: str = ""


def health(using: str | None = None, limits: Limits | None = None) -> list[Check]:
    """Every check of the database that holds the queue's tables (``using``)."""
    alias = queue_alias(using)
    connection = connections[alias]
    read = _READERS.get(connection.vendor)
    if read is None:
        return [Check("database", f"{connection.vendor}: no checks for this database")]
    return read(connection, limits or Limits())


def tables(alias: str) -> list[str]:
    """The queue's tables on ``alias``: the app's own (messages, workers, flow and
    queue state), and those of the project's ``QueueFields`` models a handler consumes."""
    config = apps.get_app_config("django_delayq")
    own = {model._meta.db_table for model in config.get_models()}
    rows = {m._meta.db_table for m in registry.models() if model_alias(m) == alias}
    return sorted(own | rows)


def _size(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _more(count: int) -> str:
    return f" and {count - SHOWN} more" if count > SHOWN else ""


def _rows(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


# -- PostgreSQL -----------------------------------------------------------------------


def _postgresql(connection: BaseDatabaseWrapper, limits: Limits) -> list[Check]:
    checks = [*_pg_horizon(connection, limits)]
    checks += _pg_tables(connection, limits)
    [(usage,)] = _rows(connection, "SELECT pg_notification_queue_usage()")
    checks.append(
        Check(
            "notification queue",
            f"{usage:.1%} used",
            problem=usage >= limits.notify_usage,
            advice="a session LISTENs and does not read its notifications (a stuck "
            "process?): NOTIFY fails once the queue is full. Find it in pg_stat_activity "
            "(wait_event ClientRead, a LISTEN) and end it",
        )
    )
    return checks


def _pg_horizon(connection: BaseDatabaseWrapper, limits: Limits) -> list[Check]:
    seconds = limits.long_transaction.total_seconds()
    # Only this database's sessions hold back the vacuum of its tables.
    sessions = _rows(
        connection,
        "SELECT pid, coalesce(state, ''), coalesce(usename, ''), "
        "coalesce(application_name, ''), extract(epoch FROM now() - xact_start) "
        "FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) "
        "AND xact_start < now() - make_interval(secs => %s) "
        "ORDER BY xact_start",
        [seconds],
    )
    prepared = _rows(
        connection,
        "SELECT gid, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts "
        "WHERE database = current_database() AND prepared < now() - make_interval(secs => %s) "
        "ORDER BY prepared",
        [seconds],
    )
    slots = _rows(
        connection,
        "SELECT slot_name, active FROM pg_replication_slots "
        "WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL ORDER BY slot_name",
    )
    checks = []
    if sessions:
        pid = sessions[0][0]
        listed = "; ".join(
            f"pid {pid_} ({', '.join(filter(None, [user, application])) or 'another user'}, "
            f"{state or 'state hidden'}, {_age(age)})"
            for pid_, state, user, application, age in sessions[:SHOWN]
        )
        checks.append(
            Check(
                "long transactions",
                f"{len(sessions)} open over {_age(seconds)}, oldest first: {listed}"
                + _more(len(sessions)),
                problem=True,
                advice="they keep vacuum from removing the queue's dead rows, so its tables "
                "grow (and a polling worker's claims step over more of them): end them "
                f"(SELECT pg_terminate_backend({pid})), "
                "and set idle_in_transaction_session_timeout for the role that left them",
            )
        )
    else:
        checks.append(Check("long transactions", f"none open over {_age(seconds)}"))
    if prepared:
        gid, age = prepared[0]
        checks.append(
            Check(
                "prepared transactions",
                f"{len(prepared)} over {_age(seconds)}; oldest {_age(age)}: {gid}",
                problem=True,
                advice=f"a forgotten two-phase commit holds the horizon: COMMIT PREPARED "
                f"or ROLLBACK PREPARED '{gid}'",
            )
        )
    if slots:
        idle = [name for name, active in slots if not active]
        inactive = f", inactive: {', '.join(idle)}" if idle else ""
        checks.append(
            Check(
                "replication slots",
                f"{len(slots)} holding a horizon{inactive}",
                problem=bool(idle),
                advice="an inactive slot holds back vacuum for as long as it exists: drop it "
                "(SELECT pg_drop_replication_slot(name)) if nothing will read it again",
            )
        )
    return checks


def _pg_tables(connection: BaseDatabaseWrapper, limits: Limits) -> list[Check]:
    [(autovacuum,)] = _rows(connection, "SELECT current_setting('autovacuum')::boolean")
    found = _rows(
        connection,
        "SELECT s.relname, s.n_live_tup, s.n_dead_tup, "
        "pg_table_size(s.relid), pg_indexes_size(s.relid), "
        "extract(epoch FROM now() - greatest(s.last_autovacuum, s.last_vacuum)), "
        "coalesce((SELECT option_value::float FROM pg_options_to_table(c.reloptions) "
        "  WHERE option_name = 'autovacuum_vacuum_threshold'), "
        "  current_setting('autovacuum_vacuum_threshold')::float) "
        "+ coalesce((SELECT option_value::float FROM pg_options_to_table(c.reloptions) "
        "  WHERE option_name = 'autovacuum_vacuum_scale_factor'), "
        "  current_setting('autovacuum_vacuum_scale_factor')::float) * greatest(c.reltuples, 0) "
        "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
        "WHERE s.schemaname = current_schema() AND s.relname = ANY(%s) "
        "ORDER BY pg_total_relation_size(s.relid) DESC",
        [tables(connection.alias)],
    )
    checks = [
        Check(
            "autovacuum",
            "on" if autovacuum else "off",
            problem=not autovacuum,
            advice="nothing removes the queue's dead rows but a VACUUM by hand: turn "
            "autovacuum on (or run VACUUM on the queue's tables every few minutes)",
        )
    ]
    for name, live, dead, table_bytes, index_bytes, since_vacuum, threshold in found:
        advice = []
        if dead > limits.dead_tuples and dead > limits.dead_share * max(live, 1):
            advice.append(
                "VACUUM it; if its dead rows stay, a long transaction or a slot holds "
                "the horizon (see above)"
            )
        if (
            autovacuum
            and dead > threshold
            and (since_vacuum is None or since_vacuum > limits.vacuum_lag.total_seconds())
        ):
            advice.append(
                "it is past its autovacuum threshold and was not vacuumed for "
                f"{_age(limits.vacuum_lag.total_seconds())}: autovacuum is behind (raise "
                "autovacuum_max_workers, or lower the table's autovacuum_vacuum_cost_delay)"
            )
        vacuumed = "never" if since_vacuum is None else f"{_age(since_vacuum)} ago"
        checks.append(
            Check(
                name,
                f"{dead:,} dead rows beside {live:,} live, vacuumed {vacuumed}; "
                f"table {_size(table_bytes)}, indexes {_size(index_bytes)}",
                problem=bool(advice),
                advice="; ".join(advice),
            )
        )
    return checks


# -- MariaDB / MySQL -------------------------------------------------------------------


def _mysql(connection: BaseDatabaseWrapper, limits: Limits) -> list[Check]:
    seconds = limits.long_transaction.total_seconds()
    with connection.cursor() as cursor:
        # trx_started is the server's time, not converted to the session's zone
        # (Django sets one): NOW() is read in the server's for the comparison.
        cursor.execute("SET @delayq_zone = @@session.time_zone, time_zone = @@global.time_zone")
        try:
            cursor.execute(
                "SELECT trx_mysql_thread_id, TIMESTAMPDIFF(SECOND, trx_started, NOW()), "
                "trx_state FROM information_schema.innodb_trx "
                "WHERE trx_started < NOW() - INTERVAL %s SECOND "
                "AND trx_mysql_thread_id <> CONNECTION_ID() ORDER BY trx_started",
                [int(seconds)],
            )
            long = list(cursor.fetchall())
        finally:
            cursor.execute("SET time_zone = @delayq_zone")
    checks = []
    if long:
        thread = long[0][0]
        listed = "; ".join(
            f"thread {thread_} ({state.lower()}, {_age(age)})"
            for thread_, age, state in long[:SHOWN]
        )
        checks.append(
            Check(
                "long transactions",
                f"{len(long)} open over {_age(seconds)}, oldest first: {listed}" + _more(len(long)),
                problem=True,
                advice="they hold back InnoDB's purge (for every database of the server), "
                "and the queue's indexes fill with deleted entries: end them "
                f"(KILL {thread}), and set wait_timeout for the client that left them",
            )
        )
    else:
        checks.append(Check("long transactions", f"none open over {_age(seconds)}"))
    history = _rows(
        connection,
        "SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'",
    )
    if history:
        [(length,)] = history
        checks.append(
            Check(
                "purge history",
                f"{length:,} undo records not purged",
                problem=length > limits.history_length,
                advice="the purge is behind: look for long transactions (above); raise "
                "innodb_purge_threads",
            )
        )
    names = tables(connection.alias)
    found = _rows(
        connection,
        "SELECT table_name, data_length, index_length, data_free "
        "FROM information_schema.TABLES WHERE table_schema = DATABASE() "
        f"AND table_name IN ({', '.join(['%s'] * len(names))}) "
        "ORDER BY data_length + index_length DESC",
        names,
    )
    for name, data, index, free in found:
        wasted = free > limits.free_bytes and free > limits.free_share * max(data + index, 1)
        checks.append(
            Check(
                name,
                f"data {_size(data)}, indexes {_size(index)}, free {_size(free)}",
                problem=wasted,
                advice="most of the table's space is free: OPTIMIZE TABLE gives it back "
                "(online on InnoDB)",
            )
        )
    return checks


# -- SQLite ----------------------------------------------------------------------------


def _sqlite(connection: BaseDatabaseWrapper, limits: Limits) -> list[Check]:
    [(pages,)] = _rows(connection, "PRAGMA page_count")
    [(free,)] = _rows(connection, "PRAGMA freelist_count")
    [(page_size,)] = _rows(connection, "PRAGMA page_size")
    free_bytes = free * page_size
    checks = [
        Check(
            "database file",
            f"{_size(pages * page_size)}, {_size(free_bytes)} of it free",
            problem=free_bytes > limits.free_bytes and free > limits.free_share * max(pages, 1),
            advice="most of the file is free pages left by pruned messages: VACUUM gives "
            "them back (it locks the database while it runs)",
        )
    ]
    name = connection.settings_dict["NAME"]
    wal = f"{name}-wal"
    if isinstance(name, str) and os.path.exists(wal):
        size = os.path.getsize(wal)
        checks.append(
            Check(
                "write-ahead log",
                _size(size),
                problem=size > limits.wal_bytes,
                advice="a reader keeps the log from being checkpointed (a long read "
                "transaction, a process that holds a connection open in one)",
            )
        )
    return checks


_READERS: dict[str, Callable[[BaseDatabaseWrapper, Limits], list[Check]]] = {
    "postgresql": _postgresql,
    "mysql": _mysql,
    "sqlite": _sqlite,
}

__all__ = ["Check", "Limits", "health", "tables"]
