"""The contract of ``store/retention.py``: pruning, and the archive's delete.

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

from django_delayq.store import retention
from tests.conftest import FakeClock
from tests.store.tables import FINISHED, MESSAGE, at, can

pytestmark = pytest.mark.django_db


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

    assert retention.prune(cutoff, batch_size=100) == len(old)
    assert MESSAGE.pks() == kept


def test_prune_deletes_in_batches_up_to_max_batches(fake_clock: FakeClock) -> None:
    cutoff = at(0)
    for _ in range(5):
        finished_message("succeeded", at(-10))

    with CaptureQueriesContext(connection) as queries:
        assert retention.prune(cutoff, batch_size=2, max_batches=2) == 4
    assert len(MESSAGE.pks()) == 1
    deletes = [q for q in queries if q["sql"].lstrip().upper().startswith("DELETE")]
    assert len(deletes) == 2

    assert retention.prune(cutoff, batch_size=2) == 1
    assert MESSAGE.pks() == set()
    assert retention.prune(cutoff, batch_size=2) == 0


def test_prune_paces_itself_between_full_batches_only(fake_clock: FakeClock) -> None:
    """The caller's pacing runs after a full batch that another may follow: never after
    the last one (nothing is left to spare the workers from), nor at ``max_batches``."""
    for _ in range(5):
        finished_message("succeeded", at(-10))
    took: list[float] = []
    assert retention.prune(at(0), batch_size=2, between=took.append) == 5
    assert len(took) == 2 and all(t >= 0 for t in took)  # after 2 and 4, not after the last 1

    for _ in range(4):
        finished_message("succeeded", at(-10))
    took.clear()
    assert retention.prune(at(0), batch_size=2, max_batches=2, between=took.append) == 4
    assert len(took) == 1  # the second batch is the last this call makes


def test_prune_deletes_only_the_given_queues(fake_clock: FakeClock) -> None:
    a = finished_message("succeeded", at(-10), queue="a")
    b = finished_message("succeeded", at(-10), queue="b")
    c = finished_message("succeeded", at(-10), queue="c")
    assert retention.prune(at(0), batch_size=10, queues=["a", "c"]) == 2
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
    statements = retention.archived_delete(connection)
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
