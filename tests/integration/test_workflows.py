"""Workflows: ``after=``, ``on_parent_failure``, results, ``wait`` (``store/dependencies.py``).

Every test runs real workers (in-process, ``--burst``) on the test's
database: PostgreSQL, SQLite or MariaDB, whichever ``DATABASE_URL`` names.
"""

from datetime import timedelta

import hypothesis
import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from hypothesis import strategies as st

from django_delayq import MessageFailed, await_result, enqueue, enqueue_many, operations, wait
from django_delayq.models import Dependency, Message
from django_delayq.store import dependencies, groups, retention
from django_delayq.worker.execute import Result
from tests.conftest import claimed_parent_and_child, finishes_within, wait_for
from tests.testapp.models import Effect, Execution

pytestmark = pytest.mark.django_db(transaction=True)


def row(result):
    return Message.objects.get(pk=result.message.pk)


def started(result):
    return Execution.objects.get(message_id=result.message.pk).started


def test_a_chain_runs_step_after_step_and_passes_each_result_down(run_worker):
    with transaction.atomic():
        first = enqueue("steps", {}, key="first")
        second = enqueue("steps", {}, key="second", after=[first])
        third = enqueue("steps", {}, key="third", after=[second])
    assert row(second).status == "pending" and row(second).next_attempt_time is None
    assert row(second).waiting_for_parents and not row(first).waiting_for_parents
    stats = run_worker(["steps"])
    assert stats[Result.SUCCEEDED] == 3
    a, b, c = row(first), row(second), row(third)
    assert a.result == {"key": "first", "parents": []}
    assert b.result == {"key": "second", "parents": [a.result]}
    assert c.result == {"key": "third", "parents": [b.result]}
    assert a.finished_at <= started(second) and b.finished_at <= started(third)
    assert [p.pk for p in c.parents()] == [b.pk]


def test_parent_results_come_in_the_order_of_after(run_worker):
    parents = enqueue_many("steps", [{"returns": i} for i in range(5)])
    order = [parents[3], parents[0], parents[4], parents[1], parents[2]]
    child = enqueue("steps", {}, after=order)
    run_worker(["steps"])
    assert row(child).result["parents"] == [3, 0, 4, 1, 2]
    assert [p.pk for p in row(child).parents()] == [r.message.pk for r in order]


def test_a_fan_in_child_is_released_once_after_its_last_parent(run_worker):
    parents = enqueue_many("steps", [{"returns": i} for i in range(40)])
    child = enqueue("steps", {}, after=parents)
    assert Dependency.objects.filter(child_id=child.message.pk).count() == 40
    stats = run_worker(["steps"], concurrency=4)
    assert stats[Result.SUCCEEDED] == 41
    assert Execution.objects.filter(message_id=child.message.pk).count() == 1
    last = max(row(p).finished_at for p in parents)
    assert started(child) >= last
    assert row(child).result["parents"] == list(range(40))


def test_parents_named_by_message_and_by_queue_and_key(run_worker):
    enqueue("steps", {"returns": "a"}, key="a")
    b = enqueue("steps", {"returns": "b"}, key="b").message
    child = enqueue("steps", {}, after=[("steps", "a"), b])
    run_worker(["steps"])
    assert row(child).result["parents"] == ["a", "b"]


def test_a_child_of_finished_parents_is_due_at_once():
    parent = enqueue("steps", {}).message
    Message.objects.filter(pk=parent.pk).update(status="succeeded", next_attempt_time=None)
    child = enqueue("steps", {}, after=[parent])
    assert row(child).next_attempt_time is not None
    assert not row(child).waiting_for_parents


def test_a_child_of_a_failed_parent_is_cancelled_at_once_naming_it():
    parent = enqueue("steps", {}, key="p").message
    Message.objects.filter(pk=parent.pk).update(status="failed", next_attempt_time=None)
    child = enqueue("steps", {}, after=[parent])
    assert row(child).status == "cancelled"
    assert row(child).last_error == f"Cancelled: parent steps/p (#{parent.pk}) ended failed"


