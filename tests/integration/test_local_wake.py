"""SQLite's wake-up: a commit that enqueued wakes the workers of this machine through
their local sockets (``store/localwake.py``); a rollback wakes nobody; polling stays
the floor. The pickup tests give the workers a poll interval of a minute: only a
wake-up can start the message before the test's deadline."""

from __future__ import annotations

import json
import logging
import os
import socket

import pytest
from django.db import connection, transaction

from django_delayq import enqueue
from django_delayq.models import Message
from django_delayq.store import localwake
from tests.conftest import wait_for

pytestmark = pytest.mark.skipif(
    "connection.vendor != 'sqlite'", reason="the local wake-up is SQLite's"
)


@pytest.fixture
def receiver(transactional_db):
    where = localwake.directory(connection)
    assert where is not None, "the suite's SQLite database is a file"
    found = localwake.Receiver(where)
    yield found
    found.close()


def bodies(receiver: localwake.Receiver) -> list[dict]:
    return [json.loads(body) for body in receiver.drain()]


def test_a_commit_sends_one_wake_up_with_queue_and_due_time(receiver):
    with transaction.atomic():
        enqueue("default", {"n": 1})
        assert bodies(receiver) == []  # not before the commit
    [body] = bodies(receiver)
    assert body["queue"] == "default"
    assert abs(body["due"] - Message.objects.get().next_attempt_time.timestamp()) < 1


def test_a_rollback_wakes_nobody(receiver):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("default", {"n": 1})
        raise RuntimeError
    assert bodies(receiver) == []
    enqueue("default", {"n": 2}, key="k")
    enqueue("default", {"n": 3}, key="k")  # ignored: nothing new to wake for
    assert [b["queue"] for b in bodies(receiver)] == ["default"]


def test_every_way_of_enqueuing_wakes(receiver):
    from django_delayq import enqueue_many

    enqueue("default", {}, on_conflict="update", key="u")
    enqueue("default", {}, on_conflict="error", key="e")
    enqueue_many("default", [{}, {}])
    enqueue("default", {}, group="g")
    assert len(bodies(receiver)) == 4


def test_no_commit_callback_while_no_worker_waits(db, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        enqueue("default", {})
    assert callbacks == []


def test_no_wake_up_when_notify_is_off(receiver, settings):
    settings.DELAYQ = {**settings.DELAYQ, "NOTIFY": False}
    enqueue("default", {})
    assert bodies(receiver) == []


def test_a_dead_workers_socket_is_removed_by_the_next_sender(receiver):
    where = receiver.path.parent
    dead = where / "dead-worker.sock"
    gone = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    gone.bind(str(dead))
    gone.close()  # bound, then its process ended without removing it (SIGKILL)
    assert localwake.send(where, b"{}") == 1
    assert not dead.exists()
    assert receiver.path.exists()


def test_a_directory_another_user_could_write_is_not_used(receiver):
    where = receiver.path.parent
    os.chmod(where, 0o777)
    try:
        assert localwake.send(where, b"{}") == 0
        with pytest.raises(PermissionError):
            localwake.Receiver(where)
    finally:
        os.chmod(where, 0o700)


@pytest.fixture
def startup_lines(caplog):
    caplog.set_level(logging.INFO, logger="django_delayq.worker")
    return lambda: [r for r in caplog.records if r.getMessage().startswith("wake-up: ")]


@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_picks_up_a_commit_without_waiting_for_its_poll(
    settings, serving_worker, startup_lines
):
    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 60}
    serving_worker(["default"])
    [line] = wait_for(startup_lines, message="the wake-up line")
    assert line.getMessage().startswith("wake-up: local socket ")
    for n in range(3):  # each after the worker went idle again
        message = enqueue("default", {"n": n}).message
        wait_for(
            lambda m=message: Message.objects.get(pk=m.pk).status == "succeeded",
            timeout=20,
            message="a pickup well before the minute's poll",
        )


@pytest.mark.process
def test_a_worker_process_is_woken_by_another_process_commit(spawn_worker):
    worker = spawn_worker("--queue", "default", env={"DELAYQ_TEST_POLL": "60"})
    worker.wait_until_consuming()
    assert worker.printed("wake-up: local socket ")
    message = enqueue("default", {"n": 1}).message
    wait_for(
        lambda: Message.objects.get(pk=message.pk).status == "succeeded",
        timeout=20,
        message="a pickup well before the minute's poll",
    )
