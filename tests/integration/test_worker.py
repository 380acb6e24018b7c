"""The worker's semantics, run in-process against the real database."""

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.utils import timezone

from django_delayq import clock, enqueue, enqueue_many, handler
from django_delayq.conf import MAX_DELAY
from django_delayq.models import Message
from django_delayq.registry import registry
from django_delayq.retry import FixedDelay
from django_delayq.store import claim, leases, settle
from django_delayq.worker.execute import Result, execute
from tests.testapp.models import Effect, Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_burst_processes_due_messages(run_worker):
    results = enqueue_many("default", [{}] * 20)
    stats = run_worker(["default"], concurrency=3, batch_size=4)
    assert stats[Result.SUCCEEDED] == 20
    assert set(Message.objects.values_list("status", flat=True)) == {"succeeded"}
    executed = sorted(Execution.objects.values_list("message_id", flat=True))
    assert executed == sorted(r.message.pk for r in results)
    message = Message.objects.first()
    assert message.finished_at is not None and message.next_attempt_time is None
    assert message.lock_token is None and message.attempt_count == 1


def test_delayed_messages_wait_until_due(run_worker, fake_clock):
    enqueue("default", {}, key="later", delay=timedelta(minutes=5))
    enqueue("default", {}, key="now")
    run_worker(["default"])
    assert Message.objects.get(key="now").status == "succeeded"
    assert Message.objects.get(key="later").status == "pending"
    fake_clock.advance(minutes=4, seconds=59)
    run_worker(["default"])
    assert Message.objects.get(key="later").status == "pending"
    fake_clock.advance(seconds=1)
    run_worker(["default"])
    assert Message.objects.get(key="later").status == "succeeded"


def test_priority_orders_claims(run_worker):
    enqueue("default", {}, key="low", priority=-5)
    enqueue("default", {}, key="mid")
    enqueue("default", {}, key="high", priority=10)
    run_worker(["default"], concurrency=1, batch_size=1)
    order = list(Execution.objects.order_by("id").values_list("message_id", flat=True))
    keys = [Message.objects.get(pk=pk).key for pk in order]
    assert keys == ["high", "mid", "low"]


def test_failures_retry_with_backoff_then_succeed(run_worker, fake_clock, settings):
    settings.DELAYQ = {**settings.DELAYQ, "RETRY_POLICY": "django_delayq.retry.FixedDelay"}
    message = enqueue("default", {"fail": 2}).message
    run_worker(["default"])
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("pending", 1)
    assert "Boom: attempt 1 of message" in message.last_error
    assert "Traceback" in message.last_traceback and "handlers.py" in message.last_traceback
    assert message.next_attempt_time - fake_clock() == timedelta(seconds=60)
    run_worker(["default"])  # not due yet
    assert Message.objects.get(pk=message.pk).attempt_count == 1
    fake_clock.advance(60)
    run_worker(["default"])
    fake_clock.advance(60)
    run_worker(["default"])
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("succeeded", 3)


def test_max_attempts_moves_to_failed(run_worker, fake_clock):
    message = enqueue("other", {"fail": 10}).message  # the handler allows 2 attempts
    run_worker(["other"])
    fake_clock.advance(3600)
    run_worker(["other"])
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("failed", 2)
    assert message.next_attempt_time is None and message.finished_at is not None
    fake_clock.advance(3600)
    run_worker(["other"])
    assert Message.objects.get(pk=message.pk).attempt_count == 2


def test_message_max_attempts_overrides_handler(run_worker):
    message = enqueue("other", {"fail": 10}, max_attempts=1).message
    run_worker(["other"])
    message.refresh_from_db()
    assert message.status == "failed"


def test_atomic_handler_writes_commit_with_the_ack(run_worker):
    message = enqueue("atomic", {"value": "kept"}).message
    run_worker(["atomic"])
    assert Message.objects.get(pk=message.pk).status == "succeeded"
    assert list(Effect.objects.values_list("value", flat=True)) == ["kept"]


