"""Rows of ``QueueFields`` models in workflows (``store/row_steps.py``): as parents
(``enqueue(..., after=[row])``) and as steps (``row.schedule(after=[...])``).

Real workers (in-process, ``--burst``) or ``run_pending`` on the test's
database: PostgreSQL, SQLite or MariaDB, whichever ``DATABASE_URL`` names.
"""

from datetime import timedelta

import hypothesis
import pytest
from django.db import connection, transaction  # noqa: F401 (read by the skipif condition)
from django.utils import timezone
from hypothesis import strategies as st

from django_delayq import enqueue, operations
from django_delayq.entity import RowHeld, row_of
from django_delayq.models import Dependency, Message
from django_delayq.store import dependencies, row_steps
from django_delayq.testing import run_pending
from django_delayq.worker.execute import Result
from tests.conftest import wait_for
from tests.integration.test_workflows import _Producer, expected_statuses
from tests.testapp.models import Execution, Shipment

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ["steps", "shipments"]


def fresh(obj):
    obj.refresh_from_db()
    return obj


def message(result):
    return Message.objects.get(pk=result.message.pk)


def stand_in(shipment):
    return Message.objects.get(queue="delayq.row:testapp.shipment", key=str(shipment.pk))


def started(obj):
    """When the handler of a message (or a Shipment row) first started."""
    queue = "shipments" if isinstance(obj, Shipment) else obj.queue
    return Execution.objects.filter(message_id=obj.pk, queue=queue).order_by("started")[0].started


def finished(obj):
    """When a message or a row finished (a row: its stand-in's end)."""
    return stand_in(obj).finished_at if isinstance(obj, Shipment) else obj.finished_at


def test_a_message_after_a_row_runs_once_the_row_succeeded(run_worker):
    shipment = Shipment.objects.create(reference="parcel")
    with transaction.atomic():
        shipment.schedule()
        child = enqueue("steps", {}, after=[shipment])
    assert message(child).waiting_for_parents
    assert stand_in(shipment).status == "pending"
    stats = run_worker(QUEUES)
    assert stats[Result.SUCCEEDED] == 2
    assert fresh(shipment).status == "succeeded" and stand_in(shipment).status == "succeeded"
    assert message(child).status == "succeeded"
    assert started(message(child)) >= fresh(shipment).shipped_at
    parent = message(child).parents()[0]
    assert row_of(parent) == shipment and row_of(Message.objects.get(pk=child.message.pk)) is None
    assert message(child).parent_results == [None]


def test_a_row_after_a_message_waits_then_runs_at_its_delay(run_worker):
    parent = enqueue("steps", {}, key="charge")
    shipment = Shipment.objects.create(reference="parcel")
    shipment.schedule(after=[parent])
    assert fresh(shipment).status == "pending" and fresh(shipment).next_attempt_time is None
    assert stand_in(shipment).waiting_for_parents
    run_worker(QUEUES)
    assert fresh(shipment).status == "succeeded"
    assert started(shipment) >= message(parent).finished_at
    # Its stand-in ends with it, not when it was released.
    assert stand_in(shipment).status == "succeeded"
    # run_at/delay count from the release.
    later = Shipment.objects.create(reference="later")
    later.schedule(after=[parent], delay=3600)
    assert fresh(later).next_attempt_time is not None
    assert fresh(later).next_attempt_time > message(parent).finished_at + timedelta(minutes=59)


def test_a_mixed_chain_of_rows_and_messages_runs_in_order(run_worker):
    first, second = Shipment.objects.create(reference="a"), Shipment.objects.create(reference="b")
    with transaction.atomic():
        a = enqueue("steps", {}, key="a")
        first.schedule(after=[a])
        b = enqueue("steps", {}, key="b", after=[first])
        second.schedule(after=[b, first])
        c = enqueue("steps", {}, key="c", after=[second])
    run_worker(QUEUES)
    chain = [message(a), fresh(first), message(b), fresh(second), message(c)]
    assert [step.status for step in chain] == ["succeeded"] * 5
    for parent, child in zip(chain, chain[1:], strict=False):
        assert finished(parent) <= started(child)
    assert not dependencies.settle(using="default")


