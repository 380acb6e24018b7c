"""The contract of ``store/changes.py``: every state change, on every database.

One section per function. Tests that take the ``table`` fixture run on
``Message`` and on the test app's ``QueueFields`` model (``Shipment``), the
two kinds of table every change serves. Times are the test clock's
(``fake_clock``), which is also the clock the store writes into its
statements; one test checks the database's own clock.
"""

from __future__ import annotations

import inspect
import re
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_delayq import clock, enqueue, enqueue_many
from django_delayq.fingerprint import fingerprint
from django_delayq.models import Message
from django_delayq.store import changes, queries, sql
from tests.conftest import FakeClock, finishes_within
from tests.store.tables import LEASE, Table, analyze, at, can, copies, subset
from tests.testapp.models import Shipment

pytestmark = pytest.mark.django_db

MESSAGE = Table(Message)
SHIPMENT = Table(Shipment)
FINISHED = ("succeeded", "failed", "cancelled")


def test_every_public_function_of_changes_has_a_test_here() -> None:
    """This file is the contract of the module: a new change needs its tests here."""
    source = Path(__file__).read_text()
    public = [
        name
        for name, value in vars(changes).items()
        if inspect.isfunction(value)
        and value.__module__ == changes.__name__
        and not name.startswith("_")
    ]
    assert len(public) > 20
    untested = [name for name in public if f"changes.{name}(" not in source]
    assert not untested


# -- fit, has_column, claim_order ----------------------------------------------------


def test_fit_keeps_only_the_columns_the_table_has() -> None:
    wanted = {"status": "pending", "updated_at": 1, "finished_at": 2, "priority": 3, "nope": 4}
    assert changes.fit(Message, wanted) == {
        "status": "pending",
        "updated_at": 1,
        "finished_at": 2,
        "priority": 3,
    }
    assert changes.fit(Shipment, wanted) == {"status": "pending", "priority": 3}
    assert changes.has_column(Message, "superseded_at")
    assert not changes.has_column(Shipment, "superseded_at")


def test_claim_order_is_priority_first_where_the_table_has_a_priority() -> None:
    assert changes.claim_order(Message) == ("-priority", "next_attempt_time")
    assert changes.claim_order(Shipment) == ("-priority", "next_attempt_time")


# -- claim -----------------------------------------------------------------------------


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

    changes.claim(["q", "r"], 10, worker="w", lease=timedelta(seconds=10), leases=leases)

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
    assert changes.ack([pk], old.token, model=table.model) == 0
    assert changes.ack([pk], new.token, model=table.model) == 1


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


def in_thread(function: Callable[[], Any]) -> Callable[[], Any]:
    """``function`` for another thread: on its own connection, closed afterwards."""

    def run() -> Any:
        try:
            return function()
        finally:
            connections.close_all()

    return run


# -- the outcomes of a claimed row: compare-and-set on (id, token, running) ---------

RETRY_IN = timedelta(seconds=7)
RETRY_AT = timedelta(minutes=5)
SNOOZE = timedelta(seconds=9)
EXTENDED = timedelta(seconds=90)

Settle = Callable[[Any, uuid.UUID, Table], int]

SETTLES: dict[str, Settle] = {
    "ack": lambda pk, token, t: changes.ack([pk], token, model=t.model),
    "ack_held": lambda pk, token, t: len(changes.ack_held({token: [pk]}, model=t.model)),
    "fail_retry_in": lambda pk, token, t: changes.fail(
        pk, token, error="boom 1", traceback="tb", retry_at=None, retry_in=RETRY_IN, model=t.model
    ),
    "fail_retry_at": lambda pk, token, t: changes.fail(
        pk, token, error="boom 1", traceback="tb", retry_at=clock.now() + RETRY_AT, model=t.model
    ),
    "fail_final": lambda pk, token, t: changes.fail(
        pk, token, error="boom 1", traceback="tb", retry_at=None, model=t.model
    ),
    "snooze_delay": lambda pk, token, t: changes.snooze(
        pk, token, run_at=SNOOZE, max_attempts=8, model=t.model
    ),
    "snooze_until": lambda pk, token, t: changes.snooze(
        pk, token, run_at=clock.now() + SNOOZE, max_attempts=8, model=t.model
    ),
    "release_started": lambda pk, token, t: changes.release(
        [pk], token, started=True, model=t.model
    ),
    "release_unstarted": lambda pk, token, t: changes.release(
        [pk], token, started=False, model=t.model
    ),
    "extend": lambda pk, token, t: len(changes.extend([pk], token, EXTENDED, model=t.model)),
}


def settled(op: str, now: datetime) -> dict[str, Any]:
    """What ``op`` leaves on a row claimed once (attempt 1), at ``now``."""
    failed = {
        "last_error": "boom 1",
        "last_traceback": "tb",
        "error_fingerprint": fingerprint("boom 1"),
        "lock_token": None,
        "attempt_count": 1,
        "finished_at": None,
    }
    pending = {"status": "pending", "lock_token": None, "finished_at": None, "attempt_count": 1}
    outcome = {
        "ack": {"status": "succeeded", "next_attempt_time": None, "lock_token": None}
        | {"finished_at": now, "attempt_count": 1},
        "fail_retry_in": failed | {"status": "pending", "next_attempt_time": now + RETRY_IN},
        "fail_retry_at": failed | {"status": "pending", "next_attempt_time": now + RETRY_AT},
        "fail_final": failed | {"status": "failed", "next_attempt_time": None, "finished_at": now},
        "snooze_delay": pending | {"next_attempt_time": now + SNOOZE, "max_attempts": 8},
        "snooze_until": pending | {"next_attempt_time": now + SNOOZE, "max_attempts": 8},
        "release_started": pending | {"next_attempt_time": now},
        "release_unstarted": pending | {"next_attempt_time": now, "attempt_count": 0},
        "extend": {"status": "running", "next_attempt_time": now + EXTENDED, "attempt_count": 1},
    }
    outcome["ack_held"] = outcome["ack"]
    return outcome[op] | {"updated_at": now}


@pytest.mark.parametrize("op", SETTLES)
def test_a_settling_change_with_the_rows_token_changes_it(
    op: str, table: Table, fake_clock: FakeClock
) -> None:
    pk = table.add()
    bystander = table.add(due=at(1))
    claimed = table.claim(1)
    assert [m.pk for m in claimed.messages] == [pk]
    untouched = table.state(bystander)
    now = fake_clock.advance(1)

    assert SETTLES[op](pk, claimed.token, table) == 1

    expected = table.expect(settled(op, now))
    assert subset(table.state(pk), expected) == expected
    if op == "extend":
        assert table.state(pk)["lock_token"] == claimed.token
    assert table.state(bystander) == untouched


@pytest.mark.parametrize("wrong", ["stale", "forged", "not_running"])
@pytest.mark.parametrize("op", SETTLES)
def test_a_settling_change_with_a_token_the_row_does_not_carry_changes_nothing(
    op: str, wrong: str, table: Table, fake_clock: FakeClock
) -> None:
    pk = table.add()
    token = table.claim().token
    if wrong == "stale":
        # The lease ran out and another worker claimed the row.
        fake_clock.advance(LEASE.total_seconds() + 1)
        assert [m.pk for m in table.claim(worker="other").messages] == [pk]
    elif wrong == "forged":
        token = uuid.uuid4()
    else:
        # The token is on the row but the row is no longer running.
        table.set(pk, status="pending")
    before = table.state(pk)
    fake_clock.advance(1)

    assert SETTLES[op](pk, token, table) == 0
    assert table.state(pk) == before


