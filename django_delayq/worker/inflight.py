"""What a worker holds: every claimed message as an :class:`InFlight`, in its lane.

The claimer adds what it claims, executor threads take and finish items, the
keeper extends their leases and enforces time limits, the shutdown hands
back the rest; all of them meet in one :class:`Book`, under one condition
variable, so the bookkeeping has a single owner and every rule about held
messages is written once.

A row is identified by its model and primary key, an attempt by its lock
token. The same row can be held twice: if its lease was lost (another worker
found this one dead, a keeper fell behind, ``enqueue(..., on_conflict=
"update")`` rewrote it) this worker may claim it again while the stale
attempt is still queued or running. The newest claim wins: a stale attempt
that has not started is dropped, one that runs is fenced off by its token
(every write under it matches nothing), and a group of atomic handlers never
takes one row twice.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Model

from django_delayq.flow import Scope
from django_delayq.logs import message_fields, who
from django_delayq.models import Message

logger = logging.getLogger("django_delayq.worker")


class Phase(enum.Enum):
    QUEUED = "queued"  # claimed, waiting for a handler slot
    RUNNING = "running"  # its handler runs
    # Its handler returned: its outcome is being written, or waits for a commit
    # (its group's, a batch of acknowledgements, a retry after a locked row or a
    # lost connection). It stays held, its lease extended, until that commits.
    SETTLING = "settling"


@dataclass(eq=False)
class Lane:
    """Queues that share a cap on concurrently running messages.

    A ``QueueFields`` model's queue is a lane of its own, claimed from that
    model's table (``model``); every other lane claims messages. A queue with
    global limits is a lane of its own too (one per limited kind, and one for
    its other kinds), claimed under its ``limits`` (``store.limits``) and
    never ahead of its free slots: a message held in one worker's prefetch is
    a start another worker could not make.
    """

    queues: list[str]
    cap: int
    model: type[Model] = Message
    limits: tuple[Scope, ...] = ()
    # Only these kinds (True) or all but these (False); None: every kind.
    kinds: tuple[frozenset[str], bool] | None = None
    # Held back by its limits until then (the claimer's clock); None: not held back.
    wake_at: datetime | None = None
    # Held back by a cap (room comes when a running message ends) rather than a rate.
    capped: bool = False
    # Its handlers are async def: coroutines on the worker's event loop, each
    # awaited by an executor thread of the lane's own (aio.py).
    is_async: bool = False
    queued: deque[InFlight] = field(default_factory=deque)
    running: int = 0
    held: int = 0
    # Moving average of a message's wall time in this lane (handler plus
    # outcome), which sizes adaptive claims.
    seconds_per_message: float | None = None


@dataclass(eq=False)
class InFlight:
    """One claimed attempt: the row, the claim's lock token, and where it stands."""

    row: Any  # a Message, or a row of the lane's QueueFields model
    token: uuid.UUID
    lane: Lane
    lease: timedelta
    time_limit: timedelta | None = None
    phase: Phase = Phase.QUEUED
    # Set while its handler runs: for the time limit, and so that a stuck
    # executor can be replaced.
    started_at: float | None = None
    thread: threading.Thread | None = None
    # Whether it counts in its lane's running handlers (one slot, freed once).
    lane_slot: bool = False
    # Cancels its handler's coroutine (an async def handler running on the
    # worker's event loop, aio.py): the keeper calls it past the time limit.
    cancel: Callable[[], Any] | None = None

    @property
    def row_key(self) -> tuple[type[Model], Any]:
        return (self.lane.model, self.row.pk)


