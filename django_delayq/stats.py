"""Per-queue figures for ``delayq_status`` and the admin dashboard.

Both read only what an index bounds, never the whole table: the live
messages (the partial indexes of pending and running rows), the failed ones
still kept (``delayq_failed_idx``), and what finished in a recent window
(``delayq_finished_idx``). ``queue_stats`` (the command) once counted every
status over the whole table, every succeeded message retention keeps
included: 0.9 s on an empty installation and 4.2 s beside ten million
finished messages (``benchmarks/history.py``).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.queues import paused_queues
from django_delayq.registry import registry
from django_delayq.routers import queue_alias
from django_delayq.store.queries import FINISHED_WINDOWS, estimated_count, minute

S = Message.Status


@dataclass(frozen=True)
class QueueStats:
    """One queue's row of ``delayq_status``."""

    queue: str
    due: int
    scheduled: int
    #: Running under a live lease (one whose lease ran out counts as due).
    running: int
    retrying: int
    #: Workflow steps waiting for their parents (``enqueue(..., after=)``).
    waiting: int
    #: Failed messages still kept, counted up to ``FAILED_CAP``.
    failed: int
    #: Succeeded, and cancelled, in the last hour (``WINDOW_LONG``).
    succeeded: int
    cancelled: int
    oldest_due: datetime | None
    now: datetime
    #: More failed messages are kept than ``failed``.
    failed_more: bool = False

    @property
    def lag(self) -> timedelta:
        """How long the oldest due message has been waiting."""
        return self.now - self.oldest_due if self.oldest_due else timedelta(0)


def queue_stats(queues: list[str] | None = None, using: str | None = None) -> list[QueueStats]:
    """Every queue with a live message, a failed one kept, or one finished in the last
    hour, by name."""
    now = clock.now()
    rows = Message.objects.using(queue_alias(using, read=True)).in_queues(queues)
    return [
        QueueStats(
            queue=f.queue,
            due=f.due,
            scheduled=f.scheduled,
            running=f.leased,
            retrying=f.retrying,
            waiting=f.waiting,
            failed=f.failed,
            failed_more=f.failed_more,
            succeeded=f.succeeded_long,
            cancelled=f.cancelled_long,
            oldest_due=f.oldest_due,
            now=now,
        )
        for f in _figures(rows, now, failed_cap=FAILED_CAP)
    ]


# -- the admin dashboard --------------------------------------------------------
#
# The dashboard must stay fast on a table of millions of rows, so nothing here
# counts the whole table: active counts read only pending/running rows (the
# partial indexes), failed counts read the failed rows (delayq_finished_idx),
# and finished counts are bounded to recent windows (delayq_finished_idx range
# scans on finished_at). All-time succeeded/cancelled totals are left out; the
# table's size is the planner's estimate where the database keeps one.
# Counting a column of the index at hand (``status``, ``queue``), not ``id``,
# lets PostgreSQL answer from the index alone (an index-only scan).

WINDOW_SHORT = timedelta(minutes=5)
WINDOW_LONG = timedelta(hours=1)
#: The dashboard and ``delayq_status`` count each queue's failed messages up to
#: this many ("10,000+"): a week of failures kept is hundreds of thousands.
FAILED_CAP = 10_000


@dataclass(frozen=True)
class QueueFigures:
    queue: str
    now: datetime
    pending: int = 0
    running: int = 0
    due: int = 0
    scheduled: int = 0
    retrying: int = 0
    leased: int = 0
    waiting: int = 0
    failed: int = 0
    #: More failed messages are kept than ``failed`` (counted up to ``FAILED_CAP``).
    failed_more: bool = False
    oldest_due: datetime | None = None
    succeeded_short: int = 0
    failed_short: int = 0
    succeeded_long: int = 0
    failed_long: int = 0
    cancelled_long: int = 0
    paused: bool = False

    @property
    def lag(self) -> timedelta:
        """How long the oldest due message has been waiting."""
        return self.now - self.oldest_due if self.oldest_due else timedelta(0)

    @property
    def failure_rate(self) -> float | None:
        """Failed share of the messages that finished in the last hour (None: none did)."""
        finished = self.succeeded_long + self.failed_long
        return self.failed_long / finished if finished else None


