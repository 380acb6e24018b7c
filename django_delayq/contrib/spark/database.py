"""From a Django database alias to what Spark needs: one configuration, never two.

The executors' connection parameters come from the Django connection's own
``get_connection_params()``; the JDBC URL from its ``settings_dict``; the
statements that write the queue table from ``store`` (the upsert is
``store.loader``'s: the statement of ``store.write``, the one write path of
new messages, so a pipeline ``--on-conflict update`` means exactly what
``enqueue(..., on_conflict="update")`` means).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.conf import get_config
from django_delayq.contrib.spark import PipelineError
from django_delayq.contrib.spark.dbapi import DbTarget, DeletePlan, LoadPlan, connect
from django_delayq.models import Message
from django_delayq.routers import queue_alias
from django_delayq.store import loader, new_rows, retention, wakeup
from django_delayq.store.features import features

ARCHIVE_LOCK = "django_delayq.archive"


def resolve_alias(alias: str | None) -> str:
    """The alias to use (``--database``, else ``DELAYQ["DATABASE"]``, else the
    router's), checked to be supported."""
    try:
        alias = queue_alias(alias)
    except ImproperlyConfigured as exc:
        raise PipelineError(str(exc)) from None
    connection = connections[alias]
    can = features(connection)
    if not can.pipeline:
        # The vendor's name only names the database in the message.
        raise PipelineError(
            "the Spark pipeline supports PostgreSQL, MariaDB/MySQL and SQLite, "
            f"not {connection.vendor}"
        )
    if can.file_database and _database_file(connection) is None:
        raise PipelineError(
            "an in-memory SQLite database cannot be shared with Spark; use a database file"
        )
    return alias


def table(alias: str) -> str:
    return connections[alias].ops.quote_name(Message._meta.db_table)


def _database_file(connection: BaseDatabaseWrapper) -> str | None:
    """The absolute path of a file database (``file_database``): ``NAME``, a path or
    a ``file:`` URI; None for an in-memory one."""
    name = str(connection.settings_dict["NAME"])
    if name == ":memory:" or "mode=memory" in name:
        return None
    if name.startswith("file:"):
        name = name[len("file:") :].split("?", 1)[0]
    return os.path.abspath(name)


def target(alias: str) -> DbTarget:
    """Connection parameters for the executors, picklable (no Django objects)."""
    connection = connections[alias]
    client = features(connection).client
    if client == "psycopg":
        params = {
            k: v
            for k, v in connection.get_connection_params().items()
            if k not in ("cursor_factory", "context")
        }
        return DbTarget(client, params)
    if client == "MySQLdb":
        return _mysql_target(connection)
    options = connection.settings_dict.get("OPTIONS", {})
    params = {"database": _database_file(connection), "timeout": float(options.get("timeout", 30))}
    init = tuple(s.strip() for s in str(options.get("init_command", "")).split(";") if s.strip())
    return DbTarget(client, params, init)


def _mysql_target(connection: BaseDatabaseWrapper) -> DbTarget:
    """MySQLdb's parameters as Django makes them, less two things executors must not get.

    Django's converters (``conv``) would make an executor import Django to
    unpickle them, and its ``FOUND_ROWS`` client flag makes an ``ON
    DUPLICATE KEY UPDATE`` that changes nothing count as a changed row: the
    loader tells updated rows from untouched ones by that count.
    """
    from MySQLdb.constants import CLIENT

    params = dict(connection.get_connection_params())
    params.pop("conv", None)
    flags = int(params.pop("client_flag", 0)) & ~CLIENT.FOUND_ROWS
    if flags:
        params["client_flag"] = flags
    level = getattr(connection, "isolation_level", None)
    init = (f"SET SESSION TRANSACTION ISOLATION LEVEL {level.upper()}",) if level else ()
    return DbTarget("MySQLdb", params, init)


def identity(alias: str) -> str:
    """Names the database in the archive's run journal (never with a password)."""
    connection = connections[alias]
    can = features(connection)
    if can.file_database:
        return f"{can.url_scheme}:{_database_file(connection)}"
    s = connection.settings_dict
    port = s["PORT"] or can.default_port
    return f"{can.url_scheme}://{s['HOST'] or 'localhost'}:{port}/{s['NAME']}"


def jdbc_options(alias: str) -> dict[str, str]:
    """Options of Spark's JDBC source for this database (Debian's JDBC drivers)."""
    connection = connections[alias]
    can = features(connection)
    driver = can.jdbc
    if can.file_database:
        url = f"jdbc:{can.url_scheme}:{_database_file(connection)}"
        return {"url": url, "driver": driver.driver_class}
    s = connection.settings_dict
    host = s["HOST"] or "localhost"
    if host.startswith("/"):
        host = "localhost"  # JDBC speaks TCP only; a socket directory means this machine
    port = s["PORT"] or can.default_port
    options = {
        "url": f"jdbc:{can.url_scheme}://{host}:{port}/{s['NAME']}{driver.url_query}",
        "driver": driver.driver_class,
        # Without a fetch size the PostgreSQL and MariaDB drivers read a whole
        # result into memory.
        "fetchsize": "10000",
    }
    if s["USER"]:
        options["user"] = s["USER"]
    if s["PASSWORD"]:
        options["password"] = s["PASSWORD"]
    for name in driver.options:
        if s["OPTIONS"].get(name):
            options[name] = str(s["OPTIONS"][name])
    return options


def load_plan(
    alias: str,
    *,
    queue: str,
    kind: str,
    priority: int,
    on_conflict: str,
    now: datetime,
    grouped: bool = False,
) -> LoadPlan:
    """The SQL one partition runs to upsert the rows it loaded into ``delayq_load``.

    Every column but the key, the payload and the due time (and the group,
    when ``grouped``) is the same for the whole job: they are parameters,
    computed here once, so a retried task writes exactly what the first
    attempt did.
    """
    connection = connections[alias]
    shared = new_rows.template(
        queue, kind=kind, priority=priority, due=now, max_attempts=None, now=now
    )
    load = loader.bulk_load(connection, shared, on_conflict, grouped=grouped)
    notify = (
        wakeup.NOTIFY_CHANNEL if features(connection).notify and get_config()["NOTIFY"] else None
    )
    return LoadPlan(
        target(alias),
        queue,
        load.sql,
        load.params,
        features(connection).bulk_writer,
        existing_sql=load.existing_sql,
        notify_channel=notify,
        hold_back_sql=load.hold_back_sql,
        hold_back_params=load.hold_back_params,
        table_sql=load.table_sql,
        update_sql=load.update_sql,
    )


def delete_plan(alias: str) -> DeletePlan:
    connection = connections[alias]
    statements = retention.archived_delete(connection)
    return DeletePlan(
        target(alias),
        delete_sql=statements["delete_sql"],
        deleter=features(connection).archive_delete,
        count_sql=statements.get("count_sql", ""),
        select_sql=statements.get("select_sql", ""),
    )


class ArchiveLockLost(PipelineError):
    """The archive lock went away during a run: the run stopped before its next step."""


# The lock's own connection notices a dead peer within about a minute
# (OPTIONS of the database win over these).
LOCK_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10}
# One row if this backend holds the advisory lock on the bigint hashtext(name):
# pg_locks shows such a key as classid (high 32 bits), objid (low), objsubid 1.
_LOCK_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND pid = pg_backend_pid() AND objsubid = 1 "
    "AND classid = ((hashtext(%(name)s)::bigint >> 32) & 4294967295)::oid "
    "AND objid = (hashtext(%(name)s)::bigint & 4294967295)::oid"
)


