"""``delayq_status --health`` and the dashboard's database section (store/pressure.py):
each problem is provoked for real on the database under test (a second connection
holding a transaction open, dead rows, a file full of free pages) and must be
named, with what to do; once it is gone, so is the problem."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from django_delayq import enqueue_many
from django_delayq.models import Message
from django_delayq.store import pressure
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NOW = pressure.Limits(long_transaction=timedelta(0))


def by_name(checks: list[pressure.Check]) -> dict[str, pressure.Check]:
    return {check.name: check for check in checks}


@contextmanager
def transaction_held_elsewhere() -> Iterator[int]:
    """A second session that has written (holds a transaction id) and stays open, as
    an ``idle in transaction`` session would; yields its server-side id."""
    params = connection.get_connection_params()
    if connection.vendor == "postgresql":
        import psycopg

        clean = {
            k: v
            for k, v in params.items()
            if k not in ("cursor_factory", "context", "prepare_threshold", "server_side_binding")
        }
        with psycopg.connect(**clean) as other:
            pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            other.execute("SELECT txid_current()")
            yield pid
            other.rollback()
    else:
        import MySQLdb

        other = MySQLdb.connect(**params)
        try:
            cursor = other.cursor()
            cursor.execute("SELECT CONNECTION_ID()")
            (thread,) = cursor.fetchone()
            cursor.execute("BEGIN")
            cursor.execute("SELECT COUNT(*) FROM django_delayq_message FOR UPDATE")
            yield thread
            other.rollback()
        finally:
            other.close()


def named(holder: int) -> str:
    """How the check names the holding session."""
    return f"{'pid' if connection.vendor == 'postgresql' else 'thread'} {holder} ("


def seen(holder: int, limits: pressure.Limits | None = None, *, held: bool = True) -> None:
    """Wait until the transaction held elsewhere shows (or, ``held=False``, is gone).
    MariaDB counts in whole seconds (a transaction is "over 0 s" in the next one),
    and refreshes its list of transactions only when it was not read for 0.1 s:
    the polls are spaced."""
    wait_for(
        lambda: (
            (named(holder) in by_name(pressure.health(limits=limits))["long transactions"].value)
            is held
        ),
        interval=0.2,
        message="the open transaction to be seen" if held else "it to be gone",
    )


def health_output(*args: str) -> tuple[str, bool]:
    """``delayq_status --health``'s output, and whether it exited with an error."""
    out = io.StringIO()
    try:
        call_command("delayq_status", "--health", *args, stdout=out)
    except CommandError:
        return out.getvalue(), True
    return out.getvalue(), False


def test_a_transaction_left_open_elsewhere_is_named_with_how_to_end_it():
    # MariaDB's transactions are the server's (its purge is): other test
    # processes' show too, so only the holder's own line is looked at.
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no sessions of other clients to look at")
    with transaction_held_elsewhere() as holder:
        seen(holder, NOW)
        check = by_name(pressure.health(limits=NOW))["long transactions"]
        assert check.problem
        assert ("pg_terminate_backend" if connection.vendor == "postgresql" else "KILL") in (
            check.advice
        )
        output, failed = health_output("--long-transaction", "0")
        assert failed
        assert "! long transactions: " in output and named(holder) in output
        # The default threshold (a minute) is not reached by a transaction this young.
        assert named(holder) not in by_name(pressure.health())["long transactions"].value
    seen(holder, NOW, held=False)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's statistics")
def test_dead_rows_are_counted_and_vacuum_clears_them():
    limits = pressure.Limits(dead_tuples=100, dead_share=0.5)
    results = enqueue_many("health", [{"n": n} for n in range(400)])
    Message.objects.filter(pk__in=[r.message.pk for r in results]).delete()

    def dead() -> pressure.Check:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")  # this session's counts
        return by_name(pressure.health(limits=limits))["django_delayq_message"]

    wait_for(lambda: dead().problem, message="the dead rows to be counted")
    assert "VACUUM" in dead().advice
    with connection.cursor() as cursor:
        cursor.execute("VACUUM django_delayq_message")
    wait_for(lambda: not dead().problem, message="vacuum to clear them")
    assert dead().value.startswith("0 dead rows")


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's LISTEN/NOTIFY")
def test_the_notification_queue_is_reported():
    check = by_name(pressure.health())["notification queue"]
    assert check.value.endswith("% used") and not check.problem
    # At a threshold of nothing, any use is reported, with the way out.
    check = by_name(pressure.health(limits=pressure.Limits(notify_usage=0.0)))["notification queue"]
    assert check.problem and "LISTEN" in check.advice


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's file")
def test_free_pages_of_the_sqlite_file_are_reported_until_vacuum():
    limits = pressure.Limits(free_bytes=0, free_share=0.1)
    results = enqueue_many("health", [{"pad": "x" * 2000} for _ in range(500)])
    Message.objects.filter(pk__in=[r.message.pk for r in results]).delete()
    check = by_name(pressure.health(limits=limits))["database file"]
    assert check.problem and "VACUUM" in check.advice
    with connection.cursor() as cursor:
        cursor.execute("VACUUM")
    assert not by_name(pressure.health(limits=limits))["database file"].problem


def test_every_table_of_the_queue_is_listed_with_its_size():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's tables share one file")
    names = set(by_name(pressure.health()))
    assert {"django_delayq_message", "django_delayq_workerstate"} <= names
    output, _ = health_output()
    assert "django_delayq_message" in output and "indexes" in output


def test_the_dashboard_names_a_transaction_left_open(admin_client, monkeypatch):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no sessions of other clients to look at")
    checks = pressure.health
    monkeypatch.setattr(pressure, "health", lambda using=None, limits=None: checks(using, NOW))
    url = reverse("admin:django_delayq_message_dashboard")
    with transaction_held_elsewhere() as holder:
        seen(holder)
        page = admin_client.get(url).content.decode()
        assert "delayq-database-problem" in page and named(holder) in page
    seen(holder, held=False)
    page = admin_client.get(url).content.decode()
    assert named(holder) not in page


def test_bad_thresholds_are_refused_before_anything_runs():
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(CommandError, match="--long-transaction"):
            call_command("delayq_status", "--health", "--long-transaction", bad)


def test_a_health_check_that_cannot_read_does_not_break_the_dashboard(admin_client, monkeypatch):
    from django.db import DatabaseError

    def refuse(*args: object, **kwargs: object) -> list[pressure.Check]:
        raise DatabaseError("permission denied for view pg_stat_activity")

    monkeypatch.setattr(pressure, "health", refuse)
    page = admin_client.get(reverse("admin:django_delayq_message_dashboard"))
    assert page.status_code == 200
    assert "could not be read" in page.content.decode()
