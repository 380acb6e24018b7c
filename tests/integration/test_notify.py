"""Wake-up: NOTIFY is sent on commit only, and an idle worker acts on it."""

import json
import signal
import time

import pytest
from django.db import connection, transaction  # noqa: F401 (read by skipif)

from django_delayq import enqueue, enqueue_many
from django_delayq.models import Message
from django_delayq.store.wakeup import NOTIFY_CHANNEL
from tests.conftest import wait_for
from tests.pooler import direct_connect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="LISTEN/NOTIFY is PostgreSQL's"),
]


@pytest.fixture
def listener():
    # A session of its own: behind a pooler, the "direct" alias.
    conn = direct_connect(autocommit=True)
    conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
    yield conn
    conn.close()


def received(conn, timeout=0.5):
    return [json.loads(n.payload) for n in conn.notifies(timeout=timeout)]


def test_notify_is_sent_on_commit_with_queue_and_due_time(listener):
    with transaction.atomic():
        # Due before the next poll (POLL_INTERVAL is 1 s in the test settings).
        message = enqueue("default", {}, delay=0.5).message
        assert received(listener, timeout=0.2) == []  # not before commit
    notes = received(listener)
    assert [n["queue"] for n in notes] == ["default"]
    assert notes[0]["due"] == pytest.approx(message.next_attempt_time.timestamp())


def test_rollback_sends_no_notify(listener):
    with transaction.atomic():
        enqueue("default", {})
        transaction.set_rollback(True)
    assert received(listener) == []


def test_enqueue_outside_a_transaction_notifies_once_per_call(listener):
    # Autocommit: the insert and its NOTIFY are one statement.
    enqueue("default", {"n": 1})
    enqueue_many("other", [{"n": n} for n in range(50)])
    assert [n["queue"] for n in received(listener)] == ["default", "other"]
    assert Message.objects.filter(queue__in=["default", "other"]).count() == 51


def test_every_conflict_mode_notifies_once_when_a_row_changes(listener):
    with transaction.atomic():
        enqueue_many("default", [{}, {}, {}])
    enqueue("default", {}, key="u", on_conflict="update")
    enqueue("default", {"v": 2}, key="u", on_conflict="update")
    enqueue("default", {}, key="e", on_conflict="error")
    assert [n["queue"] for n in received(listener)] == ["default"] * 4


def test_message_due_after_the_next_poll_sends_no_notify(listener, settings):
    # An idle worker sleeps at most POLL_INTERVAL, then reads the next due
    # time: it learns of this message before it is due without a wake-up.
    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 10}
    enqueue("default", {}, key="later", delay=11)
    enqueue_many("default", [{}, {}], delay=60)
    assert received(listener) == []
    enqueue("default", {}, key="soon", delay=9)
    assert [n["queue"] for n in received(listener)] == ["default"]


def test_ignored_duplicate_sends_no_notify(listener):
    enqueue("default", {}, key="k")
    received(listener)
    enqueue("default", {}, key="k")
    assert received(listener) == []


def test_idle_worker_is_woken_by_notify_long_before_its_poll(spawn_worker, settings):
    # A 120 s poll interval: only the notification can explain a quick pickup.
    worker = spawn_worker("--queue", "default", env={"DELAYQ_TEST_POLL": "120"})
    warm = enqueue("default", {}).message  # proves the worker is up and listening
    wait_for(
        lambda: Message.objects.get(pk=warm.pk).status == "succeeded",
        timeout=30,
        message="the worker to start",
    )
    message = enqueue("default", {}).message
    wait_for(
        lambda: Message.objects.get(pk=message.pk).status == "succeeded",
        timeout=20,
        message="the notified worker to pick the message up",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_wait_that_does_not_listen_reads_the_notifications_at_its_end():
    # The worker's wait for the next messages of a steady stream: a
    # notification must not end it (it would wake once per message), and
    # must not be lost either.
    from django_delayq.worker.wakeup import Waker

    waker = Waker("default", ["default"], listen=True, poll_interval=5)
    try:
        assert waker.listening
        enqueue("default", {})  # notified before the wait begins
        started = time.monotonic()
        waker.wait(0.2, listen=False)
        # A select() that watched the LISTEN connection would have returned at once.
        assert time.monotonic() - started >= 0.2
        assert waker.notified == {"default"}
        assert waker.hint is not None
    finally:
        waker.close()


def test_a_listening_wait_reads_every_notification_that_arrived():
    from django_delayq.worker.wakeup import Waker

    waker = Waker("default", ["default", "emails"], listen=True, poll_interval=5)
    try:
        with transaction.atomic():
            enqueue("default", {})
            enqueue("emails", {})
            enqueue("other", {})  # not this worker's queue
        heard: set[str] = set()
        deadline = time.monotonic() + 10
        while heard != {"default", "emails"} and time.monotonic() < deadline:
            waker.wait(1)
            heard |= waker.notified
        assert heard == {"default", "emails"}
    finally:
        waker.close()
