"""``async def`` handlers: coroutines on the worker's event loop, with every promise of a handler
(retries, time limits, signals)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_delayq import enqueue, enqueue_many, handler, operations, signals
from django_delayq.models import Message
from django_delayq.testing import run_pending
from django_delayq.worker import Worker
from django_delayq.worker.execute import Result
from tests.conftest import finishes_within, wait_for
from tests.testapp.handlers import ASYNC
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh():
    ASYNC.clear()


def test_an_async_handler_runs_and_its_message_succeeds(run_worker):
    # It was called, got a coroutine, and the message was marked succeeded
    # without it ever running.
    message = enqueue("async", {}).message
    stats = run_worker(["async"])
    message.refresh_from_db()
    assert (message.status, message.attempt_count) == ("succeeded", 1)
    assert list(Effect.objects.values_list("message_id", flat=True)) == [message.pk]
    assert stats[Result.SUCCEEDED] == 1


def test_an_async_handlers_errors_retries_and_discards_are_those_of_any_handler(run_worker):
    failing = enqueue("async", {"fail": 1}).message
    snoozed = enqueue("async", {"retry_in": 3600}).message
    dropped = enqueue("async", {"discard": "no"}).message
    retried: list[int] = []

    def on_retry(sender, message, **kwargs):
        retried.append(message.pk)

    signals.message_retried.connect(on_retry, weak=False)
    try:
        stats = run_worker(["async"])
    finally:
        signals.message_retried.disconnect(on_retry)
    rows = {m.pk: m for m in Message.objects.all()}
    assert (rows[failing.pk].status, rows[failing.pk].attempt_count) == ("pending", 1)
    assert "Boom" in rows[failing.pk].last_error
    assert (rows[snoozed.pk].status, rows[snoozed.pk].max_attempts) == ("pending", 3)
    assert (rows[dropped.pk].status, rows[dropped.pk].last_error) == ("failed", "Discarded: no")
    assert sorted(retried) == sorted([failing.pk, snoozed.pk])
    assert (stats[Result.RETRYING], stats[Result.SNOOZED], stats[Result.DISCARDED]) == (1, 1, 1)


def test_async_handlers_run_together_on_one_loop_beyond_the_workers_threads():
    # concurrency=20 on the handler, one thread for the worker's other queues:
    # ten coroutines wait until all ten run at once, on one thread.
    results = enqueue_many("async", [{"meet": 10}] * 10)
    worker = Worker(["async"], burst=True, concurrency=1)
    stats = finishes_within(60, worker.run)
    assert stats[Result.SUCCEEDED] == 10
    assert ASYNC["peak"] >= 10
    assert len(ASYNC["threads"]) == 1
    assert threading.get_ident() not in ASYNC["threads"]
    assert Effect.objects.count() == len(results)


@pytest.mark.parametrize("escape", ["SystemExit", "KeyboardInterrupt"])
def test_an_async_handlers_system_exit_fails_its_own_attempt_not_the_others_on_the_loop(escape):
    """asyncio lets ``SystemExit`` and ``KeyboardInterrupt`` out of the loop: one
    handler raising either stopped the worker's event loop, and every other
    coroutine on it was cancelled mid-attempt (a failed attempt each, and a
    "coroutine was never awaited" from the loop's shutdown). It must end that
    handler's attempt only, as it does a plain handler's."""
    bystanders = [m.message for m in enqueue_many("async", [{"meet": 3}] * 2)]
    escaping = enqueue("async", {"meet": 3, "escape": escape}).message
    worker = Worker(["async"], burst=True, concurrency=1)
    stats = finishes_within(60, worker.run)
    for bystander in bystanders:
        bystander.refresh_from_db()
        assert (bystander.status, bystander.attempt_count, bystander.last_error) == (
            "succeeded",
            1,
            "",
        )
    escaping.refresh_from_db()
    assert (escaping.status, escaping.attempt_count) == ("pending", 1)  # retried later
    assert escape in escaping.last_error
    assert (stats[Result.SUCCEEDED], stats[Result.RETRYING]) == (2, 1)


def test_past_its_time_limit_an_async_handlers_coroutine_is_cancelled(serving_worker):
    message = enqueue("async-limited", {}).message
    serving_worker(["async-limited"])
    wait_for(lambda: ASYNC.get("cancelled") == [message.pk], message="the coroutine's cancel")
    wait_for(lambda: Message.objects.get(pk=message.pk).status == "failed", message="failed")
    assert Message.objects.get(pk=message.pk).last_error.startswith(
        "django_delayq.exceptions.TimeLimitExceeded"
    )


def test_the_testing_helpers_run_an_async_handler_in_the_test(run_worker):
    message = enqueue("async", {}).message
    [attempt] = run_pending("async")
    assert (attempt.message.pk, attempt.result) == (message.pk, "succeeded")
    assert Effect.objects.filter(message_id=message.pk).count() == 1


def test_an_atomic_async_handler_is_refused_where_it_is_declared():
    with pytest.raises(ImproperlyConfigured, match="cannot be atomic=True"):

        @handler("async-atomic", atomic=True)
        async def h(message):  # pragma: no cover - never registered
            await asyncio.sleep(0)


def test_a_connection_the_database_dropped_fails_one_async_handler_not_all_after_it(
    serving_worker,
):
    """The async ORM runs on asgiref's thread, whose connection no outcome write
    uses: one the database dropped is closed after the handler that met it, and the
    next attempt connects again (it failed every async handler after it)."""
    from asgiref.sync import SyncToAsync
    from django.db import connection as ours
    from django.db import connections

    if ours.vendor == "sqlite":
        pytest.skip("a SQLite connection is a file: no server drops it")
    first = enqueue("async", {}).message
    serving_worker(["async"])
    wait_for(lambda: Message.objects.get(pk=first.pk).status == "succeeded", message="first")

    def drop() -> None:  # as a server that went away: the driver's connection is dead
        connections["default"].connection.close()

    SyncToAsync.single_thread_executor.submit(drop).result(timeout=30)
    second = enqueue("async", {}).message  # max_attempts=2
    wait_for(
        lambda: Message.objects.filter(pk=second.pk, status="pending", attempt_count=1).exists(),
        message="its first attempt's failure",
    )
    operations.run_now(Message.objects.filter(pk=second.pk))  # not after the policy's delay
    wait_for(
        lambda: Message.objects.get(pk=second.pk).status in ("succeeded", "failed"),
        message="the second message's end",
    )
    second.refresh_from_db()
    assert second.status == "succeeded", second.last_error
    assert second.attempt_count == 2  # its first attempt met the dropped connection
