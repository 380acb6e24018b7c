"""The claimer: what to claim, how much, and how long to sleep when nothing is due.

Runs in the worker's main thread. Each round claims, lane by lane, what the
lane has room for (``Book.room``: its free slots plus a prefetched batch),
skipping paused queues; claims are sized to the lane's recent work when
``BATCH_SIZE`` is None. When a round claims nothing, the claimer sleeps
until the earliest of: a notification (PostgreSQL LISTEN/NOTIFY), a poke from
inside the process (a slot freed, a shutdown), the next due time it knows
of, or the poll interval.

Round trips are what an idle or lightly loaded worker spends its CPU on, so
the claimer asks the database only what it cannot know:

* A lane whose claim came back short is *drained*: nothing more was due
  there. It is not claimed from again until something can have changed
  that: a notification for one of its queues, or the end of a sleep (the
  next due time, or the poll interval). A freed handler slot does not
  un-drain it.
* The next due time is read at most once per poll interval, and again once
  the time it found has come (a message this worker retries also makes it
  read again). Messages due within the poll interval announce themselves
  (NOTIFY); later ones are found by that read.
* Notifications are coalesced only where messages come densely
  (``DELAYQ["CLAIM_DELAY"]``, :meth:`Claimer.hold`): when at least
  ``HOLD_FOR`` (1) more is expected within the delay, a notification waits
  it out without waking for the ones that follow, and one claim takes them
  all. A sparser stream, and an idle worker, claim each notification at
  once: there a wait saves no claim and makes the pickup later by the whole
  delay. At the default of 6 ms a stream of 200 messages a second shares
  claims two by two (pickup p50 about 4 ms); 1,000 a second, six or seven
  to a claim. A longer delay shares more for a later pickup.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.queues import paused_queues
from django_delayq.store import claim, limits, queries
from django_delayq.worker.floors import Floors
from django_delayq.worker.inflight import Book, InFlight, Lane
from django_delayq.worker.spacing import Spacing
from django_delayq.worker.wakeup import Waker

logger = logging.getLogger("django_delayq.worker")

# Shortest idle sleep when something is due but could not be claimed (it is
# being claimed by another worker right now): avoids a busy loop.
MIN_IDLE_SLEEP = 0.01

# Shortest sleep until a lane's limits let it claim again.
MIN_LIMIT_SLEEP = 0.001

# How often a lane held back by a global cap looks again for a free place
# (its own messages' ends wake it at once; other workers' are seen this way).
CAP_RECHECK = timedelta(seconds=0.25)

# Adaptive claims (DELAYQ["BATCH_SIZE"] = None): the first claim of a lane
# asks for ADAPTIVE_FIRST_BATCH (at least one per slot); later ones for about
# CLAIM_WINDOW seconds of the lane's measured work, at most ADAPTIVE_MAX_BATCH.
ADAPTIVE_FIRST_BATCH = 10
ADAPTIVE_MAX_BATCH = 100
CLAIM_WINDOW = 0.1

# The sizes a claim is rounded down to when it asks for less than a whole
# batch. The claim statement is compiled once per size and kept
# (store.claim): a size of its own for each claim (an adaptive batch follows
# the handlers' moving average, and the room left beside what a lane holds
# changes with every message) compiled the statement again with the ORM at
# almost every claim, 3-4 ms of CPU on the claim loop before the message was
# even picked (an idle worker whose handler writes a row started it 5-6 ms
# after the commit instead of 2).
CLAIM_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)

# A notification waits CLAIM_DELAY for others only when at least this many
# more are expected meanwhile (Claimer.hold): one claim then serves two
# messages or more, and the wait is paid back. (It was 4 with a delay of
# 25 ms: at 200 a second the median message then waited 15 ms. The
# acknowledgements' longer batches under a dense stream, acks.py, took over
# most of the CPU that saved.)
HOLD_FOR = 1

# A notification waits for the whole messages expected within CLAIM_DELAY,
# each spacing lengthened by this much for the stream's jitter (Claimer.hold):
# at 200 a second (5 ms apart) a 6 ms delay waited its whole 6 ms for one
# more message; the median pickup was 4.7-5.5 ms in three runs, 4.0-4.3 with
# this fit.
HOLD_MARGIN = 1.2

HandlerKey = tuple[str, str | None]


def claim_size(limit: int, batch: int) -> int:
    """``limit`` (at least 1) as a claim asks for it: a whole ``batch``, or less rounded
    down to one of ``CLAIM_SIZES``."""
    if limit >= batch:
        return batch
    return CLAIM_SIZES[bisect.bisect_right(CLAIM_SIZES, limit) - 1]


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
        claim_delay: float = 0.0,
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
        # The longest a notification waits to be claimed together with the
        # next ones, where they come densely (CLAIM_DELAY, see hold).
        self.claim_delay = claim_delay
        self.default_lease = default_lease
        self.leases = dict(leases)
        self.time_limits = dict(time_limits)
        self.waker: Waker | None = None
        self._paused: frozenset[str] = frozenset()
        self._paused_read: float | None = None
        # Lanes whose last claim came back short (by identity).
        self._drained: set[int] = set()
        # Where each lane's claims begin (floors.py), and the LISTEN
        # connection they were kept under (Waker.listens).
        self.floors = Floors(book.lanes)
        self._floors_listen = 0
        self._next_due: datetime | None = None
        self._next_due_read: float | None = None
        self._next_due_skip: frozenset[str] = frozenset()
        # The next due time read was already past when read (see next_due).
        self._heard_of_due = False
        # A retry this worker scheduled may be the next due time (see next_due).
        self._own_due = False
        # Set from other threads: claim from every lane at the next round.
        self._due_now = False
        # The last round left every lane drained (or paused): another round
        # before a wake-up would claim nothing.
        self.exhausted = False
        # When a claim last found work (monotonic).
        self._worked_at = float("-inf")
        # When the last notification was heard (monotonic), and the time
        # between two messages' notifications lately (a moving average): how
        # dense the stream is, which decides whether a notification waits
        # for company (see hold).
        self._spacing = Spacing()
        # Batches of acknowledgements committed (bumped by the ack thread), and
        # how many of them the claim loop has seen: see acks_committed.
        self._acks = 0
        self._acks_seen = 0
        # Places a running message may have freed under a cap (bumped by the
        # threads that see one end or commit): see _claim_limited.
        self._freed = 0

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
        # Sizes from a short list: one compiled statement each (claim_size).
        return max(lane.cap, claim_size(max(1, fits), self.batch_size))

    def claim_round(self) -> int:
        """Claim for every lane with room; returns how many messages were claimed."""
        total = 0
        if self._due_now:
            self._due_now = False
            self.floors.drop()
            self.undrain()
        self._follow_notifications()
        self._uncap_after_acks()
        paused = self.paused_now()
        for lane in self.book.lanes:
            queues = [q for q in lane.queues if q not in paused]
            if not queues or id(lane) in self._drained:
                continue
            batch = self.batch_for(lane)
            limit = self.book.room(lane, batch)
            if limit <= 0:
                continue
            with self.book.claiming():
                result, limit = self._claim(lane, queues, limit, batch)
                self.book.add(self._in_flight(lane, row, result.token) for row in result.messages)
            if len(result.messages) < limit or lane.wake_at is not None:
                self._drained.add(id(lane))
            if not result.messages:
                continue
            self._worked_at = time.monotonic()
            total += len(result.messages)
        self.exhausted = all(
            id(lane) in self._drained or set(lane.queues) <= paused for lane in self.book.lanes
        )
        if total:
            # Let a handler thread that was waiting for this work start it now,
            # rather than when this thread next waits for the database (the
            # interpreter lock passes on a wait, or after 5 ms).
            time.sleep(0)
        return total

    def _follow_notifications(self) -> None:
        """Keep the lanes' floors only while every notification is heard: lower them
        to the due times notified; drop them when no LISTEN is open, or a new
        one is (what was sent between the two was not heard)."""
        waker = self.waker
        hears = waker is not None and waker.hears_due
        self.floors.keep(hears)
        if waker is None:
            return
        dues = waker.take_dues()
        if waker.listens != self._floors_listen:
            self._floors_listen = waker.listens
            self.floors.drop()
        elif hears:
            self.floors.heard(dues)

    def _claim(
        self, lane: Lane, queues: list[str], limit: int, batch: int
    ) -> tuple[claim.Claim, int]:
        """One claim for ``lane``, and the number of rows it asked for."""
        if lane.limits:
            return self._claim_limited(lane, queues, limit), limit
        limit = claim_size(limit, batch)
        entity = lane.model is not Message
        since, ticket = self.floors.start(lane)
        result = claim.claim(
            queues,
            limit,
            worker=self.name,
            lease=self.leases.get((queues[0], None), self.default_lease)
            if entity
            else self.default_lease,
            leases=self.leases,
            using=self.using,
            model=lane.model,
            kinds=lane.kinds,
            since=since,
        )
        self.floors.claimed(lane, result.messages, limit, ticket)
        return result, limit

    def _claim_limited(self, lane: Lane, queues: list[str], limit: int) -> claim.Claim:
        """Claim under the lane's global limits; when they hold messages back, the lane
        waits: until the rate's window frees a start, or (a cap) ``CAP_RECHECK``, or
        until one of its own messages ends.

        A message that ends while the claim runs may have told the lane so
        (``wants``) before this thread marks it capped: that place was then
        freed after the claim counted it, and the lane looks again at once
        rather than ``CAP_RECHECK`` later.
        """
        freed = self._freed
        result = limits.claim_limited(
            queues,
            limit,
            lane.limits,
            worker=self.name,
            lease=self.default_lease,
            leases=self.leases,
            using=self.using,
            kinds=lane.kinds,
        )
        lane.capped = result.held_back and result.retry_in is None
        if not result.held_back:
            lane.wake_at = None
        elif result.retry_in is not None:
            # A wait measured by the database, held on this host's clock.
            lane.wake_at = clock.now() + result.retry_in
        elif self._freed != freed:
            lane.wake_at = clock.now()
        else:
            lane.wake_at = clock.now() + CAP_RECHECK
        return result.claim

    def _in_flight(self, lane: Lane, row: object, token: object) -> InFlight:
        # A model's rows are its queue's, whatever columns it has.
        if lane.model is Message:
            queue, kind = row.queue, row.kind  # type: ignore[attr-defined]
        else:
            queue, kind = lane.queues[0], None
        lease = self.leases.get((queue, kind)) or self.leases.get((queue, None))
        limit = self.time_limits.get((queue, kind)) or self.time_limits.get((queue, None))
        return InFlight(row, token, lane, lease or self.default_lease, limit)  # type: ignore[arg-type]

    def wants(self, lane: Lane) -> bool:
        """Whether a freed slot of ``lane`` is worth a claim (the lane is not drained).

        A lane held back by a global cap is: the message that ended freed a
        place under the cap. So is every other lane a cap holds back: a cap
        can be shared (a queue's, over the lane of its limited kind and the
        lane of the rest), and the lane of a kind with nothing running would
        otherwise look again only ``CAP_RECHECK`` later (``--burst`` waited
        for it with every message done). True then too: the claimer must
        wake for that lane.
        """
        self._freed += 1
        uncapped = self._uncap()
        return bool(uncapped - {id(lane)}) or id(lane) not in self._drained

    def something_due(self, *, told: bool = False) -> None:
        """Claim from every lane at the next round, which has not begun yet (safe from
        any thread): messages this worker cannot be told of became due (the next
        messages of groups it moved on).

        ``told``: a notification (or SQLite's local wake-up) says so too, with
        their due times (a workflow's released steps, store/dependencies.py), and
        this worker listens: the next due time it read stays good. Read again, it
        cost a query on the claim loop at every step of a chain, beside the step.
        """
        self._due_now = True
        if not (told and self._listening()):
            self.forget_next_due()

    def acks_committed(self) -> None:
        """Batched acknowledgements were committed (called from the ack thread).

        A finished message counts against a global cap until its
        acknowledgement commits: a capped lane woken by its handler's end
        may find no room yet, and must look again once the batch is in, not
        ``CAP_RECHECK`` later. The claim loop un-caps its lanes at its next
        round (a commit during a claim is seen by the round after it).
        """
        self._freed += 1
        self._acks += 1

    def _uncap_after_acks(self) -> None:
        acks = self._acks
        if acks == self._acks_seen:
            return
        self._acks_seen = acks
        self._uncap()

    def _uncap(self) -> set[int]:
        """Let every lane a global cap held back claim again (a place under it may
        have freed); returns those lanes (by identity)."""
        uncapped = set()
        for lane in self.book.lanes:
            if lane.capped:
                lane.capped, lane.wake_at = False, None
                self._drained.discard(id(lane))
                uncapped.add(id(lane))
        return uncapped

    def undrain(self) -> None:
        """Claim from every lane at the next round (something may be due anywhere),
        but those its limits hold back for a while yet."""
        now = clock.now()
        for lane in self.book.lanes:
            wake_at = lane.wake_at  # read once: an executor may uncap the lane meanwhile
            if wake_at is None or wake_at <= now:
                self._drained.discard(id(lane))

    def held_back(self) -> list[Lane]:
        """Lanes whose global limits hold due messages back for a while yet."""
        now = clock.now()
        return [
            lane
            for lane in self.book.lanes
            if (wake_at := lane.wake_at) is not None and wake_at > now
        ]

    def forget_next_due(self) -> None:
        """Read the next due time again at the next sleep (a retry was scheduled), and
        wake for it even if it has come already."""
        self._next_due_read = None
        self._own_due = True

    def idle_wait(self) -> None:
        """Sleep until something may be due: a notification, a poke, the next due time."""
        assert self.waker is not None
        timeout = self.poll_interval
        held_back = self.held_back()
        # Every lane full (a backlog): nothing can be claimed before a slot
        # frees, and its settling wakes the claimer. Reading the next due
        # time then (always past under a backlog) cost a query and a 10 ms
        # wake-up per claim at full speed.
        full = all(
            id(lane) not in self._drained and self.book.room(lane, self.batch_for(lane)) == 0
            for lane in self.book.lanes
        )
        # The due messages of a queue its limits hold back do not wake the
        # worker: the end of the hold does.
        skip = frozenset(q for lane in held_back for q in lane.queues)
        next_due = None if full else self.next_due(skip)
        # After the read: a sleep computed from before it ends early by the
        # read's time, and its claim then finds nothing due yet. The due
        # times notified that have not come yet count as next due times.
        now = clock.now()
        later = None if full else self.waker.later(now, skip)
        if later is not None and (next_due is None or later < next_due):
            next_due = later
        if next_due is not None:
            # A due time still to come is slept to exactly (it would start
            # MIN_IDLE_SLEEP late otherwise); one already past but not
            # claimable (another worker is claiming it) must not spin. No
            # margin is added: the sleep never ends before its timeout, and
            # the claim's clock is read on the server after it (a margin of
            # 0.5 ms was 0.4 ms of every delayed start's p50).
            until = (next_due - now).total_seconds()
            timeout = min(timeout, until if until > 0 else MIN_IDLE_SLEEP)
        for lane in held_back:
            # To the millisecond: a rate's start that comes late is a start
            # lost (the next one in its place waits a whole period from it).
            # Read once: an executor's thread uncaps a lane (``wants``) when
            # its message ends, and then pokes the claimer itself.
            wake_at = lane.wake_at
            if wake_at is not None:
                timeout = max(MIN_LIMIT_SLEEP, min(timeout, (wake_at - now).total_seconds()))
        # A lane whose hold ended while a poke cut the last sleep short: its
        # claim is due now, not at the next notification or poll.
        overdue = [
            lane
            for lane in self.book.lanes
            if (wake_at := lane.wake_at) is not None
            and wake_at <= now
            and id(lane) in self._drained
        ]
        if overdue:
            timeout = min(timeout, MIN_LIMIT_SLEEP)
        if self.waker.wait(timeout):
            if timeout >= self.poll_interval:
                # Idle for a whole poll interval: a claim from the beginning
                # costs nothing beside that, and finds what no notification told.
                self.floors.drop()
            self.undrain()  # the next due time, or the poll interval, has come
            return
        for lane in overdue:
            self._drained.discard(id(lane))
        soon = clock.now() + timedelta(seconds=MIN_IDLE_SLEEP)
        notified = self.waker.notified
        heard_at = time.monotonic()
        hold = self.hold(heard_at)
        self.heard(heard_at, self.waker.heard)
        if notified and (self.waker.hint is None or self.waker.hint <= soon):
            # Not when this worker let messages go itself (a group's next, a
            # workflow's next steps): the poke that said so was read with the
            # notification, and nothing would end the wait before its end.
            if hold > 0 and not self.book.stopping and not self._due_now:
                # A dense stream: take the next ones in the same claim (read once,
                # at the end: no wake-up for each of them).
                self.waker.wait(hold, listen=False)
                notified = notified | self.waker.notified
                self.heard(time.monotonic(), self.waker.heard)
            for lane in self.book.lanes:
                if not notified.isdisjoint(lane.queues) and lane not in held_back:
                    self._drained.discard(id(lane))

    def hold(self, now: float) -> float:
        """How long a notification heard at ``now`` waits for others before its claim.

        At most ``CLAIM_DELAY``, where at least ``HOLD_FOR`` more messages are
        expected meanwhile (the time between two notifications lately, a
        moving average, is at most a ``HOLD_FOR``-th of it), else 0: a claim
        at once. Within the delay, as long as the messages expected take to
        come (``HOLD_MARGIN``).
        An idle worker (nothing heard for ``CLAIM_DELAY``) always claims at
        once. Spacing is what decides: with messages spaced more than the
        delay apart, a wait shares no claim and makes every message wait a
        whole delay. A claim that found work counts as the last message heard
        of until a notification is (a worker started on a backlog).
        """
        if self._spacing.last is not None:
            expected = self._spacing.expects(HOLD_FOR, self.claim_delay, now)
        else:
            since = now - self._worked_at
            expected = 0 < self.claim_delay and since * HOLD_FOR <= self.claim_delay
        if not expected:
            return 0.0
        gap = self._spacing.gap
        if not gap:
            return self.claim_delay
        # As long as the whole messages the delay is expected to bring take to
        # come, and a little more: not the rest of the delay after the last.
        return min(self.claim_delay, max(1, int(self.claim_delay / gap)) * gap * HOLD_MARGIN)

    def last_activity(self) -> float:
        """When this worker last heard of a new message (a notification, or a claim
        that found work; monotonic): the acknowledgements' batches wait for more
        only while they keep coming (acks.py)."""
        last = self._spacing.last
        return self._worked_at if last is None else max(last, self._worked_at)

    def heard(self, now: float, count: int) -> None:
        """``count`` notifications were read at ``now``: the stream's density (``hold``)."""
        self._spacing.heard(now, count)

    def next_due(self, skip: frozenset[str] = frozenset()) -> datetime | None:
        """The earliest due time of this worker's queues but ``skip``, read at most once
        per poll interval (and again once it has come, or when ``skip`` changes).

        A time already past when it was read is a message due now that a
        claim has not taken yet: under a steady stream there nearly always is
        one. A listening worker hears of it (its NOTIFY), so that time is no
        reason to sleep short or to read again; a polling worker claims at
        once (the shortest sleep) and reads again after.
        """
        read = self._next_due_read
        now = clock.now()
        came = self._next_due is not None and self._next_due <= now
        if (
            read is None
            or skip != self._next_due_skip
            or time.monotonic() - read >= self.poll_interval
            or (came and not (self._heard_of_due and self._listening()))
        ):
            self._next_due = self._read_next_due(skip)
            self._next_due_read = time.monotonic()
            self._next_due_skip = skip
            # Unless this worker made it due itself (a retry it scheduled): no
            # NOTIFY tells of that one.
            past = self._next_due is not None and self._next_due <= now
            self._heard_of_due = past and not self._own_due
            self._own_due = False
        if self._heard_of_due and self._listening():
            return None
        return self._next_due

    def _listening(self) -> bool:
        return self.waker is not None and self.waker.listening

    def _read_next_due(self, skip: frozenset[str] = frozenset()) -> datetime | None:
        active = [q for q in self.queues if q not in self._paused and q not in skip]
        # From the floors on: what lies below them is the maintenance thread's
        # to find (floors.py), and reading past it is what the floors avoid.
        since = self.floors.lowest()
        next_due = (
            queries.next_due(Message, active, using=self.using, since=since) if active else None
        )
        for lane in self.book.lanes:
            if lane.model is Message or lane.queues[0] in self._paused:
                continue
            due = queries.next_due(lane.model, None, using=self.using)
            if due is not None and (next_due is None or due < next_due):
                next_due = due
        return next_due

    def below_floors(self) -> bool:
        """Whether a row a lane could claim lies below its floor (the floors are then
        dropped); the maintenance thread's look, every poll interval."""
        paused = self._paused

        def active(lane: Lane) -> list[str]:
            return [q for q in lane.queues if q not in paused]

        return self.floors.below(self.using, active)

    def paused_now(self) -> frozenset[str]:
        """This worker's paused queues, read at most once per poll interval.

        Each pause and resume is logged once, when this worker notices it.
        """
        now = time.monotonic()
        if self._paused_read is not None and now - self._paused_read < self.poll_interval:
            return self._paused
        paused = frozenset(paused_queues(self.queues, using=self.using))
        self._paused_read = now
        if paused != self._paused:
            # A queue resumed: its rows were not claimed while the floors rose.
            self.floors.drop()
            self.undrain()
            self.forget_next_due()
        for queue in sorted(paused - self._paused):
            logger.info("queue %s paused; not claiming from it", queue)
        for queue in sorted(self._paused - paused):
            logger.info("queue %s resumed", queue)
        self._paused = paused
        return paused
