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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


def _driver_cursor(connection: BaseDatabaseWrapper) -> Any | None:
    """A cursor of the driver's connection for a statement, or None: the wrapper's way."""
    watched = connection.queries_logged or connection.execute_wrappers
    if connection.vendor != "postgresql" or watched:
        return None
    connection.ensure_connection()
    if not hasattr(connection.connection, "adapters"):  # psycopg 2
        return None
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    # The cursor Django's wrapper would hold: its time zone loader set where the
    # connection's time zone differs from the driver's.
    return connection.create_cursor()


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
