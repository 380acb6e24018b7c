"""Acknowledgements committed in batches (acks.py, settle.ack_held)."""

import time
import uuid
from datetime import timedelta

import pytest

from django_delayq import enqueue_many, signals
from django_delayq.models import Message
from django_delayq.store import claim, settle
from django_delayq.worker.acks import Settler
from django_delayq.worker.inflight import InFlight, Lane, Phase


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
