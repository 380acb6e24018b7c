"""Wake-up behind a pooler: DELAYQ["LISTEN_DATABASE"], its checks, and the start-up line.

Every test runs on whatever DATABASE_URL gives; the ones about a pooler
need the suite's PgBouncer leg (scripts/dev.sh: DATABASE_URL through
PgBouncer in transaction mode, DELAYQ_TEST_DIRECT_URL beside it as alias
"direct") and skip elsewhere with the reason.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection, connections

from django_delayq import enqueue
from django_delayq.checks import check_listen_database, check_notifications
from django_delayq.models import Message
from django_delayq.store import direct
from tests.conftest import wait_for
from tests.pooler import behind_pooler, session_alias

postgres_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="LISTEN/NOTIFY is PostgreSQL's"
)
needs_pooler = pytest.mark.skipif(
    not behind_pooler(),
    reason="needs DATABASE_URL through PgBouncer and DELAYQ_TEST_DIRECT_URL (scripts/dev.sh)",
)


def ids(messages: list) -> list[str]:
    return [m.id for m in messages]


@pytest.fixture
def listen_to(settings):
    """Set LISTEN_DATABASE (None: the queue's own alias)."""

    def set_alias(alias: str | None) -> None:
        settings.DELAYQ = {**settings.DELAYQ, "LISTEN_DATABASE": alias}

    return set_alias


@pytest.fixture
def startup_lines(caplog):
    caplog.set_level(logging.INFO, logger="django_delayq.worker")

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("wake-up: ")]

    return lines


# -- the static check -------------------------------------------------------------


def test_an_alias_missing_from_databases_is_an_error(listen_to):
    listen_to("nope")
    assert ids(check_listen_database()) == ["django_delayq.E080"]
    listen_to(["direct"])  # not an alias at all
    assert ids(check_listen_database()) == ["django_delayq.E080"]


def test_an_alias_that_is_not_postgresql_is_an_error(listen_to, monkeypatch, tmp_path):
    other = {**connections.settings["default"], "ENGINE": "django.db.backends.sqlite3"}
    other["NAME"] = str(tmp_path / "other.sqlite3")
    monkeypatch.setitem(connections.settings, "other", other)
    listen_to("other")
    errors = check_listen_database()
    assert ids(errors) == ["django_delayq.E081"]
    assert "not PostgreSQL" in errors[0].msg


def test_an_alias_of_another_database_is_a_warning(listen_to, monkeypatch):
    other = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "somewhere_else",
    }
    monkeypatch.setitem(connections.settings, "other", other)
    listen_to("other")
    warnings = check_listen_database()
    assert ids(warnings) == ["django_delayq.W081"]
    assert "'somewhere_else'" in warnings[0].msg


@postgres_only
def test_an_alias_of_the_same_database_passes(listen_to):
    listen_to(session_alias())
    assert check_listen_database() == []
    listen_to(None)
    assert check_listen_database() == []


# -- the database check (it LISTENs and NOTIFYs for real) -------------------------


@pytest.mark.django_db
@needs_pooler
def test_polling_behind_a_pooler_is_a_warning(listen_to):
    listen_to(None)
    warnings = check_notifications(databases=["default"])
    assert ids(warnings) == ["django_delayq.W080"]
    assert "connection 'default' does not deliver notifications" in warnings[0].msg
    assert "polling every 1 s" in warnings[0].msg


@pytest.mark.django_db
@postgres_only
def test_notifications_that_arrive_pass_the_database_check(listen_to):
    # Behind a pooler through "direct"; on a plain server through "default".
    listen_to(session_alias())
    assert check_notifications(databases=["default"]) == []


@pytest.mark.django_db
def test_the_database_check_needs_the_queue_alias(listen_to):
    listen_to(None)
    assert check_notifications(databases=[]) == []
    assert check_notifications() == []


@pytest.mark.django_db
@pytest.mark.skipif("connection.vendor == 'postgresql'", reason="polling is the other databases'")
def test_other_databases_poll_without_a_warning(listen_to):
    listen_to(None)
    assert check_notifications(databases=["default"]) == []


