"""The claimer: what to claim, how much, and how long to sleep when nothing is due.

Runs in the worker's main thread. Each round claims, lane by lane, what the
lane has room for (``Book.room``: its free slots plus a prefetched batch),
skipping paused queues; claims are sized to the lane's recent work when
``BATCH_SIZE`` is None. When a round claims nothing, the claimer sleeps
until the earliest of: a notification (PostgreSQL LISTEN/NOTIFY), a poke from
inside the process (a slot freed, a shutdown), the next due time it knows
of, or the poll interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import timedelta

from django.db.models import Min

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.queues import paused_queues
from django_delayq.store import changes
from django_delayq.store.queries import active_condition
from django_delayq.worker.inflight import Book, InFlight, Lane
from django_delayq.worker.wakeup import Waker

logger = logging.getLogger("django_delayq.worker")

# Shortest idle sleep when something is due but could not be claimed (it is
# being claimed by another worker right now): avoids a busy loop.
MIN_IDLE_SLEEP = 0.01

# Adaptive claims (DELAYQ["BATCH_SIZE"] = None): the first claim of a lane
# asks for ADAPTIVE_FIRST_BATCH (at least one per slot); later ones for about
# CLAIM_WINDOW seconds of the lane's measured work, at most ADAPTIVE_MAX_BATCH.
ADAPTIVE_FIRST_BATCH = 10
ADAPTIVE_MAX_BATCH = 100
CLAIM_WINDOW = 0.1

HandlerKey = tuple[str, str | None]


class Claimer:
    def __init__(
        self,
        book: Book,
        *,
        name: str,
        queues: list[str],
        using: str,
        batch_size: int | None,
        poll_interval: float,
        default_lease: timedelta,
        leases: Mapping[HandlerKey, timedelta],
        time_limits: Mapping[HandlerKey, timedelta | None],
    ) -> None:
        self.book = book
        self.name = name
        self.queues = queues
        self.using = using
        # No BATCH_SIZE: each claim is sized to about CLAIM_WINDOW of the
        # lane's recent work, between its handler slots and ADAPTIVE_MAX_BATCH.
        self.adaptive = batch_size is None
        self.batch_size = int(batch_size or ADAPTIVE_MAX_BATCH)
        self.poll_interval = poll_interval
        self.default_lease = default_lease
        self.leases = dict(leases)
        self.time_limits = dict(time_limits)
        self.waker: Waker | None = None
        self._paused: frozenset[str] = frozenset()
        self._paused_read: float | None = None

    def batch_for(self, lane: Lane) -> int:
        """How many messages the next claim of ``lane`` asks for.

        Fast handlers get large claims (few round trips per message); slow
        ones get about one per slot, so a worker does not sit on messages
        that other, idle workers could run.
        """
        if not self.adaptive:
            return self.batch_size
        if lane.seconds_per_message is None:
            return min(self.batch_size, max(lane.cap, ADAPTIVE_FIRST_BATCH))
        fits = int(lane.cap * CLAIM_WINDOW / max(lane.seconds_per_message, 1e-6))
        return max(lane.cap, min(self.batch_size, fits))

    def claim_round(self) -> int:
        """Claim for every lane with room; returns how many messages were claimed."""
        total = 0
        paused = self.paused_now()
        for lane in self.book.lanes:
            queues = [q for q in lane.queues if q not in paused]
            if not queues:
                continue
            limit = self.book.room(lane, self.batch_for(lane))
            if limit <= 0:
                continue
            entity = lane.model is not Message
            result = changes.claim(
                queues,
                limit,
                worker=self.name,
                lease=self.leases.get((queues[0], None), self.default_lease)
                if entity
                else self.default_lease,
                leases=self.leases,
                using=self.using,
                model=lane.model,
            )
            if not result.messages:
                continue
            total += len(result.messages)
            self.book.add(self._in_flight(lane, row, result.token) for row in result.messages)
        return total

    def _in_flight(self, lane: Lane, row: object, token: object) -> InFlight:
        # A model's rows are its queue's, whatever columns it has.
        if lane.model is Message:
            queue, kind = row.queue, row.kind  # type: ignore[attr-defined]
        else:
            queue, kind = lane.queues[0], None
        lease = self.leases.get((queue, kind)) or self.leases.get((queue, None))
        limit = self.time_limits.get((queue, kind)) or self.time_limits.get((queue, None))
        return InFlight(row, token, lane, lease or self.default_lease, limit)  # type: ignore[arg-type]

    def idle_wait(self, busy: bool) -> None:
        """Sleep until something may be due: a notification, a poke, the next due time."""
        assert self.waker is not None
        timeout = self.poll_interval
        if not busy:
            next_due = self._next_due()
            hint = self.waker.hint
            if hint is not None and (next_due is None or hint < next_due):
                next_due = hint
            if next_due is not None:
                timeout = min(timeout, (next_due - clock.now()).total_seconds())
            timeout = max(timeout, MIN_IDLE_SLEEP)
        self.waker.hint = None
        self.waker.wait(timeout)

    def _next_due(self):  # type: ignore[no-untyped-def]
        active = [q for q in self.queues if q not in self._paused]
        next_due = (
            Message.objects.using(self.using)
            .active()
            .filter(queue__in=active)
            .aggregate(t=Min("next_attempt_time"))["t"]
        )
        for lane in self.book.lanes:
            if lane.model is Message or lane.queues[0] in self._paused:
                continue
            due = (
                lane.model._base_manager.using(self.using)
                .filter(active_condition())
                .aggregate(t=Min("next_attempt_time"))["t"]
            )
            if due is not None and (next_due is None or due < next_due):
                next_due = due
        return next_due

    def paused_now(self) -> frozenset[str]:
        """This worker's paused queues, read at most once per poll interval.

        Each pause and resume is logged once, when this worker notices it.
        """
        now = time.monotonic()
        if self._paused_read is not None and now - self._paused_read < self.poll_interval:
            return self._paused
        paused = frozenset(paused_queues(self.queues, using=self.using))
        self._paused_read = now
        for queue in sorted(paused - self._paused):
            logger.info("queue %s paused; not claiming from it", queue)
        for queue in sorted(self._paused - paused):
            logger.info("queue %s resumed", queue)
        self._paused = paused
        return paused
