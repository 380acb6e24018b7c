"""A worker's background threads, and the supervisor that keeps them all running.

The lease keeper and maintenance run beside the claim loop on threads of
their own, each with its own database connection (Django's connections are
per thread), so that neither ever holds up a claim. What they share is
here: a stop event that also paces the loop, DEBUG's query log emptied on
every turn (it is per thread and per connection), and the thread's
connections closed when it ends.

No thread of a worker may die unseen: a keeper that stopped would let every
lease lapse under a live worker, an acknowledgement thread that stopped
would leave every later success to run again. Every thread reports its
death to the :class:`Supervisor`, which the claim loop asks at every turn:
a dead thread is logged and replaced, and one that keeps dying (more than
``RESTARTS`` times in ``RESTART_WINDOW`` seconds) stops the worker, which
then exits with status 70 (``EX_SOFTWARE``) for its process manager to see.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connections, reset_queries

logger = logging.getLogger("django_delayq.worker")

#: What a lost or refused database connection raises: a ``DatabaseError`` or an
#: ``InterfaceError`` ("connection already closed"), which DB-API makes siblings,
#: not one the other's subclass. The worker reconnects after either.
DB_ERRORS = (DatabaseError, InterfaceError)

#: A part of the worker may die this many times in RESTART_WINDOW seconds and be
#: started again; once more, and the worker stops (``WorkerCrashed``).
RESTARTS = 3
RESTART_WINDOW = 60.0


@dataclass(frozen=True)
class Death:
    part: str  # "executor", "keeper", "maintenance", "acks", ...
    thread: threading.Thread | None
    error: BaseException
    restart: Callable[[], None]


class Supervisor:
    """Collects the deaths of a worker's threads; the claim loop handles them."""

    def __init__(self, poke: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._deaths: list[Death] = []
        self._history: dict[str, deque[float]] = defaultdict(deque)
        self.poke = poke
        #: Set once a part died too often: why the worker stopped.
        self.fatal: str | None = None

    def died(
        self,
        part: str,
        error: BaseException,
        restart: Callable[[], None],
        thread: threading.Thread | None = None,
    ) -> None:
        """Called by a dying thread (any thread); ``restart`` replaces it."""
        logger.critical(
            "the worker's %s thread %s died: %s: %s",
            part,
            (thread or threading.current_thread()).name,
            type(error).__name__,
            error,
            exc_info=(type(error), error, error.__traceback__),
        )
        with self._lock:
            self._deaths.append(Death(part, thread or threading.current_thread(), error, restart))
        self.poke()

    def check(self) -> bool:
        """Replace the threads that died since the last call; False once one died too often
        (the worker must stop)."""
        with self._lock:
            deaths, self._deaths = self._deaths, []
        now = time.monotonic()
        for death in deaths:
            history = self._history[death.part]
            history.append(now)
            while history and history[0] < now - RESTART_WINDOW:
                history.popleft()
            if len(history) > RESTARTS:
                self.fatal = (
                    f"its {death.part} thread died {len(history)} times in "
                    f"{RESTART_WINDOW:.0f} s (last: {type(death.error).__name__}: {death.error})"
                )
                logger.critical("stopping the worker: %s", self.fatal)
                return False
            logger.warning("starting the worker's %s thread again", death.part)
            death.restart()
        return self.fatal is None


class Background:
    """Runs ``step`` after each wait of ``pause()`` seconds, on a daemon thread ``name``.

    Whatever escapes ``step`` ends the thread and is reported to ``supervisor``
    (as ``part``), which starts it again (:meth:`restart`).
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], None],
        pause: Callable[[], float],
        *,
        part: str = "",
        supervisor: Supervisor | None = None,
    ) -> None:
        self.name = name
        self.part = part or name
        self.supervisor = supervisor
        self._step = step
        self._pause = pause
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def restart(self) -> None:
        """Start a new thread in place of one that died (its state is this object's)."""
        if self._stop.is_set():
            return
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current step; wait up to ``timeout`` for it to end."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._pause()):
                if settings.DEBUG:
                    reset_queries()
                self._step()
        except BaseException as exc:
            if self.supervisor is None:
                raise
            self.supervisor.died(self.part, exc, self.restart)
        finally:
            connections.close_all()
