"""The contract of ``store/operators.py``: operators' changes, exactly the rows of the queryset.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.store import operators, settle
from tests.conftest import FakeClock
from tests.store.tables import MESSAGE, Table, at, subset, superseded_message

pytestmark = pytest.mark.django_db


def chosen(table: Table, pks: list[Any]) -> Any:
    return table.objects().filter(pk__in=pks)


def test_run_now_makes_the_querysets_rows_due(table: Table, fake_clock: FakeClock) -> None:
    a, b, other = table.add(due=at(3600)), table.add(due=at(60)), table.add(due=at(3600))
    before = table.state(other)
    now = fake_clock.advance(1)

    assert operators.run_now(chosen(table, [a, b]), now) == 2

    for pk in (a, b):
        expected = table.expect({"next_attempt_time": now, "updated_at": now, "status": "pending"})
        assert subset(table.state(pk), expected) == expected
    assert table.state(other) == before


def test_run_now_takes_the_database_clock_as_an_expression(table: Table) -> None:
    pk = table.add(due=datetime(2999, 1, 1, tzinfo=UTC))
    before = datetime.now(UTC)
    assert operators.run_now(chosen(table, [pk]), clock.sql_now()) == 1
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

    assert operators.retry(chosen(table, [a, b]), 2, now) == 2

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
    assert operators.cancel(chosen(table, [waiting, held]), now) == 2

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
    assert settle.ack([held], token, model=table.model) == 0


def test_cancel_drops_a_waiting_newer_version(fake_clock: FakeClock) -> None:
    pk = superseded_message(fake_clock)
    assert operators.cancel(chosen(MESSAGE, [pk]), clock.now()) == 1
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

    assert operators.reschedule(chosen(table, [a, b]), when, now) == 2

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

    assert operators.reprioritise(chosen(table, [a, held]), 9, now) == 2

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
    assert operators.delete(chosen(table, [a, b])) == 2
    assert table.pks() == {other}
    assert operators.delete(chosen(table, [a])) == 0


# -- edit, replace_failed_payload ------------------------------------------------------


def test_edit_writes_only_the_named_columns(fake_clock: FakeClock) -> None:
    pk = MESSAGE.add(payload={"v": 1}, kind="old")
    message = Message.objects.get(pk=pk)
    message.payload = {"v": 2}
    message.kind = "not saved"
    MESSAGE.set(pk, attempt_count=4)  # a worker's change meanwhile
    now = fake_clock.advance(1)

    operators.edit(message, ["payload"])

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
        operators.edit(message, [])
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
        with pytest.raises(operators.EditRefused, match="kind cannot change while it runs"):
            operators.edit(message, ["kind", "priority"])
        assert MESSAGE.state(pk) == before  # nothing written
        operators.edit(message, ["priority"])  # what does not choose the handler may change
        assert (MESSAGE.state(pk)["kind"], MESSAGE.state(pk)["priority"]) == ("old", 5)
        return
    operators.edit(message, ["kind", "priority"])
    state = MESSAGE.state(pk)
    assert (state["kind"], state["priority"], state["updated_at"]) == ("new", 5, now)
    assert operators.SCOPE_COLUMNS == {"queue", "kind"}


def test_replace_failed_payload_changes_a_failed_message_only(fake_clock: FakeClock) -> None:
    failed = MESSAGE.add(status="failed", due=None, payload={"v": 1})
    pending = MESSAGE.add(payload={"v": 1})
    now = fake_clock.advance(1)

    assert operators.replace_failed_payload(failed, {"v": 2}, using="default") is True
    assert operators.replace_failed_payload(pending, {"v": 2}, using="default") is False

    state = MESSAGE.state(failed)
    assert (state["payload"], state["status"], state["updated_at"]) == ({"v": 2}, "failed", now)
    assert MESSAGE.state(pending)["payload"] == {"v": 1}
    assert operators.replace_failed_payload(failed, None, using="default") is True
    assert MESSAGE.state(failed)["payload"] is None
