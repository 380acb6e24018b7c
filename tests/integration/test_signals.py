"""django_delayq.signals: sent with the right arguments, at the right moment."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.dispatch import Signal

from django_delayq import Discard, Outcome, Retry, enqueue, enqueue_many, signals
from django_delayq.exceptions import MessageAbandoned
from django_delayq.models import Message
from tests.testapp.handlers import Boom

ALL = {
    "enqueued": signals.message_enqueued,
    "started": signals.message_started,
    "succeeded": signals.message_succeeded,
    "retried": signals.message_retried,
    "failed": signals.message_failed,
    "discarded": signals.message_discarded,
}


class Recorder:
    """Connects to every signal and keeps (name, sender, kwargs) in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self._receivers: list[tuple[Signal, Any]] = []

    def connect(self) -> None:
        for name, signal in ALL.items():

            def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
                kwargs.pop("signal")
                self.calls.append((_name, sender, kwargs))

            signal.connect(receiver, weak=False)
            self._receivers.append((signal, receiver))

    def disconnect(self) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)

    def names(self, pk: int | None = None) -> list[str]:
        return [n for n, _, kw in self.calls if pk is None or kw["message"].pk == pk]

    def one(self, name: str) -> dict[str, Any]:
        found = [kw for n, _, kw in self.calls if n == name]
        assert len(found) == 1, (name, self.calls)
        return found[0]


@pytest.fixture
def received() -> Iterator[Recorder]:
    recorder = Recorder()
    recorder.connect()
    yield recorder
    recorder.disconnect()


# -- enqueued: on commit --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueued_is_sent_after_commit_once_per_new_message(received):
    with transaction.atomic():
        r = enqueue("default", {"n": 1}, key="a")
        assert received.calls == []  # not before the commit
    assert received.names() == ["enqueued"]
    call = received.calls[0]
    assert call[1] is Message
    assert call[2]["message"].pk == r.message.pk
    assert call[2]["message"].payload == {"n": 1}
    assert call[2]["outcome"] is Outcome.CREATED
    assert call[2]["using"] == "default"

    received.calls.clear()
    enqueue_many("default", [{"n": 2}, {"n": 3}, {"n": 4}], keys=["a", "b", "c"])
    # "a" exists and is ignored: only the two new messages are announced.
    assert sorted(kw["message"].key for _, _, kw in received.calls) == ["b", "c"]
    assert {kw["outcome"] for _, _, kw in received.calls} == {Outcome.CREATED}

    received.calls.clear()
    enqueue("default", {"n": 5}, key="a", on_conflict="update")
    assert [(kw["message"].key, kw["outcome"]) for _, _, kw in received.calls] == [
        ("a", Outcome.UPDATED)
    ]


@pytest.mark.django_db(transaction=True)
def test_enqueued_is_not_sent_for_a_rolled_back_message(received):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("default", {}, key="gone")
        raise RuntimeError("the business write failed")
    assert not Message.objects.filter(key="gone").exists()
    assert received.calls == []


