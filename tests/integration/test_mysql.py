"""MariaDB / MySQL: the server version check, case-sensitive keys, the UTC clock,
and exact enqueue outcomes when producers race for the same keys.

The tests that need MariaDB/MySQL skip elsewhere; the race and case tests run on
every database, since the promise they check is the same everywhere.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayq import Outcome, enqueue, enqueue_many
from django_delayq.checks import check_database
from django_delayq.models import Message
from django_delayq.store import server, without_returning
from django_delayq.store.claim import claim
from tests.conftest import wait_for

needs_mysql = pytest.mark.skipif(
    connection.vendor != "mysql", reason="MariaDB/MySQL behaviour (DATABASE_URL=mysql://...)"
)


@needs_mysql
@pytest.mark.django_db
def test_this_server_is_recent_enough_and_older_ones_are_refused(monkeypatch):
    assert server.version_problem(connection) is None
    assert [e.id for e in check_database(databases=["default"])] == []

    old = (10, 5, 27) if connection.mysql_is_mariadb else (5, 7, 44)
    monkeypatch.setattr(connection, "mysql_version", old)
    errors = check_database(databases=["default"])
    assert [e.id for e in errors] == ["django_delayq.E050"]
    assert "SKIP LOCKED" in errors[0].msg and ".".join(map(str, old)) in errors[0].msg
    with pytest.raises(SystemCheckError, match="E050"):
        call_command("run_delayq", "--burst")


@needs_mysql
@pytest.mark.django_db(transaction=True)
def test_case_insensitive_key_columns_are_reported_with_the_fix():
    assert server.collation_problems(connection) == []  # tests/conftest.py applied the fix
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {qn(Message._meta.db_table)} MODIFY {qn('key')} varchar(255) "
            "CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"
        )
    try:
        warnings = check_database(databases=["default"])
        assert [w.id for w in warnings] == ["django_delayq.W050"]
        assert "key (utf8mb4_general_ci)" in warnings[0].msg
        assert warnings[0].hint == f"run once: {server.binary_columns_sql(connection)}"
        enqueue("default", {}, key="Welcome")
        with pytest.raises(ImproperlyConfigured, match="W050"):
            enqueue("default", {}, key="welcome")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(server.binary_columns_sql(connection))
    assert server.collation_problems(connection) == []


@pytest.mark.django_db
def test_keys_that_differ_in_case_or_trailing_space_are_different_messages():
    outcomes = [enqueue("default", {"n": i}, key=k).outcome for i, k in enumerate(["A", "a", "a "])]
    assert outcomes == [Outcome.CREATED] * 3
    assert Message.objects.filter(queue="default").count() == 3


@needs_mysql
@pytest.mark.django_db
def test_due_times_use_utc_whatever_the_session_time_zone():
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@session.time_zone")
        assert cursor.fetchone()[0] == "+05:00"  # tests/settings.py
    now = timezone.now()
    enqueue("default", {}, key="due", run_at=now - timedelta(minutes=1))
    enqueue("default", {}, key="in-an-hour", run_at=now + timedelta(hours=1))
    claimed = claim(["default"], 10, worker="w", lease=timedelta(minutes=1))
    assert [m.key for m in claimed.messages] == ["due"]
    lease_end = claimed.messages[0].next_attempt_time
    assert now < lease_end <= timezone.now() + timedelta(minutes=1)


@needs_mysql
@pytest.mark.django_db
def test_enqueue_many_inserts_a_chunk_in_one_statement():
    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many("default", [{"i": i} for i in range(3000)])
    inserts = [q["sql"] for q in queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1 and "JSON_TABLE" in inserts[0]
    assert [r.outcome for r in results] == [Outcome.CREATED] * 3000
    assert {r.message.pk for r in results} == set(Message.objects.values_list("pk", flat=True))


@needs_mysql
@pytest.mark.django_db(transaction=True)
def test_a_key_committed_by_another_producer_meanwhile_is_reported_ignored():
    """Force the race: our INSERT waits on another transaction's new row, which then commits."""
    other_inserted = threading.Event()
    release = threading.Event()
    failures: list[BaseException] = []

    def other_producer() -> None:
        try:
            with transaction.atomic():
                enqueue("default", {"by": "other"}, key="contested")
                other_inserted.set()
                release.wait(timeout=30)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=other_producer)
    thread.start()
    assert other_inserted.wait(timeout=30)
    results: list = []

    statements: list[str] = []

    def ours() -> None:
        try:
            with CaptureQueriesContext(connections["default"]) as queries:
                results.extend(
                    enqueue_many("default", [{"by": "us"}] * 2, keys=["contested", "free"])
                )
            statements.extend(q["sql"] for q in queries)
        finally:
            connections["default"].close()

    ours_thread = threading.Thread(target=ours)
    ours_thread.start()

    def our_insert_is_waiting() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                # This test's database only: the server runs other test
                # processes' inserts too.
                "SELECT COUNT(*) FROM information_schema.processlist "
                "WHERE db = DATABASE() AND info LIKE 'INSERT IGNORE%%' "
                "AND id <> CONNECTION_ID()"
            )
            return cursor.fetchone()[0] > 0

    wait_for(our_insert_is_waiting, message="our INSERT to wait on the other's row")
    release.set()
    thread.join(timeout=30)
    ours_thread.join(timeout=30)
    assert not failures
    # The insert came up one row short, so the chunk was rolled back and read again.
    assert sum(s.startswith("ROLLBACK TO SAVEPOINT") for s in statements) == 1
    assert [r.outcome for r in results] == [Outcome.IGNORED, Outcome.CREATED]
    assert results[0].message.payload == {"by": "other"}
    contested = Message.objects.get(key="contested")
    assert contested.payload == {"by": "other"} and results[0].message.pk == contested.pk
    assert Message.objects.get(key="free").pk == results[1].message.pk


