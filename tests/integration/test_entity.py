"""Queue columns on a model of the project (``QueueFields``): the same claim,
lease, retry and shutdown rules as messages, run in-process on the real database."""

from datetime import timedelta

import hypothesis
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction  # noqa: F401 (read by skipif)
from django.utils import timezone
from hypothesis import strategies as st

from django_delayq import enqueue, handler, operations
from django_delayq.models import Message
from django_delayq.registry import registry
from django_delayq.store import claim, leases, settle
from django_delayq.worker.execute import Result
from tests.testapp.models import Execution, Shipment

pytestmark = pytest.mark.django_db(transaction=True)


def shipments(*references, **fields):
    """Rows queued now (``schedule()``), in order."""
    rows = []
    for reference in references:
        row = Shipment(reference=reference, **fields)
        row.schedule()
        rows.append(row)
    return rows


def test_rows_wait_until_scheduled():
    idle = Shipment.objects.create(reference="idle")
    assert (idle.status, idle.next_attempt_time) == ("pending", None)
    assert (
        claim.claim([], 10, worker="w", lease=timedelta(seconds=30), model=Shipment).messages == []
    )


def test_claim_marks_rows_running_and_ack_settles_them(fake_clock):
    first, second = shipments("a", "b")
    result = claim.claim([], 10, worker="w-1", lease=timedelta(seconds=30), model=Shipment)
    assert [r.pk for r in result.messages] == [first.pk, second.pk]
    row = Shipment.objects.get(pk=first.pk)
    assert (row.status, row.attempt_count, row.locked_by) == ("running", 1, "w-1")
    assert row.lock_token == result.token
    assert row.last_attempt_time == fake_clock()
    assert row.next_attempt_time == fake_clock() + timedelta(seconds=30)
    # Held rows are not due: a second claimer gets nothing.
    assert (
        claim.claim([], 10, worker="w-2", lease=timedelta(seconds=30), model=Shipment).messages
        == []
    )
    assert settle.ack([first.pk], result.token, model=Shipment) == 1
    assert settle.ack([first.pk], result.token, model=Shipment) == 0  # no longer running
    row.refresh_from_db()
    assert (row.status, row.next_attempt_time, row.lock_token) == ("succeeded", None, None)


def test_claim_takes_the_highest_priority_first():
    low, high = shipments("low", "high")
    Shipment.objects.filter(pk=high.pk).update(priority=5)
    result = claim.claim([], 1, worker="w", lease=timedelta(seconds=30), model=Shipment)
    assert [r.reference for r in result.messages] == ["high"]


def test_expired_lease_is_claimed_again_and_fences_off_the_old_holder(fake_clock):
    (row,) = shipments("a")
    stale = claim.claim([], 1, worker="w-1", lease=timedelta(seconds=30), model=Shipment)
    fake_clock.advance(29)
    assert (
        claim.claim([], 1, worker="w-2", lease=timedelta(seconds=30), model=Shipment).messages == []
    )
    fake_clock.advance(2)
    fresh = claim.claim([], 1, worker="w-2", lease=timedelta(seconds=30), model=Shipment)
    assert [r.pk for r in fresh.messages] == [row.pk]
    assert fresh.messages[0].attempt_count == 2
    # The first holder's outcome, extension and release all match nothing now.
    assert settle.ack([row.pk], stale.token, model=Shipment) == 0
    assert leases.extend([row.pk], stale.token, timedelta(seconds=30), model=Shipment) == set()
    assert leases.release([row.pk], stale.token, started=True, model=Shipment) == 0
    assert settle.fail(row.pk, stale.token, error="late", retry_at=None, model=Shipment) == 0
    assert Shipment.objects.get(pk=row.pk).locked_by == "w-2"


def test_release_of_unstarted_rows_gives_the_attempt_back():
    (row,) = shipments("a")
    held = claim.claim([], 1, worker="w", lease=timedelta(seconds=30), model=Shipment)
    assert leases.release([row.pk], held.token, started=False, model=Shipment) == 1
    row.refresh_from_db()
    assert (row.status, row.attempt_count, row.lock_token) == ("pending", 0, None)


