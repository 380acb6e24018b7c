"""run_delayq as real processes: concurrency, crashes, signals, start-up errors."""

import signal
import subprocess
import sys
from collections import Counter

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayq import enqueue, enqueue_many
from django_delayq.models import Message, WorkerState
from tests.conftest import ROOT, wait_for
from tests.testapp.models import Execution

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_four_processes_of_three_threads_process_each_message_exactly_once(spawn_worker):
    workers = [
        spawn_worker("--queue", "default", "--concurrency", "3", "--batch-size", "5")
        for _ in range(4)
    ]
    # All four up (heartbeat recorded, signal handlers installed) before the
    # messages exist, so that each can take a share and each stops cleanly.
    pids = {w.pid for w in workers}
    wait_for(
        lambda: WorkerState.objects.filter(pid__in=pids).count() == 4,
        timeout=60,
        message="the four workers to start",
    )
    # A little work per message (5 ms), so that one process cannot drain them
    # all before the others claim: the messages really are shared.
    results = enqueue_many("default", [{"n": i, "sleep": 0.005} for i in range(1500)])
    wait_for(
        lambda: not Message.objects.exclude(status="succeeded").exists(),
        timeout=240,
        message="all 1500 messages to succeed",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait() for w in workers] == [0, 0, 0, 0]
    runs = Counter(Execution.objects.values_list("message_id", flat=True))
    assert set(runs) == {r.message.pk for r in results}
    assert set(runs.values()) == {1}, "some message ran more than once"
    assert Message.objects.filter(attempt_count=1).count() == 1500
    # The work was shared, not done by one process.
    assert len(set(Execution.objects.values_list("worker", flat=True))) >= 2


def test_sigkilled_worker_message_is_redelivered_after_the_lease(spawn_worker):
    message = enqueue("default", {"sleep": 60, "sleep_attempts": 1}).message
    env = {"DELAYQ_TEST_LEASE": "2"}
    victim = spawn_worker("--queue", "default", env=env)
    wait_for(
        lambda: Execution.objects.filter(message_id=message.pk).exists(),
        message="the first attempt to start",
    )
    victim.signal(signal.SIGKILL)
    victim.wait()
    held = Message.objects.get(pk=message.pk)
    assert held.status == "running" and held.attempt_count == 1
    rescuer = spawn_worker("--queue", "default", env=env)
    wait_for(
        lambda: Message.objects.get(pk=message.pk).status == "succeeded",
        timeout=30,
        message="the redelivered message to succeed",
    )
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    message.refresh_from_db()
    assert message.attempt_count == 2
    assert message.is_redelivery
    attempts = list(
        Execution.objects.filter(message_id=message.pk)
        .order_by("attempt")
        .values_list("attempt", "finished")
    )
    assert [a for a, _ in attempts] == [1, 2]
    assert attempts[0][1] is None and attempts[1][1] is not None


def test_sigterm_finishes_the_running_message_and_strands_nothing(spawn_worker):
    first = enqueue("default", {"sleep": 1.5}, priority=10).message
    rest = enqueue_many("default", [{}] * 30)
    worker = spawn_worker("--queue", "default", "--concurrency", "1", "--batch-size", "10")
    wait_for(
        lambda: Execution.objects.filter(message_id=first.pk).exists(),
        message="the slow message to start",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert "SIGTERM received" in worker.output
    assert not Message.objects.filter(status="running").exists()
    assert Message.objects.get(pk=first.pk).status == "succeeded"
    pending = Message.objects.filter(pk__in=[r.message.pk for r in rest], status="pending")
    # Claimed-but-unstarted messages were handed back with their attempt.
    assert pending.exists()
    assert set(pending.values_list("attempt_count", flat=True)) == {0}


def test_sigterm_releases_a_message_that_outlives_the_grace_period(spawn_worker):
    message = enqueue("default", {"sleep": 60}).message
    worker = spawn_worker("--queue", "default", env={"DELAYQ_TEST_GRACE": "0.5"})
    wait_for(
        lambda: Execution.objects.filter(message_id=message.pk).exists(),
        message="the message to start",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    message.refresh_from_db()
    assert (message.status, message.attempt_count, message.lock_token) == ("pending", 1, None)


def test_idle_worker_wakes_for_new_and_delayed_messages(spawn_worker):
    worker = spawn_worker("--queue", "default")
    for delay in (None, 1):
        message = enqueue("default", {}, delay=delay).message
        wait_for(
            lambda m=message: Message.objects.get(pk=m.pk).status == "succeeded",
            timeout=20,
            message="the idle worker to pick up the message",
        )
        ran = Execution.objects.get(message_id=message.pk)
        assert ran.started >= message.next_attempt_time
    worker.signal(signal.SIGINT)
    assert worker.wait() == 0


def test_burst_exits_zero_when_nothing_is_due(worker_env):
    done = subprocess.run(
        [sys.executable, "-m", "django", "run_delayq", "--burst"],
        cwd=ROOT,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "nothing due" in done.stdout


def test_unknown_queue_fails_at_startup_with_a_clear_message(worker_env):
    done = subprocess.run(
        [sys.executable, "-m", "django", "run_delayq", "--queue", "nosuchqueue", "--burst"],
        cwd=ROOT,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "no handler is registered for queue(s) 'nosuchqueue'" in done.stderr


def test_unknown_queue_raises_command_error_in_process():
    with pytest.raises(CommandError, match="nosuchqueue"):
        call_command("run_delayq", queues=["nosuchqueue"], burst=True)


def test_bad_concurrency_is_refused():
    with pytest.raises(CommandError, match="positive integer"):
        call_command("run_delayq", "--concurrency", "0", "--burst")
