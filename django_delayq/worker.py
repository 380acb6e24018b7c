"""The worker loop behind ``manage.py run_delayq``.

Split as claim / execute / settle / maintain: the main thread claims batches
for free handler slots and sleeps when idle; executor threads run handlers
(``execute.py`` records each outcome); a lease keeper thread extends the
leases of everything held, so a long handler keeps its message while a
crashed process lets it go after one lease.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, reset_queries, router
from django.db.models import Min

from django_delayq import claim, clock, retention, scheduling
from django_delayq.conf import get_config, to_timedelta
from django_delayq.execute import execute
from django_delayq.models import Message
from django_delayq.queues import paused_queues
from django_delayq.registry import HandlerSpec, registry
from django_delayq.wakeup import Waker

logger = logging.getLogger("django_delayq.worker")

# Shortest idle sleep when something is due but could not be claimed (it is
# being claimed by another worker right now): avoids a busy loop.
MIN_IDLE_SLEEP = 0.01


@dataclass
class Lane:
    """Queues that share a cap on concurrently running messages."""

    queues: list[str]
    cap: int
    buffer: deque[tuple[Message, uuid.UUID]] = field(default_factory=deque)
    running: int = 0
    held: int = 0


@dataclass
class Held:
    token: uuid.UUID
    lease: timedelta
    lane: Lane
    started: bool = False


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def resolve_queues(queues: list[str] | None) -> list[str]:
    """The queues to consume; each must have a handler (checked at start-up)."""
    known = registry.queues()
    if not queues:
        if not known:
            raise ImproperlyConfigured(
                "no message handlers are registered; define them with @handler in an "
                "installed app's handlers.py"
            )
        return known
    missing = [q for q in queues if q not in known]
    if missing:
        raise ImproperlyConfigured(
            f"no handler is registered for queue(s) {', '.join(map(repr, missing))}; "
            f"known queues: {', '.join(known) or 'none'}"
        )
    return list(dict.fromkeys(queues))


class Worker:
    def __init__(
        self,
        queues: list[str] | None = None,
        *,
        concurrency: int | None = None,
        batch_size: int | None = None,
        burst: bool = False,
        using: str | None = None,
        name: str | None = None,
        shutdown_grace: timedelta | float | None = None,
    ) -> None:
        config = get_config()
        self.queues = resolve_queues(queues)
        self.concurrency = int(concurrency or config["CONCURRENCY"])
        self.batch_size = int(batch_size or config["BATCH_SIZE"] or self.concurrency)
        if self.concurrency < 1 or self.batch_size < 1:
            raise ValueError("concurrency and batch size must be positive")
        self.burst = burst
        self.using = using or router.db_for_write(Message)
        self.name = name or worker_name()
        self.poll_interval = to_timedelta(config["POLL_INTERVAL"]).total_seconds()
        self.shutdown_grace = to_timedelta(
            config["SHUTDOWN_GRACE"] if shutdown_grace is None else shutdown_grace
        ).total_seconds()
        specs: list[HandlerSpec] = [s for q in self.queues for s in registry.for_queue(q)]
        self.default_lease = to_timedelta(config["LEASE"])
        self.leases = {(s.queue, s.kind): s.effective_lease() for s in specs}
        self.lanes = self._make_lanes(specs)
        self.stats: Counter[str] = Counter()
        self._cond = threading.Condition()
        # Keyed by (id, token): after a lease expired, this very worker may
        # claim the message again while the stale attempt is still running.
        self._held: dict[tuple[int, uuid.UUID], Held] = {}
        self._stopping = False
        self._force = False
        self._threads: list[threading.Thread] = []
        self._keeper_stop = threading.Event()
        self._waker: Waker | None = None
        self._last_prune = 0.0
        self._next_install = 0.0
        self._paused: frozenset[str] = frozenset()
        self._paused_read: float | None = None

    def _make_lanes(self, specs: list[HandlerSpec]) -> list[Lane]:
        caps: dict[str, int] = {}
        queue_overrides = get_config()["QUEUES"]
        for queue in self.queues:
            cap = queue_overrides.get(queue, {}).get("CONCURRENCY")
            for spec in specs:
                if spec.queue == queue and spec.concurrency:
                    cap = min(cap or spec.concurrency, spec.concurrency)
            if cap:
                caps[queue] = min(int(cap), self.concurrency)
        shared = [q for q in self.queues if q not in caps]
        lanes = [Lane(shared, self.concurrency)] if shared else []
        lanes += [Lane([q], cap) for q, cap in caps.items()]
        return lanes

    # -- control --------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            logger.warning(
                "second %s: not waiting for running handlers", signal.Signals(signum).name
            )
            self._force = True
        else:
            logger.info(
                "%s received: finishing running messages (up to %.0f s), claiming no more",
                signal.Signals(signum).name,
                self.shutdown_grace,
            )
        self.stop()

    def stop(self) -> None:
        """Stop claiming; running handlers get the grace period to finish."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._waker is not None:
            self._waker.poke()

    # -- main loop ------------------------------------------------------------

    def run(self) -> Counter[str]:
        config = get_config()
        self._waker = Waker(self.using, self.queues, listen=config["NOTIFY"] and not self.burst)
        logger.info(
            "worker %s consuming %s (concurrency %s, batch %s%s)",
            self.name,
            ", ".join(self.queues),
            self.concurrency,
            self.batch_size,
            ", burst"
            if self.burst
            else ", LISTEN/NOTIFY"
            if self._waker.listening
            else ", polling",
        )
        for i in range(self.concurrency):
            self._start_thread(self._executor_loop, f"delayq-executor-{i}")
        keeper = self._start_thread(self._keeper_loop, "delayq-lease-keeper")
        errors = 0
        try:
            while not self._stopping:
                try:
                    self._maybe_prune()
                    self._maybe_install_schedules()
                    claimed = self._claim_round()
                    errors = 0
                except DatabaseError:
                    errors += 1
                    backoff = min(30.0, 0.5 * 2 ** min(errors, 6))
                    logger.warning(
                        "database error while claiming; retrying in %.1f s", backoff, exc_info=True
                    )
                    connections[self.using].close()
                    self._waker.wait(backoff)
                    continue
                if claimed:
                    continue
                with self._cond:
                    idle = not self._held
                if self.burst and idle:
                    break
                self._idle_wait(busy=not idle)
        finally:
            self._shutdown(keeper)
        return self.stats

    def _start_thread(self, target, name: str) -> threading.Thread:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        if target != self._keeper_loop:
            self._threads.append(thread)
        return thread

    def _claim_round(self) -> int:
        total = 0
        paused = self._paused_now()
        for lane in self.lanes:
            queues = [q for q in lane.queues if q not in paused]
            if not queues:
                continue
            with self._cond:
                if self._stopping or lane.buffer:
                    continue
                capacity = max(lane.cap, self.batch_size)
                limit = min(self.batch_size, capacity - lane.held)
            if limit <= 0:
                continue
            result = claim.claim(
                queues,
                limit,
                worker=self.name,
                lease=self.default_lease,
                leases=self.leases,
                using=self.using,
            )
            if not result.messages:
                continue
            total += len(result.messages)
            with self._cond:
                for message in result.messages:
                    lease = self.leases.get((message.queue, message.kind)) or self.leases.get(
                        (message.queue, None), self.default_lease
                    )
                    self._held[(message.pk, result.token)] = Held(result.token, lease, lane)
                    lane.buffer.append((message, result.token))
                    lane.held += 1
                self._cond.notify_all()
        return total

    def _idle_wait(self, busy: bool) -> None:
        assert self._waker is not None
        timeout = self.poll_interval
        if not busy:
            next_due = (
                Message.objects.using(self.using)
                .active()
                .filter(queue__in=[q for q in self.queues if q not in self._paused])
                .aggregate(t=Min("next_attempt_time"))["t"]
            )
            hint = self._waker.hint
            if hint is not None and (next_due is None or hint < next_due):
                next_due = hint
            if next_due is not None:
                timeout = min(timeout, (next_due - clock.now()).total_seconds())
            timeout = max(timeout, MIN_IDLE_SLEEP)
        self._waker.hint = None
        self._waker.wait(timeout)

    def _paused_now(self) -> frozenset[str]:
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

    # -- executors ------------------------------------------------------------

    def _next_item(self) -> tuple[Message, uuid.UUID, Lane] | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                for lane in self.lanes:
                    if lane.buffer and lane.running < lane.cap:
                        message, token = lane.buffer.popleft()
                        lane.running += 1
                        self._held[(message.pk, token)].started = True
                        return message, token, lane
                self._cond.wait()

    def _executor_loop(self) -> None:
        try:
            while (item := self._next_item()) is not None:
                message, token, lane = item
                result = self._run_one(message, token)
                with self._cond:
                    self._held.pop((message.pk, token), None)
                    lane.running -= 1
                    lane.held -= 1
                    self.stats[result] += 1
                    self._cond.notify_all()
                assert self._waker is not None
                self._waker.poke()
        finally:
            connections.close_all()

    def _run_one(self, message: Message, token: uuid.UUID) -> str:
        # Keep DEBUG's query log from growing for the life of the worker, and
        # drop a connection that broke on the previous message. Unlike around
        # a request, healthy connections are kept whatever CONN_MAX_AGE says:
        # reconnecting per message would cost more than the message.
        reset_queries()
        drop_broken_connections()
        try:
            return execute(message, token, using=self.using)
        except Exception:
            # The outcome could not be recorded (the database went away): the
            # message keeps its lease and is redelivered when it expires.
            logger.exception(
                "could not record the outcome of message %s; it will be redelivered "
                "when its lease expires",
                message.pk,
            )
            connections[self.using].close()
            return "unrecorded"

    # -- leases ---------------------------------------------------------------

    def _keeper_loop(self) -> None:
        """Extend the leases of held messages every third of the shortest lease."""
        leases = [*self.leases.values(), self.default_lease]
        interval = max(0.05, min(leases).total_seconds() / 3)
        try:
            while not self._keeper_stop.wait(interval):
                try:
                    self._extend_leases()
                except DatabaseError:
                    logger.warning("could not extend leases", exc_info=True)
                    connections[self.using].close()
        finally:
            connections.close_all()

    def _extend_leases(self) -> None:
        groups: dict[tuple[uuid.UUID, timedelta], list[int]] = defaultdict(list)
        with self._cond:
            for (pk, _), held in self._held.items():
                groups[(held.token, held.lease)].append(pk)
        for (token, lease), ids in groups.items():
            kept = claim.extend(ids, token, lease, using=self.using)
            if kept == len(ids):
                continue
            # Messages settled while we were extending are not losses.
            with self._cond:
                still_held = sum(1 for pk in ids if (pk, token) in self._held)
            if still_held > kept:
                logger.warning(
                    "%d held message(s) were no longer ours when extending their lease "
                    "(claimed again after their lease expired?)",
                    still_held - kept,
                )

    # -- maintenance ----------------------------------------------------------

    def _maybe_install_schedules(self) -> None:
        """Install the next cron ticks: before the first claim, then every interval.

        Every worker installs every schedule; duplicate ticks are impossible
        (``scheduling.py``). A failure is logged and retried at the next
        interval: cron must never stop a worker from consuming.
        """
        if time.monotonic() < self._next_install:
            return
        interval = to_timedelta(get_config()["CRON_INSTALL_INTERVAL"]).total_seconds()
        self._next_install = time.monotonic() + interval
        try:
            scheduling.install_schedules(using=self.using)
        except Exception as exc:
            logger.warning(
                "could not install scheduled ticks; retrying in %.0f s", interval, exc_info=True
            )
            if isinstance(exc, DatabaseError):
                connections[self.using].close()

    def _maybe_prune(self) -> None:
        interval = get_config()["PRUNE_INTERVAL"]
        if interval is None or self.burst:
            return
        if time.monotonic() - self._last_prune < to_timedelta(interval).total_seconds():
            return
        self._last_prune = time.monotonic()
        deleted = retention.prune(max_batches=10, using=self.using)
        if deleted:
            logger.info("pruned %d finished message(s)", deleted)

    # -- shutdown -------------------------------------------------------------

    def _release(self, items: list[tuple[int, Held]], started: bool) -> int:
        groups: dict[uuid.UUID, list[int]] = defaultdict(list)
        for pk, held in items:
            groups[held.token].append(pk)
        released = 0
        for token, ids in groups.items():
            try:
                released += claim.release(ids, token, started=started, using=self.using)
            except DatabaseError:
                logger.warning(
                    "could not release %d message(s); they wait for their lease",
                    len(ids),
                    exc_info=True,
                )
        return released

    def _shutdown(self, keeper: threading.Thread) -> None:
        with self._cond:
            self._stopping = True
            waiting = [
                (m.pk, self._held.pop((m.pk, token)))
                for lane in self.lanes
                for m, token in lane.buffer
            ]
            for lane in self.lanes:
                lane.held -= len(lane.buffer)
                lane.buffer.clear()
            self._cond.notify_all()
        if waiting:
            count = self._release(waiting, started=False)
            logger.info("released %d claimed but unstarted message(s)", count)
        deadline = time.monotonic() + self.shutdown_grace
        for thread in self._threads:
            while thread.is_alive() and not self._force and time.monotonic() < deadline:
                thread.join(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        with self._cond:
            leftover = [(pk, held) for (pk, _), held in self._held.items()]
            self._held.clear()
        if leftover:
            count = self._release(leftover, started=True)
            logger.warning(
                "released %d message(s) still running after the grace period; "
                "they will be redelivered",
                count,
            )
        self._keeper_stop.set()
        keeper.join(timeout=5)
        if self._waker is not None:
            self._waker.close()
        connections.close_all()
        summary = ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items()))
        logger.info("worker %s stopped: %s", self.name, summary or "nothing processed")


def drop_broken_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or not conn.errors_occurred:
            continue
        if conn.in_atomic_block or not conn.is_usable():
            conn.close()
        else:
            conn.errors_occurred = False


def next_due_time(queues: list[str], using: str | None = None) -> datetime | None:
    return (
        Message.objects.using(using or router.db_for_write(Message))
        .active()
        .filter(queue__in=queues)
        .aggregate(t=Min("next_attempt_time"))["t"]
    )