@pytest.mark.django_db(transaction=True)
def test_racing_producers_create_each_key_exactly_once():
    keys = [f"k{i:04d}" for i in range(400)]
    batches = [keys[:300], keys[100:], keys[::-1], keys[50:350]]
    barrier = threading.Barrier(len(batches))
    results: list[list] = [[] for _ in batches]
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[n] = enqueue_many("race", [{"by": n}] * len(batches[n]), keys=batches[n])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    created = [r.message.key for rs in results for r in rs if r.outcome is Outcome.CREATED]
    assert sorted(created) == keys  # every key created, and by one producer only
    rows = dict(Message.objects.filter(queue="race").values_list("key", "payload"))
    for n, rs in enumerate(results):
        for r in rs:
            assert r.message.pk is not None
            if r.outcome is Outcome.CREATED:
                assert rows[r.message.key] == {"by": n}


@needs_mysql
@pytest.mark.django_db
def test_the_share_locked_read_runs_under_repeatable_read(monkeypatch):
    enqueue("default", {"n": 1}, key="k1")
    enqueue("default", {"n": 2}, key="k2")
    monkeypatch.setattr(connection, "isolation_level", "repeatable read", raising=False)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        rows = without_returning._read(connection, "default", ["k1", "k2", "k3"], lock=True)
    assert sorted((m.key, m.payload) for m in rows) == [("k1", {"n": 1}), ("k2", {"n": 2})]
    assert any(q["sql"].endswith("LOCK IN SHARE MODE") for q in queries)


@pytest.fixture
def other_backend_alias():
    """A second alias whose backend is not the default's (MariaDB's, or SQLite's on MariaDB).

    It never connects: the test below only compiles SQL for it.
    """
    alias = "delayq_other_backend"
    if connection.vendor == "mysql":
        settings = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    else:
        pytest.importorskip("MySQLdb")
        settings = {"ENGINE": "django.db.backends.mysql", "NAME": "unused", "HOST": "invalid."}
    configured = connections.configure_settings({**connections.settings, alias: settings})
    connections.settings[alias] = configured[alias]
    try:
        yield connections[alias]
    finally:
        del connections[alias]
        del connections.settings[alias]


def test_the_share_locked_read_is_compiled_for_its_own_alias(other_backend_alias, monkeypatch):
    """``_read`` under REPEATABLE READ writes its SELECT itself: in the SQL of the
    connection it runs on (MariaDB's backticks), not in the default alias's."""
    captured = []

    def raw(sql, params, using):
        captured.append((sql, list(params), using))
        return []

    monkeypatch.setattr(Message.objects, "raw", raw)
    other = other_backend_alias
    assert without_returning._read(other, "emails", ["k1", "k2"], lock=True) == []
    [(sql, params, using)] = captured
    assert using == other.alias and sql.endswith(" LOCK IN SHARE MODE")
    assert other.ops.quote_name("key") in sql
    assert connection.ops.quote_name("key") not in sql
    assert sorted(params) == ["emails", "k1", "k2"]


@pytest.mark.django_db
def test_groups_that_differ_in_case_or_trailing_space_are_different_groups():
    for key, group in [("a", "G"), ("b", "g"), ("c", "g ")]:
        enqueue("default", {}, key=key, group=group)
    # Three groups, each with one message: none is held behind another.
    assert not Message.objects.filter(next_attempt_time=None).exists()
    claimed = claim(["default"], 10, worker="w", lease=timedelta(minutes=1))
    assert sorted(m.group for m in claimed.messages) == ["G", "g", "g "]