def test_a_failed_row_cancels_what_waits_for_it_and_its_retry_reopens_them(run_worker):
    shipment = Shipment.objects.create(reference="broken", fail=1, max_attempts=1)
    shipment.schedule()
    child = enqueue("steps", {}, after=[shipment])
    grandchild = Shipment.objects.create(reference="next")
    grandchild.schedule(after=[child])
    run_worker(QUEUES)
    assert fresh(shipment).status == "failed"
    assert message(child).status == "cancelled"
    assert f"delayq.row:testapp.shipment/{shipment.pk}" in message(child).last_error
    # The row after the cancelled message is cancelled too, with its error.
    assert fresh(grandchild).status == "cancelled"
    assert "ended cancelled" in fresh(grandchild).last_error
    assert not Execution.objects.filter(message_id=grandchild.pk, queue="shipments").exists()

    Shipment.objects.filter(pk=shipment.pk).update(fail=0)
    operations.retry_failed(Shipment.objects.filter(pk=shipment.pk))
    assert message(child).status == "pending" and message(child).waiting_for_parents
    assert fresh(grandchild).status == "pending" and fresh(grandchild).next_attempt_time is None
    run_worker(QUEUES)
    assert [fresh(shipment).status, message(child).status, fresh(grandchild).status] == [
        "succeeded"
    ] * 3


def test_a_row_that_finished_already_lets_its_child_go_at_once():
    done = Shipment.objects.create(reference="done")
    Shipment.objects.filter(pk=done.pk).update(status="succeeded")
    child = enqueue("steps", {}, after=[done])
    assert message(child).next_attempt_time is not None
    assert stand_in(done).status == "succeeded"


def test_a_row_queued_again_after_it_finished_makes_new_children_wait():
    shipment = Shipment.objects.create(reference="again")
    shipment.schedule()
    run_pending(QUEUES)
    first = enqueue("steps", {}, after=[shipment])
    assert message(first).next_attempt_time is not None
    fresh(shipment).schedule()
    assert stand_in(shipment).status == "pending"
    second = enqueue("steps", {}, after=[shipment])
    assert message(second).waiting_for_parents


def test_the_sweep_ends_a_stand_in_whose_row_ended_without_its_worker():
    shipment = Shipment.objects.create(reference="crash")
    shipment.schedule()
    child = enqueue("steps", {}, after=[shipment])
    # The row's outcome committed, and its worker died before the follow-up.
    Shipment.objects.filter(pk=shipment.pk).update(status="succeeded", next_attempt_time=None)
    assert message(child).waiting_for_parents
    settled = dependencies.settle(using="default")
    assert settled.released == [child.message.pk]
    assert stand_in(shipment).status == "succeeded"


def test_the_sweep_schedules_a_released_row_its_worker_did_not():
    parent = enqueue("steps", {})
    shipment = Shipment.objects.create(reference="released")
    shipment.schedule(after=[parent])
    # The release committed (the stand-in due), and its worker died before the row
    # was scheduled.
    Message.objects.filter(pk=parent.message.pk).update(status="succeeded")
    Dependency.objects.filter(parent_id=parent.message.pk).update(parent_ended="succeeded")
    Message.objects.filter(pk=stand_in(shipment).pk).update(
        parents_waiting=0, next_attempt_time=stand_in(shipment).scheduled_time
    )
    assert fresh(shipment).next_attempt_time is None
    dependencies.settle(using="default")
    assert fresh(shipment).next_attempt_time is not None
    assert stand_in(shipment).next_attempt_time is None


