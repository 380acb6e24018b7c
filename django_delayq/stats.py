"""Per-queue figures for ``delayq_status`` (and the admin dashboard).

One grouped aggregate per call: conditional counts over the queue table,
so the figures are consistent with each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import router
from django.db.models import Count, Min, Q

from django_delayq import clock
from django_delayq.models import Message

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
