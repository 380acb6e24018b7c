"""How an idle worker waits: LISTEN/NOTIFY on PostgreSQL, a local socket on SQLite
(``store/localwake.py``), a timed sleep elsewhere.

Either way the sleep ends at the earliest of: a notification, a poke from
inside the process (a handler slot freed, a shutdown signal), the next known
due time, or the poll interval, so delayed messages run on time without the
worker hammering the database.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import select
import time
from datetime import datetime
from typing import Any

from django.db import connections

from django_delayq import clock
from django_delayq.store import localwake
from django_delayq.store.features import features
from django_delayq.worker.listen import Mode, open_listener, relisten

logger = logging.getLogger("django_delayq.worker")

# After the LISTEN connection is lost (server restart, terminated backend),
# reopening it is tried at most this often; the worker polls meanwhile.
RELISTEN_INTERVAL = 5.0

# Most due times to come a worker keeps from notifications (Waker.later).
MAX_LATER = 1024


class Waker:
    """The idle worker's sleep; ``mode`` says how it wakes (the start-up line).

    ``listen``: whether to LISTEN at all (not with ``--burst`` or
    ``NOTIFY = False``); where, and whether it works, is
    :func:`~django_delayq.worker.listen.open_listener`'s business.
    """

    def __init__(
        self, using: str, queues: list[str], listen: bool, poll_interval: float = 5.0
    ) -> None:
        self.queues = set(queues)
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._listener: Any = None
        # The earliest due time notified during the last wait.
        self.hint: datetime | None = None
        # The due times notified that had not come when heard, earliest first
        # (a heap): see later().
        self._later: list[tuple[datetime, str]] = []
        # The queues notified since the last wait began (with a due time), and
        # how many notifications for this worker's queues that wait read.
        self.notified: set[str] = set()
        self.heard = 0
        # The earliest due time notified per queue since take_dues last ran.
        self._dues: dict[str, datetime] = {}
        # LISTEN connections opened so far: notifications may have been
        # missed between two (worker/floors.py).
        self.listens = 0
        self._using = using
        self._lost_at: float | None = None
        self.mode: Mode | None = None
        self._local: localwake.Receiver | None = None
        if listen and features(connections[using]).local_wake:
            self.mode = self._open_local(using, poll_interval)
        elif listen:
            self._listener, self.mode = open_listener(using, poll_interval)
            self.listens += self._listener is not None

    def _open_local(self, using: str, poll_interval: float) -> Mode:
        where = localwake.directory(connections[using])
        if where is None:
            return Mode(False, f"wake-up: polling every {poll_interval:g} s: an in-memory database")
        try:
            self._local = localwake.Receiver(where)
        except OSError as exc:
            return Mode(
                False,
                f"wake-up: polling every {poll_interval:g} s: no local socket in {where}: {exc}",
                degraded=True,
            )
        return Mode(
            True,
            f"wake-up: local socket {self._local.path} (pickup within milliseconds of a "
            f"commit on this machine; polling every {poll_interval:g} s for other writers)",
        )

    @property
    def listening(self) -> bool:
        return self._listener is not None or self._local is not None

    @property
    def hears_due(self) -> bool:
        """Whether every message written through the database is notified here with
        its due time (a LISTEN; not local wake-ups, which hear this host's only)."""
        return self._listener is not None

    def take_dues(self) -> dict[str, datetime]:
        """The earliest due time notified for each queue since the last call."""
        dues, self._dues = self._dues, {}
        return dues

    @property
    def how(self) -> str:
        """How it wakes, in the worker's start-up line."""
        if self._listener is not None:
            return "LISTEN/NOTIFY"
        return "local wake-ups" if self._local is not None else "polling"

    def poke(self) -> None:
        """Wake the waiting thread (safe from threads and signal handlers)."""
        try:
            os.write(self._write_fd, b"x")
        except (BlockingIOError, OSError):
            pass

    def _maybe_relisten(self) -> None:
        if self._lost_at is None or time.monotonic() - self._lost_at < RELISTEN_INTERVAL:
            return
        try:
            self._listener = relisten(self._using)
        except Exception:
            logger.warning("LISTEN failed; polling meanwhile", exc_info=True)
            self._lost_at = time.monotonic()
        else:
            self._lost_at = None
            self.listens += 1
            logger.warning("LISTEN connection restored")

    def wait(self, timeout: float, *, listen: bool = True) -> bool:
        """Sleep up to ``timeout`` seconds; True if the whole timeout passed.

        A notification (recorded in ``notified`` and ``hint``) or a poke
        ends it early. With ``listen=False`` only a poke does: the
        notifications that arrive meanwhile are read once, at the end (a
        worker collecting a steady stream's messages for one claim wakes
        once, not once per message).
        """
        self._maybe_relisten()
        self.notified = set()
        self.heard = 0
        self.hint = None
        fds = [self._read_fd]
        if self._listener is not None and listen:
            fds.append(self._listener.fileno())
        if self._local is not None and listen:
            fds.append(self._local.fileno())
        ready: list[int] = []
        if timeout > 0:
            try:
                ready = select.select(fds, [], [], timeout)[0]
            except (OSError, ValueError):
                pass
        if self._read_fd in ready:
            try:
                while os.read(self._read_fd, 4096):
                    pass
            except (BlockingIOError, OSError):
                pass
        if self._listener is not None and (
            timeout <= 0 or not listen or self._listener.fileno() in ready
        ):
            self._drain_notifications()
        if self._local is not None and (
            timeout <= 0 or not listen or self._local.fileno() in ready
        ):
            for body in self._local.drain():
                self._note(body)
        return timeout > 0 and not ready and not self.notified

    def _drain_notifications(self) -> None:
        """Read the notifications that have arrived, without waiting for more.

        Straight from the libpq connection (``consume_input``, then each
        ``PGnotify``): psycopg's ``notifies(timeout=0)`` waits on the socket
        once more and ends on a timeout, about as much CPU again as the rest
        of a wake-up, paid for every message of a steady stream. (Nothing is
        sent on this connection after its LISTEN, so no notification waits in
        psycopg's own backlog; what arrived before the first claim, that
        claim takes.)
        """
        if self._listener is None:
            return
        try:
            pgconn = self._listener.pgconn
            pgconn.consume_input()
            while (note := pgconn.notifies()) is not None:
                self._note(note.extra)
        except Exception:
            logger.warning("LISTEN connection lost; polling until it is restored", exc_info=True)
            self._close_listener()
            self._lost_at = time.monotonic()

    def later(self, now: datetime, skip: frozenset[str] = frozenset()) -> datetime | None:
        """The earliest due time notified that has not come yet, but of ``skip``'s queues
        (those that came are forgotten: the claim after the wake-up they caused
        took them).

        ``hint`` is only the earliest due time of the last wait's
        notifications, which the claim after it answers; a delayed message
        notified beside a due one (in the same wait, or while the worker
        slept until it) would otherwise be found only by the next read of the
        next due time, up to ``POLL_INTERVAL`` late, or later under a steady
        stream, where that read finds a message due now.
        """
        while self._later and self._later[0][0] <= now:
            heapq.heappop(self._later)
        if not skip:
            return self._later[0][0] if self._later else None
        return min((due for due, queue in self._later if queue not in skip), default=None)

    def _note(self, payload: bytes) -> None:
        try:
            body = json.loads(payload)
            if body.get("queue") not in self.queues:
                return
            now = clock.now()
            due = datetime.fromtimestamp(float(body["due"]), tz=now.tzinfo)
        except (ValueError, TypeError, KeyError):
            return
        self.notified.add(body["queue"])
        self.heard += 1
        if self.hint is None or due < self.hint:
            self.hint = due
        earliest = self._dues.get(body["queue"])
        if earliest is None or due < earliest:
            self._dues[body["queue"]] = due
        if due > now:
            heapq.heappush(self._later, (due, body["queue"]))
            if len(self._later) > MAX_LATER:
                # The latest go: the next due time's read finds them in time.
                self._later = heapq.nsmallest(MAX_LATER // 2, self._later)

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception:
                pass
            self._listener = None

    def close(self) -> None:
        self._close_listener()
        if self._local is not None:
            self._local.close()
            self._local = None
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
