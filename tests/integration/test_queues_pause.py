"""Pausing a queue: workers stop claiming from it, say so, and resume."""

import logging
import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from django.core.management import call_command

from django_delayq import enqueue
from django_delayq.models import Message, QueueState
from django_delayq.queues import pause_queue, paused_queues, queue_states, resume_queue
from tests.conftest import ROOT, wait_for


@pytest.mark.django_db
def test_pause_and_resume_report_whether_they_changed_anything():
    assert pause_queue("emails", by="alice", reason="provider down") is True
    assert pause_queue("emails", by="bob") is False
    state = QueueState.objects.get(queue="emails")
    assert (state.paused, state.paused_by, state.reason) == (True, "alice", "provider down")
    assert state.paused_at is not None
    assert paused_queues() == {"emails"}
    assert paused_queues(["orders"]) == set()
    assert resume_queue("emails") is True
    assert resume_queue("emails") is False
    assert resume_queue("never-paused") is False
    assert paused_queues() == set()
    assert queue_states()["emails"].paused_by == ""


@pytest.mark.django_db
@pytest.mark.parametrize("queue", ["", "x" * 101, "no spaces", None])
def test_pause_refuses_bad_queue_names(queue):
    with pytest.raises((ValueError, TypeError), match="queue name"):
        pause_queue(queue)
    assert not QueueState.objects.exists()


@pytest.mark.django_db
def test_status_command_shows_paused_queues_even_without_messages():
    enqueue("default", {})
    pause_queue("default")
    pause_queue("idle")
    out = StringIO()
    call_command("delayq_status", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split()[-1] == "state"
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["default"][-1] == "paused"
    # No handler of the suite consumes "idle": the state says so.
    assert rows["idle"][1:] == ["0", "0", "0", "0", "0", "0", "0", "0s", "paused,", "no", "handler"]
    resume_queue("default")
    out = StringIO()
    call_command("delayq_status", stdout=out)
    assert "default" in out.getvalue() and "idle" in out.getvalue()
    rows = {line.split()[0]: line.split() for line in out.getvalue().splitlines()[2:]}
    assert rows["default"][-1] == "active"


@pytest.mark.django_db(transaction=True)
def test_worker_does_not_claim_from_a_paused_queue_and_logs_it(run_worker, caplog):
    held = enqueue("default", {}, priority=10).message
    other = enqueue("other", {}).message
    pause_queue("default", reason="testing")
    with caplog.at_level(logging.INFO, logger="django_delayq.worker"):
        run_worker(["default", "other"])
    assert Message.objects.get(pk=other.pk).status == "succeeded"
    held.refresh_from_db()
    assert (held.status, held.attempt_count) == ("pending", 0)
    assert "queue default paused; not claiming from it" in caplog.messages

    resume_queue("default")
    run_worker(["default", "other"])
    assert Message.objects.get(pk=held.pk).status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_worker_logs_each_transition_once(caplog):
    from django_delayq.worker import Worker

    worker = Worker(["default"], burst=True)
    worker.claimer.poll_interval = 0  # read the state on every call
    with caplog.at_level(logging.INFO, logger="django_delayq.worker"):
        assert worker.claimer.paused_now() == frozenset()
        pause_queue("default")
        assert worker.claimer.paused_now() == {"default"}
        assert worker.claimer.paused_now() == {"default"}
        resume_queue("default")
        assert worker.claimer.paused_now() == frozenset()
        assert worker.claimer.paused_now() == frozenset()
    assert caplog.messages == [
        "queue default paused; not claiming from it",
        "queue default resumed",
    ]


@pytest.mark.django_db(transaction=True)
def test_worker_reads_the_paused_set_at_most_once_per_poll_interval(
    django_assert_num_queries,
):
    from django_delayq.worker import Worker

    worker = Worker(["default"], burst=True)
    worker.claimer.poll_interval = 3600
    worker.claimer.paused_now()
    pause_queue("default")
    with django_assert_num_queries(0):
        assert worker.claimer.paused_now() == frozenset()


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_running_worker_notices_a_pause_within_one_poll_interval(worker_env, tmp_path):
    poll = 1.0
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "run_delayq", "-q", "default", "-q", "other"],
            cwd=ROOT,
            env={**worker_env, "DELAYQ_TEST_POLL": str(poll)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        first = enqueue("default", {}).message
        wait_for(
            lambda: Message.objects.get(pk=first.pk).status == "succeeded",
            message="the worker to consume the default queue",
        )
        pause_queue("default", by="ops")
        paused_at = time.monotonic()
        wait_for(
            lambda: "queue default paused; not claiming from it" in log.read_text(),
            timeout=poll + 10,
            message="the worker to log the pause",
        )
        # Polling adds up to one interval of its own on top of the worker's.
        assert time.monotonic() - paused_at < poll + 2

        # Both due, the held one first in claim order: the other queue's
        # message succeeding proves a claim round skipped the paused queue.
        held = enqueue("default", {}, priority=10).message
        other = enqueue("other", {}).message
        wait_for(
            lambda: Message.objects.get(pk=other.pk).status == "succeeded",
            message="the other queue's message to succeed",
        )
        assert Message.objects.get(pk=held.pk).status == "pending"

        resume_queue("default")
        wait_for(
            lambda: Message.objects.get(pk=held.pk).status == "succeeded",
            timeout=poll + 10,
            message="the resumed queue's message to succeed",
        )
        assert "queue default resumed" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