class ArchiveLock:
    """One archive run's hold on its database; :meth:`check` before each destructive step."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def _lost(self, why: str, step: str) -> ArchiveLockLost:
        return ArchiveLockLost(
            f"the archive run lost its lock on database {self.alias!r} ({why}) before "
            f"{step}; it stopped there and nothing more was deleted. Another run may have "
            "started meanwhile; run the archive again: it completes this run from its journal"
        )

    def check(self, step: str) -> None:
        """Raise :class:`ArchiveLockLost` unless the lock is still this run's."""
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError


class _ServerLock(ArchiveLock):
    """A lock the database server holds for a connection of the run's own."""

    _errors: type[Exception]

    def _held(self) -> bool:
        """Whether the server still shows the lock held by this connection."""
        raise NotImplementedError

    def check(self, step: str) -> None:
        try:
            held = self._held()
        except self._errors as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise self._lost(f"its connection failed: {reason}", step) from exc
        if not held:
            raise self._lost("the server no longer shows it held", step)


class _AdvisoryLock(_ServerLock):
    """PostgreSQL: a transaction advisory lock, in a transaction of its own connection.

    Not on Django's connection: that one runs the run's own queries, may be
    closed and silently reopened by Django (taking the lock with it, unseen),
    and a nested run in the same thread would take the same lock again. This
    connection does nothing but hold the lock and answer :meth:`check`: if
    the server ends it (``pg_terminate_backend``, a failover), the next check
    fails instead of the run going on unlocked.

    Transaction-level, in one open transaction, rather than a session lock:
    behind a pooler in transaction mode (PgBouncer) a session lock would stay
    on whichever server connection ran it, held by nobody and released never,
    and ``check`` would look for it on another one. An open transaction keeps
    its server connection for as long as it lasts, here or behind a pooler,
    and the lock ends with it. It writes nothing, so it holds back no vacuum.
    """

    def __init__(self, alias: str) -> None:
        import psycopg

        super().__init__(alias)
        self._errors = psycopg.Error
        params = {**LOCK_KEEPALIVES, **target(alias).params}
        self.conn = psycopg.connect(**params, autocommit=False)
        try:
            # Idle in this transaction for as long as Spark works: the
            # server's idle timeout must not end it (SET LOCAL: this
            # transaction only, never the pooled session).
            self.conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            row = self.conn.execute(
                "SELECT pg_try_advisory_xact_lock(hashtext(%s))", [ARCHIVE_LOCK]
            ).fetchone()
        except BaseException:
            self.conn.close()
            raise
        if not (row and row[0]):
            self.conn.close()
            raise _busy(alias)

    def _held(self) -> bool:
        row = self.conn.execute(_LOCK_HELD, {"name": ARCHIVE_LOCK}).fetchone()
        return bool(row and row[0])

    def release(self) -> None:
        try:
            self.conn.rollback()  # the transaction ends, and its advisory lock with it
        except self._errors:
            pass  # a lost connection holds nothing any more
        finally:
            self.conn.close()


