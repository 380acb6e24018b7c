"""The contract of ``store/ticks.py``: cron ticks deleted, cancelled, missed.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayq.store import ticks
from tests.conftest import FakeClock
from tests.store.tables import MESSAGE, at, subset

pytestmark = pytest.mark.django_db


@pytest.fixture
def tick_rows(fake_clock: FakeClock) -> dict[str, int]:
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


def test_delete_ticks_deletes_only_pending_never_attempted_rows(tick_rows: dict[str, int]) -> None:
    asked = [pk for name, pk in tick_rows.items() if name != "not_asked"]
    assert ticks.delete_ticks(asked, using="default") == 1
    assert MESSAGE.pks() == set(tick_rows.values()) - {tick_rows["untouched"]}
    with CaptureQueriesContext(connection) as queries:
        assert ticks.delete_ticks([], using="default") == 0
    assert len(queries) == 0


def test_cancel_ticks_cancels_only_pending_never_attempted_rows(
    tick_rows: dict[str, int], fake_clock: FakeClock
) -> None:
    before = MESSAGE.states()
    asked = [pk for name, pk in tick_rows.items() if name != "not_asked"]
    now = fake_clock.advance(1)

    assert ticks.cancel_ticks(asked, reason="missed", now=now, using="default") == 1

    expected = {
        "status": "cancelled",
        "next_attempt_time": None,
        "finished_at": now,
        "updated_at": now,
        "last_error": "missed",
    }
    assert subset(MESSAGE.state(tick_rows["untouched"]), expected) == expected
    after = MESSAGE.states()
    del after[tick_rows["untouched"]], before[tick_rows["untouched"]]
    assert after == before
    assert ticks.cancel_ticks([], reason="missed", now=now, using="default") == 0


def test_miss_tick_cancels_a_claimed_tick_as_if_never_attempted(
    tick_rows: dict[str, int], fake_clock: FakeClock
) -> None:
    pk = tick_rows["running"]
    token = MESSAGE.state(pk)["lock_token"]
    now = fake_clock.advance(1)
    assert ticks.miss_tick(pk, uuid.uuid4(), reason="missed", using="default") == 0
    before = MESSAGE.states()

    assert ticks.miss_tick(pk, token, reason="missed", using="default") == 1

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
    assert ticks.miss_tick(pk, token, reason="missed", using="default") == 0