def test_worker_runs_due_rows_and_retries_failures(run_worker, fake_clock):
    ok, flaky = shipments("ok", "flaky")
    Shipment.objects.filter(pk=flaky.pk).update(fail=1)
    stats = run_worker(["shipments"])
    assert (stats[Result.SUCCEEDED], stats[Result.RETRYING]) == (1, 1)
    ok.refresh_from_db()
    assert (ok.status, ok.attempt_count, ok.next_attempt_time) == ("succeeded", 1, None)
    assert ok.shipped_at is not None and ok.lock_token is None
    flaky.refresh_from_db()
    assert (flaky.status, flaky.attempt_count) == ("pending", 1)
    assert "Boom: attempt 1 of shipment" in flaky.last_error
    assert "Traceback" in flaky.last_traceback
    assert flaky.next_attempt_time == fake_clock() + timedelta(seconds=60)  # FixedDelay
    run_worker(["shipments"])  # not due yet
    assert Shipment.objects.get(pk=flaky.pk).attempt_count == 1
    fake_clock.advance(60)
    run_worker(["shipments"])
    flaky.refresh_from_db()
    assert (flaky.status, flaky.attempt_count) == ("succeeded", 2)


def test_max_attempts_of_the_handler_moves_rows_to_failed(run_worker, fake_clock):
    (row,) = shipments("doomed", fail=99)
    for _ in range(4):
        run_worker(["shipments"])
        fake_clock.advance(3600)
    row.refresh_from_db()
    assert (row.status, row.attempt_count, row.next_attempt_time) == ("failed", 3, None)
    assert Execution.objects.filter(message_id=row.pk).count() == 3


@pytest.mark.parametrize("how", ["row", "queryset"])
def test_scheduling_a_finished_row_runs_its_handler_again(run_worker, fake_clock, how):
    (row,) = shipments("again", fail=99)
    for _ in range(3):
        run_worker(["shipments"])
        fake_clock.advance(3600)
    row.refresh_from_db()
    assert (row.status, row.attempt_count) == ("failed", 3)
    Shipment.objects.filter(pk=row.pk).update(fail=0)
    if how == "row":
        row.schedule()
    else:
        assert Shipment.objects.filter(pk=row.pk).schedule() == 1
    stats = run_worker(["shipments"])
    row.refresh_from_db()
    # A new round of attempts: the handler ran (attempt 1 of 3), not a
    # "gave up" for attempts that ended without an outcome.
    assert (stats[Result.SUCCEEDED], row.status, row.attempt_count) == (1, "succeeded", 1)
    assert Execution.objects.filter(message_id=row.pk, attempt=1).count() == 2


def test_one_worker_consumes_messages_and_rows_together(run_worker):
    rows = shipments("a", "b", "c")
    message = enqueue("default", {}).message
    stats = run_worker(["default", "shipments"], concurrency=2, batch_size=2)
    assert stats[Result.SUCCEEDED] == 4
    assert Message.objects.get(pk=message.pk).status == "succeeded"
    assert set(Shipment.objects.values_list("status", flat=True)) == {"succeeded"}
    assert sorted(
        Execution.objects.filter(queue="shipments").values_list("message_id", flat=True)
    ) == sorted(r.pk for r in rows)


def test_signals_name_the_model_as_sender(run_worker):
    from django_delayq import signals

    seen = []

    def receiver(sender, message, **kwargs):
        seen.append((sender, message.pk))

    signals.message_succeeded.connect(receiver)
    try:
        (row,) = shipments("a")
        run_worker(["shipments"])
    finally:
        signals.message_succeeded.disconnect(receiver)
    assert seen == [(Shipment, row.pk)]


