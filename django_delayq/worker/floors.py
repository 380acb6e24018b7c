"""Where each lane's claims begin: its floor, a due time no row it could claim lies below.

Why: a claim reads the claim index of its queue from its first due entry
on. Every message claimed and finished leaves entries there (its pending
version's, then, once its lease time has passed, its running version's)
which point at dead rows. Vacuum removes them, but not while any
transaction holds PostgreSQL's vacuum horizon (one left idle in a
transaction, a long report, a replica's feedback): then every claim visits
the row of each entry left since, and a ten-minute hold at 100 messages a
second made the claim visit 120,000 of them (pickup p99 155 ms, and 423 ms
beside four readers). A claim given a floor (``claim(since=...)``) starts
its index scan there instead, past them.

A lane's floor rises after a claim that came back short: every row due up
to the claim's time that it could see and take, it took. It rises to that
time less ``GRACE``. A row that claim could not see (its producer's
transaction had not committed) or take (another transaction held its lock;
its ordered group held it back; a live worker's lease on it had lapsed) may
later lie below the floor, and is brought back so:

* a notification (the NOTIFY of every enqueue, retry and release) lowers the
  floors of its queue's lanes to its due time;
* what makes the worker claim everywhere (``something_due``: a group's next
  message, a workflow's next steps, a dead worker's messages let go), a
  change of the paused queues, a wait of the whole poll interval, and a
  LISTEN lost or restored drop every floor: the next claims start at the
  beginning;
* the rest (a row lock released, a group let go by another worker, a row
  written with no NOTIFY) the maintenance thread finds by looking below the
  floors every poll interval (:meth:`Floors.below`), which drops them.

Floors are kept only while notifications are heard (a LISTEN on
PostgreSQL) and only for the message table's lanes without global limits:
elsewhere every claim starts at the beginning, as it always did.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django_delayq.models import Message
from django_delayq.store import claim
from django_delayq.worker.inflight import Lane

#: How far below its claim's time a floor stays: a row written with no
#: NOTIFY (a project's own SQL, a producer with ``NOTIFY`` off) whose
#: transaction commits within it is still claimed at once.
GRACE = timedelta(seconds=1)

#: How far below a notification's due time the floors go. The due time
#: travels as a float of seconds, which may round a microsecond up, and
#: some writers stamp the row with the database's clock but notify with
#: their host's (a release, a group let go): a host a little ahead would
#: otherwise lower the floor to just above the row. A second more of the
#: index costs a claim next to nothing.
NOTIFY_SLACK = timedelta(seconds=1)


def floored(lane: Lane) -> bool:
    """Whether ``lane``'s claims may begin at a floor."""
    return lane.model is Message and not lane.limits


class Floors:
    """The floors of a worker's lanes, by lane (identity)."""

    def __init__(self, lanes: Iterable[Lane]) -> None:
        lanes = list(lanes)
        self._lanes = [lane for lane in lanes if floored(lane)]
        # The message table's lanes that begin at the beginning (global limits).
        self._unfloored = any(lane.model is Message and not floored(lane) for lane in lanes)
        self._floors: dict[int, datetime] = {}
        # Drops so far: a claim that began before a drop raises no floor.
        self._drops = 0
        # Whether notifications are heard, so that floors may be kept (keep).
        self._kept = False
        # Written by the claim loop, read by the maintenance thread.
        self._lock = threading.Lock()

    def keep(self, kept: bool) -> None:
        """Keep floors (every notification is heard), or none from now on.

        Called at every round: only the change from kept to not kept drops
        the floors (a polling worker has none to drop, round after round).
        """
        was, self._kept = self._kept, kept
        if was and not kept:
            self.drop()

    @property
    def any_lane(self) -> bool:
        """Whether some lane may keep a floor (else there is nothing to look below)."""
        return bool(self._lanes)

    def start(self, lane: Lane) -> tuple[datetime | None, int]:
        """Where a claim of ``lane`` begins (None: at the beginning), and the ticket
        it gives :meth:`claimed`."""
        with self._lock:
            return self._floors.get(id(lane)), self._drops

    def lowest(self) -> datetime | None:
        """The lowest floor, or None if a lane of the message table has none (the idle
        worker's read of the next due time begins there)."""
        floors = [self._floors.get(id(lane)) for lane in self._lanes]
        if self._unfloored or not floors or None in floors:
            return None
        return min(f for f in floors if f is not None)

    def claimed(self, lane: Lane, rows: list[Any], limit: int, ticket: int) -> None:
        """A claim of ``lane`` (begun with ``ticket``) took ``rows`` of the ``limit`` it
        asked for.

        Not after a drop made while it ran: the row the maintenance thread
        found below the floor may be one that claim began above.
        """
        if not self._kept or not rows or len(rows) >= limit or not floored(lane):
            return  # nothing says where the due rows end
        # The claim's own time, the database's: it wrote it into every row.
        at = min(row.last_attempt_time for row in rows) - GRACE
        with self._lock:
            if ticket != self._drops:
                return
            floor = self._floors.get(id(lane))
            if floor is None or at > floor:
                self._floors[id(lane)] = at

    def heard(self, dues: Mapping[str, datetime]) -> None:
        """Notifications told of messages of these queues due at these times."""
        if not dues:
            return
        with self._lock:
            for lane in self._lanes:
                floor = self._floors.get(id(lane))
                if floor is None:
                    continue
                due = min((dues[q] for q in lane.queues if q in dues), default=None)
                if due is not None and due - NOTIFY_SLACK < floor:
                    self._floors[id(lane)] = due - NOTIFY_SLACK

    def drop(self) -> None:
        """Every lane's next claim begins at the beginning."""
        with self._lock:
            self._floors.clear()
            self._drops += 1

    def below(
        self,
        using: str,
        active: Callable[[Lane], list[str]],
        *,
        dead_after: timedelta | None = None,
    ) -> bool:
        """Whether a row some lane could claim now lies below its floor (the floors are
        then dropped). ``active``: a lane's queues that are not paused.

        Run by the maintenance thread: under a held vacuum horizon this read
        visits every dead entry below the floors, as claims used to, but off
        the claim loop and once per poll interval.
        """
        with self._lock:
            floors = [(lane, self._floors.get(id(lane))) for lane in self._lanes]
        for lane, floor in floors:
            queues = active(lane)
            if floor is None or not queues:
                continue
            if claim.claimable_below(
                queues, floor, using=using, kinds=lane.kinds, dead_after=dead_after
            ):
                self.drop()
                return True
        return False


__all__ = ["GRACE", "NOTIFY_SLACK", "Floors", "floored"]
