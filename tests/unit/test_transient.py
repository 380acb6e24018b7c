"""Which database errors mean "run the transaction again" (``store.server.is_transient``)."""

import pytest
from django.db import OperationalError

from django_delayq.store.server import is_transient


def wrapped(cause: BaseException) -> OperationalError:
    """As Django raises it: its own class, the driver's error as the cause."""
    error = OperationalError(*cause.args)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize("code", [1205, 1213, 1467])
def test_mariadb_deadlocks_and_lock_timeouts_are_transient(code):
    MySQLdb = pytest.importorskip("MySQLdb")
    assert is_transient(wrapped(MySQLdb.OperationalError(code, "deadlock")))


def test_other_mariadb_errors_are_not():
    MySQLdb = pytest.importorskip("MySQLdb")
    assert not is_transient(wrapped(MySQLdb.OperationalError(1146, "no such table")))


@pytest.mark.parametrize(
    ("name", "transient"),
    [("DeadlockDetected", True), ("SerializationFailure", True), ("UndefinedTable", False)],
)
def test_postgresql_errors_by_their_sqlstate(name, transient):
    errors = pytest.importorskip("psycopg.errors")
    assert is_transient(wrapped(getattr(errors, name)("x"))) is transient
