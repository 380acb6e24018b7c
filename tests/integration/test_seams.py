"""The worker's promises where its threads meet, each seam forced with an injected event.

A committed message runs; a message never runs beside itself; an atomic
handler's effect commits exactly once; nothing a user's code raises stops the
worker. Each test here breaks one of those at one seam between the worker's
threads (claim loop, executors, acknowledgements, lease keeper) or between
the worker and another transaction, and fails if the promise breaks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

import pytest
from django.db import InterfaceError, connection, transaction
from django.utils import timezone

from django_delayq import enqueue, enqueue_many, signals
from django_delayq.models import Message
from django_delayq.store import claim, leases, settle
from django_delayq.worker import Worker
from django_delayq.worker.execute import Result, execute
from django_delayq.worker.runner import Runner
from tests.conftest import finishes_within, wait_for
from tests.pooler import behind_pooler  # noqa: F401 (a skip condition names it)
from tests.testapp.handlers import RUNS, gate
from tests.testapp.models import Effect, Execution

pytestmark = pytest.mark.django_db(transaction=True)


def executors() -> int:
    """Executor threads alive in this process (the late one that outlived its time
    limit too, until its handler returns)."""
    return sum(t.name.startswith("delayq-executor") for t in threading.enumerate())


def executions(message: Message) -> int:
    return Execution.objects.filter(message_id=message.pk).count()


def lease_end(message: Message):
    return Message.objects.values_list("next_attempt_time", flat=True).get(pk=message.pk)


def hold_lock(pk: int) -> tuple[threading.Event, threading.Event, threading.Thread]:
    """Lock row ``pk`` in a transaction on a thread of its own, as a producer's long
    transaction would; returns (locked, unlock, thread)."""
    locked, unlock = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Message.objects.select_for_update().get(pk=pk)
                locked.set()
                unlock.wait(120)
        finally:
            connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(30)
    return locked, unlock, thread


# -- a producer's transaction holds the row of a running message ---------------------


@pytest.mark.parametrize("lock", ["select_for_update", "upsert"])
def test_a_transaction_holding_a_running_rows_lock_cannot_make_it_run_twice(serving_worker, lock):
    # "gated" has a lease of 1 s. While its handler runs, another transaction
    # holds the message's row (an upsert of its key, a bulk reprioritise, the
    # Spark loader) for well past the lease: the keeper cannot extend it
    # meanwhile, yet no other worker may take the message when it commits.
    arrived, release = gate("locked")
    message = enqueue("gated", {"v": 1, "gate": "locked"}, key="locked").message
    serving_worker(["gated"], concurrency=2)
    try:
        assert arrived.wait(30)
        with transaction.atomic():
            if lock == "upsert":
                enqueue("gated", {"v": 2}, key="locked", on_conflict="update")
            else:
                Message.objects.select_for_update().get(pk=message.pk)
            leased_until = lease_end(message)
            wait_for(
                lambda: timezone.now() > leased_until + timedelta(seconds=1.5),
                message="the lease to pass while the row is locked",
            )
        # Another worker's claim, the moment the transaction commits.
        thief = claim.claim(["gated"], 10, worker="thief", lease=timedelta(minutes=5))
        assert [m.pk for m in thief.messages] == []
        assert executions(message) == 1
    finally:
        release.set()
    versions = 2 if lock == "upsert" else 1
    wait_for(
        lambda: (
            Execution.objects.filter(message_id=message.pk, finished__isnull=False).count()
            == versions
        ),
        message="every version to run",
    )
    wait_for(lambda: Message.objects.get(pk=message.pk).status == "succeeded", message="done")
    runs = list(Execution.objects.filter(message_id=message.pk).order_by("started"))
    assert [run.worker for run in runs] == ["1", "2"][:versions]
    # The new version (of the upsert) waited for the first to end.
    assert all(b.started >= a.finished for a, b in zip(runs, runs[1:], strict=False))


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="acknowledgements are batched on PostgreSQL"
)
def test_a_locked_acknowledgement_holds_up_no_other_and_none_runs_twice(serving_worker):
    # The first message's acknowledgement meets a row lock held by another
    # transaction for several leases; the messages after it must be
    # acknowledged meanwhile, and none of them may run again.
    arrived, release = gate("ack-locked")
    first = enqueue("gated", {"v": 0, "gate": "ack-locked"}).message
    serving_worker(["gated"], concurrency=2)
    assert arrived.wait(30)
    _, unlock, holder = hold_lock(first.pk)
    try:
        release.set()  # its handler returns; its acknowledgement meets the lock
        others = [r.message for r in enqueue_many("gated", [{"v": i} for i in range(1, 4)])]
        wait_for(
            lambda: (
                Message.objects.filter(pk__in=[m.pk for m in others], status="succeeded").count()
                == 3
            ),
            timeout=15,
            message="the other messages to be acknowledged while the first is locked",
        )
        wait_for(
            lambda: timezone.now() > max(m.created_at for m in others) + timedelta(seconds=3),
            message="several leases to pass",
        )
    finally:
        unlock.set()
        holder.join(30)
    wait_for(lambda: Message.objects.get(pk=first.pk).status == "succeeded", message="the first")
    assert [executions(m) for m in [first, *others]] == [1, 1, 1, 1]


# -- user code raising what is not an Exception ---------------------------------------

BASE_EXCEPTIONS = [asyncio.CancelledError, KeyboardInterrupt, SystemExit]


@pytest.mark.parametrize("raised", BASE_EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("signal_name", ["message_started", "message_succeeded", "message_retried"])
def test_a_receiver_raising_a_base_exception_stops_nothing(run_worker, raised, signal_name):
    sent = getattr(signals, signal_name)
    calls: list[int] = []

    def receiver(sender, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise raised(f"raised by a {signal_name} receiver")

    messages = [r.message for r in enqueue_many("default", [{"retry_in": 0}, {}, {}])]
    sent.connect(receiver, weak=False)
    try:
        stats = finishes_within(60, lambda: run_worker(["default"], concurrency=1))
    finally:
        sent.disconnect(receiver)
    assert calls, "the receiver was never called"
    assert set(Message.objects.values_list("status", flat=True)) == {"succeeded"}
    assert [executions(m) for m in messages] == [2, 1, 1]
    assert stats[Result.SUCCEEDED] == 3


# -- atomic handlers that swallow a database error ------------------------------------


@pytest.mark.parametrize("ack_delay", [0.005, None], ids=["grouped", "single"])
@pytest.mark.parametrize("how", ["orm", "raw"])
def test_an_atomic_handler_that_swallows_a_database_error_is_not_acknowledged(
    run_worker, settings, monkeypatch, how, ack_delay
):
    if how == "raw" and connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL aborts a transaction on an error Django did not see")
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": ack_delay}
    message = enqueue("atomic-swallow", {"how": how, "swallow_attempts": 1}).message
    # A well-behaved atomic message queued behind it: on PostgreSQL with
    # ACK_DELAY the two run in one group (a message alone runs in a
    # transaction of its own), and the partner's writes commit.
    partner = enqueue("atomic-swallow", {"how": how, "swallow_attempts": 0}).message
    groups = []
    run_group = Runner._run_group
    monkeypatch.setattr(
        Runner, "_run_group", lambda self, item: groups.append(item.row.pk) or run_group(self, item)
    )
    stats = run_worker(["atomic-swallow"])
    message.refresh_from_db()
    assert Effect.objects.filter(message_id=message.pk).count() == 0
    assert (message.status, message.attempt_count) == ("pending", 1)
    assert "database error" in message.last_error
    assert stats[Result.RETRYING] == 1 and stats[Result.SUCCEEDED] == 1
    assert Effect.objects.filter(message_id=partner.pk).count() == 1
    grouped = ack_delay is not None and connection.vendor == "postgresql"
    assert groups == ([message.pk] if grouped else [])


# -- the keeper and an acknowledgement that commits while it looks --------------------


def test_a_message_acknowledged_while_the_keeper_extends_is_not_reported_lost(caplog):
    # The keeper extends what the book holds; a message whose success commits
    # between the keeper's look at the book and its statement is done, not lost.
    message = enqueue("default", {}).message
    worker = Worker(["default"], burst=True, concurrency=1)
    settle = worker.book.settle
    looked: list[int] = []

    def settle_after_a_look(results, *args, **kwargs):
        results = list(results)
        if not looked:
            looked.append(1)
            wait_for(lambda: Message.objects.get(pk=message.pk).status == "succeeded")
            worker.keeper.extend_leases()
        return settle(results, *args, **kwargs)

    worker.book.settle = settle_after_a_look  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="django_delayq.worker"):
        stats = finishes_within(60, worker.run)
    assert looked
    assert "no longer ours" not in caplog.text
    assert stats[Result.SUCCEEDED] == 1 and not stats["lease_lost"]


# -- a commit whose reply was lost ----------------------------------------------------


@pytest.mark.parametrize("ack_delay", [0.005, None], ids=["batched", "single"])
def test_an_outcome_whose_commit_reply_was_lost_is_still_its_outcome(
    run_worker, settings, monkeypatch, ack_delay
):
    # The acknowledgement commits, then the connection drops before its reply:
    # the worker reconnects and sends it again, which matches nothing. The
    # message is still succeeded (announced, and its group goes on), not lost.
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": ack_delay}
    first = enqueue("default", {}, group="g").message
    second = enqueue("default", {}, group="g").message
    lost: list[int] = []
    for name in ("ack", "ack_held"):
        real = getattr(settle, name)

        def committed_then_cut(*args, _real=real, **kwargs):
            result = _real(*args, **kwargs)
            if not lost:
                lost.append(1)
                connection.close()
                raise InterfaceError("connection lost before the commit's reply")
            return result

        monkeypatch.setattr(settle, name, committed_then_cut)
    succeeded: list[int] = []

    def on_success(sender, message, **kwargs):
        succeeded.append(message.pk)

    signals.message_succeeded.connect(on_success, weak=False)
    try:
        stats = finishes_within(60, lambda: run_worker(["default"], concurrency=1))
    finally:
        signals.message_succeeded.disconnect(on_success)
    assert lost
    assert sorted(succeeded) == sorted([first.pk, second.pk])
    assert stats[Result.SUCCEEDED] == 2 and not stats["lease_lost"]


# -- a time limit while a group's attempt runs again ----------------------------------


def rerun_past_its_limit(arrived: threading.Event, message: Message) -> None:
    """Wait until ``message`` runs again at its gate (a group's re-run) and its time
    limit has passed there."""
    assert arrived.wait(30)
    wait_for(
        lambda: "TimeLimitExceeded" in Message.objects.get(pk=message.pk).last_error,
        message="its time limit to pass",
    )


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="groups of atomic handlers")
def test_a_time_limit_in_a_groups_rerun_frees_its_slot_once(settings):
    # The group rolls back (its second message was claimed away), its first
    # message runs again alone and outlives its time limit there: the slot it
    # ran in is freed once, and the worker keeps one executor per slot.
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    arrived, release = gate("rerun")
    RUNS.clear()
    first, stolen = (
        r.message for r in enqueue_many("atomic-limited", [{"gate": "rerun"}, {"steal": True}])
    )
    worker = Worker(["atomic-limited"], concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        rerun_past_its_limit(arrived, first)  # the first message runs again, alone
        [lane] = worker.book.lanes
        wait_for(lambda: executors() == 2, message="a new executor beside the late one")
        assert lane.running == 0
        release.set()  # the late re-run ends; its thread goes
        wait_for(lambda: executors() == 1, message="the late executor to end")
        # One slot: two more messages run one after the other, never together.
        more = [r.message for r in enqueue_many("atomic-limited", [{}, {}])]
        wait_for(
            lambda: (
                Message.objects.filter(pk__in=[m.pk for m in more], status="succeeded").count() == 2
            ),
            message="the next messages",
        )
        assert lane.running == 0
    finally:
        release.set()
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert Message.objects.get(pk=stolen.pk).status == "running"  # left to its thief


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="groups of atomic handlers")
@pytest.mark.skipif(
    "behind_pooler()",
    reason="its premise is timing: the three messages must share the group's first run, "
    "and through PgBouncer's pool of two connections beside the suite, the second one's "
    "first run once committed on its own (attempt 1, succeeded: nothing to hand back); "
    "it runs in the PostgreSQL and prepared-statement legs",
)
def test_the_members_a_groups_late_rerun_hands_back_say_so_and_run_once_more(settings, caplog):
    # The group [gated, plain, stolen] rolls back (its last message was claimed
    # away); the gated one runs again alone and outlives its time limit, so the
    # plain one, whose run rolled back with the group, goes back to run
    # elsewhere. It runs again under a new attempt: the log must say so, with
    # its id, or a second run of a message has no cause an operator can find.
    # (A 5 s limit: the group's first run must stay within it, even through
    # PgBouncer's pool of two connections and beside the rest of the suite;
    # with 2 s, CI's PostgreSQL leg once saw the first run of the group pass
    # it, and nothing was handed back.)
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    arrived, release = gate("rerun")
    RUNS.clear()
    with transaction.atomic():  # claimed together, in this order (highest priority first)
        gated, plain, stolen = (
            enqueue("atomic-limited-5s", payload, priority=priority).message
            for payload, priority in (({"gate": "rerun"}, 3), ({}, 2), ({"steal": True}, 1))
        )
    worker = Worker(["atomic-limited-5s"], concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    caplog.set_level(logging.WARNING, logger="django_delayq")
    thread.start()
    try:
        rerun_past_its_limit(arrived, gated)  # the gated message runs again, alone
        release.set()
        wait_for(
            lambda: Message.objects.get(pk=plain.pk).status == "succeeded",
            message="the handed-back message to run again",
        )
    finally:
        release.set()
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    plain.refresh_from_db()
    assert plain.attempt_count == 2 and RUNS[plain.pk] == 2
    assert list(Effect.objects.filter(message_id=plain.pk).values_list("value", flat=True)) == [
        "2"
    ]  # the rolled-back run wrote nothing
    handed = [r.getMessage() for r in caplog.records if f"message {plain.pk} " in r.getMessage()]
    assert any(
        f"message {plain.pk} (atomic-limited-5s/" in line
        and "attempt 1 handed back, to run again" in line
        and "time limit" in line
        for line in handed
    ), handed


def test_an_atomic_handler_past_its_time_limit_commits_nothing_whoever_sees_it_first(
    run_worker, settings
):
    """The keeper records a time limit at its next round; one that comes after the
    handler returned (its rounds are far apart here; on SQLite the handler's own
    transaction holds the write lock it needs) must not let the late handler's
    writes commit as a success."""
    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 300, "HEARTBEAT_INTERVAL": 60, "MAX_ATTEMPTS": 1}
    RUNS.clear()
    late = enqueue("atomic-limited", {"sleep": 0.8}).message  # time_limit=0.5
    run_worker(["atomic-limited"])
    late.refresh_from_db()
    assert late.status == "failed"
    assert "TimeLimitExceeded" in late.last_error
    assert not Effect.objects.filter(message_id=late.pk).exists()  # rolled back
    assert RUNS[late.pk] == 1


def test_an_atomic_handler_whose_transaction_began_past_its_time_limit_never_starts():
    """On SQLite an atomic handler's BEGIN IMMEDIATE waits for the database's write
    lock; held by a long transaction (the adversary run's sqlite-long-atomic), it
    came after the time limit, the keeper had failed the attempt and a retry ran,
    and the late handler then started beside it (the adversary run's "rerun w/o
    cause" of an atomic-time-limit message). It must not start at all."""
    import time

    from django_delayq.worker.inflight import Book, InFlight, Lane, Phase
    from django_delayq.worker.runner import _Held

    RUNS.clear()
    late = enqueue("atomic-limited", {}).message  # time_limit=0.5
    batch = claim.claim(["atomic-limited"], 1, worker="w", lease=timedelta(minutes=5))
    lane = Lane(["atomic-limited"], 1)
    book = Book([lane])
    item = InFlight(batch.messages[0], batch.token, lane, timedelta(minutes=5))
    item.time_limit = timedelta(seconds=0.5)
    book.add([item])
    assert book.take() is item
    assert item.phase is Phase.RUNNING
    item.started_at = time.monotonic() - 1.0  # its BEGIN waited a second
    result = execute(batch.messages[0], batch.token, using="default", held=_Held(item, None, book))
    assert RUNS.get(late.pk, 0) == 0, "the late handler ran"
    assert result is Result.RETRYING or result is Result.FAILED
    late.refresh_from_db()
    assert "time limit" in late.last_error
    assert not Effect.objects.filter(message_id=late.pk).exists()


# -- SQLite: one write lock for the whole database ------------------------------------


def test_on_sqlite_a_long_atomic_handler_lets_no_other_lease_of_its_worker_be_taken(
    serving_worker, settings
):
    # The atomic handler's transaction holds SQLite's write lock for longer
    # than a lease: no heartbeat, no lease extension can be written meanwhile,
    # by this worker or any other. When it commits, the worker's other running
    # message must still be its own.
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write lock is the database's")
    settings.DELAYQ = {**settings.DELAYQ, "HEARTBEAT_INTERVAL": 0.2, "WORKER_DEAD_AFTER": 1}
    other_arrived, other_release = gate("other")
    long_arrived, long_release = gate("long")
    other = enqueue("gated", {"v": 1, "gate": "other"}).message  # lease 1 s
    serving_worker(["gated", "atomic-gated"], concurrency=2)
    try:
        assert other_arrived.wait(30)
        enqueue("atomic-gated", {"gate": "long"})
        assert long_arrived.wait(30)  # its transaction holds the write lock from here
        leased_until = lease_end(other)
        wait_for(
            lambda: timezone.now() > leased_until + timedelta(seconds=1.5),
            message="the other message's lease to pass",
        )
        long_release.set()
        wait_for(
            lambda: Message.objects.filter(queue="atomic-gated", status="succeeded").exists(),
            message="the long atomic handler to commit",
        )
        thief = claim.claim(["gated"], 10, worker="thief", lease=timedelta(minutes=5))
        assert [m.pk for m in thief.messages] == []
    finally:
        long_release.set()
        other_release.set()
    wait_for(lambda: Message.objects.get(pk=other.pk).status == "succeeded", message="done")
    assert executions(other) == 1


# -- InterfaceError is not a DatabaseError -------------------------------------------


@pytest.mark.parametrize("where", ["claim", "extend", "next_due"])
def test_an_interface_error_is_a_lost_connection_not_a_crash(
    serving_worker, monkeypatch, settings, where
):
    # DB-API makes InterfaceError ("connection already closed") a sibling of
    # DatabaseError: a worker that caught only the latter died of the former.
    from django_delayq.store import queries

    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 0.6}
    if where == "extend":
        enqueue("default", {"sleep": 1})  # a lease to extend

    module = {"claim": claim, "extend": leases, "next_due": queries}[where]
    real = getattr(module, where)
    raised: list[int] = []

    def once(*args, **kwargs):
        if not raised:
            raised.append(1)
            raise InterfaceError("connection already closed")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, where, once)
    worker = serving_worker(["default"], concurrency=1)
    wait_for(lambda: raised, message="the error to be raised")
    message = enqueue("default", {}).message
    wait_for(lambda: Message.objects.get(pk=message.pk).status == "succeeded", message="done")
    assert not worker.book.stopping


def test_a_coroutine_handed_to_a_dying_event_loop_is_never_left_waiting(monkeypatch):
    """A ``KeyboardInterrupt`` or ``SystemExit`` raised on the loop outside a
    handler's attempt (a callback, a task the handler started) kills the worker's
    event loop thread (asyncio lets them out of ``run_forever``).
    A coroutine an executor hands to that loop while it shuts down (cancelling its
    tasks, closing its connections) was scheduled on a loop that then closed with
    it pending: the executor waited for its result for ever, and the message
    stayed ``running``, its lease extended, never run (found by the adversary run).
    It must be refused or ended (cancelled), and the restarted loop must work."""
    import asyncio
    import concurrent.futures
    import threading

    from django_delayq.worker import aio

    closing, submitted = threading.Event(), threading.Event()

    async def slow_close():
        closing.set()
        while not submitted.is_set():
            await asyncio.sleep(0.01)

    monkeypatch.setattr(aio, "_close_connections", slow_close)

    class Supervisor:
        restarts: list = []

        def died(self, part, error, restart, thread=None):
            self.restarts.append(restart)

    supervisor = Supervisor()
    loop = aio.EventLoop(supervisor)  # type: ignore[arg-type]
    loop.start()

    def killer():
        raise KeyboardInterrupt("raised by a callback on the loop")

    async def victim():
        await asyncio.sleep(0.2)
        return "ran"

    loop.loop.call_soon_threadsafe(killer)
    assert closing.wait(10)
    try:
        future = loop.submit(victim())
    except RuntimeError:
        future = None  # refused: the executor records a failed attempt
    submitted.set()
    if future is not None:
        done, _ = finishes_within(10, lambda: concurrent.futures.wait([future], timeout=10))
        assert done, "the coroutine's future never ended: its executor would wait for ever"
    monkeypatch.undo()
    wait_for(lambda: supervisor.restarts, message="the loop's death reported")
    finishes_within(10, supervisor.restarts[0])
    assert finishes_within(10, lambda: loop.submit(victim()).result(10)) == "ran"
    loop.stop()


def test_a_coroutine_handed_over_as_the_event_loop_dies_is_ended_not_left_unawaited(caplog):
    """The narrower window of the same seam: a coroutine handed over after the
    dying loop left ``run_forever`` but before it stopped taking coroutines was
    scheduled on a loop that never ran it again: closed with its task pending,
    it warned that it was never awaited (the adversary run's "coroutines never
    awaited" count). It must run to its end or be cancelled, never be dropped."""
    import asyncio
    import concurrent.futures
    import gc
    import threading
    import warnings

    from django_delayq.worker import aio

    died, handed = threading.Event(), []

    class Supervisor:
        def died(self, part, error, restart, thread=None):
            pass

    loop = aio.EventLoop(Supervisor())  # type: ignore[arg-type]

    async def victim():
        await asyncio.sleep(0.05)
        return "ran"

    class Gate:
        """The loop's state lock; the dying loop's thread hands a coroutine over
        (from another thread) just before it takes the lock to stop taking them."""

        def __init__(self, lock):
            self.lock = lock

        def __enter__(self):
            if died.is_set() and threading.current_thread() is loop.thread and not handed:
                other = threading.Thread(target=lambda: handed.append(loop.submit(victim())))
                other.start()
                other.join()
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    loop._state = Gate(loop._state)  # type: ignore[assignment]
    loop.start()

    def killer():
        died.set()
        raise KeyboardInterrupt("raised by a callback on the loop")

    with warnings.catch_warnings(record=True) as seen, caplog.at_level("ERROR", "asyncio"):
        warnings.simplefilter("always")
        loop.loop.call_soon_threadsafe(killer)
        wait_for(lambda: handed, message="a coroutine handed over as the loop died")
        done, _ = finishes_within(10, lambda: concurrent.futures.wait(handed, timeout=10))
        assert done, "the coroutine's future never ended: its executor would wait for ever"
        loop.thread.join(10)
        handed.clear()
        gc.collect()
    never = [str(w.message) for w in seen if "never awaited" in str(w.message)]
    assert never == []
    assert "destroyed but it is pending" not in caplog.text
    loop.stop()


def test_a_task_that_raises_system_exit_as_the_dying_loop_ends_it_leaves_nothing_unended(caplog):
    """The dying loop cancels and ends its tasks; one the handler started itself
    (outside the attempt's wrapper) may raise ``SystemExit`` as it is cancelled.
    asyncio lets that out of the loop's run before the other tasks' turns: the
    end of the loop stopped there, the tasks still pending were destroyed with
    it ("coroutine 'sleep' was never awaited" in the adversary run), and the
    supervisor was never told that the loop died. Every task must end, and the
    death be reported."""
    import asyncio
    import gc
    import threading
    import warnings

    from django_delayq.worker import aio

    class Supervisor:
        restarts: list = []

        def died(self, part, error, restart, thread=None):
            self.restarts.append((error, restart))

    supervisor = Supervisor()
    loop = aio.EventLoop(supervisor)  # type: ignore[arg-type]
    loop.start()
    started = threading.Event()

    async def stubborn():
        try:
            started.set()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise SystemExit("raised by a task as it was cancelled") from None

    async def bystander():
        await asyncio.sleep(60)

    async def handler():
        for _ in range(3):
            asyncio.get_running_loop().create_task(stubborn())
        asyncio.get_running_loop().create_task(bystander())
        await asyncio.sleep(60)

    def killer():
        raise KeyboardInterrupt("raised by a callback on the loop")

    with warnings.catch_warnings(record=True) as seen, caplog.at_level("ERROR", "asyncio"):
        warnings.simplefilter("always")
        future = loop.submit(handler())
        assert started.wait(10)
        loop.loop.call_soon_threadsafe(killer)
        wait_for(lambda: supervisor.restarts, message="the loop's death reported")
        assert future.cancelled()
        loop.thread.join(10)
        gc.collect()
    never = [str(w.message) for w in seen if "never awaited" in str(w.message)]
    assert never == []
    assert "destroyed but it is pending" not in caplog.text
    error, restart = supervisor.restarts[0]
    assert isinstance(error, KeyboardInterrupt)
    finishes_within(10, restart)

    async def after():
        return "ran"

    assert finishes_within(10, lambda: loop.submit(after()).result(10)) == "ran"
    loop.stop()


def test_rows_claimed_for_a_live_worker_whose_claim_reply_was_lost_come_back(settings):
    """A claim whose commit lost its reply (the connection cut as it committed) leaves
    its rows running under the live worker's name, in no book: nothing runs them, and
    no claim takes back a live worker's lapsed lease. Under a global cap they held its
    places for good (a MariaDB adversary run stalled on it: the cap's two places, the
    workers alive, nothing claimed for six minutes)."""
    from django_delayq.flow import Scope
    from django_delayq.store.limits import claim_limited

    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 0.6, "POLL_INTERVAL": 0.1}
    enqueue_many("limited", [{}] * 4)
    worker = Worker(["limited"], concurrency=2, burst=True)
    cap = Scope("limited", "", None, 2)
    lost = claim_limited(["limited"], 2, [cap], worker=worker.name, lease=timedelta(seconds=0.6))
    assert len(lost.claim.messages) == 2  # the cap's places, under the worker's own name
    stats = finishes_within(60, worker.run)
    assert stats[Result.SUCCEEDED] == 4
    assert Message.objects.filter(queue="limited", status="succeeded").count() == 4


