"""A worker's name is held by one live run at a time (``liveness.register``).

Workers hand back what runs under their name without being held by them (an
earlier, killed run's messages): two live workers under one name would hand
back each other's running messages, and each would run them again beside
the other.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from django_delayq import enqueue, liveness
from django_delayq.exceptions import WorkerNameTaken
from django_delayq.models import Message, WorkerState
from django_delayq.store import claim
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


def register(name: str, instance: uuid.UUID, **options) -> None:
    liveness.register(name, queues=["default"], concurrency=1, instance=instance, **options)


def elsewhere(name: str) -> None:
    """Make the name's holder a worker of another host: its heartbeat alone tells
    whether it lives (this process's own runs, and this host's processes, are
    asked directly)."""
    WorkerState.objects.filter(name=name).update(host="another-host", pid=1)


def test_a_live_workers_name_is_refused_and_its_messages_kept(fake_clock):
    first, second = uuid.uuid4(), uuid.uuid4()
    register("shared", first)
    elsewhere("shared")
    enqueue("default", {})
    held = claim.claim(["default"], 1, worker="shared", lease=timedelta(hours=1))

    with pytest.raises(WorkerNameTaken, match="another worker named 'shared' is alive"):
        register("shared", second)

    row = Message.objects.get(pk=held.messages[0].pk)
    assert (row.status, row.lock_token) == ("running", held.token)
    assert WorkerState.objects.get(name="shared").instance == first


def test_a_name_whose_holder_broke_its_promise_is_taken_over(fake_clock):
    first, second = uuid.uuid4(), uuid.uuid4()
    register("shared", first, alive_for=timedelta(seconds=10))
    elsewhere("shared")
    enqueue("default", {})
    held = claim.claim(["default"], 1, worker="shared", lease=timedelta(hours=1))
    fake_clock.advance(11)

    register("shared", second)

    # What the earlier run held is handed back; it can no longer beat or stop
    # under the name, and the new holder's row is its own.
    assert Message.objects.get(pk=held.messages[0].pk).status == "pending"
    assert liveness.beat("shared", instance=first) == 0
    liveness.mark_stopped("shared", instance=first)
    state = WorkerState.objects.get(name="shared")
    assert (state.instance, state.stopped_at) == (second, None)
    elsewhere("shared")
    with pytest.raises(WorkerNameTaken):
        register("shared", first)


def test_a_waiting_worker_takes_the_name_if_no_heartbeat_renews_it(fake_clock):
    first, second = uuid.uuid4(), uuid.uuid4()
    register("shared", first, alive_for=timedelta(seconds=10))
    elsewhere("shared")
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        fake_clock.advance(seconds)  # the holder was killed: no heartbeat comes
        return True

    register("shared", second, wait=wait)

    assert waits == [pytest.approx(10.05)]
    assert WorkerState.objects.get(name="shared").instance == second


def test_a_waiting_worker_gives_up_when_the_holder_beats(fake_clock):
    first, second = uuid.uuid4(), uuid.uuid4()
    register("shared", first, alive_for=timedelta(seconds=10))
    elsewhere("shared")

    def wait(seconds: float) -> bool:
        fake_clock.advance(seconds / 2)
        assert liveness.beat("shared", instance=first, alive_for=timedelta(seconds=10))
        return True

    with pytest.raises(WorkerNameTaken):
        register("shared", second, wait=wait)
    assert WorkerState.objects.get(name="shared").instance == first


def test_a_live_process_of_this_host_keeps_its_name_on_sqlite_whatever_its_heartbeat(
    fake_clock,
):
    # SQLite: a long transaction holds every heartbeat back, so the operating
    # system says who lives (as for the claim and the dead workers' release).
    import subprocess
    import sys

    from django.db import connection

    first, second = uuid.uuid4(), uuid.uuid4()
    register("shared", first, alive_for=timedelta(seconds=10))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        WorkerState.objects.filter(name="shared").update(pid=holder.pid)
        fake_clock.advance(11)  # its promise ran out
        if connection.vendor == "sqlite":
            with pytest.raises(WorkerNameTaken):
                register("shared", second, wait=lambda seconds: True)
        else:
            register("shared", second)  # elsewhere the heartbeat decides
    finally:
        holder.kill()
        holder.wait()
    if connection.vendor == "sqlite":
        register("shared", second)  # a gone process of this host holds nothing
    assert WorkerState.objects.get(name="shared").instance == second


def test_a_stopped_or_earlier_run_of_this_process_leaves_the_name_free():
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    liveness.RUNNING_HERE.update((first, second))
    try:
        register("shared", first)
        with pytest.raises(WorkerNameTaken):  # a run of this process still running
            register("shared", second)
        liveness.mark_stopped("shared", instance=first)
        register("shared", second)  # the first stopped
        liveness.RUNNING_HERE.discard(second)  # ended, without recording its stop
        register("shared", third)
    finally:
        liveness.RUNNING_HERE.difference_update((first, second))
    assert WorkerState.objects.get(name="shared").instance == third


def test_two_worker_processes_under_one_name_never_run_a_message_twice(spawn_worker):
    # Before, the second worker handed the first one's running message back at
    # its start, claimed it and ran it beside the first.
    env = {"DELAYQ_TEST_HEARTBEAT": "0.5"}
    first = spawn_worker("--queue", "default", "--name", "shared", env=env)
    first.wait_until_consuming()
    message = enqueue("default", {"sleep": 6}).message
    deadline = time.monotonic() + 30
    while not Execution.objects.filter(message_id=message.pk).exists():
        assert time.monotonic() < deadline, "the first worker did not start the message"
        time.sleep(0.05)

    second = spawn_worker("--queue", "default", "--name", "shared", env=env)
    runs = Execution.objects.filter(message_id=message.pk)
    deadline = time.monotonic() + 60
    while second.proc.poll() is None and runs.count() == 1 and time.monotonic() < deadline:
        time.sleep(0.05)

    assert runs.count() == 1, "the second worker ran the first one's message beside it"
    assert second.wait(60) == WorkerNameTaken.exit_code
    assert "another worker named 'shared' is alive" in second.output
    assert Message.objects.get(pk=message.pk).status in ("running", "succeeded")
    assert first.proc.poll() is None


def test_a_worker_taking_its_name_back_keeps_the_messages_it_runs(settings):
    # Its successor under the name is over (it took the name while this worker
    # broke its promise, then died): taking the name back must not hand back
    # what this worker runs now, as a new worker hands back a dead one's.
    from django.utils import timezone

    from django_delayq.worker import Worker

    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 60}
    worker = Worker(["default"], concurrency=1, burst=True)
    worker.keeper.register()
    message = enqueue("default", {}).message
    held = claim.claim(["default"], 1, worker=worker.name, lease=timedelta(seconds=60))
    lane = worker.book.lanes[0]
    worker.book.add([worker.claimer._in_flight(lane, held.messages[0], held.token)])
    WorkerState.objects.filter(name=worker.name).update(
        instance=uuid.uuid4(), host="another-host", pid=1, alive_until=timezone.now()
    )

    worker.keeper._turn()  # its heartbeat finds the name not its own, and takes it back

    row = Message.objects.get(pk=message.pk)
    assert (row.status, row.lock_token) == ("running", held.token)
    assert WorkerState.objects.get(name=worker.name).instance == worker.instance


def test_a_worker_whose_name_a_live_worker_holds_is_told_once_not_at_every_turn():
    # The keeper retries a heartbeat that failed at its next turn; one that
    # reached the database and found the name taken is a heartbeat done, and
    # the worker, stopping, must not ask for the name again every turn.
    from django.utils import timezone

    from django_delayq.worker import Worker

    taken: list[WorkerNameTaken] = []
    worker = Worker(["default"], concurrency=1, burst=True)
    worker.keeper._on_name_taken = taken.append
    worker.keeper.register()
    WorkerState.objects.filter(name=worker.name).update(
        instance=uuid.uuid4(),
        host="another-host",
        pid=1,
        alive_until=timezone.now() + timedelta(hours=1),
    )
    worker.keeper._next_beat = 0.0

    worker.keeper._turn()
    worker.keeper._turn()

    assert len(taken) == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_could_not_record_its_name_claims_nothing_until_it_holds_it(
    monkeypatch,
):
    # Its registration failed (SQLite's write lock held by a long transaction,
    # a cut connection), and another live run took the name meanwhile. Before,
    # the worker went on to claim and run messages under the name anyway: the
    # holder's keeper hands back what runs under its name that it does not hold,
    # and the message ran again beside this worker's attempt.
    from django.db import OperationalError

    from django_delayq.worker import Worker

    message = enqueue("default", {}).message
    worker = Worker(["default"], concurrency=1, burst=True)
    holder = uuid.uuid4()
    real = liveness.register
    calls: list[bool] = []

    def register_fails_once(*args, **kwargs):
        if not calls:
            calls.append(True)
            # Another run of this process takes the name, and holds it for good.
            liveness.RUNNING_HERE.add(holder)
            real(worker.name, queues=["default"], concurrency=1, instance=holder)
            WorkerState.objects.filter(name=worker.name).update(alive_until=None)
            raise OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(liveness, "register", register_fails_once)
    try:
        worker.run()
    except WorkerNameTaken:
        refused = True
    else:
        refused = False
    finally:
        liveness.RUNNING_HERE.discard(holder)

    assert not Execution.objects.filter(message_id=message.pk).exists(), (
        "the worker ran a message under a name another live run holds"
    )
    assert refused
    row = Message.objects.get(pk=message.pk)
    assert (row.status, row.attempt_count) == ("pending", 0)