def test_ack_counts_only_the_rows_still_held(table: Table, fake_clock: FakeClock) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    mine = table.claim(2)
    theirs = table.claim(1)
    assert [m.pk for m in theirs.messages] == [c]

    assert changes.ack([a, b, c], mine.token, model=table.model) == 2

    assert [table.state(pk)["status"] for pk in (a, b, c)] == ["succeeded", "succeeded", "running"]
    assert changes.ack([], mine.token, model=table.model) == 0


def test_ack_held_returns_the_pairs_still_held_across_tokens(
    table: Table, fake_clock: FakeClock
) -> None:
    a, b = table.add(), table.add()
    first = table.claim(2)
    fake_clock.advance(10)
    assert changes.extend([b], first.token, LEASE, model=table.model) == {b}
    fake_clock.advance(LEASE.total_seconds() - 9)
    retaken = table.claim(1)  # a again (b's lease still runs), under a new token
    assert [m.pk for m in retaken.messages] == [a]
    c = table.add()
    second = table.claim(1)
    assert [m.pk for m in second.messages] == [c]

    acked = changes.ack_held({first.token: [a, b], second.token: [c]}, model=table.model)

    assert acked == {(b, first.token), (c, second.token)}
    assert table.state(a)["status"] == "running"
    assert table.state(a)["lock_token"] == retaken.token
    assert changes.ack_held({}, model=table.model) == set()


def test_ack_held_acknowledges_only_the_attempt_whose_token_the_row_carries(
    table: Table, fake_clock: FakeClock
) -> None:
    """A worker may hold one row under two tokens: it claimed it again after its lease."""
    pk = table.add()
    old = table.claim()
    fake_clock.advance(LEASE.total_seconds() + 1)
    new = table.claim()
    assert [m.pk for m in new.messages] == [pk]

    acked = changes.ack_held({old.token: [pk], new.token: [pk]}, model=table.model)

    assert acked == {(pk, new.token)}
    assert table.state(pk)["status"] == "succeeded"


def test_states_tell_a_held_row_from_one_ended_by_its_attempt_and_one_claimed_again(
    table: Table, fake_clock: FakeClock
) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    mine = table.claim(3)
    attempted = {m.pk: m.last_attempt_time for m in mine.messages}
    assert changes.ack([b], mine.token, model=table.model) == 1
    # Claimed again by another worker: a new token, a new attempt time.
    table.set(c, lock_token=uuid.uuid4(), last_attempt_time=fake_clock.advance(1))

    found = changes.states([a, b, c, max(a, b, c) + 1000], model=table.model)

    assert set(found) == {a, b, c}
    assert found[a].holds(mine.token) and not found[a].ended(mine.token, attempted[a])
    assert not found[b].holds(mine.token) and found[b].ended(mine.token, attempted[b])
    # Claimed again: another attempt's, neither held nor ended by this one.
    assert not found[c].holds(mine.token) and not found[c].ended(mine.token, attempted[c])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("op", ["ack", "ack_held", "ack_held_pairs", "fail", "snooze"])
def test_an_outcome_that_skips_locked_rows_neither_waits_nor_writes_them(op: str) -> None:
    """The worker's outcomes never queue behind a producer's lock on the row: they
    change nothing and report nothing written (the caller tries again later)."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks")
    a, b = MESSAGE.add(due=at(-2)), MESSAGE.add(due=at(-1))
    first = MESSAGE.claim(1)
    second = MESSAGE.claim(1)
    write: dict[str, Callable[[], Any]] = {
        "ack": lambda: changes.ack([a], first.token, skip_locked=True),
        "ack_held": lambda: changes.ack_held({first.token: [a]}, skip_locked=True),
        "ack_held_pairs": lambda: changes.ack_held(
            {first.token: [a], second.token: [b]}, skip_locked=True
        ),
        "fail": lambda: changes.fail(
            a, first.token, error="e", retry_at=None, retry_in=RETRY_IN, skip_locked=True
        ),
        "snooze": lambda: changes.snooze(
            a, first.token, run_at=SNOOZE, max_attempts=5, skip_locked=True
        ),
    }
    with transaction.atomic():
        Message.objects.select_for_update().get(pk=a)
        result = finishes_within(20, in_thread(write[op]))
    assert result in (0, set(), {(b, second.token)})
    assert MESSAGE.state(a)["status"] == "running"
    assert MESSAGE.state(a)["lock_token"] == first.token
    assert write[op]() in (1, {(a, first.token)}, {(a, first.token), (b, second.token)})


@pytest.mark.django_db(transaction=True)
def test_migration_0011_creates_the_holder_function_and_reverses() -> None:
    from django.core.management import call_command

    from django_delayq.store.features import features

    def exists() -> bool:
        if connection.vendor != "postgresql":
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'delayq_holder_gone'")
            return bool(cursor.fetchone()[0])

    assert exists() == features(connection).group_function
    try:
        call_command("migrate", "django_delayq", "0010", verbosity=0)
        assert not exists()
        changes.install_holder_function(connection)
        assert exists() == features(connection).group_function
        changes.install_holder_function(connection, remove=True)
        assert not exists()
    finally:
        call_command("migrate", "django_delayq", verbosity=0)
    assert exists() == features(connection).group_function


def test_release_of_an_unstarted_claim_never_takes_attempts_below_zero(
    table: Table, fake_clock: FakeClock
) -> None:
    pk = table.add()
    token = table.claim().token
    table.set(pk, attempt_count=0)
    assert changes.release([pk], token, started=False, model=table.model) == 1
    assert table.state(pk)["attempt_count"] == 0


def test_release_counts_only_the_rows_still_held(table: Table, fake_clock: FakeClock) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    mine = table.claim(2)
    table.claim(1)
    assert changes.release([a, b, c], mine.token, started=True, model=table.model) == 2
    assert table.state(c)["status"] == "running"


def test_extend_returns_exactly_the_ids_it_extended(table: Table, fake_clock: FakeClock) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    d = table.add(due=at(60))
    mine = table.claim(2)
    theirs = table.claim(1)
    assert [m.pk for m in theirs.messages] == [c]
    their_lease = table.state(c)["next_attempt_time"]
    missing = max(a, b, c, d) + 1000
    now = fake_clock.advance(10)

    extended = changes.extend([a, b, c, d, missing], mine.token, EXTENDED, model=table.model)

    assert extended == {a, b}
    assert table.state(a)["next_attempt_time"] == now + EXTENDED
    assert table.state(c)["next_attempt_time"] == their_lease
    assert table.state(d)["status"] == "pending"
    assert changes.extend([], mine.token, EXTENDED, model=table.model) == set()


def test_fail_records_the_error_and_its_fingerprint(fake_clock: FakeClock) -> None:
    pk = MESSAGE.add()
    token = MESSAGE.claim().token
    error = "app.Error: order 12345 not found"
    changes.fail(pk, token, error=error, retry_at=None, retry_in=RETRY_IN)
    state = MESSAGE.state(pk)
    assert (state["last_error"], state["error_fingerprint"]) == (error, fingerprint(error))
    assert state["error_fingerprint"] == fingerprint("app.Error: order 678 not found")


@pytest.mark.django_db(transaction=True)
def test_housekeeping_skips_a_row_another_transaction_locked_without_waiting() -> None:
    """The lease keeper (extend) and shutdown (release, fail with skip_locked) never
    wait for a group of atomic handlers that still holds a row."""
    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip("no row locks: one writer at a time")
    locked, free = (MESSAGE.add(due=datetime(2000, 1, 1, tzinfo=UTC)) for _ in range(2))
    token = MESSAGE.claim().token
    release_skips = can().skip_locked_subquery
    with transaction.atomic():
        Message.objects.select_for_update().get(pk=locked)

        def housekeeping() -> tuple[Any, ...]:
            extended = changes.extend([locked, free], token, EXTENDED)
            if not release_skips:
                return (extended,)
            failed = changes.fail(locked, token, error="x", retry_at=None, skip_locked=True)
            released = changes.release([locked, free], token, started=True)
            return extended, failed, released

        done = finishes_within(20, in_thread(housekeeping))
    assert done[0] == {free}
    if release_skips:
        assert done[1:] == (0, 1)
        assert MESSAGE.state(free)["status"] == "pending"
    assert MESSAGE.state(locked)["status"] == "running"
    assert MESSAGE.state(locked)["lock_token"] == token


# -- a newer version waiting (enqueue with on_conflict="update" while running) ------


def superseded_message(fake_clock: FakeClock) -> int:
    """A message running attempt 1 whose newer version (due in a minute) waits."""
    first = enqueue("q", {"v": 1}, key="k", max_attempts=3)
    claimed = MESSAGE.claim()
    assert [m.pk for m in claimed.messages] == [first.message.pk]
    fake_clock.advance(1)
    newer = enqueue(
        "q", {"v": 2}, key="k", run_at=at(60), max_attempts=4, priority=2, on_conflict="update"
    )
    assert newer.outcome == "updated"
    state = MESSAGE.state(first.message.pk)
    assert (state["status"], state["superseded_at"]) == ("running", clock.now())
    assert state["lock_token"] == claimed.token
    return first.message.pk


def newer_version(state: dict[str, Any], now: datetime) -> dict[str, Any]:
    return {
        "status": "pending",
        "next_attempt_time": state["scheduled_time"],
        "attempt_count": 0,
        "max_attempts": 4,
        "superseded_at": None,
        "finished_at": None,
        "lock_token": None,
        "payload": {"v": 2},
        "priority": 2,
        "updated_at": now,
    }


@pytest.mark.parametrize("op", [op for op in SETTLES if op != "extend"])
def test_every_end_of_a_superseded_attempt_leaves_the_new_version_due(
    op: str, fake_clock: FakeClock
) -> None:
    pk = superseded_message(fake_clock)
    token = MESSAGE.state(pk)["lock_token"]
    now = fake_clock.advance(1)

    assert SETTLES[op](pk, token, MESSAGE) == 1

    state = MESSAGE.state(pk)
    expected = newer_version(state, now)
    assert state["scheduled_time"] == now + timedelta(seconds=59)
    assert subset(state, expected) == expected


def test_extending_a_superseded_attempt_keeps_the_new_version_waiting(
    fake_clock: FakeClock,
) -> None:
    pk = superseded_message(fake_clock)
    before = MESSAGE.state(pk)
    now = fake_clock.advance(1)
    assert changes.extend([pk], before["lock_token"], EXTENDED) == {pk}
    state = MESSAGE.state(pk)
    assert (state["status"], state["superseded_at"]) == ("running", before["superseded_at"])
    assert state["next_attempt_time"] == now + EXTENDED


def test_extending_a_superseded_attempt_never_brings_the_new_version_forward(
    fake_clock: FakeClock,
) -> None:
    """A lease shorter than the wait for the new version: the keeper's extension must
    leave the row claimable at the new version's time, not when the lease ends."""
    pk = superseded_message(fake_clock)
    before = MESSAGE.state(pk)
    fake_clock.advance(1)
    assert changes.extend([pk], before["lock_token"], timedelta(seconds=5)) == {pk}
    assert MESSAGE.state(pk)["next_attempt_time"] == before["scheduled_time"]
    fake_clock.advance(10)  # the worker died after the extension
    assert MESSAGE.claim().messages == []
    fake_clock.current = before["scheduled_time"]
    assert [m.pk for m in MESSAGE.claim().messages] == [pk]