def test_schedule_a_queryset_leaves_held_rows_alone(fake_clock):
    done, held = shipments("done", "held")
    token = claim.claim([], 2, worker="w", lease=timedelta(seconds=30), model=Shipment).token
    settle.ack([done.pk], token, model=Shipment)
    later = fake_clock() + timedelta(hours=1)
    assert Shipment.objects.all().schedule(run_at=later) == 1
    assert Shipment.objects.get(pk=done.pk).status == "pending"
    assert Shipment.objects.get(pk=done.pk).next_attempt_time == later
    assert Shipment.objects.get(pk=held.pk).status == "running"


def test_schedule_checks_its_arguments():
    row = Shipment(reference="x")
    with pytest.raises(ValueError, match="either run_at or delay"):
        row.schedule(run_at=timezone.now(), delay=5)
    with pytest.raises(ValueError, match="naive"):
        row.schedule(run_at=timezone.now().replace(tzinfo=None))
    with pytest.raises(ValueError, match="negative"):
        row.schedule(delay=-1)
    assert row.pk is None


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_schedule_wakes_listening_workers_on_commit():
    import json

    from django_delayq.store.wakeup import NOTIFY_CHANNEL
    from tests.pooler import direct_connect

    with direct_connect(autocommit=True) as listener:
        listener.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
        with transaction.atomic():
            Shipment(reference="a").schedule()
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # not before commit
        notes = list(listener.notifies(timeout=10, stop_after=1))
    assert json.loads(notes[0].payload)["queue"] == "shipments"


def test_operations_work_on_the_model(fake_clock):
    a, b = shipments("a", "b")
    Shipment.objects.filter(pk=b.pk).update(
        status="failed", next_attempt_time=None, attempt_count=3
    )
    result = operations.retry_failed(Shipment.objects.all(), extra_attempts=2)
    assert (result.changed, result.skipped) == (1, {operations.PENDING: 1})
    b.refresh_from_db()
    assert (b.status, b.max_attempts, b.next_attempt_time) == ("pending", 5, fake_clock())
    assert operations.reprioritise(Shipment.objects.filter(pk=a.pk), 7).changed == 1
    assert Shipment.objects.get(pk=a.pk).priority == 7
    claim.claim([], 1, worker="w", lease=timedelta(seconds=30), model=Shipment)
    result = operations.cancel(Shipment.objects.all())
    assert (result.changed, result.skipped) == (1, {operations.RUNNING: 1})


def test_registration_rejects_what_cannot_work():
    with pytest.raises(TypeError, match="inherits QueueFields"):
        handler("plain", model=Execution)
    with pytest.raises(ValueError, match="no kind"):
        handler("other-shipments", model=Shipment, kind="x")
    with pytest.raises(ImproperlyConfigured, match="holds the rows of testapp.Shipment"):
        handler("shipments")(lambda message: None)
    with pytest.raises(ImproperlyConfigured, match="two handlers for testapp.Shipment"):
        handler("shipments-2", model=Shipment)(lambda row: None)
    assert registry.for_model(Shipment).queue == "shipments"


def test_lookup_of_an_unregistered_model_is_a_clear_error():
    from django_delayq.exceptions import HandlerNotFound

    registry_spec = registry.for_model(Shipment)
    registry.unregister("shipments")
    try:
        with pytest.raises(HandlerNotFound, match="testapp.Shipment"):
            registry.lookup_for(Shipment(reference="x"))
    finally:
        registry.register(registry_spec)


def test_schedule_of_a_held_row_is_refused_and_saves_only_the_queue_columns(fake_clock):
    from django_delayq.entity import RowHeld

    (row,) = shipments("a")
    claim.claim([], 1, worker="w", lease=timedelta(seconds=30), model=Shipment)
    with pytest.raises(RowHeld, match="running under a worker's lease"):
        row.schedule()
    fake_clock.advance(31)  # the lease expired: the row may be queued again
    row.reference = "not saved by schedule()"
    row.schedule(delay=10)
    stored = Shipment.objects.get(pk=row.pk)
    assert (stored.reference, stored.status, stored.lock_token) == ("a", "pending", None)
    assert stored.next_attempt_time == fake_clock() + timedelta(seconds=10)


