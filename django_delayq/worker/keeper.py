"""The keeper: leases, time limits and the heartbeat of one worker, in a thread of its own.

A held message stays invisible to other workers only while its lease runs,
so the keeper pushes the lease of everything this worker holds every third
of the shortest lease; a crashed process stops doing so, and its messages
come back after one lease. It also fails attempts that run past their
handler's ``time_limit`` (Python cannot stop the thread: the token changes,
which fences off the late outcome, and a fresh executor takes the slot) and
records the heartbeat by which other workers tell this one is alive.

The keeper never waits for a lock: extensions skip rows that another
transaction holds (a producer's upsert of a message's key in a long
transaction, an operator's bulk change, the Spark loader, a group of atomic
handlers still open), so it cannot fall behind. Such a row's lease may lapse
before its lock goes; it is still this worker's all the same, since no claim
takes a running message from a live worker (``queries.claimable_condition``),
and the keeper extends it at its next round.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from django.db import connections
from django.db.models import Model

from django_delayq import liveness
from django_delayq.exceptions import WorkerNameTaken
from django_delayq.logs import duration as duration_text
from django_delayq.logs import message_fields, who
from django_delayq.models import Message
from django_delayq.store import leases
from django_delayq.worker.background import DB_ERRORS, Background, Supervisor
from django_delayq.worker.execute import record_time_limit
from django_delayq.worker.inflight import Book, InFlight

logger = logging.getLogger("django_delayq.worker")

# The keeper's tick, however short the leases and time limits are.
MIN_INTERVAL = 0.05
# A heartbeat promises the next within this many heartbeat intervals.
ALIVE_BEATS = 3


class Looks:
    """When a keeper looks for the rows running under its worker's name that its book
    does not hold (``Keeper.look_for_unheld``), as monotonic times.

    Every database error asks for a look once the leases given before it
    could have lapsed. A look already asked for keeps its time, and one more
    follows at the latest time asked for since: postponing it instead,
    errors that came more often than a lease (lock waits timing out,
    deadlocks under a global cap, a flaky network) put off every look while
    they lasted, and a lost claim's rows stayed running for as long. Each
    time asked for is looked at no earlier than asked, and no later than
    one more delay after it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: float | None = None
        self._again: float | None = None

    def ask(self, at: float) -> None:
        with self._lock:
            if self._next is None:
                self._next = at
            else:
                self._again = at if self._again is None else max(self._again, at)

    def soon(self, at: float) -> None:
        """Look at ``at`` (a look that could not be made), keeping later ones."""
        with self._lock:
            if self._next is not None and self._next > at:
                self._again = self._next if self._again is None else max(self._again, self._next)
            self._next = at if self._next is None else min(self._next, at)

    def take(self, now: float) -> bool:
        """Whether a look is due at ``now``; the next one asked for takes its place."""
        with self._lock:
            if self._next is None or now < self._next:
                return False
            self._next, self._again = self._again, None
            return True


