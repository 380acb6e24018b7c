"""``store/direct.py``: the claim's and the acknowledgement's short way to the driver.

It must be the same as Django's cursor wrapper in all a caller can see
(the rows and their types, Django's exceptions, a broken transaction
refused) and must step aside whenever something watches the wrapper.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import DatabaseError, ProgrammingError, connection, connections, transaction
from django.db.backends.utils import CursorWrapper
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from django_delayq import enqueue
from django_delayq.models import Message
from django_delayq.store import claim, direct

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="only PostgreSQL takes the short way"
    ),
]

LEASE = timedelta(minutes=1)


def claimed(queue: str) -> Message:
    (message,) = claim.claim([queue], 1, worker="direct-test", lease=LEASE).messages
    return message


def test_the_short_way_is_taken_only_when_nothing_watches_the_wrapper() -> None:
    connection.ensure_connection()
    plain = direct._driver_cursor(connection)
    # The driver's cursor (of the class Django gives its connection), not the wrapper.
    assert isinstance(plain, psycopg.Cursor) and not isinstance(plain, CursorWrapper)
    plain.close()
    with CaptureQueriesContext(connection):
        assert direct._driver_cursor(connection) is None
    seen: list[str] = []

    def watcher(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watcher):
        assert direct._driver_cursor(connection) is None
        assert direct.fetch(connection, "SELECT 1", []) == [(1,)]
    assert seen == ["SELECT 1"]


def test_a_claim_reads_the_same_rows_either_way() -> None:
    enqueue("direct", {"n": 1, "when": "a"}, key="short", priority=3)
    enqueue("direct", {"n": 1, "when": "a"}, key="wrapped", priority=2)
    short = claimed("direct")
    with CaptureQueriesContext(connection) as captured:
        wrapped = claimed("direct")
    # The wrapper's way was taken (the statement is in Django's log)...
    assert any("lock_token" in query["sql"] for query in captured.captured_queries)
    # ... and the short way gave the same values, of the same types.
    assert (short.key, wrapped.key) == ("short", "wrapped")
    for field in Message._meta.concrete_fields:
        a, b = getattr(short, field.attname), getattr(wrapped, field.attname)
        assert type(a) is type(b), field.name
        if isinstance(a, datetime):
            assert a.tzinfo is UTC and b.tzinfo is UTC, field.name
    assert short.payload == wrapped.payload == {"n": 1, "when": "a"}
    assert short.lock_token is not None and short.status == "running"


def test_the_drivers_errors_are_raised_as_djangos() -> None:
    with pytest.raises(ProgrammingError) as raised:
        direct.fetch(connection, "SELECT * FROM delayq_no_such_table", [])
    assert type(raised.value).__module__ == "django.db.utils"
    assert "delayq_no_such_table" in str(raised.value)
    # The connection goes on working after it.
    assert direct.fetch(connection, "SELECT %s::int", [7]) == [(7,)]


def test_a_broken_transaction_is_refused_before_the_statement() -> None:
    with transaction.atomic():
        try:
            with transaction.atomic():
                direct.fetch(connection, "SELECT * FROM delayq_no_such_table", [])
        except DatabaseError:
            pass
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            direct.fetch(connection, "SELECT 1", [])


def test_a_connection_in_a_time_zone_of_its_own_reads_the_same_datetimes_the_short_way() -> None:
    # DATABASES[...]["TIME_ZONE"]: Django reads datetimes in that zone. The short
    # way holds the cursor Django's wrapper would (connection.create_cursor(),
    # its time zone loader set), and reads the same values in the same zone.
    wrapper = connections[connection.alias]  # not the proxy: its cached time zone
    saved = wrapper.settings_dict.get("TIME_ZONE")

    def use(zone: str | None) -> None:
        wrapper.close()
        wrapper.settings_dict["TIME_ZONE"] = zone
        for cached in ("timezone", "timezone_name"):
            wrapper.__dict__.pop(cached, None)

    use("Asia/Kathmandu")  # +05:45: no zone of the machine's by chance
    try:
        enqueue("direct-tz", {}, key="short", priority=2)
        enqueue("direct-tz", {}, key="wrapped", priority=1)
        cursor = direct._driver_cursor(connection)
        assert cursor is not None  # the short way
        cursor.close()
        short = claimed("direct-tz")
        with CaptureQueriesContext(connection):
            wrapped = claimed("direct-tz")
        assert (short.key, wrapped.key) == ("short", "wrapped")
        for name in ("created_at", "last_attempt_time", "next_attempt_time"):
            a, b = getattr(short, name), getattr(wrapped, name)
            assert str(a.tzinfo) == str(b.tzinfo) == "Asia/Kathmandu", name
            assert a.utcoffset() == b.utcoffset() == timedelta(hours=5, minutes=45), name
    finally:
        use(saved)