def test_a_look_for_unheld_rows_that_found_the_database_locked_is_made_again(settings, monkeypatch):
    """SQLite's lock (another transaction writing) makes the keeper skip its turn
    without the reconnection that asks for a new look: the look it was making was
    dropped, and a lost claim's rows stayed running under the live worker for good."""
    from django.db import OperationalError

    from django_delayq.flow import Scope
    from django_delayq.store.limits import claim_limited

    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 0.6, "POLL_INTERVAL": 0.1}
    enqueue_many("limited", [{}] * 4)
    worker = Worker(["limited"], concurrency=2, burst=True)
    cap = Scope("limited", "", None, 2)
    claim_limited(["limited"], 2, [cap], worker=worker.name, lease=timedelta(seconds=0.6))
    release_unheld, locked = leases.release_unheld, []

    def once_locked(*args, **kwargs):
        if not locked:
            locked.append(True)
            raise OperationalError("database is locked")
        return release_unheld(*args, **kwargs)

    monkeypatch.setattr(leases, "release_unheld", once_locked)
    stats = finishes_within(60, worker.run)
    assert locked and stats[Result.SUCCEEDED] == 4


def test_a_claim_landing_while_the_keeper_looks_for_unheld_rows_is_not_handed_back(settings):
    """The keeper looks for rows running under its worker's name that its book does not
    hold. A claim that lands in the book while it looks (the claimer's thread, between
    the keeper's read of the book and its read of the lapsed rows) must not be handed
    back under its running attempt: the book is read after the rows (a CI run saw a
    healthy worker's message run twice, its keeper stalled for a short lease)."""
    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 60}
    message = enqueue("default", {}).message
    worker = Worker(["default"], concurrency=1, burst=True)
    landed = claim.claim(["default"], 1, worker=worker.name, lease=timedelta(seconds=60))
    row = landed.messages[0]
    Message.objects.filter(pk=message.pk).update(
        next_attempt_time=timezone.now() - timedelta(seconds=1)
    )
    lane = worker.book.lanes[0]

    def the_claim_lands(execute, sql, params, many, context):
        # The claimer's thread adds its rows to the book as the keeper reads the
        # lapsed ones (the row's lease is lapsed: the claimer stalled that long).
        result = execute(sql, params, many, context)
        if not worker.book.leases():
            worker.book.add([worker.claimer._in_flight(lane, row, landed.token)])
        return result

    with connection.execute_wrapper(the_claim_lands):
        worker.keeper.release_unheld()
    message.refresh_from_db()
    assert (message.status, message.lock_token) == ("running", landed.token)