class Keeper:
    def __init__(
        self,
        book: Book,
        *,
        name: str,
        instance: uuid.UUID | None = None,
        queues: Collection[str],
        concurrency: int,
        using: str,
        leases: Collection[timedelta],
        time_limits: Collection[timedelta],
        heartbeat_interval: float,
        replace_executor: Callable[[threading.Thread | None], None],
        processed: Callable[[InFlight, str, float], None],
        on_database_error: Callable[[], None],
        on_heartbeat: Callable[[], None] = lambda: None,
        on_name_taken: Callable[[WorkerNameTaken], None] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.book = book
        self.name = name
        self.instance = instance or uuid.uuid4()
        self._on_name_taken = on_name_taken
        self.queues = list(queues)
        self.concurrency = concurrency
        self.using = using
        self.extend_every = max(MIN_INTERVAL, min(leases).total_seconds() / 3)
        self.limits = [t.total_seconds() for t in time_limits]
        # The heartbeat comes with every extension at the latest, and promises
        # the next one within a few of them: while that promise holds, a lease
        # of this worker's that lapsed (another transaction held its row) is
        # not taken by any claim (``liveness.beat``).
        self.heartbeat_interval = min(heartbeat_interval, self.extend_every)
        self.alive_for = timedelta(seconds=ALIVE_BEATS * self.heartbeat_interval)
        self.interval = max(
            MIN_INTERVAL,
            min(self.extend_every, heartbeat_interval, *(t / 4 for t in self.limits)),
        )
        self._replace_executor = replace_executor
        self._processed = processed
        self._on_database_error = on_database_error
        self._on_heartbeat = on_heartbeat
        self._next_extend = self._next_beat = 0.0
        # When the last heartbeat was recorded (monotonic), to tell when one
        # came too late: see _beaten.
        self._beaten_at: float | None = None
        # SQLite: a live process of this host is never taken for dead (see _beaten).
        self._may_be_taken_for_dead = connections[using].vendor != "sqlite"
        # When to look for rows running under this worker's name that its
        # book does not hold (see look_for_unheld): once a lease after the
        # start, and after every database error.
        self._looks = Looks()
        self._longest_lease = max(leases).total_seconds()
        self._shortest_lease = min(leases).total_seconds()
        self._background = Background(
            "delayq-keeper",
            self._turn,
            lambda: self.interval,
            part="lease keeper",
            supervisor=supervisor,
        )

    def start(self) -> None:
        self._next_extend = self._next_beat = time.monotonic()
        self.look_for_unheld()
        self._background.start()

    def look_for_unheld(self) -> None:
        """Look, once every lease this worker gives could have lapsed, for rows running
        under its name that it does not hold (safe from any thread).

        A database error may have cut a claim's commit from its reply (the
        rows are claimed, the worker never heard), and a worker restarted
        under a dead one's name inherits its rows: both hold rows no claim
        takes back from a live worker (``leases.release_unheld``).

        A look already asked for keeps its time (``Looks``).
        """
        self._looks.ask(time.monotonic() + self._longest_lease + self.extend_every)

    def stop(self, timeout: float = 5.0) -> None:
        self._background.stop(timeout)

    @property
    def thread(self) -> threading.Thread:
        return self._background.thread

    def register(self, wait: Callable[[float], bool] | None = None, *, again: bool = False) -> None:
        """Record this worker; ``again``: while it runs (its row was gone or taken), when
        what runs under its name is partly its own, and only the rest is handed back
        (``look_for_unheld``)."""
        liveness.register(
            self.name,
            queues=self.queues,
            concurrency=self.concurrency,
            alive_for=self.alive_for,
            using=self.using,
            instance=self.instance,
            wait=wait,
            hand_back=not again,
        )
        self._beaten_at = time.monotonic()  # registering records a heartbeat too
        if again:
            self.look_for_unheld()

    def _turn(self) -> None:
        now = time.monotonic()
        try:
            if self.limits:
                self.enforce_time_limits()
            # The next extension and heartbeat are scheduled once these succeeded:
            # one that a cut connection failed goes again at the next turn, not a
            # whole interval later (a heartbeat missed so is most of its promise).
            if now >= self._next_extend:
                self.extend_leases()
                self._next_extend = now + self.extend_every
            if self._looks.take(now):
                try:
                    self.release_unheld()
                except BaseException:
                    # SQLite's lock is not a database error that asks for a
                    # look (below): this one must not be lost.
                    self._looks.soon(time.monotonic() + self.extend_every)
                    raise
            if now >= self._next_beat:
                beaten = liveness.beat(
                    self.name, alive_for=self.alive_for, using=self.using, instance=self.instance
                )
                # Reached the database, whatever its answer: a name another worker
                # holds is not asked for again at every turn.
                self._next_beat = now + self.heartbeat_interval
                if not beaten:
                    # The row is gone (deleted by hand, a flushed database), or
                    # another worker took the name: this one broke its promise
                    # and its messages were handed back.
                    try:
                        self.register(again=True)
                    except WorkerNameTaken as exc:
                        if self._on_name_taken is None:
                            raise
                        self._on_name_taken(exc)
                        return
                self._beaten()
                self._on_heartbeat()
        except DB_ERRORS as exc:
            if _sqlite_locked(exc):
                # Another transaction holds SQLite's write lock (an atomic
                # handler's, a producer's): nothing is lost meanwhile, since
                # the claims ask the operating system whether this worker
                # lives (queries.claimable_condition). Next round.
                logger.debug("the database is locked; extending leases next round")
                return
            logger.warning(
                "could not extend leases or record the heartbeat; reconnecting",
                exc_info=True,
            )
            self._on_database_error()
            connections[self.using].close()

    def _beaten(self) -> None:
        """Say so when this heartbeat came after the last one's promise had run out.

        Meanwhile other workers may have taken this one for dead and handed
        back what it ran (``WORKER_DEAD_AFTER``), or claimed its messages once
        their leases lapsed: they may run again, even beside this worker's
        attempts, whose outcomes are then discarded. Without this line an
        overloaded host (a thread not scheduled for seconds) or a database
        that did not answer looks like a duplicate run without a cause.
        Not on SQLite: there a live process of this host is never taken for
        dead (``queries.claimable_condition``), and every worker's heartbeat
        waits whenever a long transaction holds the write lock.
        """
        now = time.monotonic()
        previous, self._beaten_at = self._beaten_at, now
        if previous is None or not self._may_be_taken_for_dead:
            return
        gap, promise = now - previous, self.alive_for.total_seconds()
        if gap > promise:
            logger.warning(
                "heartbeat %.1f s after the previous one, past its promise of %.1f s: "
                "other workers may have taken this worker for dead, and what it ran "
                "meanwhile may run again (an overloaded host, a database that did not "
                "answer?)",
                gap,
                promise,
            )

    def extend_leases(self) -> None:
        """Push the lease of every held attempt; drop queued ones that turn out lost."""
        for (token, lease, model), items in self.book.leases().items():
            ids = [item.row.pk for item in items]
            kept = leases.extend(ids, token, lease, using=self.using, model=model)
            if len(kept) == len(ids):
                continue
            missed = [item for item in items if item.row.pk not in kept]
            # A row skipped because another transaction locks it is still
            # ours (it is extended next round). Only a row no longer running
            # under this token is lost, and only if its attempt is not
            # settling: an outcome committed meanwhile (by its executor, a
            # batch of acknowledgements, a group) ends it too.
            ours = leases.held_ids(
                [item.row.pk for item in missed], token, using=self.using, model=model
            )
            lost = [item for item in missed if item.row.pk not in ours]
            if lost and self.book.lost(lost):
                logger.warning(
                    "%d held message(s) were no longer ours when extending their lease "
                    "(claimed again after their lease expired?)",
                    len(lost),
                )

    def release_unheld(self) -> None:
        """Hand back the rows running under this worker's name that its book does not hold."""
        claiming = False
        released = 0
        # Every table its lanes claim from: a QueueFields model's rows left
        # running under this name (a lost reply, a killed worker of the same
        # name before it) are as stuck as messages, this worker being alive.
        models: dict[type[Model], None] = dict.fromkeys(
            [Message, *(lane.model for lane in self.book.lanes)]
        )
        for model in models:

            def held(model: type[Model] = model) -> list[Any] | None:
                nonlocal claiming
                # Asked after the lapsed rows were read: a claim younger than
                # the shortest lease cannot have given them (half of it: the
                # database's clock may step).
                ids = self.book.held_ids(
                    model, claimed_before=time.monotonic() - self._shortest_lease / 2
                )
                claiming = claiming or ids is None
                return ids

            released += leases.release_unheld(self.name, held, using=self.using, model=model)
        if claiming:
            # A claim was on its way into the book: its rows cannot be told
            # from lost ones. Look again next turn.
            self._looks.soon(time.monotonic() + self.extend_every)
        if released:
            logger.warning(
                "%d message(s) ran under this worker's name without being held by it "
                "(a claim whose reply was lost, or a former worker of this name): handed back",
                released,
            )

    def enforce_time_limits(self) -> None:
        """Fail attempts that ran past their handler's ``time_limit``.

        The failure is recorded under the attempt's token, which fences off
        its late outcome; the lease is no longer extended; a new executor
        thread takes the slot so the worker keeps its full concurrency.
        """
        now = time.monotonic()
        for item in self.book.late(now):
            assert item.time_limit is not None
            started = item.started_at
            result = record_time_limit(item.row, item.token, item.time_limit, using=self.using)
            if result is None:
                continue  # its row is locked by another transaction: next round
            if not self.book.take_late(item):
                continue  # it finished meanwhile; its own outcome won the race
            if item.cancel is not None:
                # An async def handler: unlike a thread, its coroutine stops.
                item.cancel()
            self._replace_executor(item.thread)
            if started is not None:
                self._processed(item, result, now - started)
            message = item.row
            logger.error(
                "%s ran past its time limit of %s: attempt %s, %s; "
                "its handler's late outcome will be discarded",
                who(message),
                duration_text(item.time_limit.total_seconds()),
                message.attempt_count,
                result,
                extra=message_fields(message, outcome=result),
            )


def _sqlite_locked(exc: Exception) -> bool:
    return "database is locked" in str(exc)
