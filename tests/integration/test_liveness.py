"""Worker heartbeats, dead-worker release, time limits and the database clock."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_delayq import enqueue, handler, liveness
from django_delayq.models import Message, WorkerState
from django_delayq.registry import registry
from django_delayq.store import claim, settle

pytestmark = pytest.mark.django_db


def status_output() -> str:
    out = StringIO()
    call_command("delayq_status", stdout=out)
    return out.getvalue()


def test_dead_workers_messages_are_released_and_live_ones_kept(fake_clock):
    liveness.register("dead-one", queues=["default"], concurrency=1)
    liveness.register("live-one", queues=["default"], concurrency=1)
    a = enqueue("default", {}, key="a").message
    b = enqueue("default", {}, key="b").message
    held_dead = claim.claim(["default"], 1, worker="dead-one", lease=timedelta(hours=1))
    held_live = claim.claim(["default"], 1, worker="live-one", lease=timedelta(hours=1))
    fake_clock.advance(liveness.dead_after().total_seconds() + 1)
    liveness.beat("live-one")

    assert liveness.release_dead("me") == {"dead-one": 1}

    dead_pk = held_dead.messages[0].pk
    released = Message.objects.get(pk=dead_pk)
    assert (released.status, released.lock_token, released.attempt_count) == ("pending", None, 1)
    assert released.next_attempt_time <= fake_clock()
    assert Message.objects.get(pk=held_live.messages[0].pk).status == "running"
    # The dead worker, should it wake up, can no longer settle what it held.
    assert settle.ack([dead_pk], held_dead.token) == 0
    assert {a.pk, b.pk} == {dead_pk, held_live.messages[0].pk}
    states = {w.name: w.state for w in liveness.workers()}
    assert states == {"dead-one": "dead", "live-one": "live"}


def test_stopped_workers_are_not_dead_and_old_rows_are_forgotten(fake_clock):
    liveness.register("gone", queues=["default"], concurrency=2)
    liveness.mark_stopped("gone")
    fake_clock.advance(3600)
    assert [w.state for w in liveness.workers()] == ["stopped"]
    assert liveness.release_dead("me") == {}
    assert liveness.forget_gone() == 0
    fake_clock.advance(liveness.FORGET_AFTER.total_seconds())
    # The look for dead workers (every heartbeat) leaves that to the hourly task.
    liveness.release_dead("me")
    assert WorkerState.objects.filter(name="gone").exists()
    assert liveness.forget_gone() == 1
    assert not WorkerState.objects.exists()


def test_status_command_lists_live_and_dead_workers(fake_clock):
    liveness.register("host-a:1", queues=["default", "other"], concurrency=4)
    liveness.register("host-b:2", queues=["default"], concurrency=1)
    enqueue("default", {})
    claim.claim(["default"], 1, worker="host-a:1", lease=timedelta(hours=1))
    fake_clock.advance(liveness.dead_after().total_seconds() + 5)
    liveness.beat("host-b:2")
    lines = status_output().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("worker"))
    rows = {line.split()[0]: line.split() for line in lines[header + 2 :]}
    assert rows["host-a:1"][1:5] == ["dead", "default,other", "4", "1"]
    assert rows["host-b:2"][1:5] == ["live", "default", "1", "0"]


def test_status_command_without_workers_shows_only_queues():
    enqueue("default", {})
    lines = status_output().splitlines()
    assert lines[0].startswith("queue") and len(lines) == 3


@pytest.mark.django_db(transaction=True)
def test_worker_registers_heartbeat_and_records_its_stop(run_worker):
    enqueue("default", {})
    run_worker(["default"], name="burst-worker")
    state = WorkerState.objects.get(name="burst-worker")
    assert state.queues == ["default"] and state.stopped_at is not None
    assert state.last_seen >= state.started_at


def test_claim_uses_the_database_clock_not_the_hosts(monkeypatch):
    # A host whose clock runs an hour fast must neither claim early nor hand
    # out leases that last an hour too long.
    message = enqueue("default", {}, run_at=timezone.now() + timedelta(minutes=30)).message
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=1))
    assert claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=60)).messages == []
    # (SQLite's now() has millisecond precision: due a second ago, to be clear.)
    Message.objects.filter(pk=message.pk).update(
        next_attempt_time=real_now() - timedelta(seconds=1)
    )
    held = claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=60)).messages[0]
    assert held.next_attempt_time - held.last_attempt_time == timedelta(seconds=60)
    assert held.next_attempt_time < real_now() + timedelta(minutes=5)


def test_a_message_enqueued_now_is_due_at_once():
    # Due times are stored to the microsecond, and SQLite's clock ticks in
    # milliseconds: a claim in the same millisecond as the enqueue must still
    # see the message as due (it did not, at SQLite's plain 'now').
    missed = 0
    for i in range(200):
        enqueue("default", {}, key=f"now-{i}")
        missed += not claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=60)).messages
    assert missed == 0


@pytest.mark.parametrize("value", [0, -1, timedelta(0)])
def test_handler_time_limit_must_be_positive(value):
    with pytest.raises(ValueError, match="time_limit must be positive"):
        handler("limits", time_limit=value)(lambda message: None)


def test_time_limit_comes_from_handler_then_queue_then_setting():
    spec = registry.lookup("chaos-slow", "")
    assert spec.effective_time_limit() == timedelta(seconds=1.5)
    plain = registry.lookup("default", "")
    assert plain.effective_time_limit() is None
    with override_settings(DELAYQ={"TIME_LIMIT": 30, "QUEUES": {"other": {"TIME_LIMIT": 5}}}):
        assert plain.effective_time_limit() == timedelta(seconds=30)
        assert registry.lookup("other", "").effective_time_limit() == timedelta(seconds=5)


def test_bad_time_limit_and_heartbeat_settings_are_reported():
    from django_delayq.checks import check_settings

    with override_settings(DELAYQ={"TIME_LIMIT": "soon", "HEARTBEAT_INTERVAL": 0}):
        ids = sorted(e.id for e in check_settings())
    assert ids == ["django_delayq.E002", "django_delayq.E003"]


def test_dead_after_shorter_than_two_heartbeats_is_reported():
    from django_delayq.checks import check_settings

    with override_settings(DELAYQ={"HEARTBEAT_INTERVAL": 10, "WORKER_DEAD_AFTER": 15}):
        errors = check_settings()
    assert [e.id for e in errors] == ["django_delayq.E020"]
    assert "twice HEARTBEAT_INTERVAL" in errors[0].msg


def test_sqlite_keeps_the_messages_of_a_live_worker_of_this_host_whatever_its_heartbeat(
    fake_clock,
):
    """On SQLite every worker is on the host that has the file, and none can write a
    heartbeat while a long transaction (an atomic handler's, a producer's) holds the
    write lock: once it ends, every worker's ``last_seen`` is old. Dead-worker release
    must then ask the operating system, as the claim does (``delayq_process_alive``):
    a worker whose process lives keeps what it runs; one whose process is gone is
    released."""
    import os
    import socket
    import subprocess
    import sys

    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("SQLite only: elsewhere workers may be on other hosts, heartbeats decide")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live_name = f"{socket.gethostname()}:{os.getpid()}"  # this test's process: alive
    gone_name = f"{socket.gethostname()}:{gone.pid}"  # exited (and reaped)
    for name in (live_name, gone_name):
        liveness.register(name, queues=["default"], concurrency=1)
    enqueue("default", {}, key="a")
    enqueue("default", {}, key="b")
    held_live = claim.claim(["default"], 1, worker=live_name, lease=timedelta(hours=1))
    held_gone = claim.claim(["default"], 1, worker=gone_name, lease=timedelta(hours=1))
    # Both heartbeats are older than WORKER_DEAD_AFTER (the write lock held them back).
    fake_clock.advance(liveness.dead_after().total_seconds() + 1)

    assert liveness.release_dead("me") == {gone_name: 1}

    assert Message.objects.get(pk=held_live.messages[0].pk).status == "running"
    assert Message.objects.get(pk=held_gone.messages[0].pk).status == "pending"


def test_a_heartbeat_that_comes_after_its_promise_ran_out_says_so(caplog):
    # Other workers may have taken this one for dead meanwhile (an overloaded
    # host, a database that did not answer): without this line, what they ran
    # again of its messages looks like a duplicate run without a cause.
    import logging
    import time

    from django_delayq.worker import Worker

    worker = Worker(["default"], concurrency=1, burst=True)
    keeper = worker.keeper
    keeper.register()
    caplog.set_level(logging.WARNING, logger="django_delayq.worker")

    keeper._turn()  # on time: the promise made at registration holds
    assert "past its promise" not in caplog.text

    keeper._beaten_at = time.monotonic() - keeper.alive_for.total_seconds() - 5
    keeper._next_beat = 0.0
    keeper._turn()

    lines = [r.getMessage() for r in caplog.records if "past its promise" in r.getMessage()]
    if connection.vendor == "sqlite":
        # A live process of this host is never taken for dead there, and a long
        # transaction holds every worker's heartbeat back: nothing to say.
        assert lines == []
        return
    (line,) = lines
    promise = keeper.alive_for.total_seconds()
    assert line.startswith("heartbeat ") and f"past its promise of {promise:.1f} s" in line
    assert float(line.split()[1]) >= promise + 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("step", ["heartbeat", "lease extension"])
def test_a_keeper_step_that_a_database_error_failed_goes_again_at_the_next_turn(
    step, monkeypatch, caplog
):
    # A cut connection used to push the failed step a whole interval on: the
    # heartbeat then came a reconnect plus an interval late, most of its
    # promise, and a worker on a busy host was taken for dead.
    from django.db import OperationalError

    from django_delayq.worker import Worker
    from django_delayq.worker.keeper import Keeper

    worker = Worker(["default"], concurrency=1, burst=True)
    keeper = worker.keeper
    keeper.register()
    # Intervals longer than the test: a step goes again only because it failed.
    keeper.heartbeat_interval = keeper.extend_every = 3600.0
    calls: list[str] = []
    if step == "heartbeat":
        real = liveness.beat

        def once(*args, **kwargs):
            calls.append("cut" if not calls else "done")
            if calls == ["cut"]:
                raise OperationalError("server closed the connection unexpectedly")
            return real(*args, **kwargs)

        monkeypatch.setattr(liveness, "beat", once)
    else:
        real_extend = Keeper.extend_leases

        def once(self):
            calls.append("cut" if not calls else "done")
            if calls == ["cut"]:
                raise OperationalError("server closed the connection unexpectedly")
            return real_extend(self)

        monkeypatch.setattr(Keeper, "extend_leases", once)
    keeper._next_beat = keeper._next_extend = 0.0

    keeper._turn()  # cut
    keeper._turn()  # the next turn, at once

    assert calls == ["cut", "done"]
    failed = [r for r in caplog.records if "could not extend leases" in r.getMessage()]
    assert len(failed) == 1  # the second went through, on a new connection
    keeper._turn()  # done: the next one waits its interval
    assert calls == ["cut", "done"]