def test_releasing_a_dead_workers_superseded_row_leaves_the_new_version_due(
    fake_clock: FakeClock,
) -> None:
    pk = superseded_message(fake_clock)
    now = fake_clock.advance(1)
    assert changes.release_workers(["w"]) == {"w": 1}
    state = MESSAGE.state(pk)
    expected = newer_version(state, now)
    assert subset(state, expected) == expected


# -- statements compiled once while the clock is the database's ---------------------
#
# The claim and the acknowledgement keep their compiled SQL between calls (the
# tests above replace the clock, which turns that off): what is kept must still
# follow each call's worker, lease and table.

LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


def test_a_claim_compiled_once_still_takes_each_workers_name_and_lease() -> None:
    a, b, c = (MESSAGE.add(due=LONG_AGO + timedelta(seconds=i)) for i in range(3))
    for pk, worker, seconds in ((a, "w1", 30), (b, "w2", 90), (c, "w1", 30)):
        MESSAGE.claim(1, worker=worker, lease=timedelta(seconds=seconds))
        state = MESSAGE.state(pk)
        assert state["locked_by"] == worker
        assert state["next_attempt_time"] - state["last_attempt_time"] == timedelta(seconds=seconds)


def test_an_extension_compiled_once_still_writes_each_lease() -> None:
    pk = MESSAGE.add(due=LONG_AGO)
    token = MESSAGE.claim().token
    leases = []
    for seconds in (600, 600, 6000):
        assert changes.extend([pk], token, timedelta(seconds=seconds)) == {pk}
        leases.append(MESSAGE.state(pk)["next_attempt_time"])
    assert timedelta(0) <= leases[1] - leases[0] < timedelta(seconds=60)
    assert timedelta(seconds=5340) < leases[2] - leases[1] < timedelta(seconds=5460)


def test_an_acknowledgement_compiled_once_serves_each_table() -> None:
    for table in (MESSAGE, SHIPMENT, MESSAGE, SHIPMENT):
        pk = table.add(due=LONG_AGO)
        token = table.claim().token
        assert changes.ack([pk], token, model=table.model) == 1
        assert table.state(pk)["status"] == "succeeded"


# -- held_ids, write_payload -------------------------------------------------------


def test_held_ids_are_the_ids_still_running_under_the_token(
    table: Table, fake_clock: FakeClock
) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    mine = table.claim(2)
    table.claim(1)
    changes.ack([b], mine.token, model=table.model)
    with CaptureQueriesContext(connection) as queries:
        held = changes.held_ids([a, b, c], mine.token, model=table.model)
    assert held == {a}
    assert not any("FOR UPDATE" in q["sql"].upper() for q in queries)


def test_write_payload_replaces_the_payload_of_a_row_still_held(fake_clock: FakeClock) -> None:
    pk = MESSAGE.add(payload={"call": 1})
    token = MESSAGE.claim().token
    now = fake_clock.advance(1)

    assert changes.write_payload(pk, token, {"call": 1, "result": [1, "two"]}) == 1
    state = MESSAGE.state(pk)
    assert (state["payload"], state["status"], state["updated_at"]) == (
        {"call": 1, "result": [1, "two"]},
        "running",
        now,
    )
    assert changes.write_payload(pk, token, None) == 1
    assert MESSAGE.state(pk)["payload"] is None  # JSON null: the column is NOT NULL

    assert changes.write_payload(pk, uuid.uuid4(), {"forged": True}) == 0
    changes.ack([pk], token)
    assert changes.write_payload(pk, token, {"late": True}) == 0
    assert MESSAGE.state(pk)["payload"] is None


# -- release_workers ---------------------------------------------------------------


