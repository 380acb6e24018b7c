from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_delayq import enqueue
from django_delayq.models import Message, WorkerState

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_status_prints_counts_and_lag(fake_clock):
    enqueue("default", {}, key="due")
    enqueue("default", {}, key="later", delay=600)
    enqueue("other", {}, key="x")
    retrying = enqueue("default", {}, key="retrying").message
    Message.objects.filter(pk=retrying.pk).update(
        attempt_count=1, next_attempt_time=timezone.now() + timedelta(minutes=10)
    )
    fake_clock.advance(90)
    lines = run("delayq_status").splitlines()
    assert lines[0].split() == [
        "queue",
        "due",
        "scheduled",
        "running",
        "retrying",
        "waiting",
        "failed",
        "succeeded/1h",
        "lag",
        "state",
    ]
    default = next(line.split() for line in lines if line.startswith("default"))
    assert default[1:8] == ["1", "1", "0", "1", "0", "0", "0"]
    assert default[8] == "90s"
    assert any(line.startswith("other") for line in lines)


def test_status_counts_each_queues_failed_messages_up_to_the_cap(monkeypatch):
    from django_delayq import stats
    from tests.factories import MessageFactory

    monkeypatch.setattr(stats, "FAILED_CAP", 3)
    MessageFactory.create_batch(4, queue="many", status="failed", finished_at=timezone.now())
    MessageFactory.create_batch(3, queue="few", status="failed", finished_at=timezone.now())
    rows = {line.split()[0]: line.split() for line in run("delayq_status").splitlines()[2:]}
    assert (rows["many"][6], rows["few"][6]) == ("3+", "3")


def test_status_marks_queues_that_no_handler_consumes():
    enqueue("default", {})
    enqueue("nobody-reads-this", {})
    lines = run("delayq_status").splitlines()
    state = {line.split()[0]: line.split(None, 9)[9] for line in lines[2:4]}
    assert state == {"default": "active", "nobody-reads-this": "active, no handler"}
    assert lines[4] == (
        "no handler: no handler in this project consumes the queue; "
        "run_delayq here leaves its messages waiting"
    )
    assert "no handler" not in run("delayq_status", "--queue", "default")


def test_status_counts_stopped_workers_and_lists_them_only_when_asked(worker_rows):
    """A clean stop said goodbye: counted at once, listed with --all-workers."""
    worker_rows("live:1")
    worker_rows("just-stopped:2", stopped_ago=timedelta(seconds=1))
    worker_rows("long-stopped:3", stopped_ago=timedelta(hours=3))
    worker_rows("older:4", stopped_ago=timedelta(hours=20))
    lines = run("delayq_status").splitlines()
    names = [line.split()[0] for line in lines if line.split() and ":" in line.split()[0]]
    assert names == ["live:1"]
    assert lines[-1] == "3 stopped worker(s) (--all-workers lists them)"
    lines = run("delayq_status", "--all-workers").splitlines()
    names = [line.split()[0] for line in lines if line.split() and ":" in line.split()[0]]
    assert names == ["just-stopped:2", "live:1", "long-stopped:3", "older:4"]
    assert "--all-workers" not in lines[-1]


@pytest.fixture
def worker_rows():
    def add(name, stopped_ago=None):
        WorkerState.objects.create(
            name=name,
            host="h",
            pid=int(name.split(":")[1]),
            started_at=timezone.now(),
            last_seen=timezone.now(),
            alive_until=timezone.now(),
        )
        if stopped_ago is not None:
            then = timezone.now() - stopped_ago
            WorkerState.objects.filter(name=name).update(
                last_seen=then, alive_until=then, stopped_at=then
            )

    return add


def test_status_with_no_messages():
    assert "no messages" in run("delayq_status")


