"""The archive's lock holds one run per database, directly and behind a pooler.

Behind PgBouncer in transaction mode (the suite's PgBouncer leg), a session
advisory lock would stay on whichever server connection took it: held by
nobody, released never, and invisible to the next check. The lock is a
transaction-level one in an open transaction, which keeps its server
connection for as long as it lasts.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from django_delayq.contrib.spark import PipelineError
from django_delayq.contrib.spark.database import ARCHIVE_LOCK, archive_lock
from tests.pooler import direct_connect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="advisory locks: PostgreSQL"),
]

# Holders of the archive's advisory lock in the test database, seen without the pooler.
HOLDERS = (
    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
    "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database() "
    "AND l.objsubid = 1 AND l.objid = (hashtext(%s)::bigint & 4294967295)::oid"
)


def holders() -> int:
    with direct_connect(autocommit=True) as conn:
        return conn.execute(HOLDERS, [ARCHIVE_LOCK]).fetchone()[0]


def busy_through_the_pool() -> None:
    """Transactions of other clients, on the pool's server connections meanwhile."""
    with connection.cursor() as cursor:
        for _ in range(5):
            cursor.execute("SELECT count(*) FROM django_delayq_message")


def test_two_concurrent_runs_one_gets_the_lock_and_it_goes_with_the_run():
    with archive_lock("default") as lock:
        assert holders() == 1
        busy_through_the_pool()
        lock.check("the first step")  # still this run's, on its own server connection
        outcome: list[BaseException] = []

        def second_run() -> None:
            try:
                with archive_lock("default"):
                    pass
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=second_run)
        thread.start()
        thread.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], PipelineError)
        assert "another delayq_pipeline archive is running" in str(outcome[0])
        lock.check("the last step")
    # Released with the run: not left behind on a pooled server connection.
    assert holders() == 0
    with archive_lock("default") as again:
        again.check("a later run's step")
    assert holders() == 0
