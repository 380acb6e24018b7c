"""Per-queue figures for ``delayq_status`` and the admin dashboard.

``queue_stats`` (the command) is one grouped aggregate over the whole table,
so its figures are consistent with each other; ``dashboard`` (the admin
page) is a handful of indexed queries that never count the whole table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import router
from django.db.models import Count, Min, Q
from django.db.models.functions import TruncMinute

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.queues import paused_queues
from django_delayq.registry import registry
from django_delayq.search import estimated_count

S = Message.Status


@dataclass(frozen=True)
class QueueStats:
    queue: str
    due: int
    scheduled: int
    running: int
    retrying: int
    failed: int
    succeeded: int
    cancelled: int
    oldest_due: datetime | None
    now: datetime

    @property
    def lag(self) -> timedelta:
        """How long the oldest due message has been waiting."""
        return self.now - self.oldest_due if self.oldest_due else timedelta(0)


def queue_stats(queues: list[str] | None = None, using: str | None = None) -> list[QueueStats]:
    now = clock.now()
    active = Q(status__in=Message.ACTIVE_STATUSES)
    due = active & Q(next_attempt_time__lte=now)
    future = Q(next_attempt_time__gt=now)
    rows = (
        Message.objects.using(using or router.db_for_read(Message))
        .in_queues(queues)
        .values("queue")
        .order_by("queue")
        .annotate(
            due=Count("id", filter=due),
            scheduled=Count("id", filter=Q(status=S.PENDING, attempt_count=0) & future),
            retrying=Count("id", filter=Q(status=S.PENDING, attempt_count__gt=0) & future),
            running=Count("id", filter=Q(status=S.RUNNING) & future),
            failed=Count("id", filter=Q(status=S.FAILED)),
            succeeded=Count("id", filter=Q(status=S.SUCCEEDED)),
            cancelled=Count("id", filter=Q(status=S.CANCELLED)),
            oldest_due=Min("next_attempt_time", filter=due),
        )
    )
    return [QueueStats(now=now, **row) for row in rows]


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
    failed: int = 0
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
_WINDOW_FIELDS = (
    "succeeded_short",
    "failed_short",
    "succeeded_long",
    "failed_long",
    "cancelled_long",
)


def active_figures(
    queues: list[str] | None, now: datetime, using: str
) -> dict[str, dict[str, Any]]:
    """Per queue: pending/running counts, split by due time, and the oldest due time.

    Filtering on the active statuses first lets the database read only the
    rows of the partial indexes, however many finished rows the table holds.
    """
    due = Q(next_attempt_time__lte=now)
    future = Q(next_attempt_time__gt=now)
    rows = (
        Message.objects.using(using)
        .active()
        .in_queues(queues)
        .values("queue")
        .order_by()
        .annotate(
            pending=Count("status", filter=Q(status=S.PENDING)),
            running=Count("status", filter=Q(status=S.RUNNING)),
            due=Count("status", filter=due),
            scheduled=Count("status", filter=Q(status=S.PENDING, attempt_count=0) & future),
            retrying=Count("status", filter=Q(status=S.PENDING, attempt_count__gt=0) & future),
            leased=Count("status", filter=Q(status=S.RUNNING) & future),
            oldest_due=Min("next_attempt_time", filter=due),
        )
    )
    return {row["queue"]: _without_queue(row) for row in rows}


def failed_counts(queues: list[str] | None, using: str) -> dict[str, int]:
    """Failed messages still kept, per queue (what triage has to look at)."""
    rows = (
        Message.objects.using(using)
        .filter(status=S.FAILED)
        .in_queues(queues)
        .values("queue")
        .order_by()
        .annotate(n=Count("queue"))
    )
    return {row["queue"]: row["n"] for row in rows}


def window_figures(
    queues: list[str] | None, now: datetime, using: str
) -> dict[str, dict[str, Any]]:
    """Per queue: messages finished in the last 5 minutes and the last hour."""
    short = Q(finished_at__gte=now - WINDOW_SHORT)
    rows = (
        Message.objects.using(using)
        .finished()
        .filter(finished_at__gte=now - WINDOW_LONG)
        .in_queues(queues)
        .values("queue")
        .order_by()
        .annotate(
            succeeded_short=Count("status", filter=Q(status=S.SUCCEEDED) & short),
            failed_short=Count("status", filter=Q(status=S.FAILED) & short),
            succeeded_long=Count("status", filter=Q(status=S.SUCCEEDED)),
            failed_long=Count("status", filter=Q(status=S.FAILED)),
            cancelled_long=Count("status", filter=Q(status=S.CANCELLED)),
        )
    )
    return {row["queue"]: _without_queue(row) for row in rows}


def _without_queue(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in row.items() if name != "queue"}


def throughput(
    queues: list[str] | None = None,
    *,
    now: datetime | None = None,
    window: timedelta = WINDOW_LONG,
    using: str | None = None,
) -> list[ThroughputPoint]:
    """Messages finished per minute over ``window``, oldest first, gaps as zeros."""
    alias = using or router.db_for_read(Message)
    now = now or clock.now()
    first = _minute(now - window) + timedelta(minutes=1)
    rows = (
        Message.objects.using(alias)
        .filter(status__in=(S.SUCCEEDED, S.FAILED), finished_at__gte=first)
        .in_queues(queues)
        .annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
        .values("minute", "status")
        .order_by()
        .annotate(n=Count("status"))
    )
    counts: dict[tuple[datetime, str], int] = {
        (_minute(row["minute"]), row["status"]): row["n"] for row in rows
    }
    points = []
    minute = first
    while minute <= now:
        points.append(
            ThroughputPoint(
                minute,
                counts.get((minute, S.SUCCEEDED), 0),
                counts.get((minute, S.FAILED), 0),
            )
        )
        minute += timedelta(minutes=1)
    return points


def _minute(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def dashboard(queues: list[str] | None = None, using: str | None = None) -> Dashboard:
    """Everything the admin dashboard shows, in five indexed queries."""
    alias = using or router.db_for_read(Message)
    now = clock.now()
    active = active_figures(queues, now, alias)
    failed = failed_counts(queues, alias)
    windows = window_figures(queues, now, alias)
    paused = paused_queues(queues, using=alias)
    names = set(active) | set(failed) | set(windows) | paused
    names |= set(registry.queues()) if queues is None else set(queues)
    figures = [
        QueueFigures(
            queue=name,
            now=now,
            failed=failed.get(name, 0),
            paused=name in paused,
            **active.get(name, {}),
            **windows.get(name, {}),
        )
        for name in sorted(names)
    ]
    return Dashboard(
        now=now,
        queues=figures,
        totals=_totals(figures, now),
        throughput=throughput(queues, now=now, using=alias),
        estimated_rows=estimated_count(alias),
    )


def _totals(figures: list[QueueFigures], now: datetime) -> QueueFigures:
    sums = {
        name: sum(getattr(f, name) for f in figures)
        for name in (*_ACTIVE_FIELDS, "failed", *_WINDOW_FIELDS)
    }
    dues = [f.oldest_due for f in figures if f.oldest_due is not None]
    return QueueFigures(queue="", now=now, oldest_due=min(dues) if dues else None, **sums)
