"""Acknowledgements committed together: one statement and one commit per batch.

A worker whose handlers are fast spends nearly all its time committing one
acknowledgement per message (the commit waits for the write-ahead log to
reach the disk). Instead, executor threads hand each success of a non-atomic
handler to an :class:`AckBuffer` and move on to the next message; the
buffer's own thread commits everything handed to it in one compare-and-set
transaction (``changes.ack_held``) at most ``DELAYQ["ACK_DELAY"]`` after the
first of them, or as soon as ``max_size`` are waiting, then logs and signals
each success (after the commit, as for a single acknowledgement).

What it does not change: an acknowledgement is still a compare-and-set on
``(id, lock_token)`` (a message claimed again after its lease expired is
reported as a lost lease, not acknowledged); atomic handlers still commit
their writes and their acknowledgement together; a shutdown commits what is
waiting before the worker exits. What it widens: if the process is killed
(SIGKILL, power loss) after a handler returned and before the batch commits,
that message is redelivered when its lease expires and its handler runs
again, as it would if the process died just before a single acknowledgement.
The window is ``ACK_DELAY`` plus one commit; ``ACK_DELAY = None`` turns
batching off.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, reset_queries

from django_delayq.models import Message
from django_delayq.store import changes
from django_delayq.worker.execute import lease_lost, record_success, settle, unrecorded

logger = logging.getLogger("django_delayq.worker")


class AckBuffer:
    """Collects successes from executor threads and commits them in batches."""

    def __init__(
        self,
        using: str,
        *,
        on_lost: Callable[[Message], None] | None = None,
        on_committed: Callable[[bool], None] | None = None,
        max_delay: float,
        max_size: int = 500,
    ) -> None:
        self.using = using
        # Told of a success whose message was claimed again meanwhile, and of
        # each batch committed (whether it finished grouped messages, whose
        # groups' next messages are due now): until then its messages counted
        # as running against a global cap.
        self.on_lost, self.on_committed = on_lost, on_committed
        self.max_delay = max_delay
        self.max_size = max_size
        self._items: list[tuple[Message, uuid.UUID, float]] = []
        self._first_at = 0.0
        self._cond = threading.Condition()
        self._closing = False
        # A batch taken and not yet committed and announced.
        self._flushing = False
        self._thread = threading.Thread(target=self._loop, name="delayq-acks", daemon=True)
        self._thread.start()

    def add(self, message: Message, token: uuid.UUID, duration: float) -> None:
        with self._cond:
            if not self._items:
                self._first_at = time.monotonic()
            self._items.append((message, token, duration))
            if len(self._items) == 1 or len(self._items) >= self.max_size:
                self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until everything handed over is committed and announced (``--burst``:
        a success may let the next message of its group go, which the last claim
        must see)."""
        with self._cond:
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._items and not self._flushing, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Commit what is waiting and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _take(self) -> list[tuple[Message, uuid.UUID, float]] | None:
        with self._cond:
            while not self._items and not self._closing:
                self._cond.wait()
            if not self._items:
                return None
            while len(self._items) < self.max_size and not self._closing:
                remaining = self._first_at + self.max_delay - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch, self._items = self._items, []
            self._flushing = True
            return batch

    def _loop(self) -> None:
        try:
            while (batch := self._take()) is not None:
                try:
                    self._flush(batch)
                finally:
                    with self._cond:
                        self._flushing = False
                        self._cond.notify_all()
        finally:
            connections.close_all()

    def _flush(self, batch: list[tuple[Message, uuid.UUID, float]]) -> None:
        if settings.DEBUG:
            reset_queries()  # DEBUG's query log of this thread's connection
        held = by_token(batch)
        try:
            mine = _settle_pairs(self.using, lambda: changes.ack_held(held, using=self.using))
        except DatabaseError:
            # As when a single acknowledgement cannot be recorded.
            unrecorded(
                self.using,
                "could not record the success of %d message(s); they will be redelivered "
                "when their lease expires",
                len(batch),
            )
            return
        for message, token, duration in batch:
            if (message.pk, token) in mine:
                record_success(message, duration, using=self.using)
            else:
                lease_lost(message)
                if self.on_lost is not None:
                    self.on_lost(message)
        if self.on_committed is not None:
            # After the successes are recorded: each let its group's next go.
            self.on_committed(any(m.group for m, _, _ in batch))


def by_token(
    items: Iterable[tuple[Message, uuid.UUID] | tuple[Message, uuid.UUID, float]],
) -> dict[uuid.UUID, list[Any]]:
    """The ids of ``(message, token, ...)`` items by lock token (``changes.ack_held``'s)."""
    held: defaultdict[uuid.UUID, list[Any]] = defaultdict(list)
    for item in items:
        held[item[1]].append(item[0].pk)
    return held


def _settle_pairs(
    using: str, write: Callable[[], set[tuple[int, uuid.UUID]]]
) -> set[tuple[int, uuid.UUID]]:
    found: set[tuple[int, uuid.UUID]] = set()

    def run() -> int:
        found.clear()
        found.update(write())
        return len(found)

    settle(using, run)
    return found
