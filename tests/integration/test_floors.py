"""Claims that begin at a floor (``worker/floors.py``) still take every message.

Under a steady stream a listening worker's claims begin at each lane's
floor, past the dead index entries a held vacuum horizon leaves. Every way a
claimable row can come to lie below that floor must still end with the row
claimed: a notification lowers the floor (a producer's transaction that
commits late), and the maintenance thread's look below the floors finds the
rest (a row lock released, a row changed with no NOTIFY). A steady stream
keeps the worker from ever idling a whole poll interval, after which it
would claim from the beginning anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_delayq import enqueue
from django_delayq.models import Message
from django_delayq.worker import Worker
from tests.conftest import wait_for
from tests.integration.test_seams import hold_lock

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'",
        reason="claims begin at a floor only where a LISTEN hears every message",
    ),
]


@contextmanager
def stream(every: float = 0.05) -> Iterator[list[int]]:
    """Enqueue a message on ``default`` every ``every`` seconds on a thread of its own;
    yields the keys of those enqueued so far."""
    sent: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.wait(every):
                sent.append(enqueue("default", {"stream": True}).message.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(30)


def floor_of(worker: Worker):
    return worker.claimer.floors.start(worker.book.lanes[0])[0]


def succeeded(pk: int) -> bool:
    return Message.objects.filter(pk=pk, status="succeeded").exists()


def status(pk: int) -> str:
    return Message.objects.values_list("status", flat=True).get(pk=pk)


def floor_past(worker: Worker, moment) -> None:
    wait_for(
        lambda: (floor := floor_of(worker)) is not None and floor > moment,
        message="the worker's floor to rise past the row",
    )


def more_done(sent: list[int], count: int) -> None:
    """Wait until ``count`` more of the stream's messages have succeeded (progress, not time)."""
    last = len(sent)
    wait_for(lambda: len(sent) >= last + count, message="the stream to go on")
    wait_for(
        lambda: all(succeeded(pk) for pk in sent[last : last + count]),
        message="the stream's messages to be claimed",
    )


def hidden_row(due_in: timedelta = timedelta(hours=1)) -> Message:
    """A message due later than the poll interval: enqueued with no NOTIFY."""
    return enqueue("default", {"hidden": True}, delay=due_in).message


def test_under_a_steady_stream_claims_begin_at_a_rising_floor(serving_worker):
    worker = serving_worker(["default"], concurrency=2)
    started = timezone.now()
    with stream() as sent:
        floor_past(worker, started)
        more_done(sent, 10)
    wait_for(lambda: all(succeeded(pk) for pk in sent), message="the stream to be done")


def test_a_row_changed_below_the_floor_with_no_notify_is_found_by_the_look_below(
    serving_worker,
):
    worker = serving_worker(["default"], concurrency=2)
    row = hidden_row()
    with stream() as sent:
        floor_past(worker, timezone.now())
        # Without the maintenance thread's look, the claims never see it.
        look = worker.maintenance._below_floors
        worker.maintenance._below_floors = lambda: False
        # A project's own update, as of an operator moving a message forward.
        Message.objects.filter(pk=row.pk).update(
            next_attempt_time=timezone.now() - timedelta(minutes=5)
        )
        more_done(sent, 20)
        assert status(row.pk) == "pending"
        worker.maintenance._below_floors = look
        wait_for(lambda: succeeded(row.pk), message="the row below the floor to run")
        assert floor_of(worker) is not None  # the stream goes on from a floor again
        more_done(sent, 5)


def test_a_row_locked_while_the_floor_passed_it_runs_once_released(serving_worker):
    worker = serving_worker(["default"], concurrency=2)
    # Due within a second: not notified (past the test's poll interval of 1 s
    # it would be; 2 s is not), locked before it comes due.
    row = hidden_row(timedelta(seconds=2))
    locked, unlock, holder = hold_lock(row.pk)
    try:
        with stream() as sent:
            due = Message.objects.values_list("next_attempt_time", flat=True).get(pk=row.pk)
            floor_past(worker, due)
            more_done(sent, 5)
            assert status(row.pk) == "pending"
            unlock.set()
            holder.join(30)
            wait_for(lambda: succeeded(row.pk), message="the released row to run")
    finally:
        unlock.set()


def test_a_producer_committing_after_the_floor_passed_its_row_is_heard(serving_worker):
    worker = serving_worker(["default"], concurrency=2)
    with stream() as sent:
        floor_past(worker, timezone.now())
        # Only the notification may bring it back: no look below the floors.
        worker.maintenance._below_floors = lambda: False
        with transaction.atomic():
            row = enqueue("default", {"late": True}).message
            floor_past(worker, row.next_attempt_time)
            more_done(sent, 5)
        wait_for(lambda: succeeded(row.pk), message="the late producer's row to run")
        more_done(sent, 5)


def test_a_listen_connection_lost_drops_the_floors(serving_worker):
    worker = serving_worker(["default"], concurrency=2)
    with stream() as sent:
        floor_past(worker, timezone.now())
        worker.maintenance._below_floors = lambda: False
        waker = worker.claimer.waker
        listens = waker.listens
        # This worker's listener's backend ends (its own: another test's, or a
        # pooled server connection, must not): notifications sent until the
        # worker listens again are lost, so its claims must begin at the beginning.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [waker._listener.info.backend_pid])
        row = hidden_row()
        Message.objects.filter(pk=row.pk).update(
            next_attempt_time=timezone.now() - timedelta(minutes=5)
        )
        wait_for(lambda: worker.claimer.waker.listens > listens, message="a new LISTEN")
        wait_for(lambda: succeeded(row.pk), message="the row to be claimed")
        more_done(sent, 5)
