"""The contract of ``store/queue_fields.py``: the queue columns of ``QueueFields`` rows.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from django_delayq.store import queue_fields
from tests.conftest import FakeClock
from tests.store.tables import FINISHED, SHIPMENT, at, subset
from tests.testapp.models import Shipment

pytestmark = pytest.mark.django_db


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
    assert queue_fields.schedule(selected, when) == 3 + len(FINISHED)

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
    assert queue_fields.schedule_row(row, when, using="default") is True
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

    assert queue_fields.schedule_row(row, when, using="default") is True

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

    assert queue_fields.schedule_row(row, at(60), using="default") is False
    assert SHIPMENT.state(pk) == before
    assert row.status == "running"  # the instance is left as it was read

    Shipment.objects.filter(pk=pk).delete()
    assert queue_fields.schedule_row(row, at(60), using="default") is False


def test_mark_scheduled_restarts_a_finished_row_and_keeps_an_active_rows_attempts() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    finished = Shipment(status="failed", attempt_count=3, last_error="e", locked_by="w")
    queue_fields.mark_scheduled(finished, when)
    assert (finished.status, finished.attempt_count, finished.last_error) == ("pending", 0, "")
    assert (finished.next_attempt_time, finished.locked_by, finished.lock_token) == (when, "", None)

    retrying = Shipment(status="pending", attempt_count=2, last_error="e")
    queue_fields.mark_scheduled(retrying, when)
    assert (retrying.attempt_count, retrying.last_error) == (2, "e")
    assert finished.pk is None  # nothing was saved


OWN_COLUMNS = ["reference", "priority", "fail", "sleep", "shipped_at"]


def test_plain_save_fields_are_a_rows_own_loaded_columns_and_what_was_marked_for_it() -> None:
    pk = SHIPMENT.add()
    row = Shipment.objects.get(pk=pk)
    assert queue_fields.plain_save_fields(row) == OWN_COLUMNS
    assert queue_fields.plain_save_fields(Shipment.objects.defer("sleep").get(pk=pk)) == [
        c for c in OWN_COLUMNS if c != "sleep"
    ]
    queue_fields.mark_scheduled(row, at(5))
    marked = queue_fields.plain_save_fields(row)
    assert set(marked) == {*OWN_COLUMNS, "status", "next_attempt_time", "lock_token", "locked_by"}
    queue_fields.saved(row)
    assert queue_fields.plain_save_fields(row) == OWN_COLUMNS
    row.status = "failed"
    queue_fields.mark_scheduled(row, at(5))  # a finished row: its attempts start again
    assert {"attempt_count", "last_error", "last_traceback"} <= set(
        queue_fields.plain_save_fields(row)
    )
    assert set(queue_fields.QUEUE_COLUMN_NAMES) == {
        f.name for f in Shipment._meta.concrete_fields
    } - {
        "id",
        *OWN_COLUMNS,
    }
