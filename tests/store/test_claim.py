"""The contract of ``store/claim.py``: the claim, on every database.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements; one test
checks the database's own clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import hypothesis
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import strategies as st

from django_delayq import clock, enqueue, enqueue_many
from django_delayq.models import Message
from django_delayq.store import claim, queries, settle
from tests.conftest import FakeClock, finishes_within
from tests.store.tables import (
    FINISHED,
    LEASE,
    LONG_AGO,
    MESSAGE,
    SHIPMENT,
    Table,
    analyze,
    at,
    can,
    copies,
    in_thread,
    subset,
    superseded_message,
)
from tests.testapp.models import Shipment

pytestmark = pytest.mark.django_db


def test_claim_order_is_priority_first_where_the_table_has_a_priority() -> None:
    assert claim.claim_order(Message) == ("-priority", "next_attempt_time")
    assert claim.claim_order(Shipment) == ("-priority", "next_attempt_time")


def test_claim_takes_due_rows_only(table: Table, fake_clock: FakeClock) -> None:
    due = {
        table.add(due=at(-60)),
        table.add(due=at(0)),  # due exactly now
        table.add(status="running", due=at(-1), lock_token=uuid.uuid4()),  # lease ran out
    }
    table.add(due=at(0.000001))
    table.add(due=None)  # pending without a due time: never claimed
    table.add(status="running", due=at(10), lock_token=uuid.uuid4())  # a lease that runs
    for status in FINISHED:
        table.add(status=status, due=at(-60))  # finished, even with a due time
    before = table.states()

    claimed = table.claim(100)

    assert {m.pk for m in claimed.messages} == due
    for pk, state in table.states().items():
        if pk not in due:
            assert state == before[pk]


def test_claim_takes_the_highest_priority_first_then_the_earliest_due(
    table: Table, fake_clock: FakeClock
) -> None:
    high_early = table.add(priority=5, due=at(-2))
    high_late = table.add(priority=5, due=at(-1))
    low = table.add(priority=-1, due=at(-10))
    mid_early = table.add(priority=0, due=at(-4))
    mid_late = table.add(priority=0, due=at(-3))

    first = table.claim(3)
    second = table.claim(10)

    assert [m.pk for m in first.messages] == [high_early, high_late, mid_early]
    assert [m.pk for m in second.messages] == [mid_late, low]


def test_a_claimed_batch_runs_highest_priority_first_then_oldest_whatever_the_leases(
    fake_clock: FakeClock,
) -> None:
    """The batch's order is read after the claim wrote each row's lease over its due
    time: on MariaDB it came back sorted by those leases (a shorter kind's lease first),
    and rows of one lease in whatever order the table gave them."""
    first = MESSAGE.add(kind="slow", priority=1, due=at(-5))
    second = MESSAGE.add(kind="quick", priority=1, due=at(-10))
    urgent = MESSAGE.add(kind="slow", priority=4, due=at(-1))
    leases = {("q", "quick"): timedelta(seconds=5), ("q", "slow"): timedelta(hours=1)}

    claimed = MESSAGE.claim(10, leases=leases)

    assert [m.pk for m in claimed.messages] == [urgent, first, second]


@hypothesis.settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(
    rows=st.lists(
        st.tuples(st.integers(-2, 2), st.sampled_from(["quick", "slow", "other"])),
        min_size=1,
        max_size=12,
    ),
    dues=st.randoms(use_true_random=False),
    limit=st.integers(1, 12),
)
def test_any_claim_takes_the_first_rows_in_claim_order_and_runs_them_priority_then_oldest(
    fake_clock: FakeClock, rows: list[tuple[int, str]], dues: Any, limit: int
) -> None:
    """Which rows a claim takes is decided by priority then due time; the order the
    batch comes back in by priority then key, whatever the database and the kinds'
    leases (which the claim writes over the due times)."""
    Message.objects.all().delete()
    offsets = dues.sample(range(1, 1000), len(rows))  # distinct due times, any order
    added = [
        (MESSAGE.add(priority=priority, kind=kind, due=at(-offset)), priority, offset)
        for (priority, kind), offset in zip(rows, offsets, strict=True)
    ]
    leases = {("q", "quick"): timedelta(seconds=5), ("q", "slow"): timedelta(hours=1)}

    claimed = [m.pk for m in MESSAGE.claim(limit, leases=leases).messages]

    in_claim_order = sorted(added, key=lambda row: (-row[1], -row[2]))
    taken = in_claim_order[:limit]
    assert claimed == [pk for pk, _, _ in sorted(taken, key=lambda row: (-row[1], row[0]))]


def test_claim_takes_at_most_limit_rows(table: Table, fake_clock: FakeClock) -> None:
    for _ in range(5):
        table.add()
    assert len(table.claim(2).messages) == 2
    assert len(table.claim(1).messages) == 1
    assert len(table.claim(10).messages) == 2


def test_claim_takes_only_the_given_queues(fake_clock: FakeClock) -> None:
    a = MESSAGE.add(queue="a")
    b = MESSAGE.add(queue="b")
    c = MESSAGE.add(queue="c")
    untouched = MESSAGE.state(c)

    claimed = MESSAGE.claim(10, queues=["a", "b"])

    assert {m.pk for m in claimed.messages} == {a, b}
    assert MESSAGE.state(c) == untouched


def test_a_claim_over_several_queues_takes_the_first_rows_across_them(
    fake_clock: FakeClock,
) -> None:
    """Priority first, then due time, whichever queue a row is in; the limit over all."""
    a_old = MESSAGE.add(queue="a", priority=3, due=at(-20))
    a_new = MESSAGE.add(queue="a", priority=3, due=at(-10))
    b_high = MESSAGE.add(queue="b", priority=5)
    b_low = MESSAGE.add(queue="b", priority=1, due=at(-30))
    c_high = MESSAGE.add(queue="c", priority=9)
    MESSAGE.add(queue="a", priority=7, due=at(60))  # not due

    claimed = MESSAGE.claim(3, queues=["a", "b"])

    assert [m.pk for m in claimed.messages] == [b_high, a_old, a_new]
    assert [m.pk for m in MESSAGE.claim(10, queues=["b", "a", "c"]).messages] == [c_high, b_low]
    assert MESSAGE.claim(10, queues=["a", "b", "c"]).messages == []


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="the rows a plan node read: PostgreSQL's EXPLAIN ANALYZE",
)
def test_a_claim_over_several_queues_reads_each_queues_first_rows_only(
    fake_clock: FakeClock,
) -> None:
    """A pick of ``queue IN (...)`` read every due row of the queues, evaluated each
    grouped row's group and sorted them all: 2 s at 100,000 grouped rows."""
    for queue in ("a", "b"):
        template = MESSAGE.add(queue=queue, group="g", due=at(-60))
        copies(template, 2000, key=f"{queue}-", group=f"{queue}-")
    analyze()
    with CaptureQueriesContext(connection) as captured:
        assert len(MESSAGE.claim(3, queues=["a", "b"]).messages) == 3
    statement = captured.captured_queries[-1]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement)
        plan = cursor.fetchone()[0]

    def nodes(node: dict[str, Any]) -> Iterable[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [
        node
        for node in nodes(plan[0]["Plan"])
        if node.get("Relation Name") == Message._meta.db_table
    ]
    read = [node["Actual Rows"] * node["Actual Loops"] for node in scans]
    assert scans and max(read) <= 6, plan


def test_claim_of_no_queue_claims_nothing_and_changes_nothing(fake_clock: FakeClock) -> None:
    MESSAGE.add()
    before = MESSAGE.states()
    with CaptureQueriesContext(connection) as queries:
        claimed = MESSAGE.claim(10, queues=[])
    assert claimed.messages == []
    assert len(queries) == 0
    assert MESSAGE.states() == before


def test_claim_of_a_queue_fields_model_ignores_queues(fake_clock: FakeClock) -> None:
    """The model is the queue: no queue list (not even an empty one) narrows it."""
    row = SHIPMENT.add()
    assert [m.pk for m in SHIPMENT.claim(10, queues=[]).messages] == [row]


def test_claim_marks_rows_running_under_one_new_token_with_a_lease(
    table: Table, fake_clock: FakeClock
) -> None:
    first = table.add(attempt_count=2, locked_by="old", last_error="before")
    second = table.add()
    now = fake_clock.advance(5)

    claimed = table.claim(10, worker="worker-1")

    assert isinstance(claimed.token, uuid.UUID)
    for pk, attempts in ((first, 3), (second, 1)):
        state = table.state(pk)
        expected = table.expect(
            {
                "status": "running",
                "lock_token": claimed.token,
                "locked_by": "worker-1",
                "attempt_count": attempts,
                "last_attempt_time": now,
                "next_attempt_time": now + LEASE,
                "updated_at": now,
                "superseded_at": None,
            }
        )
        assert subset(state, expected) == expected
    # A failed attempt's error stays until the next outcome replaces it.
    assert table.state(first)["last_error"] == "before"
    # The rows returned are the rows stored (RETURNING's converters ran).
    assert {m.pk: table.expect(vars(m)) for m in claimed.messages} == {
        pk: table.expect(table.state(pk)) for pk in (first, second)
    }
    assert table.claim(10).token != claimed.token


def test_claim_cuts_the_worker_name_to_the_column(fake_clock: FakeClock) -> None:
    pk = MESSAGE.add()
    MESSAGE.claim(worker="w" * 300)
    assert MESSAGE.state(pk)["locked_by"] == "w" * 255


def test_claim_writes_the_lease_on_the_database_clock() -> None:
    pk = MESSAGE.add(due=datetime(2000, 1, 1, tzinfo=UTC))
    before = datetime.now(UTC)
    MESSAGE.claim(lease=timedelta(seconds=45))
    after = datetime.now(UTC)

    state = MESSAGE.state(pk)
    started = state["last_attempt_time"]
    # One statement, one "now": the lease is exactly that now plus the lease.
    assert state["next_attempt_time"] - started == timedelta(seconds=45)
    assert state["updated_at"] == started
    assert before - timedelta(seconds=5) <= started <= after + timedelta(seconds=5)


def test_claim_gives_each_queue_and_kind_its_own_lease(fake_clock: FakeClock) -> None:
    slow = MESSAGE.add(queue="q", kind="slow")
    other = MESSAGE.add(queue="q", kind="other")
    elsewhere = MESSAGE.add(queue="r", kind="slow")
    leases = {("q", None): timedelta(seconds=20), ("q", "slow"): timedelta(seconds=60)}

    claim.claim(["q", "r"], 10, worker="w", lease=timedelta(seconds=10), leases=leases)

    now = clock.now()
    assert MESSAGE.state(slow)["next_attempt_time"] == now + timedelta(seconds=60)
    assert MESSAGE.state(other)["next_attempt_time"] == now + timedelta(seconds=20)
    assert MESSAGE.state(elsewhere)["next_attempt_time"] == now + timedelta(seconds=10)


def test_claim_takes_a_running_row_again_once_its_lease_ran_out(
    table: Table, fake_clock: FakeClock
) -> None:
    pk = table.add()
    old = table.claim(worker="w1")
    fake_clock.advance(LEASE.total_seconds() - 0.000001)
    assert table.claim(worker="w2").messages == []

    fake_clock.advance(0.000001)  # the lease ends now: the row is due
    new = table.claim(worker="w2")

    assert [m.pk for m in new.messages] == [pk]
    state = table.state(pk)
    assert (state["lock_token"], state["locked_by"], state["attempt_count"]) == (
        new.token,
        "w2",
        2,
    )
    assert settle.ack([pk], old.token, model=table.model) == 0
    assert settle.ack([pk], new.token, model=table.model) == 1


def live_worker(name: str, *, alive: bool = True, stopped: bool = False) -> None:
    """A worker's heartbeat row, whose promise holds (``alive``) or has passed."""
    from django_delayq.models import WorkerState

    now = clock.now()
    WorkerState.objects.update_or_create(
        name=name,
        defaults={
            "host": "h",
            "pid": 1,
            "started_at": now,
            "last_seen": now,
            "alive_until": now + timedelta(seconds=15 if alive else -1),
            "stopped_at": now if stopped else None,
        },
    )


def test_claim_never_takes_a_running_row_from_a_live_worker(
    table: Table, fake_clock: FakeClock
) -> None:
    """Its lease passed (its keeper could not extend it: another transaction held the
    row), but its worker's heartbeat is fresh: the row stays that worker's."""
    table.add()
    live_worker("w1")
    table.claim(worker="w1")
    fake_clock.advance(LEASE.total_seconds() + 1)
    live_worker("w1")  # it is still beating
    assert table.claim(worker="w2").messages == []


def test_claim_takes_back_a_running_row_of_a_worker_of_an_older_version_gone_silent(
    table: Table, fake_clock: FakeClock
) -> None:
    """A worker that promises nothing (``alive_until`` empty) is live while it beats."""
    from django_delayq.conf import get_config
    from django_delayq.models import WorkerState

    pk = table.add()
    live_worker("w1")
    table.claim(worker="w1")
    fake_clock.advance(LEASE.total_seconds() + 1)
    WorkerState.objects.filter(name="w1").update(alive_until=None, last_seen=clock.now())
    assert table.claim(worker="w2").messages == []
    fake_clock.advance(get_config()["WORKER_DEAD_AFTER"].total_seconds() + 1)
    assert [m.pk for m in table.claim(worker="w2").messages] == [pk]


@pytest.mark.parametrize("how", ["silent", "stopped", "unknown"])
def test_claim_takes_a_running_row_back_from_a_gone_worker_once_its_lease_passed(
    table: Table, fake_clock: FakeClock, how: str
) -> None:
    pk = table.add()
    if how != "unknown":
        live_worker("w1")
    table.claim(worker="w1")
    fake_clock.advance(LEASE.total_seconds() + 1)
    if how == "silent":
        live_worker("w1", alive=False)  # its last heartbeat's promise passed
    elif how == "stopped":
        live_worker("w1", stopped=True)
    assert [m.pk for m in table.claim(worker="w2").messages] == [pk]


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_claim_on_sqlite_takes_nothing_from_a_live_process_of_this_host(
    table: Table, fake_clock: FakeClock, stopped: bool
) -> None:
    """SQLite: no heartbeat is written while a transaction holds the database's write
    lock, so the operating system says which workers live; a worker that stopped
    cleanly said so."""
    import os
    import socket

    if connection.vendor != "sqlite":
        pytest.skip("every SQLite worker runs on the host that has the file")
    pk = table.add()
    me = f"{socket.gethostname()}:{os.getpid()}"
    live_worker(me, alive=False, stopped=stopped)  # its promise passed long ago
    table.claim(worker=me)
    fake_clock.advance(timedelta(days=1).total_seconds())
    taken = [m.pk for m in table.claim(worker="w2").messages]
    assert taken == ([pk] if stopped else [])


def test_claim_never_takes_a_row_twice(table: Table, fake_clock: FakeClock) -> None:
    rows = {table.add() for _ in range(5)}
    first = {m.pk for m in table.claim(2).messages}
    second = {m.pk for m in table.claim(10).messages}
    assert len(first) == 2 and first.isdisjoint(second) and first | second == rows
    assert table.claim(10).messages == []


def test_claim_of_a_superseded_row_starts_the_new_versions_first_attempt(
    fake_clock: FakeClock,
) -> None:
    pk = superseded_message(fake_clock)
    fake_clock.current = MESSAGE.state(pk)["scheduled_time"]  # the lease ran out long before
    claimed = MESSAGE.claim()
    assert [m.pk for m in claimed.messages] == [pk]
    state = MESSAGE.state(pk)
    assert (state["attempt_count"], state["superseded_at"]) == (1, None)
    assert state["payload"] == {"v": 2}


HOUR = timedelta(hours=1)


def _update_to_an_hour_later(how: str) -> None:
    if how == "enqueue":
        enqueue("q", {"v": 2}, key="k", delay=HOUR, on_conflict="update")
    else:
        (result,) = enqueue_many("q", [{"v": 2}], keys=["k"], delay=HOUR, on_conflict="update")
        assert result.outcome == "updated"


@pytest.mark.parametrize("how", ["enqueue", "enqueue_many"])
def test_a_lapsed_lease_does_not_run_the_newer_version_before_its_due_time(
    how: str, fake_clock: FakeClock
) -> None:
    """The worker running version 1 is killed; its lease lapses long before version 2
    is due. The claim must wait for version 2's own time, as every other way out of
    the attempt (an outcome, a shutdown, a dead worker's release) does."""
    pk = enqueue("q", {"v": 1}, key="k").message.pk
    assert [m.pk for m in MESSAGE.claim(lease=timedelta(seconds=5)).messages] == [pk]
    fake_clock.advance(1)
    _update_to_an_hour_later(how)
    due = clock.now() + HOUR
    fake_clock.advance(10)  # the lease has lapsed (the worker was SIGKILLed)

    assert MESSAGE.claim().messages == []
    # An idle worker sleeps until then rather than waking for the lapsed lease.
    assert queries.next_due(Message, ["q"], using="default") == due
    fake_clock.current = due - timedelta(microseconds=1)
    assert MESSAGE.claim().messages == []

    fake_clock.current = due
    claimed = MESSAGE.claim()
    assert [m.pk for m in claimed.messages] == [pk]
    state = MESSAGE.state(pk)
    assert (state["payload"], state["attempt_count"], state["superseded_at"]) == (
        {"v": 2},
        1,
        None,
    )


def test_an_update_sooner_than_the_lease_keeps_the_running_attempts_lease(
    fake_clock: FakeClock,
) -> None:
    pk = enqueue("q", {"v": 1}, key="k").message.pk
    lease_end = MESSAGE.claim().messages[0].next_attempt_time
    enqueue("q", {"v": 2}, key="k", on_conflict="update")  # due now: after the attempt
    assert MESSAGE.state(pk)["next_attempt_time"] == lease_end
    fake_clock.current = lease_end - timedelta(microseconds=1)
    assert MESSAGE.claim().messages == []
    fake_clock.current = lease_end
    assert [m.pk for m in MESSAGE.claim().messages] == [pk]


@pytest.mark.django_db(transaction=True)
def test_claim_skips_the_rows_another_open_transaction_claimed() -> None:
    """Two claimers never wait for each other, nor take the same row."""
    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip("one writer at a time: claims are serialised by the database")
    rows = {MESSAGE.add(due=datetime(2000, 1, 1, tzinfo=UTC)) for _ in range(5)}
    with transaction.atomic():
        mine = MESSAGE.claim(2)
        theirs = finishes_within(20, in_thread(lambda: MESSAGE.claim(10)))
    assert len(mine.messages) == 2
    assert {m.pk for m in mine.messages}.isdisjoint({m.pk for m in theirs.messages})
    assert {m.pk for m in mine.messages} | {m.pk for m in theirs.messages} == rows


# Statements compiled once while the clock is the database's: the claim and
# the acknowledgement keep their compiled SQL between calls (the tests above
# replace the clock, which turns that off); what is kept must still follow
# each call's worker, lease and table.


def test_a_claim_compiled_once_still_takes_each_workers_name_and_lease() -> None:
    a, b, c = (MESSAGE.add(due=LONG_AGO + timedelta(seconds=i)) for i in range(3))
    for pk, worker, seconds in ((a, "w1", 30), (b, "w2", 90), (c, "w1", 30)):
        MESSAGE.claim(1, worker=worker, lease=timedelta(seconds=seconds))
        state = MESSAGE.state(pk)
        assert state["locked_by"] == worker
        assert state["next_attempt_time"] - state["last_attempt_time"] == timedelta(seconds=seconds)


def test_forget_compiled_claims_compiles_the_next_claim_again(settings: Any) -> None:
    MESSAGE.claim(1)
    if can().limit_in_subquery:
        assert claim._claim_statements  # kept by the claim
    claim._claim_statements[None] = ("stale", (), ())  # type: ignore[index]
    claim.forget_compiled_claims()
    assert not claim._claim_statements
    claim._claim_statements[None] = ("stale", (), ())  # type: ignore[index]
    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 1}  # any change of DELAYQ
    assert not claim._claim_statements


