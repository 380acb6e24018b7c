"""Acknowledgements committed in batches (acks.py, settle.ack_held)."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connections

from django_delayq import enqueue, enqueue_many, signals
from django_delayq.models import Message
from django_delayq.store import claim, settle
from django_delayq.worker import Worker
from django_delayq.worker.acks import Settler
from django_delayq.worker.inflight import InFlight, Lane, Phase
from tests.conftest import wait_for


def claim_three():
    enqueue_many("default", [{"n": i} for i in range(3)])
    held = claim.claim(["default"], 3, worker="w", lease=timedelta(minutes=1))
    assert len(held.messages) == 3
    return held


def reclaim(message):
    """What another worker's claim after the lease expired leaves behind."""
    Message.objects.filter(pk=message.pk).update(lock_token=uuid.uuid4())


@pytest.mark.django_db
def test_ack_held_acknowledges_only_messages_still_held():
    held = claim_three()
    stolen = held.messages[0]
    reclaim(stolen)

    acked = settle.ack_held({held.token: [m.pk for m in held.messages]})

    assert acked == {(m.pk, held.token) for m in held.messages[1:]}
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert statuses[stolen.pk] == "running"
    assert [statuses[m.pk] for m in held.messages[1:]] == ["succeeded", "succeeded"]


def held(batch) -> list[InFlight]:
    """The claimed messages as a worker's book holds them (settling: their handlers returned)."""
    lane = Lane(["default"], 10)
    items = [InFlight(m, batch.token, lane, timedelta(minutes=1)) for m in batch.messages]
    for item in items:
        item.phase = Phase.SETTLING
    return items


@pytest.mark.django_db(transaction=True)
def test_settler_commits_on_close_and_signals_only_what_it_acknowledged():
    batch = claim_three()
    stolen = batch.messages[2]
    reclaim(stolen)
    succeeded, settled = [], []

    def on_success(sender, message, **kwargs):
        # Sent after the commit: the row is already succeeded.
        succeeded.append((message.pk, Message.objects.get(pk=message.pk).status))

    signals.message_succeeded.connect(on_success, weak=False)
    try:
        # A delay far longer than the test: only close() can commit them.
        settler = Settler("default", max_delay=3600, settled=settled.extend)
        settler.start()
        for item in held(batch):
            settler.add(item, 0.001)
        assert settler.pending() == 3
        settler.close()
    finally:
        signals.message_succeeded.disconnect(on_success)

    assert sorted(succeeded) == sorted((m.pk, "succeeded") for m in batch.messages[:2])
    outcomes = {item.row.pk: result for item, result, _ in settled}
    assert outcomes == {
        batch.messages[0].pk: "succeeded",
        batch.messages[1].pk: "succeeded",
        stolen.pk: "lease_lost",
    }
    assert Message.objects.get(pk=stolen.pk).status == "running"


@pytest.mark.django_db(transaction=True)
def test_settler_commits_a_full_batch_without_waiting_for_the_delay():
    batch = claim_three()
    settler = Settler("default", max_delay=3600, max_size=3, settled=lambda done: None)
    settler.start()
    try:
        for item in held(batch):
            settler.add(item, 0.001)
        done = Message.objects.filter(status="succeeded")
        deadline = time.monotonic() + 30
        while done.count() < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done.count() == 3
    finally:
        settler.close()