def test_without_receivers_enqueue_registers_no_commit_callback(
    db, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        enqueue("default", {}, key="quiet")
    assert callbacks == []


def test_enqueued_inside_a_test_transaction_needs_captured_callbacks(
    db, received, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        enqueue("default", {}, key="captured")
    assert [kw["message"].key for _, _, kw in received.calls] == ["captured"]


# -- the attempt's signals --------------------------------------------------------


def test_success_sends_started_then_succeeded(delayq, received):
    message = enqueue("default", {}, key="ok").message
    received.calls.clear()
    delayq.run_pending("default")
    assert received.names() == ["started", "succeeded"]
    started, succeeded = (kw for _, _, kw in received.calls)
    assert started["message"].pk == succeeded["message"].pk == message.pk
    assert started["attempt"] == succeeded["attempt"] == 1
    assert started["using"] == succeeded["using"] == "default"
    assert succeeded["duration"] >= 0
    # Sent after the acknowledgement: the row already says succeeded.
    assert Message.objects.get(pk=message.pk).status == "succeeded"


def test_failure_sends_retried_with_the_exception_then_failed(delayq, received):
    message = enqueue("other", {"fail": 5}, key="bad").message  # "other": max_attempts=2
    delayq.run_pending("other")
    retried = received.one("retried")
    assert retried["message"].pk == message.pk
    assert retried["attempt"] == 1
    assert isinstance(retried["exception"], Boom)
    assert "attempt 1 of message" in str(retried["exception"])
    assert retried["delay"] == timedelta(seconds=60)  # the suite's FixedDelay
    assert "failed" not in received.names()

    delayq.advance(seconds=60)
    delayq.run_pending("other")
    failed = received.one("failed")
    assert failed["attempt"] == 2
    assert isinstance(failed["exception"], Boom)
    assert "attempt 2 of message" in str(failed["exception"])
    assert received.names(message.pk) == ["started", "retried", "started", "failed"]
    assert Message.objects.get(pk=message.pk).status == "failed"


def test_retry_sends_retried_with_the_retry_and_its_delay(delayq, received):
    enqueue("default", {"retry_in": 30}, key="snooze")
    delayq.run_pending("default")
    retried = received.one("retried")
    assert isinstance(retried["exception"], Retry)
    assert retried["delay"] == timedelta(seconds=30)


def test_discard_sends_discarded_with_the_reason(delayq, received):
    enqueue("default", {"discard": "no such customer"}, key="drop")
    delayq.run_pending("default")
    discarded = received.one("discarded")
    assert discarded["reason"] == "no such customer"
    assert discarded["attempt"] == 1
    assert received.names() == ["started", "discarded"]


def test_exhausted_crash_attempts_send_failed_with_message_abandoned(delayq, received):
    message = enqueue("other", {}, key="crashed").message
    # Two attempts ended without an outcome (their workers died).
    Message.objects.filter(pk=message.pk).update(attempt_count=2)
    delayq.run_pending("other")
    failed = received.one("failed")
    assert isinstance(failed["exception"], MessageAbandoned)
    assert "ended without an outcome" in str(failed["exception"])
    assert "started" not in received.names()


def test_a_raising_receiver_is_logged_and_changes_nothing(delayq, caplog):
    def broken(sender: Any, **kwargs: Any) -> None:
        raise ValueError("receiver bug")

    signals.message_succeeded.connect(broken, weak=False)
    try:
        message = enqueue("default", {}, key="robust").message
        with caplog.at_level("ERROR", logger="django_delayq.signals"):
            [attempt] = delayq.run_pending("default")
    finally:
        signals.message_succeeded.disconnect(broken)
    assert attempt.result == "succeeded"
    assert Message.objects.get(pk=message.pk).status == "succeeded"
    [record] = [r for r in caplog.records if r.name == "django_delayq.signals"]
    assert record.exc_info is not None and "receiver bug" in str(record.exc_info[1])


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_sends_the_signals_from_its_threads(run_worker, received):
    ok = enqueue("default", {}, key="w-ok").message
    bad = enqueue("default", {"discard": "nope"}, key="w-bad").message
    received.calls.clear()  # the enqueued ones
    run_worker(["default"], concurrency=2)
    assert received.names(ok.pk) == ["started", "succeeded"]
    assert received.names(bad.pk) == ["started", "discarded"]


def test_signals_module_names_every_signal():
    assert set(signals.__all__) == {f"message_{n}" for n in ALL}
    assert all(isinstance(getattr(signals, n), Signal) for n in signals.__all__)


def test_discard_attempts_capture_the_reason_as_exception(delayq):
    enqueue("default", {"discard": "bad data"}, key="d")
    [attempt] = delayq.run_pending("default")
    assert attempt.result == "discarded"
    assert isinstance(attempt.exception, Discard)
    assert attempt.exception.reason == "bad data"
