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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, reset_queries, router, transaction
from django.db.models import Min, Model

from django_delayq import claim, clock, liveness, retention, scheduling
from django_delayq.acks import AckBuffer
from django_delayq.conf import get_config, to_timedelta
from django_delayq.exceptions import HandlerNotFound
from django_delayq.execute import _lease_lost, execute, record_time_limit
from django_delayq.logs import message_fields
from django_delayq.metrics import WorkerMetrics
from django_delayq.models import Message, active_condition
from django_delayq.queues import paused_queues
from django_delayq.registry import HandlerSpec, registry
from django_delayq.wakeup import Waker

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

# Most atomic messages committed in one group transaction.
GROUP_MAX = 100

# Pruning: batches per round, and the pause before the next round when a
# round found more to delete than that.
PRUNE_BATCHES = 10
PRUNE_CATCH_UP = 1.0

# An executor whose connection sat unused this long, or that missed a
# connection failure seen by another thread, checks it before the next
# handler runs, so a handler is not blamed (and retried) for a connection
# that died while idle (server restart, terminated backend, idle timeout).
IDLE_RECHECK = 5.0


@dataclass
class Lane:
    """Queues that share a cap on concurrently running messages.

    A ``QueueFields`` model's queue is a lane of its own, claimed from that
    model's table (``model``); every other lane claims messages.
    """

    queues: list[str]
    cap: int
    buffer: deque[tuple[Message, uuid.UUID]] = field(default_factory=deque)
    running: int = 0
    held: int = 0
    # Moving average of a message's wall time in this lane (handler plus
    # outcome), which sizes adaptive claims.
    seconds_per_message: float | None = None
    model: type[Model] = Message


