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

from django_delayq import enqueue, enqueue_many, signals
from django_delayq.models import Message
from django_delayq.store import claim, leases
from django_delayq.worker.execute import Result
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


def test_a_group_whose_commit_fails_runs_each_again_alone(run_worker, settings):
    # Two messages write the same value under a deferred unique constraint:
    # both handlers succeed, the group's commit fails, and nothing of the
    # group happened: no writes, no outcomes, no signals. Each then runs
    # again in a transaction of its own, so the one whose commit fails is
    # recorded as failed on its own and the other succeeds.
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
        first, second = (
            r.message for r in enqueue_many("atomic-txid", [{"deferred": 1}, {"deferred": 1}])
        )
        stats = run_worker(["atomic-txid"], batch_size=2)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM delayq_test_deferred")
            written = cursor.fetchone()[0]
    finally:
        signals.message_succeeded.disconnect(record)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE delayq_test_deferred")
    assert (stats[Result.SUCCEEDED], stats[Result.RETRYING]) == (1, 1)
    done = Message.objects.get(pk__in=[first.pk, second.pk], status="succeeded")
    failed = Message.objects.get(pk__in=[first.pk, second.pk], status="pending")
    assert announced == [done.pk]
    assert written == 1 and list(Effect.objects.values_list("message_id", flat=True)) == [done.pk]
    assert (done.attempt_count, failed.attempt_count) == (1, 1)
    assert "IntegrityError" in failed.last_error


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
                outcome.append(leases.extend(ids, batch.token, timedelta(minutes=5)))
            finally:
                connections.close_all()

        extender = threading.Thread(target=extend)
        extender.start()
        extender.join(timeout=20)
        finished = not extender.is_alive()
        locker.rollback()
        extender.join()
    assert finished, "extend waited for the lock"
    assert outcome == [set(ids[1:])]


def test_a_single_atomic_message_still_commits_alone(run_worker, settings):
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 1.0}
    message = enqueue("atomic-txid", {}).message
    assert run_worker(["atomic-txid"])[Result.SUCCEEDED] == 1
    assert list(txids()) == [message.pk]


def _db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def test_a_buffered_message_whose_lease_was_lost_never_runs_in_a_group(settings, serving_worker):
    from tests.conftest import wait_for
    from tests.testapp.handlers import gate

    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 30}  # one group takes every message
    arrived, release = gate("first")
    first = enqueue("atomic-gated", {"gate": "first"}, priority=1).message
    second = enqueue("atomic-gated", {}).message
    serving_worker(["atomic-gated"], concurrency=1, batch_size=5)
    assert arrived.wait(30)
    # The second message waits in the worker's buffer under the claim's
    # token. Its lease is lost meanwhile (as when another worker found this
    # one dead, or after a lease expiry), and this same worker claims it again.
    stale = Message.objects.get(pk=second.pk).lock_token
    assert stale is not None
    Message.objects.filter(pk=second.pk).update(
        status="pending", lock_token=None, next_attempt_time=_db_now()
    )
    wait_for(
        lambda: (
            Message.objects.filter(pk=second.pk, status="running").exclude(lock_token=None).exists()
        ),
        message="the worker to claim the second message again",
    )
    release.set()
    wait_for(
        lambda: Message.objects.filter(status="succeeded").count() == 2,
        message="both messages to succeed",
    )
    # Its handler's writes committed once, under the new claim's token.
    effects = list(Effect.objects.filter(message_id=second.pk).values_list("value", flat=True))
    assert len(effects) == 1 and effects[0] != str(stale)
    assert Effect.objects.filter(message_id=first.pk).count() == 1


def test_a_group_keeps_the_leases_of_its_finished_members_while_another_runs(
    settings, serving_worker
):
    from tests.conftest import wait_for
    from tests.testapp.handlers import gate

    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 30}
    arrived, release = gate("long")
    short = enqueue("atomic-gated", {}, priority=1).message  # lease: 1 s
    enqueue("atomic-gated", {"gate": "long"})
    serving_worker(["atomic-gated"], concurrency=1, batch_size=5)
    assert arrived.wait(30)
    # The short message finished first; its acknowledgement waits for the
    # group's commit. Wait, on the database's clock, until its lease at this
    # moment has long expired: the keeper must have extended it meanwhile.
    claimed = Message.objects.get(pk=short.pk)
    wait_for(
        lambda: _db_now() > claimed.next_attempt_time + timedelta(seconds=1.5),
        message="the lease to pass",
    )
    now = Message.objects.get(pk=short.pk)
    release.set()
    wait_for(
        lambda: Message.objects.filter(status="succeeded").count() == 2,
        message="both messages to succeed",
    )
    # Still held by its first claim, under a lease that runs.
    assert (now.status, now.lock_token) == ("running", claimed.lock_token)
    assert now.next_attempt_time > claimed.next_attempt_time
    assert Effect.objects.filter(message_id=short.pk).count() == 1
