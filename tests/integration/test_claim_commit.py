"""PostgreSQL: a claim commits without waiting for the write-ahead log, and only it.

``synchronous_commit`` is off for the claim's own transaction (``set_config``
with ``is_local``), never for the session: the acknowledgements, the
handlers' writes and everything else a worker's connection runs afterwards
still wait for the disk (see the claim statement in
``store/sql/postgresql.sql`` for why a lost claim is harmless).
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction  # noqa: F401 (read by skipif)

from django_delayq import enqueue
from django_delayq.store import claim as store_claim

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's setting"),
]


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def claim() -> store_claim.Claim:
    return store_claim.claim(["default"], 10, worker="w", lease=timedelta(minutes=5))


def test_a_claim_that_takes_messages_commits_asynchronously():
    enqueue("default", {})
    with transaction.atomic():
        # Inside a transaction of the caller's, the setting is visible after it.
        assert len(claim().messages) == 1
        assert synchronous_commit() == "off"


def test_the_session_keeps_synchronous_commits_after_a_claim():
    enqueue("default", {})
    assert len(claim().messages) == 1
    assert synchronous_commit() == "on"
    enqueue("default", {}, key="second")
    assert len(claim().messages) == 1
    assert synchronous_commit() == "on"


def test_an_empty_claim_changes_nothing():
    with transaction.atomic():
        assert claim().messages == []
        assert synchronous_commit() == "on"
