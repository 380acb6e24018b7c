"""Ordered groups: one message of a group at a time, in the order they were enqueued.

The claim enforces the order (``store.groups.group_clear``); messages that
wait behind their group are *held* (no due time) so that claims never visit
them, and are let go one by one (``release_groups``). These tests drive
claims and outcomes directly, on every database, then a real worker.
"""

from datetime import timedelta

import pytest
from django.db import connection

from django_delayq import enqueue, enqueue_many, operations
from django_delayq.models import Message
from django_delayq.store import claim as store_claim
from django_delayq.store import groups, operators, settle
from django_delayq.worker.execute import Result
from tests.conftest import wait_for
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=5)


def claim(queue: str = "default", limit: int = 10) -> list[Message]:
    return store_claim.claim([queue], limit, worker="w", lease=LEASE).messages


def claim_one(queue: str = "default") -> tuple[Message, object]:
    result = store_claim.claim([queue], 10, worker="w", lease=LEASE)
    assert len(result.messages) == 1, [m.key for m in result.messages]
    return result.messages[0], result.token


def finish(message: Message, token: object) -> None:
    assert settle.ack([message.pk], token) == 1  # type: ignore[arg-type]
    groups.release_groups([(message.queue, message.group)])


def held(*keys: str) -> set[str]:
    rows = Message.objects.filter(key__in=keys, status="pending", next_attempt_time=None)
    return set(rows.values_list("key", flat=True))


def test_later_messages_of_a_group_are_held_and_run_one_at_a_time_in_order():
    for i in range(3):
        enqueue("default", {"i": i}, key=f"m{i}", group="order-1")
    enqueue("default", {}, key="free")
    assert held("m0", "m1", "m2") == {"m1", "m2"}
    first = claim()
    assert sorted(m.key for m in first) == ["free", "m0"]
    m0 = next(m for m in first if m.key == "m0")
    assert claim() == []  # m1 waits for m0, which runs
    finish(m0, _token_of(m0))
    m1, token = claim_one()
    assert m1.key == "m1"
    finish(m1, token)
    m2, token = claim_one()
    assert m2.key == "m2"


def _token_of(message: Message) -> object:
    return Message.objects.get(pk=message.pk).lock_token


def test_groups_run_in_parallel_with_each_other():
    for group in ("a", "b", "c"):
        for i in range(2):
            enqueue("default", {}, key=f"{group}{i}", group=group)
    assert sorted(m.key for m in claim()) == ["a0", "b0", "c0"]


def test_a_group_is_per_queue():
    enqueue("default", {}, key="d", group="same")
    enqueue("other", {}, key="o", group="same")
    assert held("d", "o") == set()
    assert [m.key for m in claim("default")] == ["d"]
    assert [m.key for m in claim("other")] == ["o"]


def test_enqueue_many_keeps_the_order_of_the_payloads_within_a_group():
    keys = ["z", "y", "x", "w"]  # not sorted: the order is the call's
    results = enqueue_many("default", [{}] * 4, keys=keys, group="g")
    ids = [r.message.pk for r in results]
    assert ids == sorted(ids)
    assert held(*keys) == {"y", "x", "w"}
    assert [r.message.next_attempt_time is None for r in results] == [False, True, True, True]
    order = []
    for _ in keys:
        message, token = claim_one()
        order.append(message.key)
        finish(message, token)
    assert order == keys


def test_enqueue_many_with_one_group_per_payload():
    results = enqueue_many(
        "default", [{}] * 5, keys=list("abcde"), groups=["g1", "g2", "g1", "", "g2"]
    )
    assert [r.message.group for r in results] == ["g1", "g2", "g1", "", "g2"]
    assert held(*"abcde") == {"c", "e"}
    assert sorted(m.key for m in claim()) == ["a", "b", "d"]


def test_enqueue_many_of_one_message_with_its_own_group():
    # One message is written by an INSERT ... VALUES whose group is a parameter.
    (first,) = enqueue_many("default", [{"n": 1}], keys=["a"], groups=["g1"])
    (second,) = enqueue_many("default", [{"n": 2}], keys=["b"], groups=["g1"])
    assert (first.message.group, second.message.group) == ("g1", "g1")
    assert Message.objects.get(key="a").payload == {"n": 1}
    assert held("a", "b") == {"b"}