@dataclass(frozen=True)
class ThroughputPoint:
    minute: datetime
    succeeded: int
    failed: int

    @property
    def total(self) -> int:
        return self.succeeded + self.failed


@dataclass(frozen=True)
class Dashboard:
    now: datetime
    queues: list[QueueFigures]
    totals: QueueFigures
    throughput: list[ThroughputPoint]
    estimated_rows: int | None


_ACTIVE_FIELDS = ("pending", "running", "due", "scheduled", "retrying", "leased")


def throughput(
    queues: list[str] | None = None,
    *,
    now: datetime | None = None,
    window: timedelta = WINDOW_LONG,
    using: str | None = None,
) -> list[ThroughputPoint]:
    """Messages finished per minute over ``window``, oldest first, gaps as zeros."""
    alias = queue_alias(using, read=True)
    now = now or clock.now()
    first = minute(now - window) + timedelta(minutes=1)
    counts = Message.objects.using(alias).in_queues(queues).finished_per_minute(first)
    points = []
    at = first
    while at <= now:
        points.append(
            ThroughputPoint(at, counts.get((at, S.SUCCEEDED), 0), counts.get((at, S.FAILED), 0))
        )
        at += timedelta(minutes=1)
    return points


def dashboard(queues: list[str] | None = None, using: str | None = None) -> Dashboard:
    """Everything the admin dashboard shows, in five indexed queries."""
    alias = queue_alias(using, read=True)
    now = clock.now()
    rows = Message.objects.using(alias).in_queues(queues)
    paused = paused_queues(queues, using=alias)
    shown = paused | (set(registry.queues()) if queues is None else set(queues))
    figures = _figures(rows, now, shown, paused, failed_cap=FAILED_CAP)
    return Dashboard(
        now=now,
        queues=figures,
        totals=_totals(figures, now),
        throughput=throughput(queues, now=now, using=alias),
        estimated_rows=estimated_count(alias),
    )


def _figures(
    rows: Any,
    now: datetime,
    shown: AbstractSet[str] = frozenset(),
    paused: AbstractSet[str] = frozenset(),
    *,
    failed_cap: int | None = None,
) -> list[QueueFigures]:
    """Each queue's figures, by name, from indexed queries only: every queue with a live
    message, a failed one kept or one finished in the last hour, and ``shown``;
    failed ones counted up to ``failed_cap`` (None: all)."""
    active = rows.depth_by_queue(now)
    failed = rows.failed_by_queue(failed_cap)
    more = set()
    if failed_cap is not None:
        more = {q for q, n in failed.items() if n > failed_cap}
        failed = {q: min(n, failed_cap) for q, n in failed.items()}
    waiting = rows.waiting_by_queue()
    windows = rows.finished_by_queue(now - WINDOW_LONG, now - WINDOW_SHORT)
    names = set(active) | set(failed) | set(windows) | set(shown)
    return [
        QueueFigures(
            queue=name,
            now=now,
            failed=failed.get(name, 0),
            failed_more=name in more,
            waiting=waiting.get(name, 0),
            paused=name in paused,
            **active.get(name, {}),
            **windows.get(name, {}),
        )
        for name in sorted(names)
    ]


def _totals(figures: list[QueueFigures], now: datetime) -> QueueFigures:
    sums = {
        name: sum(getattr(f, name) for f in figures)
        for name in (*_ACTIVE_FIELDS, "failed", "waiting", *FINISHED_WINDOWS)
    }
    dues = [f.oldest_due for f in figures if f.oldest_due is not None]
    return QueueFigures(
        queue="",
        now=now,
        oldest_due=min(dues) if dues else None,
        failed_more=any(f.failed_more for f in figures),
        **sums,
    )