def test_a_failed_parent_cancels_its_descendants_and_its_retry_reopens_them(run_worker):
    parent = enqueue("steps", {"fail": 5}, key="parent")
    other = enqueue("steps", {}, key="other")
    child = enqueue("steps", {}, key="child", after=[parent, other])
    grandchild = enqueue("steps", {}, key="grandchild", after=[child])
    run_worker(["steps"])
    assert row(parent).status == "failed"
    assert row(child).status == "cancelled"
    assert "steps/parent" in row(child).last_error
    assert row(grandchild).status == "cancelled"
    assert "steps/child" in row(grandchild).last_error
    assert not Execution.objects.filter(message_id__in=[child.message.pk, grandchild.message.pk])

    Message.objects.filter(pk=parent.message.pk).update(payload={})
    result = operations.retry_failed(Message.objects.filter(pk=parent.message.pk))
    assert result.changed == 1
    assert row(child).status == "pending" and row(child).waiting_for_parents
    assert row(grandchild).status == "pending" and row(grandchild).waiting_for_parents
    run_worker(["steps"])
    assert {row(r).status for r in (parent, child, grandchild)} == {"succeeded"}
    assert row(grandchild).result["parents"][0]["key"] == "child"


def test_wait_keeps_children_waiting_until_the_parent_is_retried(run_worker):
    parent = enqueue("steps", {"fail": 5})
    child = enqueue("steps", {}, after=[parent], on_parent_failure="wait")
    run_worker(["steps"])
    assert row(parent).status == "failed"
    assert row(child).status == "pending" and row(child).next_attempt_time is None
    dependencies.settle(using="default")  # the sweep leaves it waiting too
    assert row(child).next_attempt_time is None
    Message.objects.filter(pk=parent.message.pk).update(payload={})
    operations.retry_failed(Message.objects.filter(pk=parent.message.pk))
    run_worker(["steps"])
    assert row(child).status == "succeeded"


def test_run_runs_the_child_once_every_parent_finished_whatever_its_outcome(run_worker):
    bad = enqueue("steps", {"fail": 5})
    good = enqueue("steps", {"returns": 1})
    child = enqueue("steps", {}, after=[bad, good], on_parent_failure="run")
    run_worker(["steps"])
    assert row(bad).status == "failed"
    assert row(child).status == "succeeded"
    assert row(child).result["parents"] == [None, 1]


def test_a_parent_discarded_counts_as_failed(run_worker):
    parent = enqueue("steps", {"discard": "not needed"})
    child = enqueue("steps", {}, after=[parent])
    run_worker(["steps"])
    assert row(child).status == "cancelled"


def test_an_operator_cancelling_a_parent_cancels_its_children():
    parent = enqueue("steps", {})
    child = enqueue("steps", {}, after=[parent])
    operations.cancel(Message.objects.filter(pk=parent.message.pk))
    assert row(child).status == "cancelled"


def test_deleting_a_parent_lets_its_children_go():
    parent = enqueue("steps", {})
    child = enqueue("steps", {}, after=[parent])
    operations.delete(Message.objects.filter(pk=parent.message.pk))
    assert row(child).next_attempt_time is not None
    assert not Dependency.objects.filter(child_id=child.message.pk).exists()


def test_the_sweep_releases_a_child_whose_parent_finished_without_its_worker(run_worker):
    parent = enqueue("steps", {})
    child = enqueue("steps", {}, after=[parent])
    # The parent's worker died between its outcome and releasing the child.
    Message.objects.filter(pk=parent.message.pk).update(status="succeeded", result=7)
    assert row(child).next_attempt_time is None
    settled = dependencies.settle(using="default")
    assert settled.released == [child.message.pk]
    assert dependencies.settle(using="default").released == []
    run_worker(["steps"])
    assert row(child).result["parents"] == [7]


def test_a_child_enqueued_while_its_parent_runs_is_released_by_the_sweep(run_worker):
    parent = enqueue("steps", {})
    Message.objects.filter(pk=parent.message.pk).update(status="running")
    child = enqueue("steps", {}, after=[parent])
    assert row(parent).has_children
    Message.objects.filter(pk=parent.message.pk).update(status="succeeded")
    dependencies.settle(using="default")
    assert row(child).next_attempt_time is not None


def test_a_grouped_child_waits_for_its_parents_and_for_its_group(run_worker):
    parent = enqueue("steps", {"sleep": 0})
    before = enqueue("steps", {}, group="g")
    child = enqueue("steps", {}, group="g", after=[parent])
    after_child = enqueue("steps", {}, group="g")
    # The group's sweep does not let a step go that still waits for its parent.
    Message.objects.filter(pk=before.message.pk).update(status="succeeded")
    groups.release_groups(using="default")
    assert row(child).next_attempt_time is None
    assert row(after_child).next_attempt_time is None
    run_worker(["steps"])
    assert {row(r).status for r in (parent, child, after_child)} == {"succeeded"}
    assert started(child) < started(after_child)


