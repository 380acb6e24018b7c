"""Bad input is refused early and clearly, on every database: never a lost message, never a
worker that crashes or spins.

The commands' options are found from their own parsers: every option that
converts to a number is given numbers no database holds, every ``--database``
an alias that does not exist, every ``--queue`` a name no queue can have.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from django.test import override_settings

from django_delayq import enqueue, enqueue_many, operations
from django_delayq.dberrors import STATEMENT_ERROR_LIMIT
from django_delayq.enqueuing import aenqueue_many
from django_delayq.exceptions import WorkerCrashed
from django_delayq.models import Message, WorkerState
from django_delayq.retention import prune
from django_delayq.worker import Worker
from tests.conftest import ROOT, finishes_within

pytestmark = pytest.mark.django_db(transaction=True)

COMMANDS = ("run_delayq", "delayq_status", "delayq_prune", "delayq_cron", "delayq_pipeline")
NUMBERS_NO_DATABASE_HOLDS = ["99999999999999999999", "-99999999999999999999", "1e20", "inf", "nan"]


def parsers(name: str) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """``(sub-command path, parser)`` of a command and each of its sub-commands."""
    todo = [([], load_command_class("django_delayq", name).create_parser("manage.py", name))]
    while todo:
        path, parser = todo.pop()
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [([*path, sub], p) for sub, p in action.choices.items()]


def returns_a_number(action: argparse.Action) -> bool:
    try:
        return isinstance(action.type("1"), int | float)  # type: ignore[misc]
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return False


@pytest.fixture
def base_arguments(tmp_path: Path) -> dict[tuple[str, ...], list[str]]:
    """A valid invocation of each (sub-)command, before the option under test."""
    source = tmp_path / "in.csv"
    source.write_text("email\na@example.org\n")
    return {
        ("run_delayq",): ["--burst"],
        ("delayq_status",): [],
        ("delayq_prune",): [],
        ("delayq_cron",): ["list"],
        ("delayq_pipeline",): [],
        ("delayq_pipeline", "enqueue"): ["enqueue", str(source), "--queue", "q"],
        ("delayq_pipeline", "archive"): ["archive", "--dest", str(tmp_path / "archive")],
        ("delayq_pipeline", "report"): ["report", "--source", str(tmp_path)],
    }


def options_where(condition: Any) -> list[tuple[str, list[str], str]]:
    found = []
    for name in COMMANDS:
        for path, parser in parsers(name):
            for action in parser._actions:
                if action.option_strings and condition(action):
                    found.append((name, path, max(action.option_strings, key=len)))
    return found


def refuse(base: dict[tuple[str, ...], list[str]], name: str, path: list[str], argv: list[str]):
    """The command run with ``argv`` after its valid base arguments: a CommandError."""
    with pytest.raises(CommandError) as caught:
        call_command(name, *base[(name, *path)], *argv)
    return str(caught.value)


def test_every_numeric_option_of_every_command_is_bounded(base_arguments):
    numeric = options_where(returns_a_number)
    assert {option for *_, option in numeric} >= {
        "--concurrency",
        "--batch-size",
        "--health-port",
        "--metrics-port",
        "--database-outage-limit",
        "--older-than",
        "--partitions",
        "--priority",
        "--delay",
        "--max-reject-rate",
        "--pause",
    }
    for name, path, option in numeric:
        for value in NUMBERS_NO_DATABASE_HOLDS:
            message = refuse(base_arguments, name, path, [option, value])
            assert "Traceback" not in message, (name, path, option, value)
    assert not Message.objects.exists()


def test_every_database_option_is_checked_before_it_is_used(base_arguments):
    found = options_where(lambda action: action.dest == "database")
    assert {(name, *path) for name, path, _ in found} == {
        ("run_delayq",),
        ("delayq_status",),
        ("delayq_prune",),
        ("delayq_cron",),
        ("delayq_pipeline", "enqueue"),
        ("delayq_pipeline", "archive"),
        ("delayq_pipeline", "report"),
    }
    for name, path, option in found:
        message = refuse(base_arguments, name, path, [option, "nope"])
        assert "database 'nope' is not in DATABASES (known aliases: 'default'" in message, name


def test_every_queue_option_takes_queue_names_only(base_arguments):
    found = options_where(lambda action: action.dest in ("queue", "queues"))
    assert {(name, *path) for name, path, _ in found} >= {
        ("run_delayq",),
        ("delayq_status",),
        ("delayq_prune",),
    }
    for name, path, option in found:
        base = [a for a in base_arguments[(name, *path)] if a not in ("--queue", "q")]
        with pytest.raises(CommandError, match="may only hold letters, digits"):
            call_command(name, *base, option, "a b")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run_delayq", "--concurrency", "0"], "argument --concurrency/-c: expected a positive"),
        (["delayq_prune", "--batch-size", "-1"], "argument --batch-size: expected a positive"),
        (["delayq_status", "--database", "nope"], "database 'nope' is not in DATABASES"),
        (["delayq_cron", "--database", "nope"], "database 'nope' is not in DATABASES"),
    ],
)
def test_a_bad_option_is_a_usage_error_not_a_traceback(worker_env, argv, message):
    done = subprocess.run(
        [sys.executable, "-m", "django", *argv],
        cwd=ROOT,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("usage: ") and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("size", [0, -1, 10**20, True, 2.5])
def test_prune_refuses_a_batch_size_it_cannot_use(size: object):
    with pytest.raises((TypeError, ValueError), match="batch_size must be"):
        prune(batch_size=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("pause", [-1, float("nan"), float("inf"), 101])
def test_prune_refuses_a_pause_it_cannot_keep(pause: float):
    with pytest.raises(ValueError, match="pause must be from 0 to 100"):
        prune(pause=pause)


def test_a_worker_name_that_does_not_fit_is_refused_before_the_worker_starts():
    with pytest.raises(CommandError, match="worker name is 256 characters, over 255"):
        call_command("run_delayq", "--burst", "--name", "w" * 256)
    with pytest.raises(ValueError, match="worker name is 256 characters, over 255"):
        Worker(["default"], name="w" * 256)
    with pytest.raises(ValueError, match="NUL"):
        Worker(["default"], name="w\x00")
    assert not WorkerState.objects.exists()
    call_command("run_delayq", "--burst", "--name", "w" * 255)
    assert WorkerState.objects.get().name == "w" * 255


# -- enqueue ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("payloads", ["abc", b"abc", {"a": 1, "b": 2}])
def test_enqueue_many_takes_a_list_of_payloads_not_one_payload(payloads: object):
    with pytest.raises(TypeError, match="payloads must be an iterable of payloads"):
        enqueue_many("default", payloads)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="payloads must be an iterable of payloads"):
        finishes_within(60, lambda: __import__("asyncio").run(aenqueue_many("default", payloads)))
    assert not Message.objects.exists()
    assert len(enqueue_many("default", ["abc", {"a": 1}])) == 2


@pytest.mark.parametrize(
    "offset",
    [timedelta(hours=16), timedelta(hours=23, minutes=59), -timedelta(hours=23, minutes=59)],
)
def test_run_at_in_any_utc_offset_python_allows(offset: timedelta):
    zone = timezone(offset)
    run_at = datetime(2030, 1, 1, 12, 0, tzinfo=zone)
    message = enqueue("default", {}, run_at=run_at).message
    message.refresh_from_db()
    assert message.next_attempt_time == run_at == message.scheduled_time
    later = run_at + timedelta(days=1)
    assert operations.reschedule(Message.objects.filter(pk=message.pk), run_at=later).changed == 1
    message.refresh_from_db()
    assert message.next_attempt_time == later


def test_an_aware_run_at_is_refused_when_use_tz_is_false():
    with override_settings(USE_TZ=False):
        with pytest.raises(ValueError, match="aware datetime while USE_TZ is False"):
            enqueue("default", {}, run_at=datetime(2030, 1, 1, tzinfo=UTC))
        assert not Message.objects.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        (name, value)
        for name in ("priority", "delay", "max_attempts")
        for value in (10**20, -(10**20), math.inf, math.nan, True)
    ],
)
def test_every_numeric_argument_of_enqueue_is_bounded(option: str, value: object):
    with pytest.raises((TypeError, ValueError)):
        enqueue("default", {}, **{option: value})
    assert not Message.objects.exists()


# -- the worker ------------------------------------------------------------------------------------


def test_a_claim_the_database_refuses_stops_the_worker_instead_of_retrying_for_ever():
    """A statement error is no outage: the worker stops (exit status 70 from run_delayq)."""
    message = enqueue("default", {}).message
    worker = Worker(["default"], burst=True)
    # A batch no database takes as a LIMIT (the settings and options refuse it):
    # what a fault in the claim's own statement looks like to the claim loop.
    worker.claimer.batch_size = 10**20
    worker.claimer.adaptive = False
    with pytest.raises(WorkerCrashed) as caught:
        finishes_within(120, worker.run)
    text = str(caught.value)
    assert f"the database refused its claim {STATEMENT_ERROR_LIMIT} times in a row" in text
    assert "an error of the statement, not a lost connection" in text
    assert caught.value.exit_code == 70
    # Nothing was lost: the message waits for a worker that can claim it.
    assert Message.objects.get(pk=message.pk).status == "pending"
    Worker(["default"], burst=True).run()
    assert Message.objects.get(pk=message.pk).status == "succeeded"


# -- lone surrogates -----------------------------------------------------------

# What surrogateescape makes of a byte that is no UTF-8 (a file name, say).
LONE = b"report-\xff.csv".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"payload": {"file": LONE}}, r"payload\['file'\] contains a lone surrogate"),
        ({"payload": {LONE: 1}}, r"payload has a key that contains a lone surrogate"),
        ({"payload": [1, ["\ud800"]]}, r"payload\[1\]\[0\] contains a lone surrogate"),
        ({"key": LONE}, r"^key contains a lone surrogate \(\\udcff at character 7\)"),
        ({"group": LONE}, r"^group contains a lone surrogate"),
        ({"kind": LONE}, r"^kind contains a lone surrogate"),
    ],
    ids=["payload-value", "payload-key", "payload-nested", "key", "group", "kind"],
)
def test_a_lone_surrogate_is_refused_naming_the_argument(arguments, named):
    """The driver raised UnicodeEncodeError, naming nothing."""
    with pytest.raises(ValueError, match=named):
        enqueue("default", **{"payload": 1, **arguments})
    if "key" in arguments:
        with pytest.raises(ValueError, match=r"message 1: key contains a lone surrogate"):
            enqueue_many("default", [1, 2], keys=["a", LONE])
    else:
        many = dict(arguments)
        many["payloads"] = [1, many.pop("payload")] if "payload" in many else [1]
        with pytest.raises(ValueError, match=named.replace("payload", "(message 1: )?payload")):
            enqueue_many("default", **many)
    assert not Message.objects.exists()


def test_a_lone_surrogate_in_a_task_argument_is_refused_naming_it():
    from tests.testapp.tasks import echo

    with pytest.raises(ValueError, match=r"payload\['args'\]\[0\] contains a lone surrogate"):
        echo.enqueue(LONE)
    with pytest.raises(ValueError, match=r"payload\['kwargs'\]\['value'\] contains a lone"):
        echo.enqueue(value=LONE)
    assert not Message.objects.exists()


def test_an_error_text_holding_a_lone_surrogate_is_recorded(run_worker, caplog):
    """Every attempt ended "unrecorded", and the message finally "ended without an outcome".
    Its log line, with the traceback, was lost too where a log file is UTF-8 (a
    handler's ``--- Logging error ---``), and broke a test runner's report."""
    import logging

    message = enqueue("surrogates", {"name": LONE.encode("utf-8", "surrogateescape").hex()}).message
    with caplog.at_level(logging.INFO, logger="django_delayq"):
        run_worker(["surrogates"])
    after = Message.objects.get(pk=message.pk)
    assert after.status == "failed"
    assert after.attempt_count == 1
    assert "cannot open report-\\udcff.csv" in after.last_error
    assert "\\udcff" in after.last_traceback
    assert "without an outcome" not in after.last_error
    lines = [logging.Formatter().format(record) for record in caplog.records]
    failed = [line for line in lines if "failed after 1 attempt(s)" in line]
    assert len(failed) == 1 and "Traceback" in failed[0] and "\\udcff" in failed[0]
    for line in lines:
        line.encode("utf-8")  # no lone surrogate left in any line


def test_the_admin_pages_show_a_stored_lone_surrogate_escaped(admin_client):
    """Such a payload can no longer be written, but one written before (as JSON text's
    ``\\ud800`` escape, which SQLite keeps) made the change page 500."""
    from django.db import connection
    from django.urls import reverse

    from tests.admin.message_pages import change_url
    from tests.admin.staff import staff_client

    if connection.vendor != "sqlite":
        pytest.skip("jsonb and MariaDB's JSON check refuse a lone surrogate's escape")
    message = enqueue("default", {"file": "x"}).message
    Message.objects.filter(pk=message.pk).update(status="failed", next_attempt_time=None)
    table = connection.ops.quote_name(Message._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET payload = %s WHERE id = %s",  # noqa: S608 - the model's table
            ['{"file": "report-\\udcff.csv"}', message.pk],
        )
    assert Message.objects.get(pk=message.pk).payload == {"file": LONE}
    viewer = staff_client("viewer", "view_message")[0]
    edit = reverse("admin:django_delayq_message_edit_payload", args=[message.pk])
    for client, url in [
        (admin_client, change_url(message.pk)),
        (viewer, change_url(message.pk)),
        (admin_client, edit),
    ]:
        response = client.get(url)
        assert response.status_code == 200, url
        assert "report-\\udcff.csv" in response.content.decode(), url
