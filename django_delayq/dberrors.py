"""Telling a database that is away from a statement the database refuses.

A lost connection, a restarted server or a failover raise an
``OperationalError`` or ``InterfaceError`` (an ``InternalError`` for some
states of a failover): the worker reconnects and tries again, for as long as
``DATABASE_OUTAGE_LIMIT`` allows. A ``DataError``, ``ProgrammingError``,
``IntegrityError`` or ``NotSupportedError`` says that the database is there
and refuses the statement itself (a number out of its column's range, SQL it
cannot parse, a missing table): trying again reconnects to the same answer.
"""

from __future__ import annotations

from django.db import DataError, IntegrityError, NotSupportedError, ProgrammingError

#: Errors of the statement, not of the connection: retrying cannot cure them.
STATEMENT_ERRORS = (DataError, IntegrityError, NotSupportedError, ProgrammingError)

#: Rounds in a row whose claim failed with one of STATEMENT_ERRORS before the worker
#: stops (exit status 70): a transient one (a prepared statement a pooler dropped)
#: clears after the reconnection that follows each failure.
STATEMENT_ERROR_LIMIT = 3


def is_statement_error(error: BaseException) -> bool:
    """Whether ``error`` is the database refusing a statement (see the module docstring)."""
    return isinstance(error, STATEMENT_ERRORS)