def test_atomic_handler_failure_rolls_back_its_writes(run_worker, fake_clock):
    message = enqueue("atomic", {"value": "x", "fail": 1}).message
    run_worker(["atomic"])
    message.refresh_from_db()
    assert message.status == "pending" and message.attempt_count == 1
    assert not Effect.objects.exists()
    fake_clock.advance(3600)
    run_worker(["atomic"])
    assert Effect.objects.count() == 1


def test_atomic_handler_with_lost_lease_rolls_back(settings):
    message = enqueue("atomic", {"value": "stale"}).message
    first = claim.claim(["atomic"], 1, worker="w1", lease=timedelta(seconds=-1))
    second = claim.claim(["atomic"], 1, worker="w2", lease=timedelta(minutes=5))
    assert second.messages and second.messages[0].pk == message.pk
    assert execute(first.messages[0], first.token, using="default") is Result.LEASE_LOST
    assert not Effect.objects.exists()
    refreshed = Message.objects.get(pk=message.pk)
    assert (refreshed.status, refreshed.lock_token) == ("running", second.token)


def test_retry_snoozes_without_spending_an_attempt(run_worker, fake_clock):
    message = enqueue("other", {"retry_in": 30}).message
    run_worker(["other"])
    message.refresh_from_db()
    assert message.status == "pending" and message.last_error == ""
    assert message.next_attempt_time == fake_clock() + timedelta(seconds=30)
    assert message.max_attempts == 3  # the handler's 2, plus the snooze
    fake_clock.advance(30)
    run_worker(["other"])
    assert Message.objects.get(pk=message.pk).status == "succeeded"


def test_a_retry_delay_no_database_could_store_fails_the_attempt(run_worker):
    message = enqueue("default", {"retry_in": 10**12}).message
    stats = run_worker(["default"])
    message.refresh_from_db()
    assert stats[Result.RETRYING] == 1
    assert (message.status, message.attempt_count) == ("pending", 1)
    assert message.last_error.startswith("ValueError: Retry delay must be at most 365000 days")
    assert message.lock_token is None


def test_a_retry_policy_delay_past_max_delay_is_cut_to_it(run_worker, fake_clock):
    @handler("far-retries", retry=FixedDelay(delay=10**12))
    def always_fails(message):
        raise RuntimeError("boom")

    try:
        message = enqueue("far-retries", {}).message
        stats = run_worker(["far-retries"])
    finally:
        registry.unregister("far-retries")
    message.refresh_from_db()
    assert stats[Result.RETRYING] == 1
    assert (message.status, message.attempt_count) == ("pending", 1)
    assert message.next_attempt_time == fake_clock() + MAX_DELAY


def test_discard_fails_at_once(run_worker):
    message = enqueue("default", {"discard": "customer deleted"}).message
    run_worker(["default"])
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("failed", 1)
    assert message.last_error == "Discarded: customer deleted"


def test_unknown_kind_is_recorded_not_crashing(run_worker):
    from django_delayq.registry import HandlerSpec, registry

    registry.register(HandlerSpec(func=lambda m: None, queue="kinded", kind="known"))
    try:
        message = enqueue("kinded", {}, kind="mystery").message
        good = enqueue("kinded", {}, kind="known").message
        stats = run_worker(["kinded"])
    finally:
        registry.unregister("kinded", "known")
    message.refresh_from_db()
    assert message.status == "pending" and "no handler for queue 'kinded'" in message.last_error
    assert Message.objects.get(pk=good.pk).status == "succeeded"
    assert stats[Result.RETRYING] == 1


def test_handler_that_cannot_decode_its_payload_records_the_error(run_worker):
    from django_delayq.registry import HandlerSpec, registry

    def strict(message):
        return message.payload["order_id"]

    registry.register(HandlerSpec(func=strict, queue="strict", max_attempts=1))
    try:
        message = enqueue("strict", ["not", "an", "object"]).message
        run_worker(["strict"])
    finally:
        registry.unregister("strict")
    message.refresh_from_db()
    assert message.status == "failed"
    assert message.last_error.startswith("TypeError: list indices must be integers")


