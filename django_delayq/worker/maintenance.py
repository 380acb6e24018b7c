"""Maintenance a worker does beside consuming: pruning, cron ticks, dead workers.

Every task runs once when the worker starts (a ``--burst`` worker's before
its first claim), then on its own interval, on a thread of its own (with its
own connection),
so a prune or a sweep never holds up a claim: on the claim loop, the sweeps
every ``HEARTBEAT_INTERVAL`` made every message that arrived meanwhile start
5-10 ms late. None may stop the worker from consuming: a failing task is
logged as a maintenance error (with its connection dropped if the database
failed) and tried again at its next turn.

* Pruning deletes expired finished messages every ``PRUNE_INTERVAL``, a few
  batches at a time; a round that hit its cap is followed by another after
  ``PRUNE_CATCH_UP`` rather than a whole interval, so pruning keeps pace with
  any steady rate of messages while no single round blocks claiming for long.
* Every worker installs the next ticks of every cron schedule every
  ``CRON_INSTALL_INTERVAL``; duplicates are impossible (``cron/install.py``).
* Every ``HEARTBEAT_INTERVAL``, the running messages of workers whose
  heartbeat stopped are handed back (``liveness.release_dead``), so they are
  redelivered within seconds rather than at the end of their leases; and
  every ordered group whose next message is held although nothing before it
  is left (a worker died between an outcome and letting its group go, or a
  failed message was pruned) goes on (``groups.release_groups``), and every
  workflow step whose parents have all finished is released (or cancelled)
  although no worker did it after the parent's outcome
  (``dependencies.settle``).
* Every ``POLL_INTERVAL``, it looks for rows the claim loop could take
  below where its claims begin (``worker/floors.py``), and has them claimed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from django_delayq import guard, liveness, retention
from django_delayq.conf import get_config, to_timedelta
from django_delayq.cron import install
from django_delayq.store import dependencies, groups
from django_delayq.worker.background import DB_ERRORS, Background, Supervisor
from django_delayq.worker.inflight import Book

logger = logging.getLogger("django_delayq.worker")

# Pruning: batches per round, and the pause before the next round when a
# round found more to delete than that.
PRUNE_BATCHES = 10
PRUNE_CATCH_UP = 1.0


@dataclass
class _Task:
    name: str
    interval: float
    run: Callable[[], float | None]  # returns how long until the next run, if not interval
    # The first run is due at once, however briefly the host has been up.
    due: float = float("-inf")


class Maintenance:
    def __init__(
        self,
        book: Book,
        *,
        name: str,
        using: str,
        burst: bool,
        on_due: Callable[[], None] = lambda: None,
        supervisor: Supervisor | None = None,
        below_floors: Callable[[], bool] | None = None,
        poll_interval: float = 5.0,
    ) -> None:
        self.book = book
        self.name = name
        self.using = using
        self.burst = burst
        # Messages this thread let go are due now: the claimer is told (on
        # PostgreSQL a NOTIFY tells the other workers).
        self._on_due = on_due
        self._background = Background(
            "delayq-maintenance",
            self.run_due,
            self._until_next,
            part="maintenance",
            supervisor=supervisor,
        )
        config = get_config()
        self.tasks: list[_Task] = []
        if config["PRUNE_INTERVAL"] is not None and not burst:
            interval = to_timedelta(config["PRUNE_INTERVAL"]).total_seconds()
            self.tasks.append(_Task("prune finished messages", interval, self.prune))
        self.tasks.append(
            _Task(
                "install cron ticks",
                to_timedelta(config["CRON_INSTALL_INTERVAL"]).total_seconds(),
                self.install_schedules,
            )
        )
        self.tasks.append(
            _Task(
                "release the messages of dead workers",
                to_timedelta(config["HEARTBEAT_INTERVAL"]).total_seconds(),
                self.release_dead,
            )
        )
        self.tasks.append(
            _Task(
                "forget workers gone for a day",
                liveness.FORGET_INTERVAL.total_seconds(),
                self.forget_gone,
            )
        )
        self.tasks.append(
            _Task(
                "let ordered groups go on",
                to_timedelta(config["HEARTBEAT_INTERVAL"]).total_seconds(),
                self.release_groups,
            )
        )
        self.tasks.append(
            _Task(
                "let workflows go on",
                to_timedelta(config["HEARTBEAT_INTERVAL"]).total_seconds(),
                self.release_children,
            )
        )
        self._below_floors = below_floors
        if below_floors is not None and not burst:
            self.tasks.append(
                _Task("look below the claims' floors", poll_interval, self.look_below_floors)
            )

    def start(self) -> None:
        """Go on on a thread of its own; a ``--burst`` worker's first round is the caller's.

        A one-shot worker must see its cron ticks installed and the messages
        of dead workers let go before its first claim (its last claim may
        come right after it). A serving worker claims at once while its
        thread runs the first round (10 ms of its start-up): what that round
        installs announces itself (NOTIFY) and what it lets go is claimed
        through ``on_due``.
        """
        if self.burst:
            self.run_due()
        self._background.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._background.stop(timeout)

    @property
    def thread(self) -> threading.Thread:
        return self._background.thread

    def _until_next(self) -> float:
        return max(0.0, min(task.due for task in self.tasks) - time.monotonic())

    def run_due(self) -> None:
        """Run every task whose turn has come; a failure waits for the task's next turn."""
        for task in self.tasks:
            now = time.monotonic()
            if now < task.due:
                continue
            task.due = now + task.interval
            try:
                sooner = task.run()
            except BaseException as exc:
                # Not only Exceptions: cron installs and the sweeps call the
                # project's code (a schedule's callable, receivers).
                if guard.interrupts(exc):
                    raise
                logger.warning(
                    "maintenance error (%s); trying again in %.0f s",
                    task.name,
                    task.interval,
                    exc_info=True,
                )
                if isinstance(exc, DB_ERRORS):
                    connections[self.using].close()
                continue
            if sooner is not None:
                task.due = time.monotonic() + sooner

    def prune(self) -> float | None:
        deleted = retention.prune(max_batches=PRUNE_BATCHES, using=self.using)
        if deleted:
            logger.info("pruned %d finished message(s)", deleted)
        if deleted >= PRUNE_BATCHES * int(get_config()["PRUNE_BATCH_SIZE"]):
            return PRUNE_CATCH_UP
        return None

    def install_schedules(self) -> None:
        install.install_schedules(using=self.using)

    def release_groups(self) -> None:
        released = groups.release_groups(using=self.using)
        if released:
            logger.info("let %d ordered group(s) go on past a finished message", released)
            self._on_due()

    def release_children(self) -> None:
        settled = dependencies.settle(using=self.using, skip_locked=True)
        if settled:
            logger.info(
                "workflows: %d message(s) released, %d cancelled after their parents finished",
                len(settled.released),
                len(settled.cancelled),
            )
            self._on_due()

    def look_below_floors(self) -> None:
        # A row no notification told of, below where the claims begin
        # (worker/floors.py): found within a poll interval, as by a poll.
        if self._below_floors is not None and self._below_floors():
            self._on_due()

    def forget_gone(self) -> None:
        liveness.forget_gone(using=self.using)

    def release_dead(self) -> None:
        # The tables this worker's lanes claim from: a QueueFields model's rows too.
        models = [lane.model for lane in self.book.lanes]
        released = sum(liveness.release_dead(self.name, using=self.using, models=models).values())
        if released:
            self.book.count("released_from_dead", released)
            self._on_due()
