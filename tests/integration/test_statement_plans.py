"""Every statement a worker sends reads the message table through an index (SQLite).

SQLite is the embedded default, and it holds one write lock for the whole
database: a statement that reads every row of the table holds every other
writer back for as long as it takes. Its planner uses a partial index only
for conditions whose values are written into the statement, so a query that
looks indexed in the ORM can still read the whole queue. This runs a worker
over a mixed backlog (ordered groups, plain messages, retries, finished
rows), captures every statement it sends, as sent, and asks SQLite for each
one's plan: none may read the message table row by row, or probe a group by
reading its whole queue, but the few named below, with their reasons.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created

from django_delayq import enqueue, enqueue_many
from django_delayq.models import Message
from django_delayq.retention import prune
from django_delayq.store import dependencies, leases, row_steps
from tests.testapp.models import Shipment

pytestmark = pytest.mark.django_db(transaction=True)

#: Statements allowed to read the table row by row, by a piece of their text.
WHOLE_TABLE: dict[str, str] = {
    # Whether a QueueFields model's rows are in workflows (row_steps.in_use): the
    # unique (queue, key) index searched by queue, but LIMIT 1 stops at its first
    # entry; read at most once a second per model while there is none.
    '"django_delayq_message"."queue" = %s LIMIT 1': "a probe of one row",
    # The sweep's look for rows still waiting whose stand-in was cancelled (a
    # worker died between the two): every stand-in of the model, every
    # row_steps.CANCELLED_EVERY (10 minutes) only.
    """."on_parent_failure" = 'cancel'""": "a rare look at every stand-in",
}


def _scans(plan: list[str]) -> list[str]:
    return [
        step
        for step in plan
        if (step.startswith("SCAN django_delayq_message") and "INDEX" not in step)
        # The unique (queue, key) index searched by queue alone: a read of the
        # queue's every row.
        or "sqlite_autoindex_django_delayq_message_1 (queue=?)" in step
    ]


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's planner")
def test_no_statement_of_a_worker_reads_the_message_table_row_by_row(run_worker):
    sent: dict[str, Any] = {}
    capturing = False

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if capturing and not many:
            sent.setdefault(sql, params)
        return execute(sql, params, many, context)

    def watch(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(capture)

    for conn in connections.all(initialized_only=True):
        conn.close()  # every connection used from here on is a new one, and watched
    connection_created.connect(watch)
    try:
        # A queue of groups: their probes at enqueue, at the claim, and after each end.
        names = [f"g{n}" for n in range(150)]
        capturing = True
        enqueue_many("default", [{} for _ in names], groups=names)
        enqueue_many("default", [{} for _ in names], groups=names)
        enqueue_many("default", [{} for _ in range(150)])
        enqueue_many("limited", [{} for _ in range(30)])  # a global cap's claims
        capturing = False
        enqueue_many("other", [{} for _ in range(20)])
        Message.objects.filter(queue="other").update(status="succeeded")  # finished rows
        # A row in a workflow (its stand-in): the sweep's reads of the stand-ins.
        parent = enqueue("default", {})
        Shipment.objects.create(reference="step").schedule(after=[parent])
        row_steps._cancelled_read.clear()
        capturing = True
        run_worker(["default", "other", "limited"], concurrency=4)
        # A dead worker's messages, looked for every heartbeat until it is
        # forgotten, and a worker's own unheld ones.
        leases.release_workers(["a-dead-worker"])
        leases.release_unheld("a-live-worker", list)
        # What a serving worker also runs, every PRUNE_INTERVAL.
        prune()
        # ... and every HEARTBEAT_INTERVAL (with a row's stand-in to look at).
        dependencies.settle(using="default", skip_locked=True)
    finally:
        connection_created.disconnect(watch)
        capturing = False
    assert Message.objects.filter(queue="default", status="succeeded").count() == 451

    reads = [
        (sql, params)
        for sql, params in sent.items()
        if "django_delayq_message" in sql
        and sql.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE", "WITH"))
    ]
    assert len(reads) > 5
    offenders = []
    with connection.cursor() as cursor:
        for sql, params in reads:
            if any(allowed in sql for allowed in WHOLE_TABLE):
                continue
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            scans = _scans([row[3] for row in cursor.fetchall()])
            if scans:
                offenders.append(f"{sql[:300]}\n    {scans}")
    assert not offenders, "\n".join(offenders)