def test_expired_lease_makes_the_message_claimable_again():
    message = enqueue("default", {}).message
    first = claim.claim(["default"], 10, worker="w1", lease=timedelta(seconds=-1))
    assert [m.pk for m in first.messages] == [message.pk]
    second = claim.claim(["default"], 10, worker="w2", lease=timedelta(minutes=5))
    assert [m.attempt_count for m in second.messages] == [2]
    assert claim.claim(["default"], 10, worker="w3", lease=timedelta(minutes=5)).messages == []


def test_stale_token_cannot_ack_fail_extend_or_release():
    message = enqueue("default", {}).message
    stale = claim.claim(["default"], 1, worker="w1", lease=timedelta(seconds=-1))
    fresh = claim.claim(["default"], 1, worker="w2", lease=timedelta(minutes=5))
    ids = [message.pk]
    assert settle.ack(ids, stale.token) == 0
    assert settle.fail(message.pk, stale.token, error="x", retry_at=None) == 0
    assert leases.extend(ids, stale.token, timedelta(hours=1)) == set()
    assert leases.release(ids, stale.token, started=True) == 0
    assert settle.ack(ids, uuid.uuid4()) == 0
    assert settle.ack(ids, fresh.token) == 1
    assert Message.objects.get().status == "succeeded"


def test_claim_batches_share_one_token_and_respect_the_limit():
    enqueue_many("default", [{}] * 5)
    batch = claim.claim(["default"], 3, worker="w", lease=timedelta(minutes=1))
    assert len(batch.messages) == 3
    assert {m.lock_token for m in batch.messages} == {batch.token}
    assert settle.ack([m.pk for m in batch.messages], batch.token) == 3


def test_release_gives_back_unstarted_attempts():
    message = enqueue("default", {}).message
    batch = claim.claim(["default"], 1, worker="w", lease=timedelta(minutes=1))
    assert leases.release([message.pk], batch.token, started=False) == 1
    message.refresh_from_db()
    assert (message.status, message.attempt_count, message.lock_token) == ("pending", 0, None)


def test_claim_only_takes_the_workers_queues():
    enqueue("other", {})
    assert claim.claim(["default"], 10, worker="w", lease=timedelta(minutes=1)).messages == []


def test_lease_is_extended_while_a_long_handler_runs(run_worker, settings):
    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 1.5}
    message = enqueue("default", {"sleep": 4}).message
    run_worker(["default"])
    message.refresh_from_db()
    # Without extension the lease would have expired after 1.5 s and the
    # acknowledgement (a compare-and-set on the lease) would have been refused.
    assert (message.status, message.attempt_count) == ("succeeded", 1)


def test_a_worker_whose_keeper_stopped_loses_its_messages(run_worker, settings, monkeypatch):
    # No lease extension and no heartbeat (as when the keeper's thread hangs,
    # or the process is frozen): once the lease has passed and the worker
    # counts as dead, its message is claimed again (here by the same worker,
    # which cannot know its keeper is stuck) and the stale first attempt
    # records nothing.
    from django.db import connection

    from django_delayq import liveness
    from django_delayq.worker.keeper import Keeper

    if connection.vendor == "sqlite":
        pytest.skip("SQLite: a worker whose process lives keeps its messages (the OS says)")
    settings.DELAYQ = {
        **settings.DELAYQ,
        "LEASE": 0.5,
        "HEARTBEAT_INTERVAL": 0.25,
        "WORKER_DEAD_AFTER": 0.5,
    }
    monkeypatch.setattr(Keeper, "extend_leases", lambda self: None)
    monkeypatch.setattr(liveness, "beat", lambda name, **kwargs: 1)
    message = enqueue("default", {"sleep": 1.5, "sleep_attempts": 1}).message
    stats = run_worker(["default"], concurrency=2)
    assert (stats[Result.LEASE_LOST], stats[Result.SUCCEEDED]) == (1, 1)
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("succeeded", 2)