def lapsed(message: Message) -> bool:
    """Whether the message's lease has lapsed by the database's clock."""
    from django_delayq import clock

    return Message.objects.filter(pk=message.pk, next_attempt_time__lt=clock.sql_now()).exists()


def test_rows_of_a_claim_on_its_way_into_the_book_are_not_handed_back(settings):
    """A claim sent and not yet back (its thread stalled past the lease between the
    commit and the book) holds rows the keeper cannot tell from a lost claim's: it
    leaves them, and looks again once the claim is back; a claim that failed is no
    longer on its way, and its rows are handed back."""
    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 0.4}
    message = enqueue("default", {}).message
    worker = Worker(["default"], concurrency=1, burst=True)
    with worker.book.claiming():
        claim.claim(["default"], 1, worker=worker.name, lease=timedelta(seconds=0.4))
        wait_for(lambda: lapsed(message), message="the stalled claim's lease to lapse")
        worker.keeper.release_unheld()
        message.refresh_from_db()
        assert message.status == "running"
    worker.keeper.release_unheld()  # the claim's reply was lost: it never reached the book
    message.refresh_from_db()
    assert message.status == "pending"


def test_a_claim_loop_always_claiming_does_not_keep_a_lost_claims_rows_running(settings):
    """A claim on its way into the book that began after a lost claim's leases lapsed
    cannot hold their rows: it must not keep them from coming back. A claim loop that is
    always claiming (a backlog, lock waits under a global cap) kept a lost claim's rows
    running for 32 s under a 2 s lease in a MariaDB adversary run."""
    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 0.4}
    message = enqueue("default", {}).message
    worker = Worker(["default"], concurrency=1, burst=True)
    claim.claim(["default"], 1, worker=worker.name, lease=timedelta(seconds=0.4))  # reply lost
    wait_for(lambda: lapsed(message), message="the lost claim's lease to lapse")
    with worker.book.claiming():  # the next claim, just sent
        worker.keeper.release_unheld()
    message.refresh_from_db()
    assert (message.status, message.lock_token) == ("pending", None)