def test_release_workers_hands_back_only_the_named_workers_running_rows(
    fake_clock: FakeClock,
) -> None:
    dead_1, dead_2 = MESSAGE.add(), MESSAGE.add()
    dead = MESSAGE.claim(2, worker="dead")
    alive = MESSAGE.add()
    MESSAGE.claim(1, worker="alive")
    finished = MESSAGE.add()
    MESSAGE.claim(1, worker="dead")
    waiting = MESSAGE.add(locked_by="dead")  # pending, from an earlier attempt
    changes.ack([finished], MESSAGE.state(finished)["lock_token"])
    before = {pk: MESSAGE.state(pk) for pk in (alive, finished, waiting)}
    now = fake_clock.advance(1)

    released = changes.release_workers(["dead", "gone"])

    assert released == {"dead": 2}
    for pk in (dead_1, dead_2):
        state = MESSAGE.state(pk)
        expected = {
            "status": "pending",
            "next_attempt_time": now,
            "lock_token": None,
            "attempt_count": 1,  # the attempt was spent
            "updated_at": now,
        }
        assert subset(state, expected) == expected
    assert {pk: MESSAGE.state(pk) for pk in before} == before
    # The "dead" worker, if it was only frozen, is fenced off.
    assert changes.ack([dead_1], dead.token) == 0
    assert changes.release_workers([]) == {}


# -- operators' changes: exactly the rows of the queryset ------------------------------


def chosen(table: Table, pks: list[Any]) -> Any:
    return table.objects().filter(pk__in=pks)


def test_run_now_makes_the_querysets_rows_due(table: Table, fake_clock: FakeClock) -> None:
    a, b, other = table.add(due=at(3600)), table.add(due=at(60)), table.add(due=at(3600))
    before = table.state(other)
    now = fake_clock.advance(1)

    assert changes.run_now(chosen(table, [a, b]), now) == 2

    for pk in (a, b):
        expected = table.expect({"next_attempt_time": now, "updated_at": now, "status": "pending"})
        assert subset(table.state(pk), expected) == expected
    assert table.state(other) == before


def test_run_now_takes_the_database_clock_as_an_expression(table: Table) -> None:
    pk = table.add(due=datetime(2999, 1, 1, tzinfo=UTC))
    before = datetime.now(UTC)
    assert changes.run_now(chosen(table, [pk]), clock.sql_now()) == 1
    due = table.state(pk)["next_attempt_time"]
    assert before - timedelta(seconds=5) <= due <= datetime.now(UTC) + timedelta(seconds=5)


def test_retry_sends_the_querysets_rows_back_with_more_attempts(
    table: Table, fake_clock: FakeClock
) -> None:
    finished = {"due": None, "attempt_count": 3, "last_error": "x"}
    a = table.add(status="failed", **finished)
    b = table.add(status="cancelled", **finished)
    other = table.add(status="failed", **finished)
    if table.has("finished_at"):
        table.set(a, finished_at=clock.now())
    before = table.state(other)
    now = fake_clock.advance(1)

    assert changes.retry(chosen(table, [a, b]), 2, now) == 2

    for pk in (a, b):
        expected = table.expect(
            {
                "status": "pending",
                "next_attempt_time": now,
                "max_attempts": 5,
                "attempt_count": 3,
                "finished_at": None,
                "lock_token": None,
                "superseded_at": None,
                "updated_at": now,
            }
        )
        assert subset(table.state(pk), expected) == expected
    assert table.state(other) == before


def test_cancel_finishes_the_querysets_rows_and_fences_off_their_worker(
    table: Table, fake_clock: FakeClock
) -> None:
    held = table.add()
    token = table.claim(1).token
    waiting = table.add()
    other = table.add(due=at(1))
    before = table.state(other)
    now = fake_clock.advance(1)

    # No condition of its own: the caller chose these rows (a held one too).
    assert changes.cancel(chosen(table, [waiting, held]), now) == 2

    for pk in (waiting, held):
        expected = table.expect(
            {
                "status": "cancelled",
                "next_attempt_time": None,
                "finished_at": now,
                "lock_token": None,
                "superseded_at": None,
                "updated_at": now,
            }
        )
        assert subset(table.state(pk), expected) == expected
    assert table.state(other) == before
    assert changes.ack([held], token, model=table.model) == 0


def test_cancel_drops_a_waiting_newer_version(fake_clock: FakeClock) -> None:
    pk = superseded_message(fake_clock)
    assert changes.cancel(chosen(MESSAGE, [pk]), clock.now()) == 1
    state = MESSAGE.state(pk)
    assert (state["status"], state["superseded_at"]) == ("cancelled", None)


def test_reschedule_makes_the_querysets_rows_pending_at_the_time(
    table: Table, fake_clock: FakeClock
) -> None:
    a = table.add(status="failed", due=None, attempt_count=2)
    b = table.add(due=at(5))
    other = table.add(due=at(5))
    before = table.state(other)
    now = fake_clock.advance(1)
    when = now + timedelta(hours=2)

    assert changes.reschedule(chosen(table, [a, b]), when, now) == 2

    for pk, attempts in ((a, 2), (b, 0)):
        expected = table.expect(
            {
                "status": "pending",
                "next_attempt_time": when,
                "attempt_count": attempts,
                "lock_token": None,
                "updated_at": now,
            }
        )
        assert subset(table.state(pk), expected) == expected
    assert table.state(other) == before


def test_reprioritise_sets_the_priority_of_the_querysets_rows_only(
    table: Table, fake_clock: FakeClock
) -> None:
    a = table.add()
    held = table.add()
    other = table.add(due=at(1))
    table.claim(1)
    lease = {pk: table.state(pk)["next_attempt_time"] for pk in (a, held)}
    before = table.state(other)
    now = fake_clock.advance(1)

    assert changes.reprioritise(chosen(table, [a, held]), 9, now) == 2

    for pk in (a, held):
        state = table.state(pk)
        assert state["priority"] == 9
        assert state["next_attempt_time"] == lease[pk]  # the lease is untouched
        if table.has("updated_at"):
            assert state["updated_at"] == now
    assert table.state(other) == before


def test_delete_removes_the_querysets_rows_and_counts_them(
    table: Table, fake_clock: FakeClock
) -> None:
    a, b, other = table.add(), table.add(status="failed", due=None), table.add()
    assert changes.delete(chosen(table, [a, b])) == 2
    assert table.pks() == {other}
    assert changes.delete(chosen(table, [a])) == 0


# -- edit, replace_failed_payload ------------------------------------------------------


def test_edit_writes_only_the_named_columns(fake_clock: FakeClock) -> None:
    pk = MESSAGE.add(payload={"v": 1}, kind="old")
    message = Message.objects.get(pk=pk)
    message.payload = {"v": 2}
    message.kind = "not saved"
    MESSAGE.set(pk, attempt_count=4)  # a worker's change meanwhile
    now = fake_clock.advance(1)

    changes.edit(message, ["payload"])

    state = MESSAGE.state(pk)
    assert (state["payload"], state["kind"], state["attempt_count"], state["updated_at"]) == (
        {"v": 2},
        "old",
        4,
        now,
    )
    before = MESSAGE.state(pk)
    fake_clock.advance(1)
    with CaptureQueriesContext(connection) as queries:
        changes.edit(message, [])
    assert len(queries) == 0
    assert MESSAGE.state(pk) == before