def test_a_live_workers_lapsed_lease_is_not_taken(run_worker, settings, monkeypatch):
    # The lease lapses but the worker's heartbeat goes on (its keeper could not
    # extend it: another transaction held the row): the message stays its own.
    from django_delayq.worker.keeper import Keeper

    settings.DELAYQ = {**settings.DELAYQ, "LEASE": 0.5}
    monkeypatch.setattr(Keeper, "extend_leases", lambda self: None)
    message = enqueue("default", {"sleep": 1.5}).message
    # A name of its own: an in-process worker is named after the process, and a
    # worker of an earlier test still stopping would look for rows "it" left
    # running under that name, and find this one's (its lease lapsed on purpose).
    stats = run_worker(["default"], concurrency=2, name="lapsed-lease")
    assert (stats[Result.LEASE_LOST], stats[Result.SUCCEEDED]) == (0, 1)
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("succeeded", 1)
    assert Execution.objects.filter(message_id=message.pk).count() == 1


def test_pruning_removes_only_old_finished_messages(fake_clock):
    from django_delayq.retention import prune

    old = enqueue("default", {}).message
    Message.objects.filter(pk=old.pk).update(
        status="succeeded", finished_at=timezone.now() - timedelta(days=8)
    )
    recent = enqueue("default", {}).message
    Message.objects.filter(pk=recent.pk).update(status="failed", finished_at=timezone.now())
    pending = enqueue("default", {}).message
    assert prune(batch_size=1) == 1
    assert set(Message.objects.values_list("pk", flat=True)) == {recent.pk, pending.pk}


def test_a_message_that_keeps_killing_its_worker_stops_after_max_attempts(run_worker):
    message = enqueue("other", {}).message  # the handler allows 2 attempts
    for worker in ("w1", "w2"):  # two attempts that never report (crashed workers)
        claim.claim(["other"], 1, worker=worker, lease=timedelta(seconds=-1))
    stats = run_worker(["other"])
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("failed", 3)
    assert message.last_error == (
        "gave up: attempt 2 of 2 ended without an outcome (worker crash or lease expiry)"
    )
    assert stats[Result.FAILED] == 1
    assert not Execution.objects.exists()  # the handler did not run a third time


def test_worker_pruning_catches_up_when_a_round_hits_its_cap(settings, monkeypatch):
    # Ten batches of 5 per round: 120 expired messages need three rounds, and
    # the rounds after a capped one come at once (PRUNE_CATCH_UP set to 0),
    # not an hour later (PRUNE_INTERVAL).
    from django_delayq.worker import Worker, maintenance

    settings.DELAYQ = {
        **settings.DELAYQ,
        "PRUNE_INTERVAL": 3600,
        "PRUNE_BATCH_SIZE": 5,
        "RETENTION": 60,
    }
    monkeypatch.setattr(maintenance, "PRUNE_CATCH_UP", 0.0)
    enqueue_many("default", [{}] * 120)
    Message.objects.update(status="succeeded", finished_at=timezone.now() - timedelta(hours=1))
    w = Worker(["default"])
    remaining = []
    for _ in range(4):
        w.maintenance.run_due()
        remaining.append(Message.objects.count())
    assert remaining == [70, 20, 0, 0]


def test_worker_prunes_at_once_on_a_host_that_just_booted(settings, monkeypatch):
    # time.monotonic() counts from boot: ten seconds of uptime is less than
    # PRUNE_INTERVAL, and the first round must still not wait for it.
    from django_delayq.worker import Worker, maintenance

    settings.DELAYQ = {**settings.DELAYQ, "PRUNE_INTERVAL": 3600, "RETENTION": 60}
    monkeypatch.setattr(maintenance.time, "monotonic", lambda: 10.0)
    enqueue_many("default", [{}] * 3)
    Message.objects.update(status="succeeded", finished_at=timezone.now() - timedelta(hours=1))
    Worker(["default"]).maintenance.run_due()
    assert Message.objects.count() == 0