def test_run_pending_runs_due_rows_in_process():
    from django_delayq.testing import run_pending

    ok, flaky = shipments("ok", "flaky")
    Shipment.objects.filter(pk=flaky.pk).update(fail=1)
    message = enqueue("default", {}).message
    attempts = run_pending(["default", "shipments"])
    assert [(type(a.message), a.message.pk, a.result) for a in attempts] == [
        (Message, message.pk, "succeeded"),
        (Shipment, ok.pk, "succeeded"),
        (Shipment, flaky.pk, "retrying"),
    ]
    assert type(attempts[2].exception).__name__ == "Boom"
    assert attempts[2].message.status == "pending"


def test_run_pending_of_a_row_queue_leaves_the_messages_of_other_queues():
    from django_delayq.testing import run_pending

    [row] = shipments("ok")
    other = enqueue("default", {}).message
    attempts = run_pending("shipments")
    assert [(type(a.message), a.message.pk) for a in attempts] == [(Shipment, row.pk)]
    assert Message.objects.get(pk=other.pk).status == "pending"


def test_a_claim_of_no_queue_claims_nothing():
    enqueue("default", {})
    held = claim.claim([], 10, worker="w", lease=timedelta(seconds=30))
    assert held.messages == []
    assert Message.objects.get().status == "pending"


# -- a plain save() leaves the queue columns to the store -----------------------------

LEASE = timedelta(seconds=30)
QUEUE_COLUMNS = [
    "status",
    "next_attempt_time",
    "attempt_count",
    "max_attempts",
    "last_attempt_time",
    "last_error",
    "last_traceback",
    "lock_token",
    "locked_by",
]


def queue_state(pk):
    return dict(Shipment.objects.filter(pk=pk).values(*QUEUE_COLUMNS).get())


def _claim():
    return claim.claim([], 1, worker="w", lease=LEASE, model=Shipment)


# What a worker (or an operator) does to a row between its load and its save.
MEANWHILE = {
    "claim": lambda pk: _claim(),
    "ack": lambda pk: settle.ack([pk], _claim().token, model=Shipment),
    "fail": lambda pk: settle.fail(pk, _claim().token, error="boom", retry_at=None, model=Shipment),
    "retry": lambda pk: settle.fail(
        pk, _claim().token, error="boom", retry_at=None, retry_in=LEASE, model=Shipment
    ),
    "release": lambda pk: leases.release([pk], _claim().token, started=False, model=Shipment),
    "cancel": lambda pk: operations.cancel(Shipment.objects.filter(pk=pk)),
}


@pytest.mark.parametrize("meanwhile", MEANWHILE)
def test_a_plain_save_keeps_what_the_store_wrote_since_the_row_was_loaded(meanwhile, fake_clock):
    """An application's ``save()`` of a row it loaded before a worker claimed it (or
    recorded its outcome) wrote the old queue state back: the lock token cleared,
    so the worker's outcome was lost, or a finished row running again."""
    (row,) = shipments("a")
    loaded = Shipment.objects.get(pk=row.pk)
    MEANWHILE[meanwhile](row.pk)
    stored = queue_state(row.pk)
    loaded.reference = "edited"

    loaded.save()

    assert queue_state(row.pk) == stored
    assert Shipment.objects.get(pk=row.pk).reference == "edited"


def test_a_save_writes_the_queue_columns_it_names_and_those_schedule_set_for_it(fake_clock):
    (row,) = shipments("a")
    loaded = Shipment.objects.get(pk=row.pk)
    loaded.attempt_count = 7
    loaded.save(update_fields=["attempt_count"])
    assert queue_state(row.pk)["attempt_count"] == 7

    later = fake_clock() + timedelta(minutes=5)
    loaded.schedule(run_at=later, save=False)  # the caller's own save writes it
    loaded.reference = "edited"
    loaded.save()
    stored = Shipment.objects.get(pk=row.pk)
    assert (stored.reference, stored.status, stored.next_attempt_time) == (
        "edited",
        "pending",
        later,
    )
    loaded.reference = "again"
    loaded.save()  # what schedule() set was written once, not at every save
    assert queue_state(row.pk)["next_attempt_time"] == later