# -- the worker: its start-up line, and how it picks messages up -------------------


@pytest.mark.django_db(transaction=True)
@postgres_only
def test_a_listening_worker_picks_up_by_notification(
    listen_to, settings, serving_worker, startup_lines
):
    # An hour between polls: only a notification explains a pickup. Behind
    # a pooler, the worker listens on "direct" while the producer's NOTIFY
    # goes through the pooler with its insert.
    listen_to(session_alias())
    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 3600}
    serving_worker(["default"])
    line = wait_for(startup_lines, message="the wake-up line")[0]
    assert line.getMessage() == (
        f"wake-up: LISTEN on alias '{session_alias()}' (pickup within milliseconds)"
    )
    assert line.levelno == logging.INFO
    # Its LISTEN proved the queue's alias a session of its own (store/direct.py:
    # the claim and the acknowledgement are prepared there), unless it listens
    # on another alias: the queue's then goes through the pooler.
    assert ("default" in direct.SESSIONS) == (session_alias() == "default")
    for _ in range(3):
        # One after the other, each once the worker is idle again.
        message = enqueue("default", {}).message
        wait_for(
            lambda m=message: Message.objects.filter(pk=m.pk, status="succeeded").exists(),
            message="the message picked up by notification",
        )


@pytest.mark.django_db(transaction=True)
@needs_pooler
def test_behind_a_pooler_without_a_listen_alias_the_worker_polls_and_says_so(
    listen_to, serving_worker, startup_lines
):
    listen_to(None)
    serving_worker(["default"])
    line = wait_for(startup_lines, message="the wake-up line")[0]
    assert line.getMessage() == (
        "wake-up: polling every 1 s: connection 'default' does not deliver notifications "
        "(a pooler in transaction mode?); set DELAYQ['LISTEN_DATABASE'] to a direct alias"
    )
    assert line.levelno == logging.WARNING
    # Another client's statement may hide under a prepared statement's name there.
    assert "default" not in direct.SESSIONS
    message = enqueue("default", {}).message
    wait_for(
        lambda: Message.objects.filter(pk=message.pk, status="succeeded").exists(),
        message="the message picked up by polling",
    )


@pytest.mark.django_db(transaction=True)
@needs_pooler
def test_a_listen_alias_that_hears_nothing_makes_the_worker_poll(
    listen_to, monkeypatch, serving_worker, startup_lines
):
    # "pooled" is a second alias through the pooler: named as the LISTEN
    # alias, the probe finds that it hears nothing, and the worker says so.
    monkeypatch.setitem(connections.settings, "pooled", {**connections.settings["default"]})
    listen_to("pooled")
    serving_worker(["default"])
    line = wait_for(startup_lines, message="the wake-up line")[0]
    assert line.getMessage().startswith(
        "wake-up: polling every 1 s: a LISTEN on alias 'pooled' does not hear a NOTIFY "
        "sent through 'default'"
    )
    assert line.levelno == logging.WARNING


@pytest.mark.django_db(transaction=True)
def test_without_notify_the_worker_says_it_polls(settings, serving_worker, startup_lines):
    settings.DELAYQ = {**settings.DELAYQ, "NOTIFY": False}
    serving_worker(["default"])
    line = wait_for(startup_lines, message="the wake-up line")[0]
    assert line.getMessage() == "wake-up: polling every 1 s: DELAYQ['NOTIFY'] is False"
    assert line.levelno == logging.INFO


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    "connection.vendor != 'mysql'", reason="MariaDB/MySQL poll (SQLite: test_local_wake)"
)
def test_mariadb_says_it_polls(serving_worker, startup_lines):
    serving_worker(["default"])
    line = wait_for(startup_lines, message="the wake-up line")[0]
    assert line.getMessage() == (
        f"wake-up: polling every 1 s: {connection.vendor} has no LISTEN/NOTIFY"
    )
    assert line.levelno == logging.INFO


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_has_no_wake_up_line(run_worker, startup_lines):
    run_worker(["default"])
    assert startup_lines() == []
