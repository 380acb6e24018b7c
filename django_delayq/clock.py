"""The one place the library reads the time.

Two clocks, on purpose:

* ``sql_now()`` / ``sql_now_plus()`` are SQL expressions evaluated by the
  database. Every status change that decides *who may run what* (the claim's
  "is it due?", the lease expiry, the retry time, the acknowledgement) is
  written with them, so workers on hosts whose clocks disagree still agree
  about due times and leases: there is only one clock, the database's.
* ``now()`` is this process's clock, for what only needs to be roughly right
  (how long an idle worker sleeps, a log line, the producer's ``run_at``
  arithmetic which the caller expresses in its own time anyway).

Keeping both behind this module gives tests (and the user-facing testing
helpers) a single seam: replacing ``clock.now`` (``monkeypatch.setattr``)
makes the SQL expressions use the replaced time too, so a test can move time
forward without sleeping.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import DateTimeField, Expression, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.utils import timezone


def now() -> datetime:
    return timezone.now()


_system_now = now


class DatabaseNow(Now):
    """``Now()``, in UTC on MariaDB/MySQL too, at microsecond resolution on SQLite.

    With ``USE_TZ`` Django stores naive UTC there, while ``CURRENT_TIMESTAMP``
    is in the session's time zone: on a server that is not on UTC every due
    time and lease would be off by the offset.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        template = "UTC_TIMESTAMP(6)" if settings.USE_TZ else "CURRENT_TIMESTAMP(6)"
        return self.as_sql(compiler, connection, template=template, **extra_context)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # SQLite's 'now' ticks in milliseconds while Django stores times to
        # the microsecond: as the plain 'now', a message enqueued now was not
        # due until the next tick, and a claim right after its enqueue missed
        # it. The last microsecond of the current millisecond counts instead
        # (due times are compared at SQLite's resolution); like 'now', it is
        # the same for the whole statement.
        # (Percent signs doubled twice: once for the template, once for the
        # statement's parameters, as Django's own Now.as_sqlite does.)
        template = "(STRFTIME('%%%%Y-%%%%m-%%%%d %%%%H:%%%%M:%%%%f', 'NOW') || '999')"
        return self.as_sql(compiler, connection, template=template, **extra_context)


class FixedNow(Value):
    """A replaced clock's time as SQL; selected as a column, a datetime on MySQL too
    (where a bare string parameter comes back as a string)."""

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        sql, params = self.as_sql(compiler, connection)
        return f"CAST({sql} AS DATETIME(6))", params


def is_overridden() -> bool:
    """True while a test (or a testing helper) has replaced ``now``."""
    return now is not _system_now


def sql_now() -> Expression:
    """The database's current time (``STATEMENT_TIMESTAMP()`` on PostgreSQL)."""
    if is_overridden():
        return FixedNow(now(), output_field=DateTimeField())
    return DatabaseNow()


def sql_now_plus(delta: timedelta) -> Expression:
    """The database's current time plus ``delta``, as one SQL expression."""
    if is_overridden():
        return FixedNow(now() + delta, output_field=DateTimeField())
    return ExpressionWrapper(DatabaseNow() + Value(delta), output_field=DateTimeField())
