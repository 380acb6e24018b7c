"""The contract of ``store/leases.py``: held rows given back, extended and read.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayq.store import leases, settle
from tests.conftest import FakeClock
from tests.store.tables import (
    EXTENDED,
    LONG_AGO,
    MESSAGE,
    Table,
    at,
    newer_version,
    subset,
    superseded_message,
)

pytestmark = pytest.mark.django_db


def test_release_of_an_unstarted_claim_never_takes_attempts_below_zero(
    table: Table, fake_clock: FakeClock
) -> None:
    pk = table.add()
    token = table.claim().token
    table.set(pk, attempt_count=0)
    assert leases.release([pk], token, started=False, model=table.model) == 1
    assert table.state(pk)["attempt_count"] == 0


def test_release_counts_only_the_rows_still_held(table: Table, fake_clock: FakeClock) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    mine = table.claim(2)
    table.claim(1)
    assert leases.release([a, b, c], mine.token, started=True, model=table.model) == 2
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

    extended = leases.extend([a, b, c, d, missing], mine.token, EXTENDED, model=table.model)

    assert extended == {a, b}
    assert table.state(a)["next_attempt_time"] == now + EXTENDED
    assert table.state(c)["next_attempt_time"] == their_lease
    assert table.state(d)["status"] == "pending"
    assert leases.extend([], mine.token, EXTENDED, model=table.model) == set()


def test_extending_a_superseded_attempt_keeps_the_new_version_waiting(
    fake_clock: FakeClock,
) -> None:
    pk = superseded_message(fake_clock)
    before = MESSAGE.state(pk)
    now = fake_clock.advance(1)
    assert leases.extend([pk], before["lock_token"], EXTENDED) == {pk}
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
    assert leases.extend([pk], before["lock_token"], timedelta(seconds=5)) == {pk}
    assert MESSAGE.state(pk)["next_attempt_time"] == before["scheduled_time"]
    fake_clock.advance(10)  # the worker died after the extension
    assert MESSAGE.claim().messages == []
    fake_clock.current = before["scheduled_time"]
    assert [m.pk for m in MESSAGE.claim().messages] == [pk]


# Statements compiled once while the clock is the database's: the claim and
# the acknowledgement keep their compiled SQL between calls (the tests above
# replace the clock, which turns that off); what is kept must still follow
# each call's worker, lease and table.


def test_an_extension_compiled_once_still_writes_each_lease() -> None:
    pk = MESSAGE.add(due=LONG_AGO)
    token = MESSAGE.claim().token
    expiries = []
    for seconds in (600, 600, 6000):
        assert leases.extend([pk], token, timedelta(seconds=seconds)) == {pk}
        expiries.append(MESSAGE.state(pk)["next_attempt_time"])
    assert timedelta(0) <= expiries[1] - expiries[0] < timedelta(seconds=60)
    assert timedelta(seconds=5340) < expiries[2] - expiries[1] < timedelta(seconds=5460)


# -- held_ids, states, write_payload -------------------------------------------------


def test_held_ids_are_the_ids_still_running_under_the_token(
    table: Table, fake_clock: FakeClock
) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    mine = table.claim(2)
    table.claim(1)
    settle.ack([b], mine.token, model=table.model)
    with CaptureQueriesContext(connection) as queries:
        held = leases.held_ids([a, b, c], mine.token, model=table.model)
    assert held == {a}
    assert not any("FOR UPDATE" in q["sql"].upper() for q in queries)


def test_states_tell_a_held_row_from_one_ended_by_its_attempt_and_one_claimed_again(
    table: Table, fake_clock: FakeClock
) -> None:
    a, b, c = table.add(due=at(-3)), table.add(due=at(-2)), table.add(due=at(-1))
    mine = table.claim(3)
    attempted = {m.pk: m.last_attempt_time for m in mine.messages}
    assert settle.ack([b], mine.token, model=table.model) == 1
    # Claimed again by another worker: a new token, a new attempt time.
    table.set(c, lock_token=uuid.uuid4(), last_attempt_time=fake_clock.advance(1))

    found = leases.states([a, b, c, max(a, b, c) + 1000], model=table.model)

    assert set(found) == {a, b, c}
    assert found[a].holds(mine.token) and not found[a].ended(mine.token, attempted[a])
    assert not found[b].holds(mine.token) and found[b].ended(mine.token, attempted[b])
    # Claimed again: another attempt's, neither held nor ended by this one.
    assert not found[c].holds(mine.token) and not found[c].ended(mine.token, attempted[c])


def test_write_payload_replaces_the_payload_of_a_row_still_held(fake_clock: FakeClock) -> None:
    pk = MESSAGE.add(payload={"call": 1})
    token = MESSAGE.claim().token
    now = fake_clock.advance(1)

    assert leases.write_payload(pk, token, {"call": 1, "result": [1, "two"]}) == 1
    state = MESSAGE.state(pk)
    assert (state["payload"], state["status"], state["updated_at"]) == (
        {"call": 1, "result": [1, "two"]},
        "running",
        now,
    )
    assert leases.write_payload(pk, token, None) == 1
    assert MESSAGE.state(pk)["payload"] is None  # JSON null: the column is NOT NULL

    assert leases.write_payload(pk, uuid.uuid4(), {"forged": True}) == 0
    settle.ack([pk], token)
    assert leases.write_payload(pk, token, {"late": True}) == 0
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
    settle.ack([finished], MESSAGE.state(finished)["lock_token"])
    before = {pk: MESSAGE.state(pk) for pk in (alive, finished, waiting)}
    now = fake_clock.advance(1)

    released = leases.release_workers(["dead", "gone"])

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
    assert settle.ack([dead_1], dead.token) == 0
    assert leases.release_workers([]) == {}


def test_releasing_a_dead_workers_superseded_row_leaves_the_new_version_due(
    fake_clock: FakeClock,
) -> None:
    pk = superseded_message(fake_clock)
    now = fake_clock.advance(1)
    assert leases.release_workers(["w"]) == {"w": 1}
    state = MESSAGE.state(pk)
    expected = newer_version(state, now)
    assert subset(state, expected) == expected


def test_release_unheld_hands_back_only_the_lapsed_rows_under_the_name_not_held() -> None:
    from django.utils import timezone

    from django_delayq import enqueue_many
    from django_delayq.models import Message
    from django_delayq.store import claim

    enqueue_many("default", [{}] * 4)
    mine = claim.claim(["default"], 3, worker="w-1", lease=timedelta(minutes=5))
    other = claim.claim(["default"], 1, worker="w-2", lease=timedelta(minutes=5))
    held, lost, fresh = mine.messages
    Message.objects.filter(pk__in=[held.pk, lost.pk, other.messages[0].pk]).update(
        next_attempt_time=timezone.now() - timedelta(seconds=1)
    )
    assert leases.release_unheld("w-1", lambda: [held.pk]) == 1
    states = dict(Message.objects.values_list("pk", "status"))
    assert states[lost.pk] == "pending"  # lapsed, not held: handed back
    assert states[held.pk] == "running"  # lapsed but held (its keeper was kept off)
    assert states[fresh.pk] == "running"  # not lapsed: a claim whose reply may be on its way
    assert states[other.messages[0].pk] == "running"  # another worker's