@dataclass
class Held:
    token: uuid.UUID
    lease: timedelta
    lane: Lane
    started: bool = False
    message: Message | None = None
    time_limit: timedelta | None = None
    # Set when an executor starts it: for the time limit, and so that a
    # stuck executor can be replaced.
    started_at: float | None = None
    thread: threading.Thread | None = None
    # Its outcome is written and waits for its group's commit: the row is
    # locked by that transaction, and its time limit no longer applies.
    settling: bool = False


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
        metrics_port: int | None = None,
        metrics_address: str | None = None,
    ) -> None:
        config = get_config()
        self.queues = resolve_queues(queues)
        self.concurrency = int(concurrency or config["CONCURRENCY"])
        configured = batch_size or config["BATCH_SIZE"]
        # No BATCH_SIZE: each claim is sized to about CLAIM_WINDOW of the
        # lane's recent work, between its handler slots and ADAPTIVE_MAX_BATCH.
        self.adaptive = configured is None
        self.batch_size = int(configured or ADAPTIVE_MAX_BATCH)
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
        self.time_limits = {(s.queue, s.kind): s.effective_time_limit() for s in specs}
        self.heartbeat_interval = to_timedelta(config["HEARTBEAT_INTERVAL"]).total_seconds()
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
        # The first round is due at once, however briefly the host has been up.
        self._last_prune = float("-inf")
        self._next_install = 0.0
        self._paused: frozenset[str] = frozenset()
        self._paused_read: float | None = None
        self._acks: AckBuffer | None = None
        # Atomic handlers' transactions are grouped (see _run_group) for up
        # to this long; None: one transaction per message.
        self._group_window: float | None = None
        # Bumped on every database error seen by the claim loop or the keeper.
        self._db_failures = 0
        self._local = threading.local()
        port = config["METRICS_PORT"] if metrics_port is None else metrics_port
        self.metrics: WorkerMetrics | None = None
        if port:
            self.metrics = WorkerMetrics(
                port=int(port),
                address=config["METRICS_ADDRESS"] if metrics_address is None else metrics_address,
                interval=to_timedelta(config["METRICS_INTERVAL"]),
                queues=self.queues,
                using=self.using,
            )

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
        models = {s.queue: s.model for s in specs if s.model is not None}
        shared = [q for q in self.queues if q not in caps and q not in models]
        lanes = [Lane(shared, self.concurrency)] if shared else []
        lanes += [
            Lane([q], caps.get(q, self.concurrency), model=models.get(q, Message))
            for q in self.queues
            if q in caps or q in models
        ]
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
        if self.metrics is not None:
            self.metrics.start(self.name)
        self._waker = Waker(self.using, self.queues, listen=config["NOTIFY"] and not self.burst)
        if config["ACK_DELAY"] is not None and connections[self.using].vendor == "postgresql":
            self._acks = AckBuffer(
                self.using,
                max_delay=to_timedelta(config["ACK_DELAY"]).total_seconds(),
                on_lost=self._ack_lost,
            )
            self._group_window = self._acks.max_delay
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
        try:
            liveness.register(
                self.name, queues=self.queues, concurrency=self.concurrency, using=self.using
            )
        except DatabaseError:
            logger.warning("could not record this worker's heartbeat yet", exc_info=True)
            connections[self.using].close()
        for i in range(self.concurrency):
            self._start_thread(self._executor_loop, f"delayq-executor-{i}")
        keeper = self._start_thread(self._keeper_loop, "delayq-lease-keeper")
        errors = 0
        try:
            while not self._stopping:
                # DEBUG's query log is per thread and per connection: each of
                # the worker's threads empties its own (see _run_one).
                reset_queries()
                try:
                    if self.metrics is not None:
                        self.metrics.loop()
                    self._maybe_prune()
                    self._maybe_install_schedules()
                    claimed = self._claim_round()
                    if errors:
                        logger.warning(
                            "database reachable again after %d failed attempt(s)", errors
                        )
                    errors = 0
                    if claimed:
                        continue
                    with self._cond:
                        idle = not self._held
                    if self.burst and idle:
                        break
                    self._idle_wait(busy=not idle)
                except DatabaseError:
                    # Lost connection, restarted server, failover: reconnect
                    # with a capped exponential backoff; the worker never
                    # exits for it, and what it holds stays leased meanwhile.
                    errors += 1
                    self._db_failures += 1
                    backoff = min(30.0, 0.5 * 2 ** min(errors, 6))
                    logger.warning(
                        "database error while claiming; reconnecting in %.1f s",
                        backoff,
                        exc_info=True,
                    )
                    connections[self.using].close()
                    self._waker.wait(backoff)
        finally:
            self._shutdown(keeper)
            if self.metrics is not None:
                self.metrics.stop()
        return self.stats

    def _batch_for(self, lane: Lane) -> int:
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

    def _ack_lost(self, message: Message) -> None:
        """A batched acknowledgement found the message claimed again."""
        with self._cond:
            self.stats["succeeded"] -= 1
            self.stats["lease_lost"] += 1

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
                # Prefetch: the next batch is claimed while the current one
                # runs, so handler slots never wait for a claim's round trip.
                # A lane holds at most its slots plus two batches; what is
                # still waiting at shutdown is released with its attempt back.
                batch = self._batch_for(lane)
                if self._stopping or len(lane.buffer) >= batch:
                    continue
                capacity = lane.cap + 2 * batch
                limit = min(batch, capacity - lane.held)
            if limit <= 0:
                continue
            result = claim.claim(
                queues,
                limit,
                worker=self.name,
                lease=self.default_lease
                if lane.model is Message
                else self.leases.get((queues[0], None), self.default_lease),
                leases=self.leases,
                using=self.using,
                model=lane.model,
            )
            if not result.messages:
                continue
            total += len(result.messages)
            with self._cond:
                for message in result.messages:
                    # A model's rows are its queue's, whatever columns it has.
                    queue, kind = (
                        (message.queue, message.kind)
                        if lane.model is Message
                        else (queues[0], None)
                    )
                    lease = self.leases.get((queue, kind)) or self.leases.get(
                        (queue, None), self.default_lease
                    )
                    self._held[(message.pk, result.token)] = Held(
                        result.token,
                        lease,
                        lane,
                        message=message,
                        time_limit=self.time_limits.get((queue, kind))
                        or self.time_limits.get((queue, None)),
                    )
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
            for lane in self.lanes:
                if lane.model is Message or lane.queues[0] in self._paused:
                    continue
                due = (
                    lane.model._base_manager.using(self.using)
                    .filter(active_condition())
                    .aggregate(t=Min("next_attempt_time"))["t"]
                )
                if due is not None and (next_due is None or due < next_due):
                    next_due = due
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

    def _start(self, lane: Lane) -> tuple[Message, uuid.UUID]:
        """Take the next message of ``lane`` for this thread (with ``_cond`` held)."""
        message, token = lane.buffer.popleft()
        lane.running += 1
        held = self._held[(message.pk, token)]
        held.started = True
        held.started_at = time.monotonic()
        held.thread = threading.current_thread()
        return message, token

    def _next_item(self) -> tuple[Message, uuid.UUID, Lane] | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                for lane in self.lanes:
                    if lane.buffer and lane.running < lane.cap:
                        return (*self._start(lane), lane)
                self._cond.wait()

    def _next_atomic_item(self, lane: Lane) -> tuple[Message, uuid.UUID] | None:
        """The next message of ``lane`` if one is waiting and its handler is atomic."""
        with self._cond:
            if self._stopping or not lane.buffer or lane.running >= lane.cap:
                return None
            if not _is_atomic(lane.buffer[0][0]):
                return None
            return self._start(lane)

    def _executor_loop(self) -> None:
        try:
            while (item := self._next_item()) is not None:
                grouped = self._group_window is not None and _is_atomic(item[0])
                if not (self._run_group(item) if grouped else self._run_single(item)):
                    return
        finally:
            connections.close_all()

    def _run_single(self, item: tuple[Message, uuid.UUID, Lane]) -> bool:
        """Run one message; False if this thread was replaced meanwhile (time limit)."""
        message, token, lane = item
        self._prepare_connection()
        started = time.monotonic()
        result = self._run_one(message, token)
        elapsed = time.monotonic() - started
        if not self._handler_done(message, token, lane, elapsed):
            return False
        self._settled([(message, token, lane, result, elapsed)])
        return True

    def _run_group(self, item: tuple[Message, uuid.UUID, Lane]) -> bool:
        """Run atomic handlers one after another in one transaction, committed once.

        A commit waits for the write-ahead log to reach the disk; for fast
        atomic handlers it is most of their cost. Each handler still runs in
        a savepoint of its own, so a failing one rolls back its own writes
        only (its failure is recorded in the same transaction); the successes
        are acknowledged together by one compare-and-set statement just
        before the commit, so every handler's writes commit exactly when its
        acknowledgement does. The group closes ``ACK_DELAY`` after its first
        message finished, at ``GROUP_MAX`` messages, or when the next waiting
        message is not atomic. Outcomes are logged and signalled after the
        commit; if the commit fails, none of them happened (the messages keep
        their leases and are redelivered). If a message of the group was
        taken from it meanwhile (its time limit passed, or its lease was
        lost), the group rolls back and the others run again, one
        transaction each, so that message's writes never commit. False if
        this thread was replaced meanwhile.
        """
        message, token, lane = item
        assert self._group_window is not None
        self._prepare_connection()
        done: list[tuple[Message, uuid.UUID, Lane, str, float]] = []
        later: list[Callable[[], None]] = []
        pending: list[tuple[Message, uuid.UUID]] = []
        replaced = False
        try:
            with transaction.atomic(using=self.using):
                deadline = None
                while True:
                    started = time.monotonic()
                    result: str = "unrecorded"
                    try:
                        # If its outcome cannot be written, the exception rolls
                        # back the whole group, this message with the others.
                        result = execute(
                            message, token, using=self.using, later=later, group_acks=pending
                        )
                    finally:
                        elapsed = time.monotonic() - started
                        if self._handler_done(message, token, lane, elapsed, settling=True):
                            done.append((message, token, lane, result, elapsed))
                        else:
                            replaced = True
                    if replaced:
                        raise _GroupLost([message.pk])
                    if deadline is None:
                        deadline = time.monotonic() + self._group_window
                    if len(done) >= GROUP_MAX or time.monotonic() >= deadline:
                        break
                    following = self._next_atomic_item(lane)
                    if following is None:
                        break
                    message, token = following
                self._ack_group(pending, lane)
        except _GroupLost as lost:
            done = self._rerun(done, lost.ids)
            later = []
        except BaseException:
            # BaseException: whatever escapes (a signal receiver's
            # KeyboardInterrupt too) must not kill the executor thread.
            logger.exception(
                "could not commit the outcome of %d message(s); they will be redelivered "
                "when their leases expire",
                len(done),
            )
            connections[self.using].close()
            done = [(m, t, ln, "unrecorded", e) for m, t, ln, _, e in done]
            later = []
        for announce in later:
            announce()
        self._settled(done)
        return not replaced

    def _ack_group(self, pending: list[tuple[Message, uuid.UUID]], lane: Lane) -> None:
        """Acknowledge the group's successes; raise ``_GroupLost`` if one is no longer ours."""
        if not pending:
            return
        held: dict[uuid.UUID, list[int]] = defaultdict(list)
        for message, token in pending:
            held[token].append(message.pk)
        mine = claim.ack_held(held, using=self.using, model=lane.model)
        lost = [message.pk for message, _ in pending if message.pk not in mine]
        if lost:
            raise _GroupLost(lost)

    def _rerun(
        self, done: list[tuple[Message, uuid.UUID, Lane, str, float]], lost: list[int]
    ) -> list[tuple[Message, uuid.UUID, Lane, str, float]]:
        """After a group rolled back for ``lost``: run every other message again, alone."""
        out: list[tuple[Message, uuid.UUID, Lane, str, float]] = []
        for message, token, lane, _, _ in done:
            if message.pk in lost:
                out.append((message, token, lane, _lease_lost(message), 0.0))
                continue
            with self._cond:
                held = self._held.get((message.pk, token))
                if held is not None:  # running again: its lease and time limit apply
                    held.settling = False
                    held.started_at = time.monotonic()
            started = time.monotonic()
            self._prepare_connection()
            result = self._run_one(message, token)
            out.append((message, token, lane, result, time.monotonic() - started))
        return out

    def _handler_done(
        self,
        message: Message,
        token: uuid.UUID,
        lane: Lane,
        elapsed: float,
        *,
        settling: bool = False,
    ) -> bool:
        """Free the handler slot; False if the message was taken from this thread.

        That happens past its time limit: the keeper already failed the
        attempt, freed the slot and started a replacement thread, so this
        thread (and the late result) goes; or at a shutdown whose grace ran
        out. ``settling``: the outcome waits for the group's commit, so the
        lease keeper leaves the row alone.
        """
        with self._cond:
            held = self._held.get((message.pk, token))
            if held is None:
                # Whoever took it (the keeper, or a shutdown past its grace)
                # did the bookkeeping.
                if not self._stopping:
                    self.stats["late"] += 1
                return False
            # Done running: no time limit applies any more.
            held.started_at = None
            held.settling = settling
            lane.running -= 1
            previous = lane.seconds_per_message
            lane.seconds_per_message = (
                elapsed if previous is None else 0.9 * previous + 0.1 * elapsed
            )
            return True

    def _settled(self, done: list[tuple[Message, uuid.UUID, Lane, str, float]]) -> None:
        """Bookkeeping once outcomes are committed (or known to be lost)."""
        wake = False
        with self._cond:
            for message, token, lane, result, _ in done:
                if self._held.pop((message.pk, token), None) is None:
                    continue  # taken meanwhile (time limit): accounted for there
                lane.held -= 1
                self.stats[result] += 1
                # Wake the claiming thread only when it has something to do:
                # claim for a buffer running low, or notice that all is done
                # (--burst). Waking it after every message made it compete
                # with the executors for the GIL.
                wake = wake or len(lane.buffer) < self._batch_for(lane)
            wake = wake or not self._held
            self._cond.notify_all()
        if self.metrics is not None:
            for message, _, _, result, elapsed in done:
                self.metrics.processed(message.queue, result, elapsed)
        if wake:
            assert self._waker is not None
            self._waker.poke()

    def _prepare_connection(self) -> None:
        # Keep DEBUG's query log from growing for the life of the worker, and
        # drop a connection that broke on the previous message. Unlike around
        # a request, healthy connections are kept whatever CONN_MAX_AGE says:
        # reconnecting per message would cost more than the message.
        if settings.DEBUG:
            reset_queries()
        drop_broken_connections()
        self._recheck_connection()

    def _run_one(self, message: Message, token: uuid.UUID) -> str:
        try:
            # Batched acknowledgements are for messages; a model's rows are
            # acknowledged one statement each.
            acks = self._acks if isinstance(message, Message) else None
            return execute(message, token, using=self.using, acks=acks)
        except BaseException:
            # The outcome could not be recorded (the database went away): the
            # message keeps its lease and is redelivered when it expires.
            logger.exception(
                "could not record the outcome of message %s; it will be redelivered "
                "when its lease expires",
                message.pk,
                extra=message_fields(message, outcome="unrecorded"),
            )
            connections[self.using].close()
            return "unrecorded"

    def _recheck_connection(self) -> None:
        local = self._local
        now = time.monotonic()
        stale = (
            getattr(local, "failures", 0) != self._db_failures
            or now - getattr(local, "used", now) > IDLE_RECHECK
        )
        local.failures, local.used = self._db_failures, now
        connection = connections[self.using]
        if stale and connection.connection is not None and not connection.is_usable():
            logger.warning("dropping a database connection that died while idle")
            connection.close()

    # -- leases ---------------------------------------------------------------

    def _keeper_loop(self) -> None:
        """Housekeeping of held messages and of this worker's liveness.

        Extends leases every third of the shortest lease, records the
        heartbeat and hands back dead workers' messages every heartbeat
        interval, and enforces handler time limits.
        """
        leases = [*self.leases.values(), self.default_lease]
        extend_every = max(0.05, min(leases).total_seconds() / 3)
        limits = [t.total_seconds() for t in self.time_limits.values() if t is not None]
        interval = min(extend_every, self.heartbeat_interval, *(t / 4 for t in limits))
        interval = max(0.05, interval)
        next_extend = next_beat = time.monotonic()
        try:
            while not self._keeper_stop.wait(interval):
                reset_queries()
                now = time.monotonic()
                try:
                    if limits:
                        self._enforce_time_limits()
                    if now >= next_extend:
                        next_extend = now + extend_every
                        self._extend_leases()
                    if now >= next_beat:
                        next_beat = now + self.heartbeat_interval
                        if not liveness.beat(self.name, using=self.using):
                            liveness.register(
                                self.name,
                                queues=self.queues,
                                concurrency=self.concurrency,
                                using=self.using,
                            )
                        self.stats["released_from_dead"] += sum(
                            liveness.release_dead(self.name, using=self.using).values()
                        )
                except DatabaseError:
                    logger.warning(
                        "could not extend leases or record the heartbeat; reconnecting",
                        exc_info=True,
                    )
                    self._db_failures += 1
                    connections[self.using].close()
        finally:
            connections.close_all()

    def _enforce_time_limits(self) -> None:
        """Fail attempts that ran past their handler's ``time_limit``.

        The handler's thread cannot be stopped: the attempt is failed (and
        retried per the retry policy) under its token, which fences off its
        late outcome, the lease is no longer extended, and a new executor
        thread takes the slot so the worker keeps its full concurrency.
        """
        now = time.monotonic()
        with self._cond:
            late = [
                (key, held)
                for key, held in self._held.items()
                if held.time_limit is not None
                and held.started_at is not None
                and now - held.started_at > held.time_limit.total_seconds()
            ]
        for (pk, token), held in late:
            assert held.message is not None and held.time_limit is not None
            result = record_time_limit(held.message, token, held.time_limit, using=self.using)
            with self._cond:
                if self._held.get((pk, token)) is not held or held.started_at is None:
                    continue  # it finished meanwhile; its own outcome won the race
                del self._held[(pk, token)]
                held.lane.running -= 1
                held.lane.held -= 1
                self.stats["time_limit"] += 1
                if held.thread in self._threads:
                    self._threads.remove(held.thread)
                if not self._stopping:
                    self._start_thread(
                        self._executor_loop, f"delayq-executor-{uuid.uuid4().hex[:6]}"
                    )
                self._cond.notify_all()
            if self.metrics is not None and held.started_at is not None:
                self.metrics.processed(held.message.queue, result, now - held.started_at)
            logger.error(
                "message %s (%s/%s) ran past its time limit of %s: attempt %s, %s; "
                "its handler's late outcome will be discarded",
                pk,
                held.message.queue,
                held.message.key,
                held.time_limit,
                held.message.attempt_count,
                result,
                extra=message_fields(held.message, outcome=result),
            )

    def _extend_leases(self) -> None:
        groups: dict[tuple[uuid.UUID, timedelta, type[Model]], list[int]] = defaultdict(list)
        with self._cond:
            for (pk, _), held in self._held.items():
                # A settling row is locked by its group's transaction, which
                # decides its fate: nothing to extend.
                if not held.settling:
                    groups[(held.token, held.lease, held.lane.model)].append(pk)
        for (token, lease, model), ids in groups.items():
            kept = claim.extend(ids, token, lease, using=self.using, model=model)
            if kept == len(ids):
                continue
            # Messages settled (or settling) while we were extending are not losses.
            with self._cond:
                current = [self._held.get((pk, token)) for pk in ids]
                still_held = sum(1 for h in current if h is not None and not h.settling)
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
        """Delete expired finished messages every ``PRUNE_INTERVAL``, a few batches at a time.

        A round that hit its batch cap left more behind: the next comes after
        ``PRUNE_CATCH_UP`` seconds rather than a whole interval, so pruning
        keeps pace with any steady rate of messages (a fixed number of
        batches per interval would let a busy table grow without bound)
        while no single round keeps the worker from claiming for long.
        """
        config = get_config()
        interval = config["PRUNE_INTERVAL"]
        if interval is None or self.burst:
            return
        seconds = to_timedelta(interval).total_seconds()
        if time.monotonic() - self._last_prune < seconds:
            return
        self._last_prune = time.monotonic()
        deleted = retention.prune(max_batches=PRUNE_BATCHES, using=self.using)
        if deleted:
            logger.info("pruned %d finished message(s)", deleted)
        if deleted >= PRUNE_BATCHES * int(config["PRUNE_BATCH_SIZE"]):
            self._last_prune -= max(0.0, seconds - PRUNE_CATCH_UP)

    # -- shutdown -------------------------------------------------------------

    def _release(self, items: list[tuple[int, Held]], started: bool) -> int:
        groups: dict[tuple[uuid.UUID, type[Model]], list[int]] = defaultdict(list)
        for pk, held in items:
            groups[(held.token, held.lane.model)].append(pk)
        released = 0
        for (token, model), ids in groups.items():
            try:
                released += claim.release(
                    ids, token, started=started, using=self.using, model=model
                )
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
        for thread in list(self._threads):
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
        if self._acks is not None:
            self._acks.close()
        self._keeper_stop.set()
        keeper.join(timeout=5)
        try:
            liveness.mark_stopped(self.name, using=self.using)
        except DatabaseError:
            logger.warning("could not record this worker's stop", exc_info=True)
        if self._waker is not None:
            self._waker.close()
        connections.close_all()
        summary = ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items()))
        logger.info("worker %s stopped: %s", self.name, summary or "nothing processed")


class _GroupLost(Exception):
    """A message of a group of atomic handlers is no longer this worker's."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(ids)
        self.ids = ids


def _is_atomic(message: Message) -> bool:
    try:
        return registry.lookup_for(message).atomic
    except HandlerNotFound:
        return False


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
