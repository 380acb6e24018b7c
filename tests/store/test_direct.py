"""``store/direct.py``: the claim's and the acknowledgement's short way to the driver.

It must be the same as Django's cursor wrapper in all a caller can see
(the rows and their types, Django's exceptions, a broken transaction
refused) and must step aside whenever something watches the wrapper.
"""

from __future__ import annotations

import threading
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
from tests.pooler import skip_behind_pooler

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


def test_a_connection_keeps_its_cursor_until_it_is_closed_or_reconnects() -> None:
    connection.ensure_connection()
    first = direct._driver_cursor(connection)
    assert direct._driver_cursor(connection) is first
    assert direct.fetch(connection, "SELECT %s::int", [3]) == [(3,)]
    assert direct._driver_cursor(connection) is first  # a statement leaves it open
    first.close()  # closed by someone: replaced
    second = direct._driver_cursor(connection)
    assert second is not first and not second.closed
    connection.close()  # a new server session: a cursor of its own
    third = direct._driver_cursor(connection)
    assert third is not second and third.connection is connection.connection
    assert direct.fetch(connection, "SELECT now()", [])[0][0].tzinfo is UTC
    # A connection shared between threads: each thread has a cursor of its own.
    wrapper = connections[connection.alias]
    other: list[object] = []
    wrapper.inc_thread_sharing()
    try:
        thread = threading.Thread(target=lambda: other.append(direct._driver_cursor(wrapper)))
        thread.start()
        thread.join(30)
    finally:
        wrapper.dec_thread_sharing()
    assert other and other[0] is not third and other[0] is not None


@pytest.fixture(params=["client-side binding", "prepared"])
def way(request: pytest.FixtureRequest) -> str:
    """Whether the alias's sessions are proven its own (its statements prepared)."""
    if request.param == "prepared":
        skip_behind_pooler("a prepared statement may be another client's there")
        direct.sessions_proven(connection.alias)
    return request.param


def prepared_statements() -> list[str]:
    """The statements prepared in this connection's session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_claim_reads_the_same_rows_either_way(way: str) -> None:
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


def test_a_connection_in_a_time_zone_of_its_own_reads_the_same_datetimes_the_short_way(
    way: str,
) -> None:
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


def test_the_claim_and_the_ack_are_prepared_only_where_sessions_are_proven_the_clients() -> None:
    # Behind a pooler in transaction mode a prepared statement may be another
    # client's under the same name: nothing is prepared until a worker's LISTEN
    # proved the alias's sessions its own (worker/listen.py).
    from django_delayq.store import settle

    skip_behind_pooler("the session that prepared a statement is not the next statement's")
    options = connection.settings_dict.get("OPTIONS", {})
    if options.get("server_side_binding") or "prepare_threshold" in options:
        pytest.skip("psycopg prepares every statement of this configuration")
    connection.close()
    for key in "abcdef":
        enqueue("direct-prepared", {}, key=key)

    def claim_and_ack_two() -> None:
        # Acknowledged together (the acknowledgement thread's batch), and alone.
        one, two = claimed("direct-prepared"), claimed("direct-prepared")
        held = {one.lock_token: [one.pk], two.lock_token: [two.pk]}
        assert settle.ack_held(held) == {(one.pk, one.lock_token), (two.pk, two.lock_token)}
        three = claimed("direct-prepared")
        assert settle.ack([three.pk], three.lock_token) == 1

    claim_and_ack_two()
    assert not [s for s in prepared_statements() if "lock_token" in s]

    direct.sessions_proven(connection.alias)
    claim_and_ack_two()
    statements = [s for s in prepared_statements() if "lock_token" in s]
    # The claim's, and the acknowledgements' (of several claims, of one).
    assert len(statements) == 3, statements
    statuses = Message.objects.filter(queue="direct-prepared").values_list("status", flat=True)
    assert set(statuses) == {"succeeded"}