@pytest.mark.parametrize("status", ["pending", "running", "failed"])
def test_edit_of_what_chooses_the_handler_leaves_a_running_message_alone(
    status: str, fake_clock: FakeClock
) -> None:
    """Moved to another kind while it runs, a message would free a place under its
    kind's global concurrency cap while its handler still runs."""
    pk = MESSAGE.add(status=status, kind="old", priority=1)
    message = Message.objects.get(pk=pk)
    message.kind, message.priority = "new", 5
    before = MESSAGE.state(pk)
    now = fake_clock.advance(1)
    if status == "running":
        with pytest.raises(changes.EditRefused, match="kind cannot change while it runs"):
            changes.edit(message, ["kind", "priority"])
        assert MESSAGE.state(pk) == before  # nothing written
        changes.edit(message, ["priority"])  # what does not choose the handler may change
        assert (MESSAGE.state(pk)["kind"], MESSAGE.state(pk)["priority"]) == ("old", 5)
        return
    changes.edit(message, ["kind", "priority"])
    state = MESSAGE.state(pk)
    assert (state["kind"], state["priority"], state["updated_at"]) == ("new", 5, now)
    assert changes.SCOPE_COLUMNS == {"queue", "kind"}


def test_replace_failed_payload_changes_a_failed_message_only(fake_clock: FakeClock) -> None:
    failed = MESSAGE.add(status="failed", due=None, payload={"v": 1})
    pending = MESSAGE.add(payload={"v": 1})
    now = fake_clock.advance(1)

    assert changes.replace_failed_payload(failed, {"v": 2}, using="default") is True
    assert changes.replace_failed_payload(pending, {"v": 2}, using="default") is False

    state = MESSAGE.state(failed)
    assert (state["payload"], state["status"], state["updated_at"]) == ({"v": 2}, "failed", now)
    assert MESSAGE.state(pending)["payload"] == {"v": 1}
    assert changes.replace_failed_payload(failed, None, using="default") is True
    assert MESSAGE.state(failed)["payload"] is None


# -- schedule, schedule_row, mark_scheduled (QueueFields models) ---------------------


def test_schedule_queues_every_selected_row_but_those_a_worker_holds(
    fake_clock: FakeClock,
) -> None:
    never = SHIPMENT.add(due=None)
    retrying = SHIPMENT.add(due=at(60), attempt_count=2, last_error="e")
    held = SHIPMENT.add()
    SHIPMENT.claim(1)
    expired = SHIPMENT.add(status="running", due=at(-1), lock_token=uuid.uuid4(), locked_by="w")
    done = {
        status: SHIPMENT.add(
            status=status, due=None, attempt_count=3, last_error="e", last_traceback="t"
        )
        for status in FINISHED
    }
    other = SHIPMENT.add(due=None)
    before = {pk: SHIPMENT.state(pk) for pk in (held, other)}
    when = at(300)

    selected = Shipment.objects.exclude(pk=other)
    assert changes.schedule(selected, when) == 3 + len(FINISHED)

    queued = {"status": "pending", "next_attempt_time": when, "lock_token": None, "locked_by": ""}
    for pk in (never, retrying, expired, *done.values()):
        assert subset(SHIPMENT.state(pk), queued) == queued
    # An active row keeps its round of attempts; a finished one starts a new one.
    assert subset(SHIPMENT.state(retrying), {"attempt_count": 2, "last_error": "e"}) == {
        "attempt_count": 2,
        "last_error": "e",
    }
    for pk in done.values():
        restarted = {"attempt_count": 0, "last_error": "", "last_traceback": ""}
        assert subset(SHIPMENT.state(pk), restarted) == restarted
    assert {pk: SHIPMENT.state(pk) for pk in before} == before


def test_schedule_row_saves_a_new_row_whole() -> None:
    row = Shipment(reference="new")
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert changes.schedule_row(row, when, using="default") is True
    state = SHIPMENT.state(row.pk)
    assert subset(state, {"reference": "new", "status": "pending", "next_attempt_time": when}) == {
        "reference": "new",
        "status": "pending",
        "next_attempt_time": when,
    }


def test_schedule_row_writes_only_the_queue_columns_of_an_existing_row(
    fake_clock: FakeClock,
) -> None:
    pk = SHIPMENT.add(status="succeeded", due=None, attempt_count=3, last_error="e")
    row = Shipment.objects.get(pk=pk)
    row.reference = "not saved"
    when = at(60)

    assert changes.schedule_row(row, when, using="default") is True

    state = SHIPMENT.state(pk)
    assert state["reference"] != "not saved"
    expected = {"status": "pending", "next_attempt_time": when, "attempt_count": 0}
    assert subset(state, expected) == expected
    assert (row.status, row.next_attempt_time, row.attempt_count) == ("pending", when, 0)


def test_schedule_row_refuses_a_row_a_worker_holds_or_that_is_gone(
    fake_clock: FakeClock,
) -> None:
    pk = SHIPMENT.add()
    SHIPMENT.claim()
    row = Shipment.objects.get(pk=pk)
    before = SHIPMENT.state(pk)

    assert changes.schedule_row(row, at(60), using="default") is False
    assert SHIPMENT.state(pk) == before
    assert row.status == "running"  # the instance is left as it was read

    Shipment.objects.filter(pk=pk).delete()
    assert changes.schedule_row(row, at(60), using="default") is False


def test_mark_scheduled_restarts_a_finished_row_and_keeps_an_active_rows_attempts() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    finished = Shipment(status="failed", attempt_count=3, last_error="e", locked_by="w")
    changes.mark_scheduled(finished, when)
    assert (finished.status, finished.attempt_count, finished.last_error) == ("pending", 0, "")
    assert (finished.next_attempt_time, finished.locked_by, finished.lock_token) == (when, "", None)

    retrying = Shipment(status="pending", attempt_count=2, last_error="e")
    changes.mark_scheduled(retrying, when)
    assert (retrying.attempt_count, retrying.last_error) == (2, "e")
    assert finished.pk is None  # nothing was saved


OWN_COLUMNS = ["reference", "priority", "fail", "sleep", "shipped_at"]


def test_plain_save_fields_are_a_rows_own_loaded_columns_and_what_was_marked_for_it() -> None:
    pk = SHIPMENT.add()
    row = Shipment.objects.get(pk=pk)
    assert changes.plain_save_fields(row) == OWN_COLUMNS
    assert changes.plain_save_fields(Shipment.objects.defer("sleep").get(pk=pk)) == [
        c for c in OWN_COLUMNS if c != "sleep"
    ]
    changes.mark_scheduled(row, at(5))
    marked = changes.plain_save_fields(row)
    assert set(marked) == {*OWN_COLUMNS, "status", "next_attempt_time", "lock_token", "locked_by"}
    changes.saved(row)
    assert changes.plain_save_fields(row) == OWN_COLUMNS
    row.status = "failed"
    changes.mark_scheduled(row, at(5))  # a finished row: its attempts start again
    assert {"attempt_count", "last_error", "last_traceback"} <= set(changes.plain_save_fields(row))
    assert set(changes.QUEUE_COLUMN_NAMES) == {f.name for f in Shipment._meta.concrete_fields} - {
        "id",
        *OWN_COLUMNS,
    }


# -- prune -------------------------------------------------------------------------------


def finished_message(status: str, finished_at: datetime, queue: str = "q") -> int:
    return MESSAGE.add(status=status, due=None, finished_at=finished_at, queue=queue)


def test_prune_deletes_finished_rows_that_finished_before_the_cutoff_only(
    fake_clock: FakeClock,
) -> None:
    cutoff = at(-3600)
    old = {finished_message(status, cutoff - timedelta(seconds=1)) for status in FINISHED}
    kept = {
        finished_message("succeeded", cutoff),  # at the cutoff: not before it
        finished_message("failed", at(0)),
        MESSAGE.add(finished_at=cutoff - timedelta(days=1)),  # pending: not finished
        MESSAGE.add(status="running", finished_at=cutoff - timedelta(days=1)),
    }

    assert changes.prune(cutoff, batch_size=100) == len(old)
    assert MESSAGE.pks() == kept