def test_waits_for_a_row_in_hand_says_what_the_counts_query_says():
    """``dependencies.waits`` (the admin's pages) is the twin of ``waiting_rows``
    (the counts, the filter): for every combination of the columns they read."""
    import itertools

    from django.utils import timezone

    combos = list(
        itertools.product(
            ["pending", "running", "succeeded", "failed", "cancelled"],
            [None, timezone.now()],
            ["", "cancel", "wait", "run"],
            [0, 1, 2],
            [0, 1],
            ["", "g"],
        )
    )
    rows = [
        Message(
            queue="twins",
            key=f"k{i}",
            payload={},
            status=status,
            next_attempt_time=due,
            scheduled_time=timezone.now(),
            on_parent_failure=policy,
            parents_waiting=waiting,
            parents_failed=failed,
            group=group,
        )
        for i, (status, due, policy, waiting, failed, group) in enumerate(combos)
    ]
    Message.objects.bulk_create(rows)
    counted = set(
        Message.objects.filter(dependencies.waiting_rows(), queue="twins").values_list(
            "key", flat=True
        )
    )
    in_hand = {m.key for m in Message.objects.filter(queue="twins") if dependencies.waits(m)}
    assert in_hand == counted
    assert 0 < len(counted) < len(combos)


def test_a_released_step_held_by_its_group_is_not_counted_as_waiting_for_parents(admin_client):
    """The counts of steps waiting for their parents (``delayq_status``, the
    dashboard, the metrics) took every held row that has parents: a step whose
    parents had let it go, held now by its ordered group, was counted with them,
    while its page and the workflow page said otherwise. One condition for all."""
    first = enqueue("steps", {}, group="g")  # runs first: holds the group
    parent = enqueue("steps", {})
    step = enqueue("steps", {}, group="g", after=[parent])
    still = enqueue("steps", {}, after=[enqueue("steps", {})])
    Message.objects.filter(pk=parent.message.pk).update(status="succeeded")
    dependencies.settle([parent.message.pk], using="default")
    held = row(step)
    assert held.next_attempt_time is None and held.parents_waiting == 0  # its group holds it
    assert not held.waiting_for_parents and not dependencies.waits(held)
    assert Message.objects.waiting_by_queue() == {"steps": 1}  # only `still`
    assert row(still).waiting_for_parents and dependencies.waits(row(still))
    listed = admin_client.get("/admin/django_delayq/message/", {"workflow": "waiting"})
    assert f"/{still.message.pk}/change/" in listed.content.decode()
    assert f"/{step.message.pk}/change/" not in listed.content.decode()
    assert row(first).status == "pending"


def test_prune_keeps_a_parent_while_a_child_needs_it():
    parent = enqueue("steps", {}).message
    child = enqueue("steps", {}, after=[parent])
    old = parent.created_at - timedelta(days=30)
    Message.objects.filter(pk=parent.pk).update(status="succeeded", finished_at=old)
    assert retention.prune(old + timedelta(days=1), batch_size=100, using="default") == 0
    Message.objects.filter(pk=child.message.pk).update(status="succeeded", finished_at=old)
    assert retention.prune(old + timedelta(days=1), batch_size=100, using="default") == 2


# -- results ----------------------------------------------------------------------


def test_a_result_json_cannot_hold_fails_the_attempt(run_worker):
    bad = enqueue("steps", {"returns_a_set": True})
    run_worker(["steps"])
    message = row(bad)
    assert message.status == "failed"
    assert "return value" in message.last_error
    assert message.result is None


def test_an_atomic_handlers_result_commits_with_its_writes(run_worker):
    results = enqueue_many("steps-atomic", [{"returns": [i]} for i in range(6)])
    run_worker(["steps-atomic"], concurrency=2)
    assert [row(r).result for r in results] == [[i] for i in range(6)]
    assert Effect.objects.count() == 6


def test_an_async_handlers_result_is_stored(run_worker):
    result = enqueue("steps-async", {})
    run_worker(["steps-async"])
    assert row(result).result == {"key": result.message.key, "async": True}


def test_a_handler_returning_none_stores_no_result(run_worker):
    result = enqueue("default", {})
    run_worker(["default"])
    assert row(result).status == "succeeded" and row(result).result is None


# -- wait -------------------------------------------------------------------------


def test_wait_returns_the_result_of_a_succeeded_message(serving_worker):
    serving_worker(["steps"])
    result = enqueue("steps", {"returns": {"ok": True}})
    assert wait(result, timeout=60) == {"ok": True}


def test_wait_raises_message_failed_with_the_last_error(serving_worker):
    serving_worker(["steps"])
    result = enqueue("steps", {"fail": 5})
    with pytest.raises(MessageFailed) as caught:
        wait(result, timeout=60)
    assert caught.value.status == "failed"
    assert "failed" in caught.value.error