class Book:
    """Every attempt a worker holds, its lanes, and its counters, under one lock."""

    def __init__(self, lanes: list[Lane]) -> None:
        self.lanes = lanes
        self.cond = threading.Condition()
        self.stats: Counter[str] = Counter()
        self.stopping = False
        self._held: set[InFlight] = set()
        # The newest claim of each row this worker holds.
        self._newest: dict[tuple[type[Model], Any], InFlight] = {}
        # When each claim sent and not yet in the book began (monotonic; held_ids).
        self._claiming: dict[object, float] = {}

    # -- claimed --------------------------------------------------------------

    @contextmanager
    def claiming(self) -> Iterator[None]:
        """Around a claim and the ``add`` of what it returned (see ``held_ids``)."""
        key = object()
        with self.cond:
            self._claiming[key] = time.monotonic()
        try:
            yield
        finally:
            with self.cond:
                del self._claiming[key]

    def held_ids(self, model: type[Model], *, claimed_before: float) -> list[Any] | None:
        """The ids of ``model``'s rows this worker holds; None while a claim that began
        before ``claimed_before`` (monotonic) is on its way into the book.

        Rows running under this worker's name that are in neither are handed
        back (``leases.release_unheld``): a claim that is sent but not yet
        added could be either (its rows committed, its thread not yet back);
        one that failed is no longer on its way. Only a claim old enough to
        have given leases that lapsed since can hold the lapsed rows the
        caller asks about: a younger one must not hold them back, or a claim
        loop that is always claiming (a backlog, a lock wait under a global
        cap) kept a lost claim's rows from coming back for as long as it was
        busy.
        """
        with self.cond:
            if any(began < claimed_before for began in self._claiming.values()):
                return None
            return [item.row.pk for item in self._held if item.lane.model is model]

    def add(self, items: Iterable[InFlight]) -> None:
        """Hold freshly claimed attempts; a stale attempt of the same row that has not
        started is dropped (its lease was lost: the row is this claim's now)."""
        with self.cond:
            added = 0
            for item in items:
                previous = self._newest.get(item.row_key)
                if previous is not None and previous.phase is Phase.QUEUED:
                    self._drop_queued(previous)
                self._newest[item.row_key] = item
                self._held.add(item)
                item.lane.queued.append(item)
                item.lane.held += 1
                added += 1
            # One waiting executor per attempt, not all of them: every executor
            # can take from every lane, so one that finds nothing it may take
            # means none could (16 executors woken per claim cost more CPU than
            # the claim).
            self.cond.notify(added)

    def _drop_queued(self, item: InFlight) -> None:
        """Forget a queued attempt whose lease is lost: it must not run (``cond`` held)."""
        item.lane.queued.remove(item)
        self._forget(item)
        self.stats["lease_lost"] += 1
        logger.warning(
            "%s: lease lost while waiting for a handler slot; not run here",
            who(item.row),
            extra=message_fields(item.row, outcome="lease_lost"),
        )

    def _forget(self, item: InFlight) -> None:
        self._held.discard(item)
        item.lane.held -= 1
        if self._newest.get(item.row_key) is item:
            del self._newest[item.row_key]

    def idle(self) -> bool:
        with self.cond:
            return not self._held

    def room(self, lane: Lane, batch: int) -> int:
        """How many more the claimer may claim for ``lane`` (0: its queue is full).

        Prefetch: the next batch is claimed while the current one runs, so
        handler slots never wait for a claim's round trip. A lane holds at
        most its slots plus two batches; what is still queued at shutdown is
        released with its attempt given back.
        """
        with self.cond:
            if self.stopping or len(lane.queued) >= batch:
                return 0
            if lane.limits:
                return max(0, lane.cap - lane.held)
            return max(0, min(batch, lane.cap + 2 * batch - lane.held))

    # -- executors ------------------------------------------------------------

    def take(self) -> InFlight | None:
        """The next attempt a free slot may run; blocks; None once stopping."""
        with self.cond:
            while not self.stopping:
                for lane in self.lanes:
                    if lane.queued and lane.running < lane.cap:
                        return self._start(lane.queued.popleft())
                self.cond.wait()
            return None

    def take_for_group(
        self, lane: Lane, group: set[tuple[type[Model], Any]], atomic: Callable[[Any], bool]
    ) -> InFlight | None:
        """The next queued attempt of ``lane`` if it may join the open group, else None.

        It must be atomic, and not a row the group already holds (the group
        would acknowledge one row twice, under two tokens).
        """
        with self.cond:
            if lane.running >= lane.cap or self._joinable(lane, group, atomic) is None:
                return None
            return self._start(lane.queued.popleft())

    def _joinable(
        self, lane: Lane, group: set[tuple[type[Model], Any]], atomic: Callable[[Any], bool]
    ) -> InFlight | None:
        """``lane``'s next queued attempt if it may join a group holding ``group``'s rows:
        atomic, and not a row the group holds (it would acknowledge one row twice,
        under two tokens). ``cond`` held."""
        if self.stopping or not lane.queued:
            return None
        head = lane.queued[0]
        return head if head.row_key not in group and atomic(head.row) else None

    def _start(self, item: InFlight) -> InFlight:
        item.phase = Phase.RUNNING
        item.started_at = time.monotonic()
        item.thread = threading.current_thread()
        item.lane_slot = True
        item.lane.running += 1
        return item

    def returned(self, item: InFlight) -> bool:
        """Its handler returned (or raised): the outcome is about to be written.

        From here on no time limit applies (the outcome won the race with
        the keeper), and a row the keeper finds changed is being settled,
        not lost. False if the keeper took the attempt first (its time
        limit passed): its outcome must not be written.
        """
        with self.cond:
            if item not in self._held:
                return False
            if item.phase is Phase.RUNNING:
                item.phase = Phase.SETTLING
                item.started_at = None
            return True

    def handler_done(self, item: InFlight, elapsed: float) -> bool:
        """Free the handler slot; False if the attempt was taken from this thread.

        That happens past its time limit (the keeper failed the attempt,
        freed the slot and started a replacement thread, so this thread and
        the late result go), or at a shutdown whose grace ran out. The
        attempt stays held (settling) until :meth:`settle` forgets it, once
        its outcome is committed.
        """
        with self.cond:
            if item not in self._held or item.lane_slot is False:
                if not self.stopping:
                    self.stats["late"] += 1
                return False
            item.phase = Phase.SETTLING
            item.started_at = None  # no time limit applies any more
            item.lane_slot = False
            lane = item.lane
            lane.running -= 1
            previous = lane.seconds_per_message
            lane.seconds_per_message = (
                elapsed if previous is None else 0.9 * previous + 0.1 * elapsed
            )
            return True

    def resume(self, item: InFlight) -> bool:
        """Run a settling attempt again in its own slot (its group rolled back): its time
        limit applies again. False if it is no longer held."""
        with self.cond:
            if item not in self._held:
                return False
            item.phase = Phase.RUNNING
            item.started_at = time.monotonic()
            item.thread = threading.current_thread()
            if not item.lane_slot:
                item.lane_slot = True
                item.lane.running += 1
            return True

    def settle(
        self,
        results: Iterable[tuple[InFlight, str]],
        wants: Callable[[Lane], int],
        *,
        when_idle: bool = False,
    ) -> bool:
        """Forget attempts whose outcome is committed (or known lost); count them.

        True when the claimer has something to do: claim for a lane whose
        queue runs below what it ``wants`` (0: a drained lane, nothing to
        claim), or, ``when_idle`` (``--burst``), notice that all is done.
        Waking it after every message made it compete with the executors for
        the GIL.
        """
        wake = freed = False
        with self.cond:
            for item, result in results:
                if item not in self._held:
                    continue  # taken meanwhile (time limit): counted there
                freed = freed or item.lane_slot
                self._free_slot(item)
                self._forget(item)
                self.stats[result] += 1
                # Asked for every attempt, not until one says yes: each ending
                # is counted, and may free a place under its lane's cap.
                wanted = len(item.lane.queued) < wants(item.lane)
                wake = wake or wanted
            wake = wake or (when_idle and not self._held)
            # No executor is woken as a rule: forgetting a settled attempt
            # frees no slot (handler_done did, and its thread takes next).
            if freed:
                self.cond.notify_all()
        return wake

    def count(self, result: str, n: int = 1) -> None:
        with self.cond:
            self.stats[result] += n

    # -- keeper ---------------------------------------------------------------

    def leases(self) -> dict[tuple[uuid.UUID, timedelta, type[Model]], list[InFlight]]:
        """Every held attempt by what its extension shares: token, lease, table.

        Settling attempts too: their acknowledgement waits for the group's
        commit, and until then nothing else protects their rows from being
        claimed by another worker.
        """
        groups: dict[tuple[uuid.UUID, timedelta, type[Model]], list[InFlight]] = defaultdict(list)
        with self.cond:
            for item in self._held:
                groups[(item.token, item.lease, item.lane.model)].append(item)
        return groups

    def lost(self, items: Iterable[InFlight]) -> int:
        """Attempts whose lease could not be extended: the queued ones are dropped.

        Returns how many of them were still held (not settled meanwhile).
        A running attempt cannot be stopped; its outcome is fenced by its
        token.
        """
        still = 0
        with self.cond:
            for item in items:
                if item not in self._held or item.phase is Phase.SETTLING:
                    # Settled meanwhile, or settling: its outcome is being
                    # written, and that compare-and-set tells a real loss.
                    continue
                still += 1
                if item.phase is Phase.QUEUED:
                    self._drop_queued(item)
            self.cond.notify_all()
        return still

    def holds(self, item: InFlight) -> bool:
        """Whether ``item`` is still held (not settled, dropped or taken)."""
        with self.cond:
            return item in self._held

    def late(self, now: float) -> list[InFlight]:
        """Running attempts past their time limit."""
        with self.cond:
            return [
                item
                for item in self._held
                if item.time_limit is not None
                and item.started_at is not None
                and now - item.started_at > item.time_limit.total_seconds()
            ]

    def take_late(self, item: InFlight) -> bool:
        """Take a late attempt from its thread; False if it finished meanwhile."""
        with self.cond:
            if item not in self._held or item.started_at is None:
                return False
            self._free_slot(item)
            self._forget(item)
            self.stats["time_limit"] += 1
            self.cond.notify_all()
            return True

    def _free_slot(self, item: InFlight) -> None:
        if item.lane_slot:
            item.lane_slot = False
            item.lane.running -= 1

    # -- shutdown -------------------------------------------------------------

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def drain_queued(self) -> list[InFlight]:
        """Stop and take every attempt that has not started (to release)."""
        with self.cond:
            self.stopping = True
            waiting = [item for lane in self.lanes for item in lane.queued]
            for lane in self.lanes:
                lane.queued.clear()
            for item in waiting:
                self._forget(item)
            self.cond.notify_all()
        return waiting

    def drain(self) -> list[InFlight]:
        """Take whatever is still held (still running after the grace period)."""
        with self.cond:
            left = list(self._held)
            for item in left:
                self._free_slot(item)
                self._forget(item)
        return left