def test_prune_deletes_in_batches_up_to_max_batches(fake_clock: FakeClock) -> None:
    cutoff = at(0)
    for _ in range(5):
        finished_message("succeeded", at(-10))

    with CaptureQueriesContext(connection) as queries:
        assert changes.prune(cutoff, batch_size=2, max_batches=2) == 4
    assert len(MESSAGE.pks()) == 1
    deletes = [q for q in queries if q["sql"].lstrip().upper().startswith("DELETE")]
    assert len(deletes) == 2

    assert changes.prune(cutoff, batch_size=2) == 1
    assert MESSAGE.pks() == set()
    assert changes.prune(cutoff, batch_size=2) == 0


def test_prune_deletes_only_the_given_queues(fake_clock: FakeClock) -> None:
    a = finished_message("succeeded", at(-10), queue="a")
    b = finished_message("succeeded", at(-10), queue="b")
    c = finished_message("succeeded", at(-10), queue="c")
    assert changes.prune(at(0), batch_size=10, queues=["a", "c"]) == 2
    assert MESSAGE.pks() == {b}
    assert a not in MESSAGE.pks() and c not in MESSAGE.pks()


# -- the archive's delete (Spark pipeline) --------------------------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(moment: datetime | None) -> int | None:
    return None if moment is None else (moment - EPOCH) // timedelta(microseconds=1)


def archived(pk: int) -> tuple[Any, ...]:
    s = MESSAGE.state(pk)
    return (pk, s["status"], s["attempt_count"], micros(s["updated_at"]), micros(s["finished_at"]))


@pytest.fixture
def archive_rows(fake_clock: FakeClock) -> dict[str, tuple[Any, ...]]:
    """Finished rows as the archive read them, and how each changed since."""
    if not can().pipeline:
        pytest.skip("the archive runs on the pipeline's databases only")
    rows = {}
    for name in ("same", "updated", "retried", "other_attempt"):
        pk = finished_message("succeeded", at(-60))
        MESSAGE.set(pk, updated_at=at(-60), attempt_count=1)
        rows[name] = archived(pk)
    MESSAGE.set(rows["updated"][0], updated_at=at(0))
    MESSAGE.set(rows["retried"][0], status="pending", finished_at=None, next_attempt_time=at(0))
    MESSAGE.set(rows["other_attempt"][0], attempt_count=2)
    return rows


def test_archived_delete_deletes_only_rows_still_at_their_archived_version(
    archive_rows: dict[str, tuple[Any, ...]],
) -> None:
    statements = changes.archived_delete(connection)
    ids = [row[0] for row in archive_rows.values()]
    with connection.cursor() as cursor:
        if can().array_parameters:
            assert set(statements) == {"delete_sql", "count_sql"}
            columns = [list(column) for column in zip(*archive_rows.values(), strict=True)]
            cursor.execute(statements["delete_sql"], columns)
            assert cursor.rowcount == 1
            cursor.execute(statements["count_sql"], [ids])
            assert cursor.fetchone()[0] == 3
        else:
            # SQLite, MariaDB/MySQL: the current versions are read (locked on
            # MariaDB/MySQL), compared by the caller, and the matching ids deleted.
            assert set(statements) == {"delete_sql", "select_sql"}
            cursor.execute(statements["select_sql"], [json_ids(ids)])
            current = {row[0]: row for row in cursor.fetchall()}
            assert set(current) == set(ids)
            assert current[archive_rows["retried"][0]][1] == "pending"
            cursor.execute(statements["delete_sql"], [json_ids([archive_rows["same"][0]])])
            assert cursor.rowcount == 1
    assert MESSAGE.pks() == set(ids) - {archive_rows["same"][0]}


def json_ids(ids: list[int]) -> str:
    return "[" + ",".join(str(i) for i in ids) + "]"


# -- cron ticks: delete_ticks, cancel_ticks ---------------------------------------------


@pytest.fixture
def ticks(fake_clock: FakeClock) -> dict[str, int]:
    rows = {
        "untouched": MESSAGE.add(due=at(60)),
        "attempted": MESSAGE.add(due=at(60), attempt_count=1),
        "running": MESSAGE.add(),
        "finished": MESSAGE.add(status="succeeded", due=None),
        "not_asked": MESSAGE.add(due=at(60)),
    }
    MESSAGE.claim(1)
    assert MESSAGE.state(rows["running"])["status"] == "running"
    return rows


def test_delete_ticks_deletes_only_pending_never_attempted_rows(ticks: dict[str, int]) -> None:
    asked = [pk for name, pk in ticks.items() if name != "not_asked"]
    assert changes.delete_ticks(asked, using="default") == 1
    assert MESSAGE.pks() == set(ticks.values()) - {ticks["untouched"]}
    with CaptureQueriesContext(connection) as queries:
        assert changes.delete_ticks([], using="default") == 0
    assert len(queries) == 0


def test_cancel_ticks_cancels_only_pending_never_attempted_rows(
    ticks: dict[str, int], fake_clock: FakeClock
) -> None:
    before = MESSAGE.states()
    asked = [pk for name, pk in ticks.items() if name != "not_asked"]
    now = fake_clock.advance(1)

    assert changes.cancel_ticks(asked, reason="missed", now=now, using="default") == 1

    expected = {
        "status": "cancelled",
        "next_attempt_time": None,
        "finished_at": now,
        "updated_at": now,
        "last_error": "missed",
    }
    assert subset(MESSAGE.state(ticks["untouched"]), expected) == expected
    after = MESSAGE.states()
    del after[ticks["untouched"]], before[ticks["untouched"]]
    assert after == before
    assert changes.cancel_ticks([], reason="missed", now=now, using="default") == 0


def test_miss_tick_cancels_a_claimed_tick_as_if_never_attempted(
    ticks: dict[str, int], fake_clock: FakeClock
) -> None:
    pk = ticks["running"]
    token = MESSAGE.state(pk)["lock_token"]
    now = fake_clock.advance(1)
    assert changes.miss_tick(pk, uuid.uuid4(), reason="missed", using="default") == 0
    before = MESSAGE.states()

    assert changes.miss_tick(pk, token, reason="missed", using="default") == 1

    expected = {
        "status": "cancelled",
        "next_attempt_time": None,
        "finished_at": now,
        "updated_at": now,
        "last_error": "missed",
        "lock_token": None,
        "attempt_count": 0,
        "last_attempt_time": None,
    }
    assert subset(MESSAGE.state(pk), expected) == expected
    after = MESSAGE.states()
    del after[pk], before[pk]
    assert after == before
    assert changes.miss_tick(pk, token, reason="missed", using="default") == 0


# -- ordered groups: group_clear, hold_back, release_groups, groups_of -----------------------


def test_group_clear_lets_only_the_first_message_of_a_group_run(fake_clock: FakeClock) -> None:
    first = MESSAGE.add(group="g")
    second = MESSAGE.add(group="g")
    other = MESSAGE.add(group="h")
    free = MESSAGE.add()
    clear = Message.objects.filter(
        changes.group_clear(Message, ["q"], clock.sql_now(), using="default")
    )
    assert set(clear.values_list("pk", flat=True)) == {first, other, free}
    # A running message (live lease) keeps every other message of its group waiting,
    # an earlier one too.
    MESSAGE.set(second, status="running", next_attempt_time=at(60))
    assert set(clear.values_list("pk", flat=True)) == {other, free}
    # Once its lease has run out, the earlier message may run again.
    MESSAGE.set(second, next_attempt_time=at(-1))
    assert set(clear.values_list("pk", flat=True)) == {first, other, free}