def test_wait_times_out():
    result = enqueue("steps", {}, delay=3600)
    with pytest.raises(TimeoutError):
        wait(result, timeout=0.05)


def test_wait_inside_a_transaction_returns_what_it_ran_or_times_out():
    from django_delayq.testing import run_pending

    with transaction.atomic():
        result = enqueue("steps", {"returns": 3})
        # Nothing can run it before this transaction commits...
        with pytest.raises(TimeoutError):
            wait(result, timeout=0.05)
        # ... but what this transaction ran (the testing helpers) is seen.
        run_pending("steps")
        assert wait(result, timeout=0.05) == 3


def test_wait_for_a_deleted_message_raises_and_leaves_the_callers_row_alone():
    message = enqueue("steps", {}).message
    Message.objects.filter(pk=message.pk).delete()
    with pytest.raises(MessageFailed, match="deleted"):
        wait(message, timeout=1)
    assert message.status == "pending"


def test_await_result_is_the_async_twin(serving_worker):
    serving_worker(["steps"])
    result = enqueue("steps", {"returns": 5})
    # Through asgiref's bridge, as Django runs async code from sync code: the
    # reads come back to this thread, on its connection.
    assert async_to_sync(await_result)(result, timeout=60) == 5
    cancelled = enqueue("steps", {}, delay=3600)
    operations.cancel(Message.objects.filter(pk=cancelled.message.pk))
    with pytest.raises(MessageFailed):
        async_to_sync(await_result)(cancelled.message, timeout=5)


# -- wait, woken by a notification (PostgreSQL) -------------------------------------

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="waits poll where there is no LISTEN/NOTIFY"
)


@pytest.fixture
def looks_never(monkeypatch):
    """Waits whose next look is an hour away: only a notification ends them in time."""
    from django_delayq import workflows

    monkeypatch.setattr(workflows._Looks, "pause", lambda self: 3600.0)


def marked(result) -> bool:
    return Message.objects.filter(pk=result.message.pk, waited=True).exists()


@on_postgresql
@pytest.mark.parametrize("waiter", ["wait", "await_result"])
def test_a_wait_on_postgresql_is_woken_by_the_messages_end(run_worker, looks_never, waiter):
    result = enqueue("steps", {"returns": 7})
    call = wait if waiter == "wait" else async_to_sync(await_result)
    outcome: dict = {}

    def waiting():
        outcome["value"] = finishes_within(60, lambda: call(result))

    import threading

    thread = threading.Thread(target=waiting, daemon=True)
    thread.start()
    # Marked means listening, and its first read saw the message pending
    # (nothing runs it before run_worker): from here only the NOTIFY wakes it.
    wait_for(lambda: marked(result), timeout=20)
    run_worker(["steps"])
    thread.join(90)
    assert outcome == {"value": 7}


@on_postgresql
def test_a_deleted_waited_message_wakes_its_waiter(looks_never):
    result = enqueue("steps", {}, delay=3600)
    import threading

    outcome: dict = {}

    def waiting():
        try:
            finishes_within(60, lambda: wait(result))
        except MessageFailed as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=waiting, daemon=True)
    thread.start()
    wait_for(lambda: marked(result), timeout=20)
    Message.objects.filter(pk=result.message.pk).delete()
    thread.join(90)
    assert "deleted" in str(outcome["error"])


@on_postgresql
def test_a_wait_never_queues_behind_a_row_lock_held_by_a_producer():
    import threading

    result = enqueue("steps", {}, delay=3600)
    holding, release = threading.Event(), threading.Event()

    def producer():
        with transaction.atomic():
            Message.objects.select_for_update().get(pk=result.message.pk)
            holding.set()
            release.wait(60)
        connection.close()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    assert holding.wait(20)
    try:
        with pytest.raises(TimeoutError):
            finishes_within(20, lambda: wait(result, timeout=0.2))
        assert not marked(result)
    finally:
        release.set()
        thread.join(20)
    with pytest.raises(TimeoutError):
        wait(result, timeout=0.05)
    assert marked(result)


@on_postgresql
def test_the_end_of_a_message_nobody_waits_for_sends_no_notification(run_worker):
    from django_delayq.store.ended import channel
    from django_delayq.worker.listen import connect

    result = enqueue("steps", {})
    listener = connect("default")
    try:
        listener.execute(f'LISTEN "{channel(result.message.pk)}"')
        run_worker(["steps"])
        assert row(result).status == "succeeded"
        # The ack committed before run_worker returned: a NOTIFY would be here.
        assert list(listener.notifies(timeout=0.5)) == []
    finally:
        listener.close()


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "error"),
    [
        ("abc", TypeError),
        (("steps", "k"), TypeError),
        ([1], TypeError),
        ([("steps",)], TypeError),
        ([("steps", "missing")], ValueError),
        ([Message(queue="steps", key="unsaved")], ValueError),
    ],
)
def test_bad_parents_are_refused_before_anything_is_written(after, error):
    with pytest.raises(error):
        enqueue("steps", {}, key="child", after=after)
    assert not Message.objects.filter(key="child").exists()