# -- a claim from a floor (worker/floors.py) -----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_claim_from_a_floor_takes_no_row_due_before_it_on_postgresql():
    """Elsewhere ``since`` is ignored: every due row is taken, as before."""
    moment = clock.now()
    early = enqueue("default", {"n": 1}).message
    late = enqueue("default", {"n": 2}).message
    Message.objects.filter(pk=early.pk).update(next_attempt_time=moment - timedelta(seconds=5))
    Message.objects.filter(pk=late.pk).update(next_attempt_time=moment - timedelta(seconds=1))
    floor = moment - timedelta(seconds=2)
    assert claim.claimable_below(["default"], floor)
    assert not claim.claimable_below(["other"], floor)
    taken = claim.claim(["default"], 10, worker="w", lease=LEASE, since=floor)
    if connection.vendor != "postgresql":
        assert {m.pk for m in taken.messages} == {early.pk, late.pk}
        assert not claim.claimable_below(["default"], floor)
        return
    assert [m.pk for m in taken.messages] == [late.pk]
    assert claim.claimable_below(["default"], floor)
    # From the beginning: the row below it.
    taken = claim.claim(["default"], 10, worker="w", lease=LEASE)
    assert [m.pk for m in taken.messages] == [early.pk]
    assert not claim.claimable_below(["default"], floor)


@pytest.mark.django_db(transaction=True)
def test_a_claim_from_a_floor_over_several_queues_bounds_each(fake_clock: FakeClock):
    """The pick of several queues (one lane each, joined) bounds every one of them,
    with the test clock as with the database's."""
    moment = clock.now()
    rows = {
        (queue, age): enqueue(queue, {"q": queue, "age": age}).message
        for queue in ("default", "other")
        for age in (5, 1)
    }
    for (_, age), row in rows.items():
        Message.objects.filter(pk=row.pk).update(next_attempt_time=moment - timedelta(seconds=age))
    taken = claim.claim(
        ["default", "other"], 10, worker="w", lease=LEASE, since=moment - timedelta(seconds=2)
    )
    expected = {row.pk for (_, age), row in rows.items() if age == 1}
    if connection.vendor != "postgresql":
        expected = {row.pk for row in rows.values()}
    assert {m.pk for m in taken.messages} == expected
