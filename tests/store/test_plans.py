"""The figures an operator reads come from indexes, not from a scan of the message table.

The admin dashboard, ``delayq_status`` and the metrics count active rows
per queue; a table that keeps millions of finished messages for retention
must not be read whole for them. Each SELECT these pages run on the
message table is planned by PostgreSQL with sequential scans discouraged
(the test table is small): a scan that remains is one no index can serve.
"""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

from django_delayq import enqueue, enqueue_many, stats
from django_delayq.models import Message
from django_delayq.store.dependencies import waiting_rows

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="PostgreSQL's planner and EXPLAIN"
    ),
]

TABLE = Message._meta.db_table


def rows() -> None:
    """A message of each kind a page counts: due, later, held in a group, waiting for
    a parent, running, failed, succeeded."""
    parent = enqueue("default", {})
    enqueue("default", {}, after=[parent])
    enqueue_many("default", [{}, {}], group="g")
    enqueue("other", {}, delay=3600)
    for status in ("running", "failed", "succeeded"):
        row = enqueue("other", {}).message
        Message.objects.filter(pk=row.pk).update(status=status)


def scans(action: Callable[[], Any]) -> list[str]:
    """The statements of ``action`` on the message table whose plan reads it whole."""
    with CaptureQueriesContext(connection) as captured:
        action()
    found = []
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT") or TABLE not in sql:
                continue
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            if f"Seq Scan on {TABLE}" in plan:
                found.append(f"{sql}\n{plan}")
    return found


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(lambda: stats.dashboard(), id="dashboard"),
        pytest.param(lambda: call_command("delayq_status", stdout=StringIO()), id="delayq_status"),
        pytest.param(
            lambda: Message.objects.in_queues(["default", "other"]).waiting_by_queue(),
            id="metrics-waiting",
        ),
    ],
)
def test_every_count_a_page_shows_reads_an_index(page: Callable[[], Any]) -> None:
    rows()
    assert scans(page) == []


def test_the_held_rows_per_queue_are_counted_from_their_own_index() -> None:
    rows()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    counted = Message.objects.filter(waiting_rows()).values("queue").annotate(n=Count("queue"))
    plan = counted.order_by().explain()
    # Without it the count walked every pending and running row of the claim
    # index, or the whole table (1 s at 10 million kept messages).
    assert "delayq_held_idx" in plan, plan