def test_a_parent_named_twice_or_a_deleted_one_is_refused():
    parent = enqueue("steps", {})
    with pytest.raises(ValueError, match="twice"):
        enqueue("steps", {}, after=[parent, parent.message])
    gone = enqueue("steps", {}).message
    Message.objects.filter(pk=gone.pk).delete()
    with pytest.raises(ValueError, match="does not exist"):
        enqueue("steps", {}, after=[gone])


def test_bad_policies_and_update_with_after_are_refused():
    parent = enqueue("steps", {})
    with pytest.raises(ValueError, match="on_parent_failure"):
        enqueue("steps", {}, after=[parent], on_parent_failure="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_conflict"):
        enqueue("steps", {}, key="k", after=[parent], on_conflict="update")


def test_an_ignored_duplicate_gets_no_new_parents():
    a = enqueue("steps", {})
    b = enqueue("steps", {})
    enqueue("steps", {}, key="step", after=[a])
    again = enqueue("steps", {}, key="step", after=[b])
    assert again.outcome.name == "IGNORED"
    assert [p.pk for p in row(again).parents()] == [a.message.pk]


@pytest.mark.parametrize("policy", ["cancel", "wait"])
def test_an_update_of_a_waiting_step_keeps_it_waiting_for_its_parents(run_worker, policy):
    """``on_conflict="update"`` (which takes no ``after=``) rewrote a waiting step's
    due time like any pending message's: the step was released before its parents
    had finished, and ran before them. Its new content waits as the old did."""
    parent = enqueue("steps", {"fail": 1 if policy == "wait" else 0}, max_attempts=1)
    step = enqueue("steps", {"v": 1}, key="step", after=[parent], on_parent_failure=policy)
    updated = enqueue("steps", {"v": 2}, key="step", on_conflict="update", delay=0)
    assert updated.outcome.name == "UPDATED"
    waiting = row(step)
    assert (waiting.payload, waiting.next_attempt_time) == ({"v": 2}, None)
    assert waiting.waiting_for_parents
    run_worker(["steps"])
    done = row(step)
    if policy == "cancel":
        assert row(parent).status == "succeeded" and done.status == "succeeded"
        assert started(step) >= row(parent).finished_at
    else:  # the parent failed: the step still waits for an operator's retry
        assert row(parent).status == "failed"
        assert (done.status, done.next_attempt_time) == ("pending", None)
        enqueue("steps", {"v": 3}, key="step", on_conflict="update")
        run_worker(["steps"])
        assert (row(step).status, row(step).payload) == ("pending", {"v": 3})
        assert not Execution.objects.filter(message_id=step.message.pk).exists()


def test_an_update_of_a_released_or_finished_step_runs_it_like_any_message(run_worker):
    parent = enqueue("steps", {})
    step = enqueue("steps", {}, key="step", after=[parent])
    run_worker(["steps"])
    assert row(step).status == "succeeded"
    enqueue("steps", {"again": 1}, key="step", on_conflict="update")
    assert row(step).next_attempt_time is not None
    run_worker(["steps"])
    assert (row(step).status, row(step).attempt_count) == ("succeeded", 1)