def test_group_clear_lets_a_failed_message_block_or_not(settings: Any) -> None:
    MESSAGE.add(group="g", status="failed", due=None)
    later = MESSAGE.add(group="g")
    clear = Message.objects.filter(
        changes.group_clear(Message, ["q"], clock.sql_now(), using="default")
    )
    assert later not in set(clear.values_list("pk", flat=True))
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"q": {"GROUP_AFTER_FAILURE": "continue"}}}
    clear = Message.objects.filter(
        changes.group_clear(Message, ["q"], clock.sql_now(), using="default")
    )
    assert later in set(clear.values_list("pk", flat=True))


def _due_of_a_group() -> Any:
    """Three messages of group "g", and the claim's pick of them (due, group clear)."""
    for _ in range(3):
        MESSAGE.add(group="g")
    return (
        Message.objects.filter(queue="q")
        .due()
        .filter(changes.group_clear(Message, ["q"], clock.sql_now(), using="default"))
    )


@pytest.mark.skipif(
    "connection.vendor != 'mysql'",
    reason="PostgreSQL runs the probes in delayq_group_clear (the next test); SQLite plans "
    "with the unique (queue, key) index",
)
def test_group_clear_probes_the_group_index(fake_clock: FakeClock) -> None:
    plan = str(_due_of_a_group().explain())
    assert "delayq_group_idx" in plan, plan


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="the planner's use of a partial index for a bound condition: PostgreSQL's",
)
def test_the_group_function_probes_the_group_index_and_the_claim_plans_no_probe(
    fake_clock: FakeClock,
) -> None:
    clear = _due_of_a_group()
    # The claim's own plan holds no subquery: planning it costs what an
    # ungrouped claim's does (the probes were planned with every claim).
    assert "SubPlan" not in str(clear.explain()), clear.explain()
    # The function's probes, as the server runs them with a kept (generic)
    # plan: each reads the group index. Without the index's own condition
    # PostgreSQL read the primary key's range below each candidate (every
    # older message) instead.
    from django_delayq.store.features import features

    create = sql.statement("create_group_clear", features(connection))
    body = create[create.index("RETURN NOT") + len("RETURN") : create.index(";\nEND")]
    names = ["row_queue", "row_group", "row_id", "at", "failed_blocks"]
    for number, name in enumerate(names, 1):
        body = re.sub(rf"\b{name}\b", f"${number}", body)
    columns = {"queue": "queue", "group": "group", "status": "status", "id": "id"}
    body = body.format(
        table=connection.ops.quote_name(Message._meta.db_table),
        due=connection.ops.quote_name("next_attempt_time"),
        **{
            k: connection.ops.quote_name(Message._meta.get_field(v).column)
            for k, v in columns.items()
        },
    )
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is small
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(
            f"PREPARE probes(varchar, varchar, bigint, timestamptz, boolean) AS SELECT {body}"
        )
        cursor.execute("EXPLAIN EXECUTE probes('q', 'g', 3, now(), true)")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE probes")
    assert plan.count("delayq_group_idx") == 2, plan
    assert "pkey" not in plan, plan


@pytest.mark.django_db(transaction=True)
def test_migration_0010_creates_the_group_function_where_the_claim_calls_it_and_reverses() -> None:
    from django.core.management import call_command

    from django_delayq.store.features import features

    def exists() -> bool:
        if connection.vendor != "postgresql":
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'delayq_group_clear'")
            return bool(cursor.fetchone()[0])

    assert exists() == features(connection).group_function == (connection.vendor == "postgresql")
    try:
        call_command("migrate", "django_delayq", "0009", verbosity=0)
        assert not exists()
        changes.install_group_function(connection)
        assert exists() == features(connection).group_function
        changes.install_group_function(connection, remove=True)
        assert not exists()
    finally:
        call_command("migrate", "django_delayq", verbosity=0)
    assert exists() == features(connection).group_function


def test_hold_back_holds_what_an_earlier_message_of_its_group_holds_back() -> None:
    head = MESSAGE.add(group="g")
    done = MESSAGE.add(group="h", status="succeeded", due=None)
    behind = MESSAGE.add(group="g")
    alone = MESSAGE.add(group="h")
    rows = {m.pk: m for m in Message.objects.filter(pk__in=[head, behind, alone])}
    assert changes.hold_back(rows, using="default") == {behind}
    assert MESSAGE.state(behind)["next_attempt_time"] is None
    assert MESSAGE.state(head)["next_attempt_time"] is not None
    assert MESSAGE.state(done)["status"] == "succeeded"
    assert changes.hold_back({}, using="default") == set()


def test_hold_back_loaded_holds_what_the_load_wrote_behind_its_group() -> None:
    if not can().pipeline:
        pytest.skip("the Spark loader's statement, for the pipeline's databases")
    written = at(10)  # the load's updated_at: what it created or rewrote
    head = MESSAGE.add(group="g", key="head")
    behind = MESSAGE.add(group="g", key="b", updated_at=written)
    alone = MESSAGE.add(group="h", key="c", updated_at=written)
    kept = MESSAGE.add(group="g", key="x", updated_at=at(0))  # loaded, but left alone
    other = MESSAGE.add(group="g", key="d", updated_at=written)  # not in this batch
    plain = MESSAGE.add(key="e", updated_at=written)
    elsewhere = MESSAGE.add(group="g", key="b2", queue="q2", updated_at=written)
    MESSAGE.add(group="g", key="h2", queue="q2")  # holds b2 back, in its own queue
    loaded = " UNION ALL ".join(f"SELECT '{k}'" for k in ("b", "c", "x", "e", "b2"))
    sql, params = changes.hold_back_loaded(connection, "q", loaded, written)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    due = {pk for pk in MESSAGE.pks() if MESSAGE.state(pk)["next_attempt_time"] is not None}
    assert due >= {head, alone, kept, other, plain, elsewhere}
    assert behind not in due


def test_release_groups_lets_the_next_message_go_once_the_one_before_is_done(
    fake_clock: FakeClock,
) -> None:
    head = MESSAGE.add(group="g")
    later = at(30)
    behind = MESSAGE.add(group="g", due=None, scheduled_time=later)
    last = MESSAGE.add(group="g", due=None)
    assert changes.release_groups([("q", "g")]) == 0  # the head is still pending
    MESSAGE.set(head, status="succeeded", next_attempt_time=None)
    assert changes.release_groups([("q", "g")]) == 1
    assert MESSAGE.state(behind)["next_attempt_time"] == later  # its own due time
    assert MESSAGE.state(last)["next_attempt_time"] is None
    assert changes.release_groups([]) == 0


def test_release_groups_without_groups_sweeps_every_group(fake_clock: FakeClock) -> None:
    for group in ("a", "b"):
        MESSAGE.add(group=group, status="cancelled", due=None)
        MESSAGE.add(group=group, due=None, scheduled_time=at(-5))
    blocked = MESSAGE.add(group="c", status="failed", due=None)
    waiting = MESSAGE.add(group="c", due=None)
    assert changes.release_groups() == 2
    assert MESSAGE.state(waiting)["next_attempt_time"] is None
    assert MESSAGE.state(blocked)["status"] == "failed"
    # A held message whose time has passed becomes due now.
    assert Message.objects.filter(group="a", status="pending").get().next_attempt_time == at(0)


# More groups than a statement takes parameters: 65,535 on PostgreSQL with
# server-side binding (DELAYQ_TEST_PREPARED=1), 32,766 on SQLite; MariaDB's
# bound is its packet (megabytes), so there a few batches' worth checks the
# same code.
MANY_GROUPS = {"postgresql": 65_536, "sqlite": 32_767}.get(connection.vendor, 1_500)
SQLITE_DEFAULT_VARIABLES = 32_766


