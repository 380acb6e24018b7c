"""The contract of ``store/settle.py``: the outcomes of held rows, on every database.

Every worker's change of a row it holds (an outcome here, a release or an
extension of ``leases``) is a compare-and-set on ``(id, lock_token,
running)``: the tests of that contract run each of them.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from django_delayq import clock
from django_delayq.fingerprint import fingerprint
from django_delayq.models import Dependency, Message
from django_delayq.store import leases, settle
from tests.conftest import FakeClock, claimed_parent_and_child, finishes_within
from tests.store.tables import (
    EXTENDED,
    LEASE,
    LONG_AGO,
    MESSAGE,
    SHIPMENT,
    Table,
    at,
    can,
    in_thread,
    newer_version,
    subset,
    superseded_message,
)

pytestmark = pytest.mark.django_db


RETRY_IN = timedelta(seconds=7)


RETRY_AT = timedelta(minutes=5)


SNOOZE = timedelta(seconds=9)


Settle = Callable[[Any, uuid.UUID, Table], int]


SETTLES: dict[str, Settle] = {
    "ack": lambda pk, token, t: settle.ack([pk], token, model=t.model),
    "ack_held": lambda pk, token, t: len(settle.ack_held({token: [pk]}, model=t.model)),
    "fail_retry_in": lambda pk, token, t: settle.fail(
        pk, token, error="boom 1", traceback="tb", retry_at=None, retry_in=RETRY_IN, model=t.model
    ),
    "fail_retry_at": lambda pk, token, t: settle.fail(
        pk, token, error="boom 1", traceback="tb", retry_at=clock.now() + RETRY_AT, model=t.model
    ),
    "fail_final": lambda pk, token, t: settle.fail(
        pk, token, error="boom 1", traceback="tb", retry_at=None, model=t.model
    ),
    "snooze_delay": lambda pk, token, t: settle.snooze(
        pk, token, run_at=SNOOZE, max_attempts=8, model=t.model
    ),
    "snooze_until": lambda pk, token, t: settle.snooze(
        pk, token, run_at=clock.now() + SNOOZE, max_attempts=8, model=t.model
    ),
    "release_started": lambda pk, token, t: leases.release(
        [pk], token, started=True, model=t.model
    ),
    "release_unstarted": lambda pk, token, t: leases.release(
        [pk], token, started=False, model=t.model
    ),
    "extend": lambda pk, token, t: len(leases.extend([pk], token, EXTENDED, model=t.model)),
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

    assert settle.ack([a, b, c], mine.token, model=table.model) == 2

    assert [table.state(pk)["status"] for pk in (a, b, c)] == ["succeeded", "succeeded", "running"]
    assert settle.ack([], mine.token, model=table.model) == 0


def test_ack_held_returns_the_pairs_still_held_across_tokens(
    table: Table, fake_clock: FakeClock
) -> None:
    a, b = table.add(), table.add()
    first = table.claim(2)
    fake_clock.advance(10)
    assert leases.extend([b], first.token, LEASE, model=table.model) == {b}
    fake_clock.advance(LEASE.total_seconds() - 9)
    retaken = table.claim(1)  # a again (b's lease still runs), under a new token
    assert [m.pk for m in retaken.messages] == [a]
    c = table.add()
    second = table.claim(1)
    assert [m.pk for m in second.messages] == [c]

    acked = settle.ack_held({first.token: [a, b], second.token: [c]}, model=table.model)

    assert acked == {(b, first.token), (c, second.token)}
    assert table.state(a)["status"] == "running"
    assert table.state(a)["lock_token"] == retaken.token
    assert settle.ack_held({}, model=table.model) == set()


def test_ack_held_acknowledges_only_the_attempt_whose_token_the_row_carries(
    table: Table, fake_clock: FakeClock
) -> None:
    """A worker may hold one row under two tokens: it claimed it again after its lease."""
    pk = table.add()
    old = table.claim()
    fake_clock.advance(LEASE.total_seconds() + 1)
    new = table.claim()
    assert [m.pk for m in new.messages] == [pk]

    acked = settle.ack_held({old.token: [pk], new.token: [pk]}, model=table.model)

    assert acked == {(pk, new.token)}
    assert table.state(pk)["status"] == "succeeded"


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
        "ack": lambda: settle.ack([a], first.token, skip_locked=True),
        "ack_held": lambda: settle.ack_held({first.token: [a]}, skip_locked=True),
        "ack_held_pairs": lambda: settle.ack_held(
            {first.token: [a], second.token: [b]}, skip_locked=True
        ),
        "fail": lambda: settle.fail(
            a, first.token, error="e", retry_at=None, retry_in=RETRY_IN, skip_locked=True
        ),
        "snooze": lambda: settle.snooze(
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


def test_fail_records_the_error_and_its_fingerprint(fake_clock: FakeClock) -> None:
    pk = MESSAGE.add()
    token = MESSAGE.claim().token
    error = "app.Error: order 12345 not found"
    settle.fail(pk, token, error=error, retry_at=None, retry_in=RETRY_IN)
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
            extended = leases.extend([locked, free], token, EXTENDED)
            if not release_skips:
                return (extended,)
            failed = settle.fail(locked, token, error="x", retry_at=None, skip_locked=True)
            released = leases.release([locked, free], token, started=True)
            return extended, failed, released

        done = finishes_within(20, in_thread(housekeeping))
    assert done[0] == {free}
    if release_skips:
        assert done[1:] == (0, 1)
        assert MESSAGE.state(free)["status"] == "pending"
    assert MESSAGE.state(locked)["status"] == "running"
    assert MESSAGE.state(locked)["lock_token"] == token


# -- a newer version waiting (enqueue with on_conflict="update" while running) ------


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


# Statements compiled once while the clock is the database's: the claim and
# the acknowledgement keep their compiled SQL between calls (the tests above
# replace the clock, which turns that off); what is kept must still follow
# each call's worker, lease and table.


def test_an_acknowledgement_compiled_once_serves_each_table() -> None:
    for table in (MESSAGE, SHIPMENT, MESSAGE, SHIPMENT):
        pk = table.add(due=LONG_AGO)
        token = table.claim().token
        assert settle.ack([pk], token, model=table.model) == 1
        assert table.state(pk)["status"] == "succeeded"


# -- a workflow parent's success and its children's release, in one statement -------


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="one statement on PostgreSQL; two elsewhere"
)
@pytest.mark.django_db(transaction=True)  # in autocommit, as a worker writes it
def test_a_parents_acknowledgement_releases_its_children_in_its_own_statement(monkeypatch):
    # A worker that ran a parent alone writes its success and releases its
    # children in one statement: one round trip and one commit per step.
    from django_delayq.store import direct
    from django_delayq.worker.execute import Returned

    parent, child, token = claimed_parent_and_child()
    sent = []
    fetch = direct.fetch
    monkeypatch.setattr(
        direct, "fetch", lambda conn, sql, *a, **kw: sent.append(sql) or fetch(conn, sql, *a, **kw)
    )
    took, done = settle.ack_releasing(
        parent.pk, token, using="default", skip_locked=True, result=Returned({"n": 1})
    )
    assert (took, done.released, done.cancelled) == (1, [child.pk], [])
    assert len(sent) == 1
    parent.refresh_from_db()
    child.refresh_from_db()
    assert (parent.status, parent.result) == ("succeeded", {"n": 1})
    assert child.next_attempt_time is not None
    assert child.parent_results == [{"n": 1}]


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="one statement on PostgreSQL; two elsewhere"
)
@pytest.mark.django_db(transaction=True)
def test_an_acknowledgement_that_does_not_take_releases_nothing():
    # The parent's lease was lost (another token holds it): its success is
    # not written, and its children must stay waiting (the attempt that holds
    # the parent now decides their fate).
    parent, child, _token = claimed_parent_and_child(on_parent_failure="run")
    took, done = settle.ack_releasing(parent.pk, uuid.uuid4(), using="default", skip_locked=True)
    assert (took, done.released, done.cancelled) == (0, [], [])
    parent.refresh_from_db()
    child.refresh_from_db()
    assert parent.status == "running"
    assert child.next_attempt_time is None
    assert Dependency.objects.get(child_id=child.pk).parent_ended == ""


@pytest.mark.django_db(transaction=True)
def test_a_parents_acknowledgement_is_one_statement_only_in_postgresqls_autocommit():
    # Elsewhere, and inside a caller's transaction, nothing is written: the
    # caller acknowledges (settle.ack) and releases after it.
    parent, child, token = claimed_parent_and_child()
    with transaction.atomic():
        assert settle.ack_releasing(parent.pk, token, using="default") is None
    if connection.vendor != "postgresql":
        assert settle.ack_releasing(parent.pk, token, using="default") is None
    parent.refresh_from_db()
    assert parent.status == "running"