def lock_name(alias: str) -> str:
    """MariaDB/MySQL: the archive's ``GET_LOCK`` name for this database.

    Named locks belong to the server, not to a database: the name carries
    the database's, hashed when it would pass the 64 characters a name may
    have.
    """
    name = f"{ARCHIVE_LOCK}:{connections[alias].settings_dict['NAME']}"
    if len(name) > 64:
        digest = hashlib.sha256(name.encode()).hexdigest()
        name = f"{ARCHIVE_LOCK}:{digest[: 63 - len(ARCHIVE_LOCK)]}"
    return name


class _NamedLock(_ServerLock):
    """MariaDB/MySQL: ``GET_LOCK`` on a connection of its own (see :class:`_AdvisoryLock`).

    The server releases a named lock when its connection ends, so a killed
    run leaves none behind; :meth:`check` asks the server whether this
    connection still holds it.
    """

    def __init__(self, alias: str) -> None:
        import MySQLdb

        super().__init__(alias)
        self._errors = MySQLdb.Error
        self.name = lock_name(alias)
        self.conn = connect(target(alias))
        try:
            cursor = self.conn.cursor()
            # Idle for as long as Spark works: the server's idle timeout must not end it.
            cursor.execute("SET SESSION wait_timeout = 31536000")
            cursor.execute("SELECT GET_LOCK(%s, 0)", [self.name])
            row = cursor.fetchone()
        except BaseException:
            self.conn.close()
            raise
        if not (row and row[0] == 1):
            self.conn.close()
            raise _busy(alias)

    def _held(self) -> bool:
        cursor = self.conn.cursor()
        cursor.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", [self.name])
        row = cursor.fetchone()
        return bool(row and row[0])

    def release(self) -> None:
        self.conn.close()  # the connection ends, and its named locks with it


class _FileLock(ArchiveLock):
    """SQLite: an ``flock`` on a file beside the database, held by this process."""

    def __init__(self, alias: str, path: Path) -> None:
        super().__init__(alias)
        self.path = path
        self.handle = open(path, "a")  # noqa: SIM115 (closed by release)
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise _busy(alias) from None

    def check(self, step: str) -> None:
        # A lock file removed (or replaced) lets another run lock a new one.
        try:
            same = os.path.samestat(os.fstat(self.handle.fileno()), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            raise self._lost(f"{self.path} was removed or replaced", step)

    def release(self) -> None:
        try:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
        finally:
            self.handle.close()


def _busy(alias: str) -> PipelineError:
    return PipelineError(f"another delayq_pipeline archive is running on database {alias!r}")


@contextmanager
def archive_lock(alias: str) -> Iterator[ArchiveLock]:
    """One archive run per database at a time, released even if the process is killed.

    PostgreSQL: a transaction advisory lock held in an open transaction of a
    dedicated connection (:class:`_AdvisoryLock`). MariaDB/MySQL: a named lock
    (``GET_LOCK``) on a dedicated connection (:class:`_NamedLock`). SQLite: an
    ``flock`` on a file beside the database. All go away with the process, so
    a killed run never leaves a stale lock for the re-run to trip over. The
    run calls ``check`` before each step that publishes, deletes or closes its
    journal.
    """
    connection = connections[alias]
    kind = features(connection).archive_lock
    lock: ArchiveLock
    if kind == "advisory":
        lock = _AdvisoryLock(alias)
    elif kind == "named":
        lock = _NamedLock(alias)
    else:
        lock = _FileLock(alias, Path(f"{_database_file(connection)}.delayq-archive.lock"))
    try:
        yield lock
    finally:
        lock.release()