class _Producer:
    """Another connection's transaction holding a message's row lock (a producer's
    upsert of its key, a bulk change), or a row's of ``model``, until ``release``."""

    def __init__(self, pk, model=Message):
        import threading

        self.locked, self.released = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(pk, model))

    def _hold(self, pk, model):
        from django.db import connections

        try:
            with transaction.atomic():
                model.objects.select_for_update().get(pk=pk)
                self.locked.set()
                self.released.wait(60)
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        assert self.locked.wait(30)
        return self

    def __exit__(self, *exc):
        self.released.set()
        self.thread.join(30)


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="one writer at a time: no row locks")
def test_a_producer_holding_a_childs_row_lock_never_stalls_the_worker(serving_worker, settings):
    """A parent's worker ends its edges and changes its children's rows: a producer's
    transaction that holds a child's row made the worker wait for it, and every
    message behind it waited too (with one executor, none ran; acknowledgements
    batched behind it kept their leases lapsing). The worker must go on, and the
    child be released once the producer lets go, after its parent."""
    settings.DELAYQ = {**settings.DELAYQ, "HEARTBEAT_INTERVAL": 0.5}
    parent = enqueue("steps", {})
    child = enqueue("steps", {}, key="child", after=[parent])
    with _Producer(child.message.pk):
        serving_worker(["steps"], concurrency=1)
        wait_for(lambda: row(parent).status == "succeeded", message="the parent's success")
        later = enqueue("steps", {}).message
        wait_for(
            lambda: Message.objects.get(pk=later.pk).status == "succeeded",
            timeout=20,
            message="a later message, while the producer holds the child",
        )
        assert row(child).next_attempt_time is None  # still waiting: its edge is open
    wait_for(lambda: row(child).status == "succeeded", timeout=30, message="the child")
    assert started(child) >= row(parent).finished_at
    assert row(child).attempt_count == 1


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="one writer at a time: no row locks")
def test_a_workers_settle_passes_a_locked_child_and_ends_the_rest():
    """What the worker's executors and its acknowledgement thread both call: the
    edges to a child locked elsewhere stay open (said so), and nothing waits for
    the lock for long; the sweep passes that child, ends the rest, and ends its
    edges once it is free."""
    parent = enqueue("steps", {})
    held = enqueue("steps", {}, after=[parent])
    free = enqueue("steps", {}, after=[parent])
    Message.objects.filter(pk=parent.message.pk).update(status="succeeded")
    with _Producer(held.message.pk):
        done = finishes_within(
            10, lambda: dependencies.settle_without_waiting([parent.message.pk], using="default")
        )
        assert done.skipped and held.message.pk not in done.released
        assert row(held).next_attempt_time is None
        # The rest go now, not at the next sweep (PostgreSQL's statement, timed
        # out on the held child, is sent again locking the children first).
        assert done.released == [free.message.pk]
        assert row(free).next_attempt_time is not None
        finishes_within(10, lambda: dependencies.settle(skip_locked=True))
        assert row(held).next_attempt_time is None  # the sweep passes it too
    swept = dependencies.settle(skip_locked=True)
    assert (swept.released, swept.skipped) == ([held.message.pk], False)


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="one writer at a time anyway")
def test_parents_finishing_at_once_on_many_connections_release_their_child_once():
    import threading

    from django.db import connections

    parents = enqueue_many("steps", [{}] * 16)
    child = enqueue("steps", {}, after=parents)
    Message.objects.filter(pk__in=[p.message.pk for p in parents]).update(status="succeeded")
    barrier = threading.Barrier(8)
    released = []

    def finish(mine):
        try:
            barrier.wait(10)
            released.extend(dependencies.settle(mine, using="default").released)
        finally:
            connections.close_all()

    ids = [p.message.pk for p in parents]
    threads = [threading.Thread(target=finish, args=(ids[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert released == [child.message.pk]
    assert row(child).next_attempt_time is not None
    assert connection.vendor in ("postgresql", "mysql")


# -- the class of fault: any graph, any outcomes --------------------------------------


@st.composite
def graphs(draw):
    """A random workflow: each step's parents among the earlier ones, its policy, and
    whether its handler fails."""
    size = draw(st.integers(2, 8))
    steps = []
    for i in range(size):
        parents = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        steps.append(
            {
                "parents": parents,
                "policy": draw(st.sampled_from(["cancel", "wait", "run"])),
                "fails": draw(st.booleans()),
            }
        )
    return steps


def run_graph(steps, *, failures):
    """Enqueue ``steps`` (``graphs()``) in one transaction on an empty table, a failing
    step's handler failing its first ``failures`` attempts, and run what is due."""
    from django_delayq.testing import run_pending

    Dependency.objects.all().delete()
    Message.objects.all().delete()
    Execution.objects.all().delete()
    results = []
    with transaction.atomic():
        for i, step in enumerate(steps):
            payload = {"fail": failures} if step["fails"] else {"echo": i}
            results.append(
                enqueue(
                    "steps",
                    payload,
                    key=f"s{i}",
                    after=[results[p] for p in step["parents"]] or None,
                    on_parent_failure=step["policy"],
                )
            )
    run_pending("steps")
    return results


def expected_statuses(steps):
    """What each step must end as, by the rules of on_parent_failure."""
    status = []
    for step in steps:
        ended = [status[p] for p in step["parents"]]
        failed = any(s in ("failed", "cancelled") for s in ended)
        waiting = any(s == "pending" for s in ended)
        if failed and step["policy"] == "cancel":
            status.append("cancelled")
        elif waiting or (failed and step["policy"] == "wait"):
            status.append("pending")
        else:
            status.append("failed" if step["fails"] else "succeeded")
    return status


@hypothesis.settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(steps=graphs())
def test_any_graph_ends_as_its_rules_say_and_no_step_starts_before_its_parents(steps):

    results = run_graph(steps, failures=5)
    rows = [row(r) for r in results]
    assert [m.status for m in rows] == expected_statuses(steps)
    for step, message in zip(steps, rows, strict=True):
        ran = Execution.objects.filter(message_id=message.pk)
        if message.status in ("pending", "cancelled"):
            assert not ran.exists(), "a step ran that its parents held back"
            continue
        assert ran.count() == (2 if step["fails"] else 1)
        first = ran.order_by("started").first().started
        for p in step["parents"]:
            assert rows[p].finished_at <= first, "a step started before its parent finished"
        if message.status == "succeeded":
            want = [
                rows[p].result if rows[p].status == "succeeded" else None for p in step["parents"]
            ]
            assert message.result["parents"] == want if "parents" in message.result else True
    # Waiting steps are held (no due time), and nothing is left to release.
    assert all(m.next_attempt_time is None for m in rows if m.status == "pending")
    assert not dependencies.settle(using="default")


def statuses_after(steps, before, changed, to):
    """What each step must end as once an operator made step ``changed`` end ``to``
    (a retried failed step that then succeeds, a cancelled waiting one): the steps
    that ran keep their outcome; those waiting or cancelled are decided again by the
    rules, with it ended so."""
    status = []
    for i, step in enumerate(steps):
        if i == changed:
            status.append(to)
            continue
        if before[i] in ("succeeded", "failed"):
            status.append(before[i])
            continue
        ended = [status[p] for p in step["parents"]]
        failed = any(s in ("failed", "cancelled") for s in ended)
        waiting = any(s == "pending" for s in ended)
        if failed and step["policy"] == "cancel":
            status.append("cancelled")
        elif waiting or (failed and step["policy"] == "wait"):
            status.append("pending")
        else:
            status.append("failed" if step["fails"] else "succeeded")
    return status


@hypothesis.settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(steps=graphs(), pick=st.integers(0, 7), prune=st.booleans())
@hypothesis.example(  # pruning took the parent of a failed step that a retry runs again
    steps=[
        {"parents": [], "policy": "cancel", "fails": False},
        {"parents": [0], "policy": "cancel", "fails": True},
        {"parents": [1], "policy": "wait", "fails": False},
    ],
    pick=0,
    prune=True,
)
def test_any_graph_with_a_failed_step_retried_goes_on_as_its_rules_say(steps, pick, prune):
    """An operator's retry of a failed step that then succeeds: the steps its failure
    cancelled (down the graph) or held run; those another failure holds stay; the
    steps that ran are not run again, and none starts before its parents ended.

    ``prune``: finished steps are pruned first, but those whose children still
    wait (their status and result are what the children read)."""
    from django_delayq.operations import retry_failed
    from django_delayq.retention import prune as prune_finished
    from django_delayq.testing import run_pending

    # A failing step fails both attempts it is given; an operator's third succeeds.
    results = run_graph(steps, failures=2)
    before = [row(r).status for r in results]
    assert before == expected_statuses(steps)
    if prune:
        prune_finished(older_than=0)
        kept = set(Message.objects.values_list("pk", flat=True))
        # Kept: what waits, and a parent of a kept child that may still run (waiting,
        # or failed or cancelled: an operator's retry runs it again); a child pruned
        # takes its edges, and its parents may go.
        keep = [False] * len(steps)
        for i in reversed(range(len(steps))):
            keep[i] = before[i] == "pending" or any(
                keep[c] and before[c] != "succeeded" and i in s["parents"]
                for c, s in enumerate(steps)
            )
        assert [r.message.pk in kept for r in results] == keep, (
            "pruned a step that a child may still need, or kept one nobody needs"
        )
    present = set(Message.objects.values_list("pk", flat=True))
    failed = [
        i
        for i, status in enumerate(before)
        if status == "failed" and results[i].message.pk in present
    ]
    hypothesis.assume(failed)
    retried = failed[pick % len(failed)]
    runs_before = {
        r.message.pk: Execution.objects.filter(message_id=r.message.pk).count() for r in results
    }

    assert retry_failed(Message.objects.filter(pk=results[retried].message.pk)).changed == 1
    run_pending("steps")

    rows = [Message.objects.filter(pk=r.message.pk).first() for r in results]
    want = statuses_after(steps, before, retried, "succeeded")
    assert [m and m.status for m in rows] == [
        w if m is not None else None for m, w in zip(rows, want, strict=True)
    ]
    for i, (step, message) in enumerate(zip(steps, rows, strict=True)):
        if message is None:
            continue
        runs = list(Execution.objects.filter(message_id=message.pk).order_by("started"))
        again = runs[runs_before[message.pk] :]
        if i == retried:
            assert len(again) == 1
        elif before[i] in ("succeeded", "failed"):
            assert not again, "a step that had ended ran again"
        elif message.status in ("pending", "cancelled"):
            assert not runs, "a step ran that its parents held back"
        for p in step["parents"] if again else []:
            assert rows[p] is not None, "a parent of a step that ran again was pruned"
            assert rows[p].finished_at <= again[0].started, "a step started before a parent"
    assert all(m.next_attempt_time is None for m in rows if m and m.status == "pending")
    assert not dependencies.settle(using="default")


@hypothesis.settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(steps=graphs(), pick=st.integers(0, 7))
def test_any_graph_with_a_waiting_step_cancelled_goes_on_as_its_rules_say(steps, pick):
    """An operator cancels a step that waits (for a held-back or failed parent): its
    descendants follow their on_parent_failure, as after a parent's failure, and the
    step itself never runs, even once its parents are retried."""
    from django_delayq.operations import cancel, retry_failed
    from django_delayq.testing import run_pending

    results = run_graph(steps, failures=2)
    before = [row(r).status for r in results]
    waiting = [i for i, status in enumerate(before) if status == "pending"]
    hypothesis.assume(waiting)
    cancelled = waiting[pick % len(waiting)]

    assert cancel(Message.objects.filter(pk=results[cancelled].message.pk)).changed == 1
    run_pending("steps")

    rows = [row(r) for r in results]
    assert [m.status for m in rows] == statuses_after(steps, before, cancelled, "cancelled")
    assert not Execution.objects.filter(message_id=rows[cancelled].pk).exists()
    for i, step in enumerate(steps):
        if rows[i].status in ("succeeded", "failed"):
            first = Execution.objects.filter(message_id=rows[i].pk).order_by("started")[0]
            for p in step["parents"]:
                assert rows[p].finished_at <= first.started, "a step started before a parent"
    # Retrying every failed step now never runs the cancelled one (no parent of it
    # failed because of it: it was cancelled by hand, not by a parent).
    retry_failed(Message.objects.filter(status="failed"))
    run_pending("steps")
    assert row(results[cancelled]).status == "cancelled"
    assert not Execution.objects.filter(message_id=rows[cancelled].pk).exists()
    assert not dependencies.settle(using="default")


def test_a_step_whose_release_woke_its_queue_leaves_the_claimers_next_due_time_alone():
    # On PostgreSQL the release notifies the steps' queues in its own statement, due
    # times included: a listening claim loop need not read its next due time again,
    # which cost a query beside every step of a chain. Where the release could not
    # tell (or the worker does not listen), the next due time is read again.
    from django_delayq.worker import Worker
    from django_delayq.worker.execute import _children_go_on, released_children
    from django_delayq.worker.wakeup import Waker

    parent = enqueue("default", {}).message
    enqueue("default", {}, after=[parent])
    Message.objects.filter(pk=parent.pk).update(status="succeeded")
    finished = Message.objects.get(pk=parent.pk)
    _children_go_on(finished, "default")
    told = released_children(finished).told
    assert told == (connection.vendor == "postgresql")

    worker = Worker(["default"], concurrency=1)
    claimer = worker.claimer
    for listen in (True, False):
        claimer.waker = Waker("default", ["default"], listen=listen)
        try:
            for release_told in (True, False):
                claimer._next_due_read = 1.0  # read once already
                claimer.something_due(told=release_told)
                kept = claimer._next_due_read is not None
                assert kept == (release_told and claimer.waker.listening)
                assert claimer._due_now
                claimer._due_now = False
        finally:
            claimer.waker.close()


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="one statement on PostgreSQL; two elsewhere"
)
def test_an_acknowledgement_that_would_wait_for_a_locked_child_writes_nothing():
    # A producer's transaction holds the child: the one statement gives up after
    # its bounded wait, with nothing written, and the worker writes the success
    # alone (the release is then passed to the sweep).
    from django_delayq.store import settle

    parent, child, token = claimed_parent_and_child()
    with _Producer(child.pk):
        assert (
            finishes_within(
                10,
                lambda: settle.ack_releasing(parent.pk, token, using="default", skip_locked=True),
            )
            is None
        )
        assert row_of(parent).status == "running"
    assert row_of(child).next_attempt_time is None


def row_of(message):
    return Message.objects.get(pk=message.pk)