def test_prune_command_deletes_old_finished_messages():
    message = enqueue("default", {}).message
    Message.objects.filter(pk=message.pk).update(
        status="succeeded", finished_at=timezone.now() - timedelta(hours=2)
    )
    assert "deleted 0" in run("delayq_prune")
    assert "deleted 1" in run("delayq_prune", "--older-than", "3600")
    assert not Message.objects.exists()


def test_prune_command_waits_between_batches_as_long_as_they_took_times_its_pause(monkeypatch):
    from types import SimpleNamespace

    from django_delayq import retention

    def finished(count: int) -> None:
        ids = [enqueue("default", {}).message.pk for _ in range(count)]
        Message.objects.filter(pk__in=ids).update(
            status="succeeded", finished_at=timezone.now() - timedelta(hours=2)
        )

    waits: list[float] = []
    monkeypatch.setattr(retention, "time", SimpleNamespace(sleep=waits.append))
    finished(5)
    assert "deleted 5" in run("delayq_prune", "--older-than", "60", "--batch-size", "2")
    assert len(waits) == 2  # after the first two full batches: the third is the last
    finished(3)
    assert "deleted 3" in run(
        "delayq_prune", "--older-than", "60", "--batch-size", "1", "--pause", "0"
    )
    assert len(waits) == 2


@pytest.mark.parametrize(
    ("older_than", "words"),
    [
        ("1e12", "expected at most 31536000000 seconds"),
        ("1e300", "expected at most 31536000000 seconds"),
        ("nan", "expected a number of seconds, 0 or more"),
        ("-1", "expected a number of seconds, 0 or more"),
    ],
)
def test_prune_command_refuses_a_retention_out_of_range(older_than, words):
    with pytest.raises(CommandError, match=words):
        run("delayq_prune", "--older-than", older_than)


@pytest.mark.django_db(transaction=True)
def test_a_stop_asked_for_while_the_worker_starts_stops_it_before_it_claims(monkeypatch):
    import os
    import signal

    from django_delayq.management.commands import run_delayq

    enqueue("default", {}, key="due")
    checks = run_delayq.Command.check

    def check_then_sigterm(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # while the worker starts
        return checks(self, *args, **kwargs)

    monkeypatch.setattr(run_delayq.Command, "check", check_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    call_command("run_delayq", "--queue", "default", verbosity=0)  # returns: stopped
    assert Message.objects.get(key="due").status == "pending"  # nothing was claimed
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handlers are gone


@pytest.mark.django_db(transaction=True)
def test_run_delayq_from_the_command_line_spares_its_process_the_last_garbage_collection():
    # The collection at exit walks every object Django and the project
    # loaded: about 0.1 s of a --burst run on an empty queue (a third of it).
    # Frozen objects are skipped; only a process that ends with the command
    # freezes them, not a caller of call_command.
    import gc

    from django_delayq.management.commands import run_delayq

    assert gc.get_freeze_count() == 0
    try:
        call_command("run_delayq", "--burst", "--queue", "default", verbosity=0)
        assert gc.get_freeze_count() == 0
        run_delayq.Command().run_from_argv(
            ["manage.py", "run_delayq", "--burst", "--queue", "default", "-v0"]
        )
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


@pytest.mark.django_db(transaction=True)
@pytest.mark.process
@pytest.mark.parametrize(("verbosity", "shown"), [("1", True), ("0", False)])
def test_run_delayq_in_a_project_without_logging_shows_its_handlers_log_lines(
    worker_env, verbosity, shown
):
    """A fresh project has no LOGGING: its handlers' ``logger.info`` lines reach
    the console (a worker that prints nothing while it runs looks dead)."""
    import subprocess
    import sys

    enqueue("default", {"log": "the handler ran"})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "run_delayq",
            "--burst",
            "--queue",
            "default",
            f"-v{verbosity}",
        ],
        env={**worker_env, "DELAYQ_TEST_NO_LOGGING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert Message.objects.get().status == "succeeded"
    assert ("INFO tests.testapp: the handler ran" in done.stderr) is shown, done.stderr