def test_every_worker_thread_keeps_its_debug_query_log_short(run_worker, settings):
    # DEBUG keeps each connection's queries (per thread, up to 9,000): the
    # claiming thread, the lease keeper and the acknowledgement thread must
    # each empty their own, not only the handler threads.
    import gc

    from django.db.backends.base.base import BaseDatabaseWrapper

    settings.DEBUG = True
    enqueue_many("default", [{}] * 150)
    stats = run_worker(["default"], batch_size=1)
    assert stats[Result.SUCCEEDED] == 150
    longest = max(
        len(obj.queries_log) for obj in gc.get_objects() if isinstance(obj, BaseDatabaseWrapper)
    )
    assert longest < 50


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "CancelledError"])
def test_a_handler_raising_a_base_exception_fails_its_attempt_and_the_worker_goes_on(raised):
    from django_delayq.worker import Worker

    odd = enqueue("default", {"raise": raised}, priority=1, max_attempts=1).message
    plain = enqueue("default", {}).message
    worker = Worker(["default"], burst=True, concurrency=1)
    stats: dict[str, object] = {}
    thread = threading.Thread(target=lambda: stats.update(worker.run()), daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        worker.stop()
        thread.join(30)
        pytest.fail("--burst did not exit: the handler's exception killed its executor")
    odd.refresh_from_db()
    plain.refresh_from_db()
    assert plain.status == "succeeded"
    # Recorded like any failure: failed at max_attempts.
    assert (odd.status, odd.attempt_count) == ("failed", 1)
    assert odd.last_error.startswith(
        {"KeyboardInterrupt": "KeyboardInterrupt", "CancelledError": "asyncio"}[raised]
    )
    assert f"raised by the handler of message {odd.pk}" in odd.last_error
    assert "Traceback" in odd.last_traceback
    assert odd.lock_token is None
    assert stats[Result.FAILED] == 1 and stats[Result.SUCCEEDED] == 1


def test_a_keyboard_interrupt_in_the_main_thread_is_recorded_and_still_interrupts():
    # Handlers run in the main thread only when called directly (the testing
    # helpers' run_pending): there a Ctrl-C must still stop the caller.
    message = enqueue("default", {"raise": "KeyboardInterrupt"}).message
    batch = claim.claim(["default"], 1, worker="test", lease=timedelta(seconds=30))
    with pytest.raises(KeyboardInterrupt):
        execute(batch.messages[0], batch.token, using="default")
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("pending", 1)
    assert message.last_error.startswith("KeyboardInterrupt")


def test_an_update_of_a_running_message_never_runs_beside_it(serving_worker):
    # "gated": lease 1 s. The first version waits at its gate for longer
    # than its lease; an update meanwhile must wait for it to end.
    from tests.conftest import wait_for
    from tests.testapp.handlers import gate

    def db_now():
        return Message.objects.annotate(n=clock.sql_now()).values_list("n", flat=True)[0]

    arrived, release = gate("v1")
    message = enqueue("gated", {"v": 1, "gate": "v1"}, key="k").message
    serving_worker(["gated"], concurrency=2)
    assert arrived.wait(30)
    claimed = Message.objects.get(pk=message.pk)
    enqueue("gated", {"v": 2}, key="k", on_conflict="update")
    wait_for(
        lambda: db_now() > claimed.next_attempt_time + timedelta(seconds=1.5),
        message="the first lease to pass",
    )
    started = Execution.objects.filter(message_id=message.pk).count()
    release.set()
    wait_for(
        lambda: (
            Execution.objects.filter(message_id=message.pk, finished__isnull=False).count() == 2
        ),
        message="both versions to run",
    )
    assert started == 1, "the new version ran while the first was still running"
    first, second = Execution.objects.filter(message_id=message.pk).order_by("started")
    assert (first.worker, second.worker) == ("1", "2")
    assert second.started >= first.finished
    wait_for(lambda: Message.objects.get(pk=message.pk).status == "succeeded", message="done")


@contextmanager
def _serving(worker, release: threading.Event) -> Iterator[None]:
    """``worker`` runs (serving) on a thread; at the end ``release`` lets a blocked
    maintenance task go and the worker must stop."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        release.set()
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()


def test_a_maintenance_task_never_holds_up_a_claim():
    # On the claim loop, the sweeps every HEARTBEAT_INTERVAL (dead workers,
    # ordered groups) made each message that arrived meanwhile start 5-10 ms
    # late (the idle pickup's p95), and a long prune held every claim for as
    # long as it ran. Here a task blocks until the message it would have held
    # up has run.
    from django_delayq.worker import Worker, maintenance
    from tests.conftest import wait_for

    blocking, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def slow() -> None:
        runs.append(1)
        if len(runs) > 1:  # the first round passes
            blocking.set()
            release.wait(60)

    worker = Worker(["default"], concurrency=1)
    worker.maintenance.tasks.append(maintenance._Task("slow", 0.01, slow))
    with _serving(worker, release):
        assert blocking.wait(30)
        message = enqueue("default", {}).message
        wait_for(
            lambda: Message.objects.get(pk=message.pk).status == "succeeded",
            timeout=15,
            message="the message to run while a maintenance task runs",
        )


def test_a_serving_workers_first_claim_does_not_wait_for_its_first_maintenance_round():
    # The first round (cron installs, the sweeps, a prune) ran on the main
    # thread before the first claim: about 10 ms of every serving worker's
    # start-up to its first message. Here the first round blocks until the
    # message due at start has run.
    from django_delayq.worker import Worker, maintenance
    from tests.conftest import wait_for

    release = threading.Event()
    message = enqueue("default", {}).message
    worker = Worker(["default"], concurrency=1)
    worker.maintenance.tasks.insert(
        0, maintenance._Task("slow", 60, lambda: release.wait(60) and None)
    )
    with _serving(worker, release):
        wait_for(
            lambda: Message.objects.get(pk=message.pk).status == "succeeded",
            timeout=15,
            message="the message to run while the first maintenance round runs",
        )


def test_a_worker_whose_lanes_are_full_waits_for_a_slot_without_reading_the_next_due_time(
    run_worker, monkeypatch
):
    # With a backlog every claim fills the lane; the next due time is always
    # past then, and reading it (with a 10 ms sleep after) at every round cost
    # a query per claim and about a sixth of the full-speed throughput. A
    # slot's settling wakes the claimer: nothing else is needed.
    from django_delayq.worker import claimer

    reads: list[frozenset[str]] = []
    read = claimer.Claimer._read_next_due

    def counted(self, skip):
        reads.append(skip)
        return read(self, skip)

    monkeypatch.setattr(claimer.Claimer, "_read_next_due", counted)
    enqueue_many("default", [{}] * 3000)
    stats = run_worker(["default"], concurrency=4)
    assert stats[Result.SUCCEEDED] == 3000
    # About 30 claims of 100 fill the lane; reads belong to the rounds whose
    # lane was not full (the start and the end), not to every claim.
    assert len(reads) <= 5, len(reads)  # 150 before


def test_an_idle_worker_sleeps_until_the_next_due_time_not_a_fixed_step_more(fake_clock):
    # A delayed message 3 ms ahead: the sleep ends just after its due time.
    # The shortest idle sleep (10 ms, against spinning on a message another
    # worker is claiming) applied to due times still to come made each
    # delayed message start up to 10 ms late (p50 10.2 ms, 4.8 before).
    from django_delayq.worker import Worker
    from django_delayq.worker import claimer as claiming
    from django_delayq.worker.wakeup import Waker

    enqueue("default", {}, run_at=fake_clock.current + timedelta(milliseconds=3))
    worker = Worker(["default"], concurrency=1, using="default")
    timeouts: list[float] = []

    class Recorded(Waker):
        def wait(self, timeout: float) -> bool:
            timeouts.append(timeout)
            return True

    worker.claimer.waker = Recorded("default", ["default"], listen=False, poll_interval=5)
    try:
        assert worker.claimer.claim_round() == 0
        worker.claimer.idle_wait()
    finally:
        worker.claimer.waker.close()
    assert timeouts == [pytest.approx(0.003)]
    assert timeouts[0] < claiming.MIN_IDLE_SLEEP


class _Notified:
    """A Waker whose every listening wait is ended by a notification for "default"."""

    def __new__(cls, calls: list[tuple[float, bool]]):
        from django_delayq.worker.wakeup import Waker

        class Notified(Waker):
            def wait(self, timeout: float, *, listen: bool = True) -> bool:
                calls.append((timeout, listen))
                self.notified = {"default"} if listen else set()
                return False

        return Notified("default", ["default"], listen=False, poll_interval=5)


def test_a_notification_soon_after_a_claim_that_found_work_is_claimed_with_the_next_ones(
    settings,
):
    # At a steady rate each message used to cost a wake-up and a claim of its
    # own (about 0.7 ms of CPU at 200 a second): in a dense stream (at least
    # HOLD_FOR notifications expected within CLAIM_DELAY), the worker waits
    # out the rest of it without waking for each notification, then claims
    # what arrived meanwhile at once. The stream's density is the worker's
    # own estimate; here it has heard one notification a millisecond. (A
    # CLAIM_DELAY of half a second: the wake-up must come within it of the
    # last notification, and a loaded machine can take more than 25 ms
    # between the two lines of this test that stand for them.)
    import time

    from django_delayq.worker import Worker

    settings.DELAYQ = {**settings.DELAYQ, "CLAIM_DELAY": 0.5}
    worker = Worker(["default"], concurrency=4, using="default")
    calls: list[tuple[float, bool]] = []
    worker.claimer.waker = _Notified(calls)
    try:
        enqueue("default", {})
        assert worker.claimer.claim_round() == 1
        enqueue_many("default", [{}, {}])
        now = time.monotonic()
        for ago in (0.004, 0.003, 0.002, 0.001, 0.0):
            worker.claimer.heard(now - ago, 1)
        worker.claimer.idle_wait()
        assert worker.claimer.claim_round() == 2
    finally:
        worker.claimer.waker.close()
    assert [listen for _, listen in calls] == [True, False]
    assert 0 < calls[1][0] <= 0.5


@pytest.mark.parametrize("claim_delay", [0.025, None])
def test_an_idle_worker_claims_at_once_when_notified(settings, claim_delay):
    # No claim found work within CLAIM_DELAY (or there is none): the pickup
    # of a message that finds the worker idle is never delayed.
    from django_delayq.worker import Worker

    settings.DELAYQ = {**settings.DELAYQ, "CLAIM_DELAY": claim_delay}
    worker = Worker(["default"], concurrency=4, using="default")
    calls: list[tuple[float, bool]] = []
    worker.claimer.waker = _Notified(calls)
    try:
        if claim_delay is None:
            enqueue("default", {})
            assert worker.claimer.claim_round() == 1
        enqueue("default", {})
        worker.claimer.idle_wait()
        assert worker.claimer.claim_round() == 1
    finally:
        worker.claimer.waker.close()
    assert [listen for _, listen in calls] == [True]


@pytest.mark.parametrize("together", [True, False], ids=["same-wait", "while-sleeping-to-it"])
def test_a_delayed_message_notified_beside_a_due_one_wakes_the_worker_at_its_due_time(
    settings, together
):
    # The wake-up's hint was the earliest due time of its notifications, and
    # the claim it caused cleared it: a delayed message heard of beside a due
    # one (in the same wait, or while the worker slept until the delayed one)
    # was found only by the next read of the next due time, up to
    # POLL_INTERVAL late (or later: under a steady stream that read finds a
    # message due now).
    import json

    from django_delayq.worker import Worker
    from django_delayq.worker.wakeup import Waker

    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 30, "CLAIM_DELAY": None}
    worker = Worker(["default"], concurrency=4, using="default")
    timeouts: list[float] = []

    def heard(waker: Waker, message: Message) -> None:
        due = message.next_attempt_time.timestamp()
        waker._note(json.dumps({"queue": "default", "due": due}).encode())

    class Notified(Waker):
        def wait(self, timeout: float, *, listen: bool = True) -> bool:
            timeouts.append(timeout)
            self.notified = set()
            if len(timeouts) == 1:
                later = enqueue("default", {}, delay=timedelta(seconds=10)).message
                heard(self, later)
                if not together:
                    return False
            if len(timeouts) == (1 if together else 2):
                heard(self, enqueue("default", {}).message)
                return False
            return True

    worker.claimer.waker = Notified("default", ["default"], listen=False, poll_interval=30)
    try:
        assert worker.claimer.claim_round() == 0
        worker.claimer.idle_wait()  # hears of the delayed message (and of the due one)
        if not together:
            worker.claimer.idle_wait()  # sleeping until the delayed one, hears of the due one
        assert worker.claimer.claim_round() == 1  # the due one
        worker.claimer.idle_wait()
    finally:
        worker.claimer.waker.close()
    assert 0 < timeouts[-1] <= 10