def test_rows_of_a_queue_fields_model_left_running_under_a_live_worker_come_back(settings):
    """A ``QueueFields`` model's rows left running under a live worker's name (a claim
    whose reply was lost; a killed worker of the same name before it, as containers
    restarted under one host name and pid are) were never handed back: the keeper
    looked at the message table only, and no claim takes a live worker's rows."""
    from tests.testapp.models import Shipment

    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 60}
    row = Shipment(reference="lost")
    row.schedule()
    worker = Worker(["shipments"], concurrency=1, burst=True)
    claim.claim([], 1, worker=worker.name, lease=timedelta(seconds=60), model=Shipment)
    Shipment.objects.filter(pk=row.pk).update(
        next_attempt_time=timezone.now() - timedelta(seconds=1)
    )

    worker.keeper.release_unheld()

    row.refresh_from_db()
    assert (row.status, row.lock_token) == ("pending", None)


def lock_timeout(conn, seconds: str) -> None:
    """How long this session waits for a row lock (PostgreSQL, MariaDB/MySQL)."""
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            value = "DEFAULT" if seconds == "DEFAULT" else f"'{seconds}s'"
            cursor.execute(f"SET lock_timeout = {value}")
        else:
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {seconds}")


def test_a_dead_workers_rows_are_handed_back_around_one_another_transaction_locks():
    """A producer's transaction locking one running row of a dead worker (an upsert of
    its key) held back the release of every other row of that worker until it ended
    (a full MariaDB adversary run saw messages running for minutes with no worker,
    and releases by several workers at once deadlock there). The others are handed
    back at once; the locked one once its lock is gone."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's write lock is the database's")
    enqueue_many("default", [{}] * 3)
    claimed = claim.claim(["default"], 3, worker="dead-one", lease=timedelta(minutes=5))
    locked_row, *others = claimed.messages
    _, unlock, holder = hold_lock(locked_row.pk)
    try:
        # Waiting for the lock fails the release instead of hanging the test.
        lock_timeout(connection, "5")
        released = leases.release_workers(["dead-one"])
    finally:
        lock_timeout(connection, "DEFAULT")
        unlock.set()
        holder.join(30)
    assert released == {"dead-one": 2}
    states = dict(Message.objects.values_list("pk", "status"))
    assert [states[m.pk] for m in others] == ["pending", "pending"]
    assert states[locked_row.pk] == "running"
    assert leases.release_workers(["dead-one"]) == {"dead-one": 1}
    assert Message.objects.get(pk=locked_row.pk).status == "pending"
