"""Django signals for the life of a message.

Every signal is sent with ``sender=Message`` (the model class, as Django's
model signals do; for the rows of a ``QueueFields`` model, ``sender`` is that
model and ``message`` is the row) and keyword arguments; receivers should accept
``**kwargs`` so that later arguments do not break them.

* ``message_enqueued(message, outcome, using)``: a message was created or
  updated by ``enqueue`` / ``enqueue_many`` (not for ``Outcome.IGNORED``).
  Sent **after the enqueue's transaction commits** (``transaction.on_commit``),
  once per message: a message that was rolled back with the caller's
  transaction never existed, so nothing is announced for it. Inside a test
  wrapped in a transaction (``TestCase``, pytest-django's ``db``) it is sent
  only by ``captureOnCommitCallbacks(execute=True)`` /
  ``django_capture_on_commit_callbacks``.
* ``message_started(message, attempt, using)``: a worker is about to call the
  handler (``attempt`` counts from 1).
* ``message_succeeded(message, attempt, duration, using)``: the handler
  returned and the message is marked succeeded.
* ``message_retried(message, attempt, exception, delay, using)``: the attempt
  failed (or the handler raised ``Retry``: ``exception`` is then that
  ``Retry``) and the message will run again after ``delay``.
* ``message_failed(message, attempt, exception, using)``: the message gave
  up and is now ``failed`` (attempts exhausted, the retry policy said stop,
  or no handler). ``exception`` is what the last attempt raised; after
  attempts that ended without an outcome (a crashed worker) it is a
  ``MessageAbandoned``.
* ``message_discarded(message, attempt, reason, using)``: the handler raised
  ``Discard(reason)``; the message is now ``failed`` and will not run again.

The outcome signals are sent by the worker thread that recorded the outcome
(the handler's, or the lease keeper's for an attempt past its time limit),
after the outcome was committed; an attempt whose outcome could not be
recorded (its lease was lost to another worker) sends none. ``duration`` is the handler's
run time in seconds. A receiver that raises is logged
(``django_delayq.signals``) and never changes the outcome. With no receiver
connected, sending costs one attribute check.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.dispatch import Signal

from django_delayq import guard

logger = logging.getLogger("django_delayq.signals")

message_enqueued = Signal()
message_started = Signal()
message_succeeded = Signal()
message_retried = Signal()
message_failed = Signal()
message_discarded = Signal()

__all__ = [
    "message_discarded",
    "message_enqueued",
    "message_failed",
    "message_retried",
    "message_started",
    "message_succeeded",
]


def send(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` from the Message model; whatever a receiver raises is logged, not raised.

    Each receiver is called on its own (:func:`django_delayq.guard.call`), so
    one that raises, even ``SystemExit`` or ``asyncio.CancelledError`` (which
    Django's ``send_robust`` lets through), neither stops the receivers after
    it nor the worker thread that sends.
    """
    if not signal.receivers:
        return
    from django_delayq.models import Message

    row = kwargs.get("message")
    sender = Message if row is None else type(row)
    for receiver in _receivers(signal, sender):
        guard.call(
            f"signal receiver {receiver!r}",
            receiver,
            signal=signal,
            sender=sender,
            log=logger,
            **kwargs,
        )


def _receivers(signal: Signal, sender: Any) -> list[Any]:
    """The live receivers of ``signal`` for ``sender``, the async ones made callable
    from this (synchronous) thread."""
    sync_receivers, async_receivers = signal._live_receivers(sender)  # type: ignore[attr-defined]
    return [*sync_receivers, *(async_to_sync(r) for r in async_receivers)]
