"""The worker's most frequent statements, sent through the driver's own cursor.

A worker claims and acknowledges many times a second, and Django's cursor
wrapper costs about as much client CPU as the round trip itself on every
one of them (its wrappers, its checks, a time zone loader looked up per
cursor): a claim of one message took 0.41 ms of CPU through it against
0.28 ms through psycopg's cursor on the same connection. These statements
are compiled once and carry no user data to adapt, so they take the short
way on PostgreSQL with psycopg 3, keeping what the wrapper does that they
need: the connection opened on demand, the thread check, a broken
transaction refused, and the driver's errors raised as Django's.

The driver's cursor is the one Django's wrapper would hold
(``connection.create_cursor()``: datetimes read in the connection's time
zone, as through the wrapper). The wrapper's way is kept whenever something
watches it: Django's query log (``DEBUG``, ``CaptureQueriesContext``,
``assertNumQueries``) or an ``execute_wrapper`` installed on the connection.
Instrumentation that patches Django's cursor wrapper itself (some tracing
libraries do) does not see these statements.

**Prepared, where that is proven safe.** Their text never changes, so the
server need not parse and plan them again at every call (about half a
millisecond of a one-row claim, most of its time on the server). A prepared statement lives in the
server's session, though, and behind a pooler in transaction mode the next
transaction may run in another client's session, where the same name may
be another statement. So they are prepared only on an alias whose sessions
are the client's own: one where a worker's LISTEN was proven to hear a
NOTIFY sent through the alias (``worker/listen.py``: a pooler in
transaction mode never delivers it). Django turns psycopg's prepared
statements off unless the alias's ``OPTIONS`` name a ``prepare_threshold``;
these few are prepared all the same, and no other statement. A
``"prepare_threshold": None`` written there turns them off too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC
from typing import Any, TypeVar

from django.db.backends.base.base import BaseDatabaseWrapper

_T = TypeVar("_T")

#: The aliases whose connections are sessions of their own (see the module docstring).
SESSIONS: set[str] = set()

#: Most rows a statement is prepared for: an acknowledgement's messages, the
#: rows a claim took the last time. Planning is a fixed cost, most of a one-row
#: claim's time on the server and little of a hundred rows'; and a worker that
#: drained a backlog in claims and acknowledgements of a hundred ran 10-20 %
#: slower with them prepared (the generic plan the server settles on, in part:
#: forcing a plan per call won half of it back). Larger ones are planned at
#: each call.
PREPARED_ROWS = 16

#: psycopg's prepare threshold that prepares only the statements executed with
#: ``prepare=True`` (no count of executions ever reaches it).
ONLY_WHEN_ASKED = 2**62


def sessions_proven(alias: str) -> None:
    """Say that ``alias``'s connections keep their server session from one
    transaction to the next: its frequent statements may be prepared."""
    SESSIONS.add(alias)


def _driver_cursor(connection: BaseDatabaseWrapper, prepare: bool = False) -> Any | None:
    """A cursor of the driver's connection for a statement, or None: the wrapper's way;
    ``prepare``: one that can prepare it (the caller checked that sessions are proven
    the client's).

    Kept on the connection and used again (a new one cost about 0.05 ms of
    CPU, a tenth of a one-row claim's): one per driver connection, way, time
    zone and thread.
    """
    watched = connection.queries_logged or connection.execute_wrappers
    if connection.vendor != "postgresql" or watched:
        return None
    connection.ensure_connection()
    driver = connection.connection
    if not hasattr(driver, "adapters"):  # psycopg 2
        return None
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    # The thread too: a connection shared between threads (allow_thread_sharing)
    # must not share a cursor, whose result one thread's statement replaces.
    key = (prepare, connection.timezone, threading.get_ident())
    kept = connection.__dict__.get(_KEPT)
    if kept is None or kept[0] is not driver:
        kept = connection.__dict__[_KEPT] = (driver, {})
    cursors: dict[tuple[bool, Any, int], Any] = kept[1]
    cursor = cursors.get(key)
    if cursor is None or cursor.closed:
        cursor = cursors[key] = _new_cursor(connection, prepare)
    return cursor


# Where a connection keeps its cursors (_driver_cursor): (the driver's connection,
# the cursors by way, time zone and thread).
_KEPT = "_delayq_cursors"


def _new_cursor(connection: BaseDatabaseWrapper, prepare: bool) -> Any:
    """The cursor ``_driver_cursor`` keeps: reading datetimes as Django's cursors do, by
    the driver's own loader where that reads the same values."""
    import psycopg
    from psycopg.pq import Format

    cursor = _binding_cursor(connection) if prepare else connection.create_cursor()
    # Django reads every timestamptz through a loader of its own that puts the
    # connection's zone on what psycopg's Python loader parsed: 5 us a value
    # against 0.3 for psycopg's compiled one, and a claimed row has seven. In
    # a session kept in UTC for a project with USE_TZ (the usual case) both
    # read the same values, in datetime.timezone.utc.
    driver = connection.connection
    if connection.timezone is UTC and driver.pgconn.parameter_status(b"TimeZone") == b"UTC":
        oid = driver.adapters.types["timestamptz"].oid
        cursor.adapters.register_loader(oid, psycopg.adapters.get_loader(oid, Format.TEXT))
    return cursor


def _binding_cursor(connection: BaseDatabaseWrapper) -> Any:
    """A cursor that sends parameters apart from the text (the one a statement can
    be prepared with), reading datetimes as Django's cursors do."""
    import psycopg
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg.pq import Format

    driver = connection.connection
    if driver.prepare_threshold is None and "prepare_threshold" not in connection.settings_dict.get(
        "OPTIONS", {}
    ):
        # Django's default, for the poolers' sake: nothing prepared. In a session
        # proven the client's, the statements asked for (and no other) are.
        driver.prepare_threshold = ONLY_WHEN_ASKED
    if not issubclass(driver.cursor_factory, psycopg.ClientCursor):
        # OPTIONS "server_side_binding": Django's own cursor binds so already.
        return connection.create_cursor()
    cursor = psycopg.Cursor(driver)
    # As Django's create_cursor: the connection's time zone, where the driver's differs.
    loader = driver.adapters.get_loader(driver.adapters.types["timestamptz"].oid, Format.TEXT)
    if getattr(loader, "timezone", None) != connection.timezone:
        register_tzloader(connection.timezone, cursor)
    return cursor


def fetch(
    connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *, prepare: bool = False
) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``%s`` placeholders) and return every row it returns.

    ``prepare``: the text is one the caller sends again and again (compiled
    once): prepare it where sessions are proven the client's. Preparing costs
    a round trip of its own the first time, which a statement sent once never
    pays back.
    """
    return _run(connection, sql, params, prepare, lambda cursor: cursor.fetchall())


def execute(
    connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *, prepare: bool = False
) -> int:
    """Run ``sql`` as :func:`fetch` does; returns how many rows it changed."""
    return _run(connection, sql, params, prepare, lambda cursor: cursor.rowcount)


def _run(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: Sequence[Any],
    prepare: bool,
    result: Callable[[Any], _T],
) -> _T:
    prepare = prepare and connection.alias in SESSIONS
    cursor = _driver_cursor(connection, prepare)
    if cursor is None:
        with connection.cursor() as wrapped:
            wrapped.execute(sql, params)
            return result(wrapped)
    with connection.wrap_database_errors:
        if prepare:
            cursor.execute(sql, params, prepare=True)
        else:
            cursor.execute(sql, params)
        return result(cursor)