def test_a_new_row_is_saved_whole_and_a_deleted_one_is_not_brought_back():
    row = Shipment(reference="new", status="failed", attempt_count=2)
    row.save()
    assert (queue_state(row.pk)["status"], queue_state(row.pk)["attempt_count"]) == ("failed", 2)
    Shipment.objects.filter(pk=row.pk).delete()
    from django.db import DatabaseError

    with pytest.raises(DatabaseError):
        row.save()
    assert not Shipment.objects.filter(pk=row.pk).exists()


STEPS = {
    **MEANWHILE,
    "extend": lambda pk: leases.extend([pk], _claim().token, LEASE, model=Shipment),
    "schedule": lambda pk: Shipment.objects.filter(pk=pk).schedule(delay=5),
    "retry_failed": lambda pk: operations.retry_failed(Shipment.objects.filter(pk=pk)),
    "later": lambda pk: None,  # the passing of time (see advance)
}


@hypothesis.settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
    ],
)
@hypothesis.given(
    steps=st.lists(st.sampled_from(sorted(STEPS)), max_size=4),
    advance=st.sampled_from([0, 10, 40]),
    reference=st.text(alphabet="abcxyz", min_size=1, max_size=8),
    priority=st.integers(-5, 5),
)
def test_no_change_of_the_store_is_undone_by_a_save_of_a_row_loaded_before_it(
    fake_clock, steps, advance, reference, priority
):
    """Whatever the store did between a row's load and its plain ``save()``, the save
    writes the row's own columns as edited and leaves the queue columns as the
    store left them."""
    Shipment.objects.all().delete()
    (row,) = shipments("a")
    loaded = Shipment.objects.get(pk=row.pk)
    for step in steps:
        STEPS[step](row.pk)
        fake_clock.advance(advance)
    stored = queue_state(row.pk)
    loaded.reference, loaded.priority = reference, priority

    loaded.save()

    assert queue_state(row.pk) == stored
    saved = Shipment.objects.get(pk=row.pk)
    assert (saved.reference, saved.priority) == (reference, priority)


def test_a_dead_workers_rows_are_handed_back_with_its_messages(fake_clock):
    # Before, only the message table was looked at: a QueueFields row a dead
    # worker held came back once its lease lapsed, long after the death was known.
    from django_delayq import liveness

    liveness.register("dead-one", queues=["default"], concurrency=1)
    (row,) = shipments("held")
    held = claim.claim([], 1, worker="dead-one", lease=timedelta(hours=1), model=Shipment)
    assert [r.pk for r in held.messages] == [row.pk]
    fake_clock.advance(liveness.dead_after().total_seconds() + 1)

    assert liveness.release_dead("me", models=[Shipment]) == {"dead-one": 1}

    back = Shipment.objects.get(pk=row.pk)
    assert (back.status, back.lock_token, back.attempt_count) == ("pending", None, 1)
    assert back.next_attempt_time <= fake_clock()
    # The dead worker, should it wake up, can no longer settle what it held.
    assert settle.ack([row.pk], held.token, model=Shipment) == 0


def test_a_worker_hands_back_and_runs_the_rows_a_dead_worker_held(run_worker, fake_clock):
    from django_delayq import liveness

    liveness.register("dead-one", queues=["shipments"], concurrency=1)
    (row,) = shipments("held")
    claim.claim([], 1, worker="dead-one", lease=timedelta(hours=1), model=Shipment)
    fake_clock.advance(liveness.dead_after().total_seconds() + 1)

    stats = run_worker(["shipments"])

    assert stats[Result.SUCCEEDED] == 1
    row.refresh_from_db()
    assert (row.status, row.attempt_count) == ("succeeded", 2)