@pytest.fixture
def parameter_limit() -> Any:
    """SQLite's default cap on a statement's parameters (SQLITE_MAX_VARIABLE_NUMBER),
    whatever the build of the library at hand (Debian's allows 250,000)."""
    if connection.vendor != "sqlite":
        yield
        return
    import sqlite3

    connection.ensure_connection()
    raw = connection.connection
    before = raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_DEFAULT_VARIABLES)
    yield
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)


def test_release_groups_lets_go_past_more_groups_than_a_statement_takes_parameters(
    fake_clock: FakeClock, parameter_limit: None
) -> None:
    """Every blocked group's first message once went into one ``pk IN (...)``: beyond
    the parameter limit the sweep failed at every turn, and held messages whose
    release a crash had missed were never let go."""
    blocked = MESSAGE.add(key="bf0", group="b0", status="failed", due=None)
    copies(blocked, MANY_GROUPS, key="bf", group="b")
    behind = MESSAGE.add(key="bh0", group="b0", due=None)
    copies(behind, MANY_GROUPS, key="bh", group="b")
    # Groups whose first message is done: their held one (more than a batch) goes on.
    done = MESSAGE.add(key="rs0", group="r0", status="succeeded", due=None)
    copies(done, 1_000, key="rs", group="r")
    held = MESSAGE.add(key="rh0", group="r0", due=None, scheduled_time=at(-5))
    copies(held, 1_000, key="rh", group="r")
    analyze()
    freed = 1_001

    def due(prefix: str) -> int:
        return Message.objects.filter(key__startswith=prefix, next_attempt_time=at(0)).count()

    assert changes.release_groups() == freed
    assert (due("rh"), due("bh")) == (freed, 0)
    assert changes.release_groups() == 0

    Message.objects.filter(key__startswith="rh").update(next_attempt_time=None)
    pairs = {("q", f"b{i}") for i in range(MANY_GROUPS + 1)}
    pairs |= {("q", f"r{i}") for i in range(freed)}
    assert changes.release_groups(pairs) == freed
    assert (due("rh"), due("bh")) == (freed, 0)


def test_hold_back_looks_at_more_messages_than_a_statement_takes_parameters(
    parameter_limit: None,
) -> None:
    """``enqueue_many`` of that many grouped messages hands them all to hold_back.

    Each of the many is the first of its group, in a queue of its own: on
    SQLite the probe for an earlier message reads its queue's rows (it
    cannot use the partial group index with bound values), and one queue of
    all of them would make this test quadratic.
    """
    blocked = MESSAGE.add(key="f0", group="g0", status="failed", due=None)
    behind = {MESSAGE.add(key=f"h{i}", group="g0") for i in range(3)}
    first = MESSAGE.add(key="n0", group="n0", queue="n0")
    copies(first, MANY_GROUPS, key="n", group="n", queue="n")
    analyze()
    written = {
        pk: SimpleNamespace(queue=queue)
        for pk, queue in Message.objects.exclude(pk=blocked).values_list("pk", "queue")
    }
    assert len(written) > MANY_GROUPS
    assert changes.hold_back(written, using="default") == behind
    held = Message.objects.filter(next_attempt_time__isnull=True, status="pending")
    assert set(held.values_list("pk", flat=True)) == behind


# Every change given a list that can grow without bound, with more values
# than a statement binds (the list is a queryset's ids, or a batch size);
# hold_back has a test of its own above, one queue per message.
BOUNDLESS: dict[str, Callable[[list[int]], int]] = {
    "delete_ticks": lambda ids: changes.delete_ticks(ids, using="default"),
    "cancel_ticks": lambda ids: changes.cancel_ticks(
        ids, reason="Missed", now=clock.now(), using="default"
    ),
    "prune": lambda ids: changes.prune(at(1), batch_size=len(ids) + 10),
    "release_groups": lambda ids: changes.release_groups({("q", f"g{i}") for i in range(len(ids))}),
}


@pytest.mark.parametrize("name", BOUNDLESS)
def test_no_change_binds_a_parameter_per_value_of_an_unbounded_list(
    name: str, fake_clock: FakeClock, parameter_limit: None
) -> None:
    finished = name == "prune"
    template = MESSAGE.add(
        key="m0",
        group="g0",
        due=None if finished else at(60),
        status="succeeded" if finished else "pending",
        finished_at=at(-1) if finished else None,
    )
    copies(template, MANY_GROUPS, key="m", group="g")
    analyze()
    ids = list(Message.objects.values_list("pk", flat=True))
    assert len(ids) > MANY_GROUPS
    done = BOUNDLESS[name](ids)
    left = Message.objects.count()
    assert (done, left) == {
        "delete_ticks": (len(ids), 0),
        "cancel_ticks": (len(ids), len(ids)),
        "prune": (len(ids), 0),
        "release_groups": (0, len(ids)),
    }[name]
    if name == "cancel_ticks":
        assert not Message.objects.exclude(status="cancelled").exists()


def test_batches_cuts_a_list_into_consecutive_lists_of_at_most_its_size() -> None:
    assert list(changes.batches([1, 2, 3, 4, 5], 2)) == [[1, 2], [3, 4], [5]]
    assert list(changes.batches([], 2)) == []
    assert [len(b) for b in changes.batches(list(range(1001)))] == [
        changes.IN_BATCH,
        changes.IN_BATCH,
        1001 - 2 * changes.IN_BATCH,
    ]


def test_the_sweep_lets_groups_go_on_past_a_failure_only_where_their_queue_says_so(
    settings: Any, fake_clock: FakeClock
) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"c": {"GROUP_AFTER_FAILURE": "continue"}}}
    for queue in ("q", "c"):
        MESSAGE.add(queue=queue, group="g", status="failed", due=None)
        MESSAGE.add(queue=queue, group="g", due=None, key=f"behind-{queue}")
    assert changes.release_groups() == 1
    released = Message.objects.filter(next_attempt_time__isnull=False, status="pending")
    assert list(released.values_list("key", flat=True)) == ["behind-c"]


def test_groups_of_names_the_groups_of_a_selection() -> None:
    MESSAGE.add(group="g")
    MESSAGE.add(group="g")
    MESSAGE.add(queue="other", group="g")
    MESSAGE.add()
    assert changes.groups_of(Message.objects.all()) == {("q", "g"), ("other", "g")}
    assert changes.groups_of(Shipment.objects.all()) == set()


def test_forget_compiled_claims_compiles_the_next_claim_again(settings: Any) -> None:
    MESSAGE.claim(1)
    if can().limit_in_subquery:
        assert changes._claim_statements  # kept by the claim
    changes._claim_statements[None] = ("stale", (), ())  # type: ignore[index]
    changes.forget_compiled_claims()
    assert not changes._claim_statements
    changes._claim_statements[None] = ("stale", (), ())  # type: ignore[index]
    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 1}  # any change of DELAYQ
    assert not changes._claim_statements


def test_wake_tells_listening_workers_on_postgresql(transactional_db: None) -> None:
    if connection.vendor != "postgresql":
        changes.wake(["q"])  # nothing to tell, nothing fails
        return
    import json

    from tests.pooler import direct_connect

    with direct_connect(autocommit=True) as listener:  # a session of its own
        listener.execute("LISTEN django_delayq")
        changes.wake(["q", "r"])
        heard = {json.loads(n.payload)["queue"] for n in listener.notifies(timeout=5, stop_after=2)}
    assert heard == {"q", "r"}
