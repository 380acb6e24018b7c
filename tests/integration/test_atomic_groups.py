"""Atomic handlers committed in groups (PostgreSQL, ``ACK_DELAY``).

Each message runs in a savepoint with its acknowledgement, inside one
transaction per group: these tests prove that the grouping happens, that a
failing handler only loses its own writes, that outcomes are announced after
the commit, and that a failed commit records and announces nothing.
"""

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, connections

from django_delayq import claim, enqueue, enqueue_many, signals
from django_delayq.execute import Result
from django_delayq.models import Message
from tests.testapp.models import Effect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="groups need batched acknowledgements"
    ),
]


def txids() -> dict[int, str]:
    return dict(Effect.objects.values_list("message_id", "value"))


def test_atomic_handlers_share_transactions(run_worker, settings):
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    results = enqueue_many("atomic-txid", [{}] * 30)
    stats = run_worker(["atomic-txid"], batch_size=30)
    assert stats[Result.SUCCEEDED] == 30
    assert set(Message.objects.values_list("status", flat=True)) == {"succeeded"}
    written = txids()
    assert sorted(written) == sorted(r.message.pk for r in results)  # one write each
    assert len(set(written.values())) < 30


def test_without_ack_delay_each_message_has_its_own_transaction(run_worker, settings):
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": None}
    enqueue_many("atomic-txid", [{}] * 10)
    run_worker(["atomic-txid"], batch_size=10)
    assert len(set(txids().values())) == 10


def test_a_failing_handler_in_a_group_loses_only_its_own_writes(run_worker, settings):
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    payloads = [{"fail": 1} if i % 3 == 1 else {} for i in range(12)]
    results = enqueue_many("atomic-txid", payloads)
    stats = run_worker(["atomic-txid"], batch_size=12)
    assert (stats[Result.SUCCEEDED], stats[Result.RETRYING]) == (8, 4)
    failed = {r.message.pk for r, p in zip(results, payloads, strict=True) if p}
    written = txids()
    assert set(written) == {r.message.pk for r in results} - failed
    assert len(set(written.values())) < 8
    for message in Message.objects.filter(pk__in=failed):
        assert (message.status, message.attempt_count) == ("pending", 1)
        assert "Boom" in message.last_error


def test_group_outcomes_are_announced_after_the_commit(run_worker, settings):
    # A receiver reading the message from another connection must already
    # see the outcome it is told about.
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k not in ("cursor_factory", "context", "prepare_threshold", "server_side_binding")
    }
    seen: list[tuple[str, str]] = []
    with psycopg.connect(**params, autocommit=True) as other:

        def look(sender, message, **kwargs):
            row = other.execute(
                "SELECT status FROM django_delayq_message WHERE id = %s", [message.pk]
            ).fetchone()
            seen.append((kwargs["signal"] is signals.message_succeeded and "ok" or "retry", row[0]))

        signals.message_succeeded.connect(look, weak=False)
        signals.message_retried.connect(look, weak=False)
        try:
            enqueue_many("atomic-txid", [{}, {"fail": 1}, {}, {}])
            run_worker(["atomic-txid"], batch_size=4)
        finally:
            signals.message_succeeded.disconnect(look)
            signals.message_retried.disconnect(look)
    assert sorted(seen) == [("ok", "succeeded")] * 3 + [("retry", "pending")]


def test_a_group_whose_commit_fails_records_and_announces_nothing(run_worker, settings):
    # Two messages write the same value under a deferred unique constraint:
    # both handlers succeed, the group's commit fails, and nothing of the
    # group happened: no writes, no outcomes, no signals; the messages keep
    # their leases and are redelivered when those expire.
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE delayq_test_deferred (v integer, "
            "CONSTRAINT delayq_test_deferred_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)"
        )
    announced = []

    def record(sender, message, **kwargs):
        announced.append(message.pk)

    signals.message_succeeded.connect(record, weak=False)
    try:
        enqueue_many("atomic-txid", [{"deferred": 1}, {"deferred": 1}])
        stats = run_worker(["atomic-txid"], batch_size=2)
    finally:
        signals.message_succeeded.disconnect(record)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE delayq_test_deferred")
    assert stats["unrecorded"] == 2 and not stats[Result.SUCCEEDED]
    assert announced == []
    assert not Effect.objects.exists()
    assert list(Message.objects.values_list("status", "attempt_count")) == [("running", 1)] * 2


def test_a_message_lost_by_the_group_rolls_it_back_and_the_others_run_alone(run_worker, settings):
    # The middle message is claimed by someone else while its handler runs:
    # its writes must not commit, so the group rolls back and the others run
    # again, one transaction each; each keeps exactly one write.
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    results = enqueue_many("atomic-txid", [{}, {"steal": True}, {}])
    stats = run_worker(["atomic-txid"], batch_size=3)
    assert (stats[Result.SUCCEEDED], stats[Result.LEASE_LOST]) == (2, 1)
    first, stolen, last = (r.message.pk for r in results)
    written = txids()
    assert sorted(written) == sorted([first, last])
    assert written[first] != written[last]  # committed alone, after the rollback
    assert Message.objects.get(pk=stolen).status == "running"  # left to its new holder
    assert set(Message.objects.filter(pk__in=[first, last]).values_list("status", flat=True)) == {
        "succeeded"
    }


def test_lease_extension_skips_rows_locked_by_an_open_transaction():
    # The lease keeper must never wait for a group of atomic handlers (or any
    # transaction) holding one of its rows.
    enqueue_many("default", [{}, {}])
    batch = claim.claim(["default"], 2, worker="w", lease=timedelta(minutes=1))
    ids = [m.pk for m in batch.messages]
    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k not in ("cursor_factory", "context", "prepare_threshold", "server_side_binding")
    }
    with psycopg.connect(**params) as locker:
        locker.execute("SELECT 1 FROM django_delayq_message WHERE id = %s FOR UPDATE", [ids[0]])
        outcome: list[int] = []

        def extend() -> None:
            try:
                outcome.append(claim.extend(ids, batch.token, timedelta(minutes=5)))
            finally:
                connections.close_all()

        extender = threading.Thread(target=extend)
        extender.start()
        extender.join(timeout=20)
        finished = not extender.is_alive()
        locker.rollback()
        extender.join()
    assert finished, "extend waited for the lock"
    assert outcome == [1]


def test_a_single_atomic_message_still_commits_alone(run_worker, settings):
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    message = enqueue("atomic-txid", {}).message
    assert run_worker(["atomic-txid"])[Result.SUCCEEDED] == 1
    assert list(txids()) == [message.pk]