def test_a_message_waiting_for_its_retry_blocks_its_group():
    enqueue("default", {}, key="head", group="g")
    enqueue("default", {}, key="next", group="g")
    head, token = claim_one()
    settle.fail(head.pk, token, error="boom", retry_at=None, retry_in=timedelta(seconds=-1))
    groups.release_groups([("default", "g")])
    # The head is due again (its retry time has passed); "next" still waits.
    again, token = claim_one()
    assert again.key == "head"
    settle.fail(again.pk, token, error="boom", retry_at=None, retry_in=timedelta(hours=1))
    groups.release_groups([("default", "g")])
    assert claim() == []
    assert held("next") == {"next"}


def test_a_failed_message_blocks_its_group_until_an_operator_acts(settings):
    enqueue("default", {}, key="head", group="g")
    enqueue("default", {}, key="next", group="g")
    head, token = claim_one()
    settle.fail(head.pk, token, error="boom", retry_at=None)
    groups.release_groups([("default", "g")])
    assert Message.objects.get(key="head").status == "failed"
    assert claim() == [] and held("next") == {"next"}
    # Deleting the failed head (or retrying it) lets the group go on.
    assert operations.cancel(Message.objects.filter(key="head")).changed == 0  # not waiting
    assert operations.delete(Message.objects.filter(key="head")).changed == 1
    assert [m.key for m in claim()] == ["next"]


def test_a_queue_may_let_its_groups_go_on_past_a_failed_message(settings):
    settings.DELAYQ = {
        **settings.DELAYQ,
        "QUEUES": {"default": {"GROUP_AFTER_FAILURE": "continue"}},
    }
    enqueue("default", {}, key="head", group="g")
    enqueue("default", {}, key="next", group="g")
    head, token = claim_one()
    settle.fail(head.pk, token, error="boom", retry_at=None)
    groups.release_groups([("default", "g")])
    assert [m.key for m in claim()] == ["next"]


def test_a_redelivered_message_still_runs_before_its_successors():
    enqueue("default", {}, key="head", group="g")
    enqueue("default", {}, key="next", group="g")
    head, _ = claim_one()
    # Its worker died: the lease runs out.
    Message.objects.filter(pk=head.pk).update(next_attempt_time=head.created_at)
    again = claim()
    assert [m.key for m in again] == ["head"]
    assert again[0].attempt_count == 2


def test_the_claim_itself_keeps_the_order_when_no_message_is_held():
    # Two producers that enqueue into a new group at the same instant may
    # both see no earlier message: neither is held, and the claim decides.
    enqueue("default", {}, key="first", group="g")
    enqueue("default", {}, key="second", group="g")
    Message.objects.filter(key="second").update(
        next_attempt_time=Message.objects.get(key="first").next_attempt_time
    )
    assert [m.key for m in claim()] == ["first"]
    assert claim() == []


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="a PostgreSQL plan")
def test_the_claim_leaves_its_group_probes_to_the_group_function():
    # Planned with every claim (Django sends it as text), the two probes of
    # the group condition were most of an idle worker's claim; the function
    # delayq_group_clear runs them with a plan the server keeps (their use of
    # delayq_group_idx: tests/store/test_groups.py).
    from django.test.utils import CaptureQueriesContext

    enqueue_many("default", [{}] * 3, group="g")
    with CaptureQueriesContext(connection) as queries:
        assert len(claim()) == 1
    (statement,) = [q["sql"] for q in queries.captured_queries if "message_group" in q["sql"]]
    assert "delayq_group_clear(" in statement
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "SubPlan" not in plan, plan


def test_an_earlier_message_run_again_waits_for_the_one_that_runs():
    enqueue("default", {}, key="old", group="g")
    old, token = claim_one()
    finish(old, token)
    enqueue("default", {}, key="new", group="g")
    new, _ = claim_one()
    assert new.key == "new"
    # An operator runs the old message again while "new" runs.
    operators.retry(Message.objects.filter(key="old"), 1, now=new.last_attempt_time)
    assert claim() == []


