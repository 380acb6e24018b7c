"""PostgreSQL: a claim, and a worker's release of a workflow's steps, commit without
waiting for the write-ahead log, and only they.

``synchronous_commit`` is off for their own transaction (``set_config``
with ``is_local``), never for the session: the acknowledgements, the
handlers' writes and everything else a worker's connection runs afterwards
still wait for the disk (see the claim and ``end_edges_lock_wait`` in
``store/sql/postgresql.sql`` for why a lost claim or release is harmless).
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction  # noqa: F401 (read by skipif)

from django_delayq import enqueue
from django_delayq.models import Message
from django_delayq.store import claim as store_claim
from django_delayq.store import dependencies, direct

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


def finished_parent_and_its_child() -> tuple[Message, Message]:
    parent = enqueue("default", {}, key="parent").message
    child = enqueue("default", {}, key="child", after=[parent]).message
    Message.objects.filter(pk=parent.pk).update(status="succeeded")
    return parent, child


def test_a_workers_release_of_the_steps_it_let_go_commits_asynchronously(monkeypatch):
    # A chain's step waited for two flushes of the log: its parent's outcome,
    # then the release. The release is made again by the sweep if a crash
    # loses it, so only the outcome waits.
    parent, child = finished_parent_and_its_child()
    sent: list[str] = []
    fetch = direct.fetch
    monkeypatch.setattr(
        direct,
        "fetch",
        lambda conn, sql, *args, **kw: sent.append(sql) or fetch(conn, sql, *args, **kw),
    )
    assert dependencies.settle_without_waiting([parent.pk]).released == [child.pk]
    assert any("'synchronous_commit', 'off', true" in sql for sql in sent)
    assert synchronous_commit() == "on"  # its own transaction only


def test_a_release_in_the_callers_transaction_keeps_its_synchronous_commit():
    # An operator's action (a retry, a delete) releases steps in its own
    # transaction: that one must still wait for the disk.
    parent, child = finished_parent_and_its_child()
    with transaction.atomic():
        assert dependencies.settle([parent.pk], skip_locked=True).released == [child.pk]
        assert synchronous_commit() == "on"