def test_the_sweep_cancels_a_waiting_row_whose_stand_in_was_cancelled_without_it():
    parent = enqueue("steps", {})
    shipment = Shipment.objects.create(reference="cancelled")
    shipment.schedule(after=[parent])
    # The parent failed and its release cancelled the stand-in, and the worker died
    # before the row was cancelled with it.
    Message.objects.filter(pk=parent.message.pk).update(status="failed")
    Dependency.objects.filter(parent_id=parent.message.pk).update(parent_ended="failed")
    Message.objects.filter(pk=stand_in(shipment).pk).update(
        status="cancelled", last_error="Cancelled: parent steps/x ended failed"
    )
    row_steps._cancelled_read.clear()
    dependencies.settle(using="default")
    assert fresh(shipment).status == "cancelled"
    assert fresh(shipment).last_error == "Cancelled: parent steps/x ended failed"


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="one writer at a time: no row locks")
def test_a_producer_holding_a_rows_stand_in_never_stalls_the_worker(serving_worker, settings):
    """A producer naming a row ``after=`` holds its stand-in until it commits. The
    executor that ran the row ends its stand-in after the row's outcome: it waited
    for that lock, its slot taken (with one, nothing else ran). It must pass it, and
    the sweep end it once the producer lets go."""
    settings.DELAYQ = {**settings.DELAYQ, "HEARTBEAT_INTERVAL": 0.5}
    shipment = Shipment.objects.create(reference="held")
    shipment.schedule()
    child = enqueue("steps", {}, after=[shipment])
    with _Producer(stand_in(shipment).pk):
        serving_worker(QUEUES, concurrency=1)
        wait_for(lambda: fresh(shipment).status == "succeeded", message="the row's success")
        later = Shipment.objects.create(reference="later")
        later.schedule()
        wait_for(
            lambda: fresh(later).status == "succeeded",
            timeout=20,
            message="a later row, while the producer holds the first one's stand-in",
        )
        assert message(child).next_attempt_time is None  # still waiting
    wait_for(lambda: message(child).status == "succeeded", timeout=30, message="the child")
    assert started(message(child)) >= fresh(shipment).shipped_at


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="one writer at a time: no row locks")
@pytest.mark.parametrize(
    ("payload", "ended", "then"),
    [({}, "succeeded", "succeeded"), ({"fail": 2}, "failed", "cancelled")],
)
def test_an_application_holding_a_waiting_rows_lock_never_stalls_the_worker(
    serving_worker, settings, payload, ended, then
):
    """A row waits for a message; the application's transaction holds the row's lock
    (``select_for_update`` as it edits it) when the message ends. The worker
    scheduled (or cancelled) the row with an update that waited for that lock, in
    the thread that acknowledges (or with the executor's slot taken): nothing else
    of the worker's ended meanwhile. It must pass the row, and the sweep follow up
    once the lock is let go."""
    settings.DELAYQ = {**settings.DELAYQ, "HEARTBEAT_INTERVAL": 0.5}
    parent = enqueue("steps", payload)
    shipment = Shipment.objects.create(reference="edited")
    shipment.schedule(after=[parent])
    with _Producer(shipment.pk, model=Shipment):
        serving_worker(QUEUES, concurrency=1)
        wait_for(lambda: message(parent).status == ended, message="the parent's end")
        later = enqueue("steps", {})
        wait_for(
            lambda: message(later).status == "succeeded",
            timeout=20,
            message="a later message, while the application holds the waiting row",
        )
        assert fresh(shipment).status == "pending"  # still waiting
        assert fresh(shipment).next_attempt_time is None
    wait_for(lambda: fresh(shipment).status == then, timeout=30, message="the row")
    if then == "succeeded":
        assert started(shipment) >= message(parent).finished_at


def test_deleting_a_row_lets_what_waits_for_it_go():
    shipment = Shipment.objects.create(reference="gone")
    child = enqueue("steps", {}, after=[shipment])
    other = Shipment.objects.create(reference="deleted by an operator")
    second = enqueue("steps", {}, after=[other])
    Shipment.objects.filter(pk=shipment.pk).delete()
    dependencies.settle(using="default")
    assert message(child).next_attempt_time is not None
    assert not Message.objects.filter(queue__startswith="delayq.row:", key=str(shipment.pk))
    operations.delete(Shipment.objects.filter(pk=other.pk))
    assert message(second).next_attempt_time is not None


def test_an_operator_cancelling_a_row_cancels_its_children():
    shipment = Shipment.objects.create(reference="cancel me")
    shipment.schedule(delay=3600)
    child = enqueue("steps", {}, after=[shipment])
    operations.cancel(Shipment.objects.filter(pk=shipment.pk))
    assert message(child).status == "cancelled"


def test_bad_row_steps_are_refused_before_anything_is_written():
    parent = enqueue("steps", {})
    unsaved = Shipment(reference="never saved")
    with pytest.raises(ValueError, match="never saved"):
        enqueue("steps", {}, after=[unsaved])
    shipment = Shipment.objects.create(reference="once")
    shipment.schedule(after=[parent])
    with pytest.raises(ValueError, match="step already"):
        shipment.schedule(after=[parent])
    with pytest.raises(ValueError, match="on_parent_failure"):
        Shipment.objects.create(reference="x").schedule(after=[parent], on_parent_failure="no")
    with pytest.raises(ValueError, match="save=False"):
        shipment.schedule(after=[parent], save=False)
    # No cycle: not after itself, nor after what waits for it (its stand-in may be a
    # parent already, unlike a new message's).
    alone = Shipment.objects.create(reference="alone")
    with pytest.raises(ValueError, match="cycle"):
        alone.schedule(after=[alone])
    child = enqueue("steps", {}, after=[alone])
    grandchild = Shipment.objects.create(reference="grandchild")
    grandchild.schedule(after=[child])
    with pytest.raises(ValueError, match="cycle"):
        alone.schedule(after=[grandchild])
    assert fresh(alone).next_attempt_time is None and stand_in(alone).on_parent_failure == ""
    with pytest.raises(ValueError, match="delayq.row:"):
        enqueue("delayq.row:testapp.shipment", {})
    running = Shipment.objects.create(reference="running")
    Shipment.objects.filter(pk=running.pk).update(
        status="running", next_attempt_time=timezone.now() + timedelta(minutes=5)
    )
    with pytest.raises(RowHeld):
        fresh(running).schedule(after=[parent])
    # The parent, shipment's stand-in, alone's, its child and grandchild's stand-in.
    assert Message.objects.count() == 5


