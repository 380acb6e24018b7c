"""Worker hardening with real processes: poison messages, time limits, dead
workers, and lost database connections."""

import signal

import pytest
from django.db import connection

from django_delayq import enqueue, enqueue_many
from django_delayq.models import Message, WorkerState
from tests.conftest import wait_for
from tests.testapp.models import Execution

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

# Fast heartbeats, so a dead worker is noticed within about a second.
LIVENESS = {"DELAYQ_TEST_HEARTBEAT": "0.2", "DELAYQ_TEST_DEAD_AFTER": "1"}


def test_poison_message_that_kills_its_worker_stops_at_max_attempts(spawn_worker):
    # A lease far longer than the test: each redelivery can only come from
    # live workers noticing that the previous one died.
    env = {**LIVENESS, "DELAYQ_TEST_LEASE": "600"}
    message = enqueue("poison", {}).message
    exits = []
    for _ in range(5):
        worker = spawn_worker("--queue", "poison", env=env)
        wait_for(
            lambda w=worker: (
                w.proc.poll() is not None or Message.objects.get(pk=message.pk).status == "failed"
            ),
            timeout=60,
            message="the worker to die or the message to be given up",
        )
        if worker.proc.poll() is None:
            worker.signal(signal.SIGTERM)
            assert worker.wait() == 0, worker.output
            break
        exits.append(worker.proc.returncode)
    message.refresh_from_db()
    assert exits == [3, 3, 3]
    assert message.status == "failed"
    assert message.attempt_count == 4
    assert "ended without an outcome" in message.last_error
    assert Execution.objects.filter(message_id=message.pk).count() == 3


def test_handler_past_its_time_limit_is_retried_and_the_worker_stays_healthy(spawn_worker):
    # chaos-slow: time_limit=1.5 s, retried after 0.2 s; one handler slot.
    slow = enqueue("chaos-slow", {"sleep": 5, "sleep_attempts": 1}, priority=10).message
    worker = spawn_worker("--queue", "chaos-slow", "--concurrency", "1")
    wait_for(lambda: Execution.objects.filter(message_id=slow.pk).exists(), message="the start")
    quick = enqueue_many("chaos-slow", [{}] * 3)
    ids = [r.message.pk for r in quick]
    wait_for(
        lambda: Message.objects.filter(pk__in=[*ids, slow.pk], status="succeeded").count() == 4,
        timeout=60,
        message="the retried slow message and the quick ones to succeed",
    )
    first = Execution.objects.get(message_id=slow.pk, attempt=1)
    # The slot was freed while the first attempt was still sleeping.
    assert first.finished is None
    wait_for(
        lambda: Execution.objects.get(pk=first.pk).finished is not None,
        timeout=30,
        message="the late handler to return",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    slow.refresh_from_db()
    # Its late outcome was discarded: still one success, by attempt 2.
    assert (slow.status, slow.attempt_count) == ("succeeded", 2)
    assert slow.last_error.startswith("django_delayq.exceptions.TimeLimitExceeded")
    assert "ran past its time limit" in worker.output
    assert "its handler returned after its time limit; its outcome is discarded" in worker.output


def test_messages_of_a_killed_worker_are_released_before_their_lease_expires(spawn_worker):
    env = {**LIVENESS, "DELAYQ_TEST_LEASE": "600"}
    message = enqueue("default", {"sleep": 60, "sleep_attempts": 1}).message
    victim = spawn_worker("--queue", "default", env=env)
    wait_for(lambda: Execution.objects.filter(message_id=message.pk).exists(), message="start")
    victim.signal(signal.SIGKILL)
    victim.wait()
    rescuer = spawn_worker("--queue", "default", env=env)
    wait_for(
        lambda: Message.objects.get(pk=message.pk).status == "succeeded",
        timeout=60,
        message="the dead worker's message to be released and run",
    )
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    assert "stopped sending heartbeats; released 1 message(s)" in rescuer.output
    states = dict(WorkerState.objects.values_list("pid", "stopped_at"))
    assert states[victim.pid] is None  # died without a word
    assert states[rescuer.pid] is not None  # stopped cleanly


def test_worker_survives_its_database_connections_being_terminated(spawn_worker):
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")
    worker = spawn_worker("--queue", "default", "--concurrency", "2")
    first = enqueue("default", {}).message
    wait_for(lambda: Message.objects.get(pk=first.pk).status == "succeeded", message="first")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 2  # its Django and LISTEN connections
    later = enqueue_many("default", [{}] * 20)
    wait_for(
        lambda: (
            Message.objects.filter(pk__in=[r.message.pk for r in later], status="succeeded").count()
            == 20
        ),
        timeout=60,
        message="the worker to reconnect and go on: " + worker.proc.pid.__str__(),
    )
    assert worker.proc.poll() is None
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert "Traceback" in worker.output or "reconnect" in worker.output


def test_burst_exits_after_a_handler_raised_a_base_exception(spawn_worker):
    odd = enqueue("default", {"raise": "KeyboardInterrupt"}, priority=1).message
    plain = enqueue("default", {}).message
    worker = spawn_worker("--queue", "default", "--burst", "--concurrency", "1")
    assert worker.wait(timeout=60) == 0, worker.output
    odd.refresh_from_db()
    # An ordinary failure: recorded, and retried later by the retry policy.
    assert (odd.status, odd.attempt_count) == ("pending", 1)
    assert odd.last_error.startswith("KeyboardInterrupt")
    assert odd.next_attempt_time > odd.last_attempt_time
    assert Message.objects.get(pk=plain.pk).status == "succeeded"
