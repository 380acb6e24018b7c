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

The wrapper's way is kept whenever something watches it: Django's query log
(``DEBUG``, ``CaptureQueriesContext``, ``assertNumQueries``), an
``execute_wrapper`` installed on the connection, or a connection whose time
zone differs from the one its datetimes are read in. Instrumentation that
patches Django's cursor wrapper itself (some tracing libraries do) does not
see these statements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

try:
    from psycopg.pq import Format
except ImportError:  # no psycopg 3: every statement takes the wrapper's way
    Format = None  # type: ignore[assignment,misc]

# psycopg's type oid of timestamptz, whose loader reads the connection's datetimes.
TIMESTAMPTZ = 1184
_MISSING = object()


def _driver_cursor(connection: BaseDatabaseWrapper) -> Any | None:
    """A cursor of the driver's connection for a statement, or None: the wrapper's way."""
    if (
        Format is None
        or connection.vendor != "postgresql"
        or connection.queries_logged
        or connection.execute_wrappers
    ):
        return None
    connection.ensure_connection()
    raw = connection.connection
    if not hasattr(raw, "adapters"):  # psycopg 2
        return None
    loader = raw.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)
    if getattr(loader, "timezone", _MISSING) != connection.timezone:
        return None
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    return raw.cursor()


def fetch(
    connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``%s`` placeholders) and return every row it returns."""
    cursor = _driver_cursor(connection)
    if cursor is None:
        with connection.cursor() as wrapped:
            wrapped.execute(sql, params)
            return wrapped.fetchall()
    with connection.wrap_database_errors, cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
