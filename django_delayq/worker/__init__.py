"""The worker behind ``manage.py run_delayq``, split the way its jobs are.

* :mod:`~django_delayq.worker.claimer` (the main thread): claims batches for
  free handler slots, lane by lane, and sleeps when nothing is due;
* :mod:`~django_delayq.worker.runner` (executor threads): runs handlers,
  alone or in groups of atomic handlers, through
  :mod:`~django_delayq.worker.execute`, which records each outcome
  (:mod:`~django_delayq.worker.acks` commits successes in batches);
* :mod:`~django_delayq.worker.keeper` (a thread): extends leases, enforces
  time limits, records the heartbeat;
* :mod:`~django_delayq.worker.maintenance` (a thread; with ``--burst``,
  after a first round on the main thread): pruning, cron ticks, the
  messages of dead workers (the keeper's and its loop:
  :mod:`~django_delayq.worker.background`).

They share one :class:`~django_delayq.worker.inflight.Book` of what the
worker holds. :class:`Worker` builds them from the settings and owns start
and stop.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from types import FrameType

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, reset_queries

from django_delayq import guard, liveness
from django_delayq.conf import MAX_BATCH_SIZE, check_count, get_config, to_timedelta
from django_delayq.dberrors import STATEMENT_ERROR_LIMIT, is_statement_error
from django_delayq.exceptions import DatabaseUnreachable, WorkerCrashed, WorkerNameTaken
from django_delayq.flow import Scope, limits_of
from django_delayq.health import Health, HealthServer
from django_delayq.models import Message
from django_delayq.registry import HandlerSpec, registry
from django_delayq.routers import queue_alias
from django_delayq.store import groups, leases
from django_delayq.store.features import features
from django_delayq.worker.acks import Settler
from django_delayq.worker.aio import EventLoop
from django_delayq.worker.background import DB_ERRORS, Supervisor
from django_delayq.worker.claimer import Claimer
from django_delayq.worker.execute import Result, released_children
from django_delayq.worker.inflight import Book, InFlight, Lane
from django_delayq.worker.keeper import Keeper
from django_delayq.worker.listen import polling
from django_delayq.worker.maintenance import Maintenance
from django_delayq.worker.runner import Done, Runner
from django_delayq.worker.wakeup import Waker

logger = logging.getLogger("django_delayq.worker")

# Outcomes that make a message due again later: the next due time may move.
RESCHEDULED = frozenset({Result.RETRYING, Result.SNOOZED})
# Outcomes after which the next message of a group may be due (execute.py).
GROUP_DONE = frozenset({Result.SUCCEEDED, Result.FAILED, Result.DISCARDED})
# Reconnection backoff after a database error: 1 s, 2 s, ... up to this.
MAX_BACKOFF = 30.0

__all__ = ["Worker", "resolve_queues", "worker_name"]


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


def make_lanes(queues: list[str], specs: list[HandlerSpec], concurrency: int) -> list[Lane]:
    """One shared lane, plus one per queue with a concurrency cap or a model of its own,
    one per limited kind and per limited queue (``flow.limits_of``), and one per queue
    whose handlers are all ``async def``.

    An async queue's lane runs up to its handlers' ``concurrency`` (else its
    queue's ``CONCURRENCY``, else the worker's) coroutines at once on the
    worker's event loop, beyond the worker's ``--concurrency``, which counts
    threads: that is what async handlers are for. A queue that mixes plain and
    ``async def`` handlers shares the threads' lanes; its async handlers then
    run on the loop one per executor thread.
    """
    caps: dict[str, int] = {}
    queue_overrides = get_config()["QUEUES"]
    asynchronous = {
        q
        for q in queues
        if (mine := [s for s in specs if s.queue == q]) and all(s.is_async for s in mine)
    }
    for queue in queues:
        cap = queue_overrides.get(queue, {}).get("CONCURRENCY")
        for spec in specs:
            if spec.queue == queue and spec.concurrency:
                cap = min(cap or spec.concurrency, spec.concurrency)
        if cap:
            caps[queue] = int(cap) if queue in asynchronous else min(int(cap), concurrency)
    models = {s.queue: s.model for s in specs if s.model is not None}
    limited = {q: found for q in queues if q not in models and (found := limits_of(q))}
    own = caps.keys() | models.keys() | limited.keys() | asynchronous
    shared = [q for q in queues if q not in own]
    lanes = [Lane(shared, concurrency)] if shared else []
    for queue in queues:
        if queue in limited:
            split = _limited_lanes(queue, limited[queue], caps.get(queue, concurrency))
            for lane in split:
                lane.is_async = queue in asynchronous
            lanes += split
        elif queue in own:
            lanes.append(
                Lane(
                    [queue],
                    caps.get(queue, concurrency),
                    model=models.get(queue, Message),
                    is_async=queue in asynchronous,
                )
            )
    return lanes


def _limited_lanes(queue: str, scopes: list[Scope], cap: int) -> list[Lane]:
    """A lane per limited kind of ``queue`` (under its own and the queue's limits), and
    one for the rest of it (under the queue's, if it has any)."""
    whole = tuple(s for s in scopes if not s.kind)
    kinds = frozenset(s.kind for s in scopes if s.kind)

    def slots(limits: tuple[Scope, ...]) -> int:
        # No point in more slots than the tightest global cap lets run.
        return min([cap, *(s.cap for s in limits if s.cap is not None)])

    lanes = [
        Lane([queue], slots((s, *whole)), limits=(s, *whole), kinds=(frozenset({s.kind}), True))
        for s in scopes
        if s.kind
    ]
    lanes.append(Lane([queue], slots(whole), limits=whole, kinds=(kinds, False) if kinds else None))
    return lanes


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
        health_port: int | None = None,
        health_address: str | None = None,
        database_outage_limit: timedelta | float | None = None,
    ) -> None:
        config = get_config()
        self.queues = resolve_queues(queues)
        self.concurrency = check_count(concurrency or config["CONCURRENCY"], "concurrency")
        batch = batch_size or config["BATCH_SIZE"]
        if batch is not None:
            batch = check_count(batch, "batch size", MAX_BATCH_SIZE)
        self.burst = burst
        self.using = queue_alias(using)
        self.name = worker_name() if name is None else liveness.validate_worker_name(name)
        # This run of the worker: another live worker under the same name is
        # refused, and one that took the name over stops this one (liveness).
        self.instance = uuid.uuid4()
        self._name_taken: WorkerNameTaken | None = None
        self.poll_interval = to_timedelta(config["POLL_INTERVAL"]).total_seconds()
        self.shutdown_grace = to_timedelta(
            config["SHUTDOWN_GRACE"] if shutdown_grace is None else shutdown_grace
        ).total_seconds()
        outage = config["DATABASE_OUTAGE_LIMIT"]
        if database_outage_limit is not None:
            outage = database_outage_limit
        #: Seconds of unreachable database after which run() gives up; None: never.
        self.database_outage_limit = (
            None if outage is None else to_timedelta(outage).total_seconds()
        )
        heartbeat = to_timedelta(config["HEARTBEAT_INTERVAL"]).total_seconds()
        self.health = Health(loop_period=self.poll_interval, heartbeat_interval=heartbeat)
        self.health_server = None
        port = config["HEALTH_PORT"] if health_port is None else health_port
        if port:
            self.health_server = HealthServer(
                self.health,
                port=int(port),
                address=config["HEALTH_ADDRESS"] if health_address is None else health_address,
                worker=self.name,
            )
        specs = [s for q in self.queues for s in registry.for_queue(q)]
        default_lease = to_timedelta(config["LEASE"])
        handler_leases = {(s.queue, s.kind): s.effective_lease() for s in specs}
        time_limits = {(s.queue, s.kind): s.effective_time_limit() for s in specs}
        self.book = Book(make_lanes(self.queues, specs, self.concurrency))
        self.claimer = Claimer(
            self.book,
            name=self.name,
            queues=self.queues,
            using=self.using,
            batch_size=None if batch is None else int(batch),
            poll_interval=self.poll_interval,
            claim_delay=0.0
            if config["CLAIM_DELAY"] is None
            else to_timedelta(config["CLAIM_DELAY"]).total_seconds(),
            default_lease=default_lease,
            leases=handler_leases,
            time_limits=time_limits,
        )
        #: Every thread of the worker reports its death here; the claim loop
        #: replaces it, or stops the worker (background.py).
        self.supervisor = Supervisor(poke=self._poke)
        self.maintenance = Maintenance(
            self.book,
            name=self.name,
            using=self.using,
            burst=burst,
            on_due=self._due_elsewhere,
            supervisor=self.supervisor,
            # No look below floors no lane of this worker keeps.
            below_floors=self.claimer.below_floors if self.claimer.floors.any_lane else None,
            poll_interval=self.poll_interval,
        )
        self.keeper = Keeper(
            self.book,
            name=self.name,
            instance=self.instance,
            queues=self.queues,
            concurrency=self.concurrency,
            using=self.using,
            leases=[*handler_leases.values(), default_lease],
            time_limits=[t for t in time_limits.values() if t is not None],
            heartbeat_interval=heartbeat,
            replace_executor=lambda thread: self.runner.replace(thread),
            processed=self._processed,
            on_database_error=self._database_error,
            on_heartbeat=self.health.beat,
            on_name_taken=self._lost_name,
            supervisor=self.supervisor,
        )
        self.runner: Runner  # built by run(): its acknowledgements need the connection
        self.settler: Settler
        self._force = False
        # Bumped on every database error seen by the claim loop or the keeper:
        # executors then check their connection before the next handler.
        self._db_failures = 0
        self.metrics = None
        port = config["METRICS_PORT"] if metrics_port is None else metrics_port
        if port:
            from django_delayq.metrics import WorkerMetrics

            self.metrics = WorkerMetrics(
                port=int(port),
                address=config["METRICS_ADDRESS"] if metrics_address is None else metrics_address,
                interval=to_timedelta(config["METRICS_INTERVAL"]),
                queues=self.queues,
                using=self.using,
            )

    @property
    def stats(self) -> Counter[str]:
        return self.book.stats

    # -- control --------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.book.stopping:
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
        self.health.stopping(self.shutdown_grace)
        self.book.stop()
        self._poke()

    def _poke(self) -> None:
        if self.claimer.waker is not None:
            self.claimer.waker.poke()

    # -- main loop ------------------------------------------------------------

    def run(self) -> Counter[str]:
        config = get_config()
        if self.metrics is not None:
            self.metrics.start(self.name)
        if self.health_server is not None:
            try:
                self.health_server.start()
            except ImproperlyConfigured:
                if self.metrics is not None:
                    self.metrics.stop()
                raise
        batching = None
        if config["ACK_DELAY"] is not None and features(connections[self.using]).group_commits:
            batching = to_timedelta(config["ACK_DELAY"]).total_seconds()
        acks = self.settler = Settler(
            self.using,
            settled=self._settled,
            max_delay=batching,
            on_committed=self._acks_committed,
            activity=self.claimer.last_activity,
        )
        # Its thread starts with the first coroutine (an async def handler's,
        # or an async task's through the Tasks backend).
        self.loop = EventLoop(self.supervisor)
        self.runner = Runner(
            self.book,
            using=self.using,
            settler=acks,
            group_window=batching,
            settled=self._settled,
            database_failures=lambda: self._db_failures,
            died=self._executor_died,
            loop=self.loop,
        )
        waker = self.claimer.waker = Waker(
            self.using,
            self.queues,
            listen=config["NOTIFY"] and not self.burst,
            poll_interval=self.poll_interval,
        )
        errors = 0
        # Rounds in a row whose claim the database refused (dberrors.py).
        refused = 0
        refusal: BaseException | None = None
        # --burst: once nothing is held, one more claim of every lane (drained
        # or not) must find nothing before the worker exits.
        last_look = False
        gave_up = False
        # Until it ends, this run holds its name in this process (liveness).
        liveness.RUNNING_HERE.add(self.instance)
        try:
            # From here on, whatever fails is shut down in order (the finally).
            logger.info(
                "worker %s consuming %s (concurrency %s, batch %s%s)",
                self.name,
                ", ".join(self.queues),
                self.concurrency,
                "adaptive" if self.claimer.adaptive else self.claimer.batch_size,
                ", burst" if self.burst else f", {waker.how}",
            )
            self._log_wakeup(waker)
            acks.start(self.supervisor)
            # A thread per slot; an async lane's slots wait on its coroutines.
            self.runner.start(
                self.concurrency + sum(lane.cap for lane in self.book.lanes if lane.is_async)
            )
            self.maintenance.start()
            # Nothing is claimed before the name is this run's: the run that holds
            # a name hands back whatever runs under it that it does not hold.
            registered = False
            while not self.book.stopping:
                if not self.supervisor.check():
                    self.stop()
                    break
                # DEBUG's query log is per thread and per connection: each of
                # the worker's threads empties its own.
                if settings.DEBUG:
                    reset_queries()
                self.health.turned()
                try:
                    if not registered:
                        registered = self._register()
                        if not registered:
                            break
                    if self.metrics is not None:
                        guard.call("the metrics", self.metrics.loop, log=logger)
                    claimed = self.claimer.claim_round()
                    self.health.reached_database()
                    if errors:
                        logger.warning(
                            "database reachable again after %d failed attempt(s)", errors
                        )
                    errors = refused = 0
                    if claimed:
                        last_look = False
                        if not self.claimer.exhausted:
                            continue
                        # Every lane's claim came back short: the next round
                        # would claim nothing, so wait now (a poke or a
                        # notification ends the wait at once).
                    elif self.burst and self.book.idle() and not self.claimer.held_back():
                        # (Messages a limit holds back are due: --burst runs them too.)
                        if last_look:
                            break
                        acks.wait_idle()
                        last_look = True
                        self.claimer.undrain()
                        continue
                    last_look = False
                    self.claimer.idle_wait()
                except DB_ERRORS as exc:
                    # Lost connection, restarted server, failover: reconnect
                    # with a capped exponential backoff, and what it holds
                    # stays leased meanwhile; past DATABASE_OUTAGE_LIMIT (if
                    # set) stop instead, for the supervisor to restart. The
                    # database refusing the statement itself is no outage:
                    # STATEMENT_ERROR_LIMIT rounds in a row stop the worker.
                    errors += 1
                    refused = refused + 1 if is_statement_error(exc) else 0
                    if refused >= STATEMENT_ERROR_LIMIT:
                        refusal = exc
                        logger.error("the database refused the claim", exc_info=True)
                        connections[self.using].close()
                        self.stop()
                        break
                    self._database_error()
                    self.health.database_failed()
                    backoff = min(MAX_BACKOFF, 0.5 * 2 ** min(errors, 6))
                    if self.database_outage_limit is not None:
                        left = self.database_outage_limit - self.health.outage()
                        if left <= 0:
                            gave_up = True
                            self._give_up(errors)
                            break
                        backoff = min(backoff, left)
                    self.health.turned(pause=backoff)
                    logger.warning(
                        "database error while %s; reconnecting in %.1f s",
                        "claiming" if registered else "recording this worker's name",
                        backoff,
                        exc_info=True,
                    )
                    connections[self.using].close()
                    waker.wait(backoff)
        finally:
            try:
                self._shutdown(acks)
            finally:
                liveness.RUNNING_HERE.discard(self.instance)
            if self.metrics is not None:
                self.metrics.stop()
            if self.health_server is not None:
                self.health_server.stop()
        if self._name_taken is not None:
            raise self._name_taken
        if self.supervisor.fatal is not None:
            raise WorkerCrashed(f"the worker stopped: {self.supervisor.fatal}")
        if refusal is not None:
            raise WorkerCrashed(
                f"the worker stopped: the database refused its claim {refused} times in a row "
                f"({type(refusal).__name__}: {str(refusal).strip()}), an error of the "
                "statement, not a lost connection"
            )
        if gave_up:
            raise DatabaseUnreachable(
                f"the database stayed unreachable for over {self.database_outage_limit:g} s "
                "(DATABASE_OUTAGE_LIMIT)"
            )
        return self.stats

    def _give_up(self, errors: int) -> None:
        """Stop for good after the database stayed unreachable past the limit.

        Nothing can be acknowledged or released without the database: the
        shutdown tries, and what it cannot hand back returns to the queue
        when its lease expires (or sooner, when live workers see this one's
        heartbeat stop).
        """
        logger.error(
            "database unreachable for %.1f s (%d failed attempt(s)), over "
            "DATABASE_OUTAGE_LIMIT (%g s): stopping, exit status %d",
            self.health.outage(),
            errors,
            self.database_outage_limit,
            DatabaseUnreachable.exit_code,
        )
        self.stop()

    def _log_wakeup(self, waker: Waker) -> None:
        """Say how an idle worker learns of new messages, and what that costs."""
        if self.burst:
            return
        mode = waker.mode or polling(self.poll_interval, "DELAYQ['NOTIFY'] is False")
        logger.log(logging.WARNING if mode.degraded else logging.INFO, "%s", mode.line)

    # -- callbacks of the parts -----------------------------------------------

    def _database_error(self) -> None:
        self._db_failures += 1
        # A claim's commit may have lost its reply: rows claimed, never held.
        self.keeper.look_for_unheld()

    def _processed(self, item: InFlight, result: str, elapsed: float) -> None:
        if self.metrics is not None:
            guard.call(
                "the metrics", self.metrics.processed, item.row.queue, result, elapsed, log=logger
            )

    def _settled(self, done: Done) -> None:
        """Bookkeeping once outcomes are committed (or known to be lost)."""
        wake = self.book.settle(
            ((item, result) for item, result, _ in done), self._wants, when_idle=self.burst
        )
        if any(result in RESCHEDULED for _, result, _ in done):
            self.claimer.forget_next_due()
        moved_on = [
            item.row
            for item, result, _ in done
            if result in GROUP_DONE
            and (bool(getattr(item.row, "group", "")) or bool(released_children(item.row).released))
        ]
        if moved_on:
            # Recorded, and the next message of the group (or a workflow's next
            # steps) let go (execute.py): claim it now, with the slot it frees.
            # (A batched success lets a group go after its commit: the
            # acknowledgement buffer calls _acks_committed then.)
            wake = True
            self.claimer.something_due(told=all(released_children(row).told for row in moved_on))
        for item, result, elapsed in done:
            self._processed(item, result, elapsed)
        if wake and self.claimer.waker is not None:
            self.claimer.waker.poke()

    def _wants(self, lane: Lane) -> int:
        """How many queued messages ``lane`` should hold (0 if nothing is due there)."""
        return self.claimer.batch_for(lane) if self.claimer.wants(lane) else 0

    def _acks_committed(self, grouped: bool) -> None:
        """A batch of acknowledgements committed: a lane under a global cap may have room,
        and the next messages of the groups it finished are due."""
        capped = any(s.cap is not None for lane in self.book.lanes for s in lane.limits)
        if capped:
            self.claimer.acks_committed()
        if grouped:
            self.claimer.something_due()
        if (capped or grouped) and self.claimer.waker is not None:
            self.claimer.waker.poke()

    def _due_elsewhere(self) -> None:
        """Another thread let messages go (dead workers', ordered groups'): claim them now."""
        self.claimer.something_due()
        if self.claimer.waker is not None:
            self.claimer.waker.poke()

    def _register(self) -> bool:
        """Take this worker's name, and start the keeper that holds it; False if a
        live worker holds it (this one stops). A database error goes to the caller:
        the claim loop's backoff, and the next round tries again.

        A live worker under this name is waited for (its heartbeat's promise: a
        worker restarted at once after a kill), then the name is taken, or this
        worker stops if that one beat meanwhile.
        """
        try:
            self.keeper.register(wait=self._wait_for_name)
        except WorkerNameTaken as exc:
            self._name_taken = exc
            self.stop()
            return False
        self.health.beat()
        self.keeper.start()
        return True

    def _wait_for_name(self, seconds: float) -> bool:
        """Wait for another worker's hold on this name to lapse; False if stopped meanwhile."""
        logger.warning(
            "another worker named %s may be alive; waiting %.1f s for its heartbeat",
            self.name,
            seconds,
        )
        waker = self.claimer.waker
        deadline = time.monotonic() + seconds
        while not self.book.stopping and (left := deadline - time.monotonic()) > 0:
            if waker is not None:
                waker.wait(left, listen=False)
            else:
                time.sleep(min(left, 0.1))
        return not self.book.stopping

    def _lost_name(self, exc: WorkerNameTaken) -> None:
        """Another worker took this one's name (this one broke its heartbeat's promise,
        and its messages were handed back): stop, and say so."""
        logger.error("%s; this worker stops", exc)
        self._name_taken = exc
        self.stop()

    def _executor_died(self, thread: threading.Thread, error: BaseException) -> None:
        self.supervisor.died("executor", error, lambda: self.runner.replace(thread), thread=thread)

    # -- shutdown -------------------------------------------------------------

    def _release(self, items: list[InFlight], *, started: bool) -> int:
        by_claim: dict[tuple[object, type], list[int]] = {}
        for item in items:
            by_claim.setdefault((item.token, item.lane.model), []).append(item.row.pk)
        released = 0
        for (token, model), ids in by_claim.items():
            try:
                released += leases.release(
                    ids,
                    token,  # type: ignore[arg-type]
                    started=started,
                    using=self.using,
                    model=model,
                )
            except DB_ERRORS:
                logger.warning(
                    "could not release %d message(s); they wait for their lease",
                    len(ids),
                    exc_info=True,
                )
        if released:
            # The other workers take them now, not at their next poll.
            queues = {item.row.queue for item in items if item.lane.model is Message}
            try:
                groups.wake(queues, using=self.using)
            except DB_ERRORS:
                logger.warning("could not wake the other workers", exc_info=True)
        return released

    def _shutdown(self, acks: Settler) -> None:
        """Hand back what has not started, let the rest finish (the grace period), commit
        the outcomes handed over, hand back what is left, stop every thread.

        Every step runs whatever the one before it raised: a shutdown that
        failed half-way would leave threads and connections behind, and the
        worker's heartbeat promising a life it no longer has. The first error
        that is not the database's is raised again at the end (``run_delayq``
        then exits non-zero).
        """
        errors: list[BaseException] = []

        def step(what: str, function: Callable[[], object]) -> None:
            try:
                function()
            except DB_ERRORS:
                logger.warning("could not %s", what, exc_info=True)
            except BaseException as exc:
                logger.error("could not %s", what, exc_info=True)
                errors.append(exc)

        step("release the unstarted messages", self._release_unstarted)
        deadline = time.monotonic() + self.shutdown_grace
        step(
            "wait for the running handlers", lambda: self.runner.join(deadline, lambda: self._force)
        )
        # The outcomes handed over are committed before anything is handed
        # back: what waits for a locked row gets what is left of the grace
        # period (at least a second), its lease extended meanwhile.
        step(
            "commit the outcomes handed over",
            lambda: acks.close(timeout=max(1.0, deadline - time.monotonic())),
        )
        step("stop the event loop", self.loop.stop)
        step("release the messages still held", self._release_leftovers)
        step("stop the lease keeper", self.keeper.stop)
        step("stop the maintenance thread", self.maintenance.stop)
        step(
            "record this worker's stop",
            lambda: liveness.mark_stopped(self.name, using=self.using, instance=self.instance),
        )
        if self.claimer.waker is not None:
            step("close the wake-up connection", self.claimer.waker.close)
        step("close the database connections", connections.close_all)
        # Attempts, not messages: a message retried twice is three attempts.
        summary = ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items()))
        logger.info(
            "worker %s stopped; %s",
            self.name,
            f"attempts by outcome: {summary}" if summary else "nothing processed",
        )
        if errors:
            raise errors[0]

    def _release_unstarted(self) -> None:
        waiting = self.book.drain_queued()
        if waiting:
            count = self._release(waiting, started=False)
            logger.info("released %d claimed but unstarted message(s)", count)

    def _release_leftovers(self) -> None:
        leftover = self.book.drain()
        if leftover:
            count = self._release(leftover, started=True)
            logger.warning(
                "released %d message(s) still running (or not recorded) after the grace "
                "period; they will be redelivered",
                count,
            )
