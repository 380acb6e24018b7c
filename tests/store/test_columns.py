"""The contract of ``store/columns.py``: what every change shares, and bounded statements.

Tests that take the ``table`` fixture run on ``Message`` and on the test
app's ``QueueFields`` model (``Shipment``), the two kinds of table every
change serves (``tables.py``). Times are the test clock's (``fake_clock``),
which is also the clock the store writes into its statements.
"""

from __future__ import annotations

import pytest

from django_delayq.models import Message
from django_delayq.store import columns
from tests.testapp.models import Shipment

pytestmark = pytest.mark.django_db


def test_fit_keeps_only_the_columns_the_table_has() -> None:
    wanted = {"status": "pending", "updated_at": 1, "finished_at": 2, "priority": 3, "nope": 4}
    assert columns.fit(Message, wanted) == {
        "status": "pending",
        "updated_at": 1,
        "finished_at": 2,
        "priority": 3,
    }
    assert columns.fit(Shipment, wanted) == {"status": "pending", "priority": 3}
    assert columns.has_column(Message, "superseded_at")
    assert not columns.has_column(Shipment, "superseded_at")


def test_batches_cuts_a_list_into_consecutive_lists_of_at_most_its_size() -> None:
    assert list(columns.batches([1, 2, 3, 4, 5], 2)) == [[1, 2], [3, 4], [5]]
    assert list(columns.batches([], 2)) == []
    assert [len(b) for b in columns.batches(list(range(1001)))] == [
        columns.IN_BATCH,
        columns.IN_BATCH,
        1001 - 2 * columns.IN_BATCH,
    ]


HOSTILE_GROUPS = [
    "plain",
    "o'brien",
    "''; DROP TABLE x; --",
    "100%",
    "%s",
    "%%s",
    "?",
    "é ∑ 😀",
    "a\\b",
    "",
]


def test_rows_and_counts_with_literals_read_what_the_queryset_reads_whatever_the_values() -> None:
    # The values are written into the statement on SQLite (so its partial
    # indexes apply): quotes, percent signs and placeholders in a group's name
    # must read as themselves.
    from django_delayq import enqueue_many

    enqueue_many("literal", [{} for _ in HOSTILE_GROUPS], groups=HOSTILE_GROUPS)
    for name in HOSTILE_GROUPS:
        rows = Message.objects.filter(queue="literal", group=name, status__in=["pending"])
        query = rows.order_by("pk").values_list("group", "queue")
        assert columns.rows_with_literals(query, "default") == list(query) == [(name, "literal")]
        assert columns.count_with_literals(rows, "default") == rows.count() == 1
    assert Message.objects.filter(queue="literal").count() == len(HOSTILE_GROUPS)