def test_a_queryset_of_rows_becomes_steps_in_one_call(run_worker):
    parent = enqueue("steps", {})
    rows = [Shipment.objects.create(reference=f"r{i}") for i in range(5)]
    made = Shipment.objects.filter(pk__in=[r.pk for r in rows]).schedule(after=[parent])
    assert made == 5
    assert all(fresh(r).next_attempt_time is None for r in rows)
    run_worker(QUEUES, concurrency=3)
    assert all(fresh(r).status == "succeeded" for r in rows)
    assert all(started(r) >= message(parent).finished_at for r in rows)


# -- the class: any graph of rows and messages ------------------------------------------


@st.composite
def mixed_graphs(draw):
    """A random workflow of messages and rows: each step's parents among the earlier
    ones, its policy, whether it is a row, and whether its handler fails."""
    size = draw(st.integers(2, 7))
    steps = []
    for i in range(size):
        parents = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        steps.append(
            {
                "parents": parents,
                "policy": draw(st.sampled_from(["cancel", "wait", "run"])),
                "row": draw(st.booleans()),
                "fails": draw(st.booleans()),
            }
        )
    return steps


@hypothesis.settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(steps=mixed_graphs())
def test_any_graph_of_rows_and_messages_ends_as_its_rules_say(steps):
    Dependency.objects.all().delete()
    Message.objects.all().delete()
    Shipment.objects.all().delete()
    Execution.objects.all().delete()
    made: list = []
    with transaction.atomic():
        for i, step in enumerate(steps):
            after = [made[p] for p in step["parents"]] or None
            if step["row"]:
                row = Shipment.objects.create(
                    reference=f"s{i}", fail=1 if step["fails"] else 0, max_attempts=1
                )
                if after:
                    row.schedule(after=after, on_parent_failure=step["policy"])
                else:
                    row.schedule()
                made.append(row)
            else:
                payload = {"fail": 5} if step["fails"] else {"echo": i}
                made.append(
                    enqueue(
                        "steps", payload, key=f"s{i}", after=after, on_parent_failure=step["policy"]
                    ).message
                )
    run_pending(QUEUES)
    ended = [fresh(step) for step in made]
    assert [s.status for s in ended] == expected_statuses(steps)
    for step, obj in zip(steps, ended, strict=True):
        queue = "shipments" if step["row"] else "steps"
        ran = Execution.objects.filter(message_id=obj.pk, queue=queue)
        if obj.status in ("pending", "cancelled"):
            assert not ran.exists(), "a step ran that its parents held back"
            assert obj.next_attempt_time is None
            continue
        first = ran.order_by("started")[0].started
        for p in step["parents"]:
            assert finished(ended[p]) <= first, "a step started before its parent finished"
    # A row in the graph (a parent or a step: it has a stand-in) shows its end on
    # its stand-in; nothing is left for the sweep.
    named = {p for step in steps for p in step["parents"]}
    for i, (step, obj) in enumerate(zip(steps, ended, strict=True)):
        if step["row"] and (step["parents"] or i in named) and obj.status != "pending":
            assert stand_in(obj).status == obj.status
    assert not dependencies.settle(using="default")


def test_the_worker_hands_each_row_on_itself_without_the_sweep(run_worker, monkeypatch):
    """The worker that ends a row ends its stand-in and releases what waits for it, and
    the release of a row's stand-in schedules the row: the sweep is a safety net only."""
    monkeypatch.setattr(row_steps, "sweep", lambda alias: [])
    first, second = Shipment.objects.create(reference="a"), Shipment.objects.create(reference="b")
    with transaction.atomic():
        a = enqueue("steps", {}, key="a")
        first.schedule(after=[a])
        b = enqueue("steps", {}, key="b", after=[first])
        second.schedule(after=[b])
    run_worker(QUEUES)
    assert [fresh(first).status, message(b).status, fresh(second).status] == ["succeeded"] * 3
    assert stand_in(second).status == "succeeded"