@pytest.mark.django_db(transaction=True)
def test_a_claim_carries_the_successes_waiting_and_the_settler_announces_them():
    if not claim.carries_acks("default"):
        pytest.skip("a claim carries acknowledgements on PostgreSQL only")
    batch = claim_three()
    Message.objects.filter(pk=batch.messages[2].pk).update(group="g")
    grouped = Message.objects.get(pk=batch.messages[2].pk)
    items = held(batch)
    items[2].row = grouped  # its group's next waits for it: it goes in a batch of its own
    succeeded, settled = [], []

    def on_success(sender, message, **kwargs):
        succeeded.append((message.pk, Message.objects.get(pk=message.pk).status))

    signals.message_succeeded.connect(on_success)
    settler = Settler("default", settled=settled.extend, max_delay=30.0)
    settler.start()
    try:
        for item in items:
            settler.add(item, 0.01)
        riding, acks = settler.take_riding()
        assert [a.item for a in riding] == items[:2]
        assert settler.pending() == 3  # taken, not yet committed
        taken = claim.claim(["default"], 1, worker="w", lease=timedelta(minutes=1), acks=acks)
        assert taken.acked == {(m.pk, batch.token) for m in batch.messages[:2]}
        settler.rode(riding, taken.acked)
        deadline = time.monotonic() + 10
        while len(settled) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(succeeded) == sorted((m.pk, "succeeded") for m in batch.messages[:2])
        assert [(item, result) for item, result, _ in settled] == [
            (items[0], "succeeded"),
            (items[1], "succeeded"),
        ]
        assert settler.pending() == 1  # the grouped one waits for its batch
    finally:
        settler.close()
        signals.message_succeeded.disconnect(on_success)
    assert Message.objects.get(pk=grouped.pk).status == "succeeded"  # on close
    assert len(succeeded) == 3


@pytest.mark.django_db(transaction=True)
def test_successes_a_failed_claim_was_to_carry_are_written_by_the_settler():
    if not claim.carries_acks("default"):
        pytest.skip("a claim carries acknowledgements on PostgreSQL only")
    batch = claim_three()
    items = held(batch)
    succeeded = []

    def on_success(sender, message, **kwargs):
        succeeded.append(message.pk)

    signals.message_succeeded.connect(on_success)
    settler = Settler("default", settled=lambda done: None, max_delay=30.0)
    settler.start()
    try:
        for item in items:
            settler.add(item, 0.01)
        riding, _ = settler.take_riding()
        assert len(riding) == 3
        settler.give_back(riding)  # the claim's statement failed
        assert settler.wait_idle(10)
        deadline = time.monotonic() + 10
        while len(succeeded) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signals.message_succeeded.disconnect(on_success)
        settler.close()
    assert sorted(succeeded) == sorted(m.pk for m in batch.messages)
    assert set(Message.objects.values_list("status", flat=True)) == {"succeeded"}


@pytest.mark.django_db(transaction=True)
def test_in_a_sparse_stream_the_next_claim_commits_the_last_success(settings, monkeypatch):
    # A message at a time: the worker claims once per message, and that claim's
    # statement commits the success before it (ACK_DELAY here is far longer than
    # the test: no batch of the settler's own writes it).
    if not claim.carries_acks("default"):
        pytest.skip("a claim carries acknowledgements on PostgreSQL only")
    settings.DELAYQ = {**settings.DELAYQ, "ACK_DELAY": 60, "CLAIM_DELAY": None}
    batches = []
    ack_held = settle.ack_held
    monkeypatch.setattr(settle, "ack_held", lambda *a, **k: batches.append(a) or ack_held(*a, **k))
    succeeded = []

    def on_success(sender, message, **kwargs):
        succeeded.append(message.pk)

    signals.message_succeeded.connect(on_success)
    worker = Worker(["default"], concurrency=1)

    def serve():
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        first = enqueue("default", {}, key="first").message
        wait_for(lambda: worker.settler.pending() == 1, message="the first success handed over")
        second = enqueue("default", {}, key="second").message
        wait_for(
            lambda: Message.objects.get(pk=first.pk).status == "succeeded",
            message="the claim of the second to commit the first",
        )
        wait_for(lambda: succeeded == [first.pk], message="the first success announced")
        assert not batches  # committed by the claim alone
    finally:
        worker.stop()
        thread.join(60)
        signals.message_succeeded.disconnect(on_success)
    assert not thread.is_alive()
    assert Message.objects.get(pk=second.pk).status == "succeeded"  # at shutdown
    assert sorted(succeeded) == sorted([first.pk, second.pk])