def test_the_sweep_lets_a_group_go_on_when_its_worker_died_before_doing_so():
    enqueue("default", {}, key="head", group="g")
    enqueue("default", {}, key="next", group="g")
    head, token = claim_one()
    assert settle.ack([head.pk], token) == 1  # and the worker died here
    assert claim() == []
    assert groups.release_groups() == 1
    assert [m.key for m in claim()] == ["next"]


def test_a_held_message_becomes_due_at_its_own_scheduled_time():
    enqueue("default", {}, key="head", group="g")
    enqueue("default", {}, key="later", group="g", delay=timedelta(hours=1))
    head, token = claim_one()
    finish(head, token)
    later = Message.objects.get(key="later")
    assert later.next_attempt_time == later.scheduled_time
    assert claim() == []


def test_cancelling_the_head_lets_the_group_go_on():
    enqueue("default", {}, key="head", group="g", delay=timedelta(hours=1))
    enqueue("default", {}, key="next", group="g")
    assert operations.cancel(Message.objects.filter(key="head")).changed == 1
    assert [m.key for m in claim()] == ["next"]


def test_an_update_keeps_a_message_in_its_place_in_its_group():
    enqueue("default", {"v": 1}, key="head", group="g")
    enqueue("default", {"v": 1}, key="next", group="g")
    enqueue("default", {"v": 2}, key="next", group="g", on_conflict="update")
    assert held("next") == {"next"}
    assert [m.key for m in claim()] == ["head"]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"group": 42}, TypeError),
        ({"group": "x" * 201}, ValueError),
        ({"group": "a\x00b"}, ValueError),
    ],
)
def test_a_bad_group_is_refused_before_anything_is_written(kwargs, error):
    with pytest.raises(error, match="group"):
        enqueue("default", {}, **kwargs)
    assert not Message.objects.exists()


def test_groups_must_match_the_payloads():
    with pytest.raises(ValueError, match="2 payloads but 1 groups"):
        enqueue_many("default", [{}, {}], groups=["a"])
    with pytest.raises(ValueError, match="either group or groups"):
        enqueue_many("default", [{}], group="a", groups=["a"])
    with pytest.raises(TypeError, match="one per payload"):
        enqueue_many("default", [{}], groups="a")
    with pytest.raises(ValueError, match="message 1: group"):
        enqueue_many("default", [{}, {}], groups=["a", "b\x00"])
    assert not Message.objects.exists()


def test_a_worker_runs_each_group_in_order_and_the_groups_side_by_side(run_worker):
    groups = [f"g{i % 4}" for i in range(24)]
    results = enqueue_many("default", [{"sleep": 0.05}] * 24, groups=groups)
    stats = run_worker(["default"], concurrency=4)
    assert stats[Result.SUCCEEDED] == 24
    runs = {e.message_id: e for e in Execution.objects.all()}
    assert len(runs) == 24  # each ran once
    for group in set(groups):
        ids = [r.message.pk for r, g in zip(results, groups, strict=True) if g == group]
        spans = [(runs[i].started, runs[i].finished) for i in ids]
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start  # strictly one after the other, in order
    if connection.vendor != "sqlite":  # SQLite runs one writer at a time
        spans = sorted((e.started, e.finished) for e in runs.values())
        overlaps = sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1])
        assert overlaps > 0


@pytest.mark.parametrize("ack_delay", [None, 0.005])
def test_a_serving_worker_runs_the_next_message_of_a_group_without_waiting_for_a_poll(
    serving_worker, settings, ack_delay
):
    # Polls an hour apart: only the worker's own wake-up can move the group on.
    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 3600, "ACK_DELAY": ack_delay}
    enqueue_many("default", [{}] * 4, group="g")  # before the worker: no NOTIFY needed
    serving_worker(["default"], concurrency=2)
    wait_for(
        lambda: Message.objects.filter(status="succeeded").count() == 4,
        message="the group to run through",
    )


def test_other_workers_hear_of_the_next_message_of_a_group(serving_worker, settings):
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 3600}
    enqueue("default", {}, key="head", group="g")
    enqueue("default", {}, key="next", group="g")
    head, token = claim_one()  # as if another worker ran it
    serving_worker(["default"], concurrency=1)
    finish(head, token)  # its worker moves the group on: this one is told
    wait_for(
        lambda: Message.objects.get(key="next").status == "succeeded",
        message="the next message to run",
    )
