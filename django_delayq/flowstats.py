"""How close each queue is to its flow control, for the admin, ``delayq_status`` and metrics.

Per queue with global limits (``flow.limits_of``) or ordered groups in use:

* each limit's scope (the queue, or one kind in it) with the starts its
  rate's sliding window holds now against the rate, its live leases against
  its cap, and whether it is **throttled**: due messages wait while the
  window is full or the cap is reached;
* how many messages are **held** behind their group (pending with no due
  time, waiting for an earlier message of their group to finish);
* how many groups are **blocked** (their first message is failing: waiting
  for a retry after an error, or failed where ``GROUP_AFTER_FAILURE`` is
  "block"), and the names of the first few.

Every figure is on the database's clock and read through an index; nothing
here counts the whole table or locks anything (see the verbs' docstrings in
``store.queries`` and ``store.limits.starts_in_window``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from django.db.models import Count, QuerySet

from django_delayq.conf import get_config
from django_delayq.flow import Scope, continuing_queues, limits_of
from django_delayq.models import Message
from django_delayq.registry import registry
from django_delayq.routers import queue_alias
from django_delayq.store.limits import kept_running, starts_in_window
from django_delayq.store.queries import distinct_values

#: How many blocked groups are named per queue (the longest blocked first).
BLOCKED_NAMES = 5


@dataclass(frozen=True)
class ScopeFlow:
    """One limit's scope now: its starts in the window, its live leases, throttled or not."""

    scope: Scope
    #: Starts in the rate's current window (0 without a rate).
    started: int = 0
    #: Live leases: running messages whose lease has not expired (0 without a cap).
    running: int = 0
    #: Due messages wait while the window is full or the cap is reached.
    throttled: bool = False

    @property
    def kind(self) -> str:
        return self.scope.kind

    @property
    def window_full(self) -> bool:
        rate = self.scope.rate
        return rate is not None and self.started >= rate.count

    @property
    def at_cap(self) -> bool:
        return self.scope.cap is not None and self.running >= self.scope.cap

    @property
    def limits_text(self) -> str:
        """``20/s, 3 at once``."""
        parts = []
        if self.scope.rate is not None:
            parts.append(str(self.scope.rate))
        if self.scope.cap is not None:
            parts.append(f"{self.scope.cap} at once")
        return ", ".join(parts)

    @property
    def window_text(self) -> str:
        """``12/20 per s``: starts in the window against the rate ("" without one)."""
        rate = self.scope.rate
        if rate is None:
            return ""
        unit = str(rate).split("/", 1)[1]
        return f"{self.started}/{rate.count} per {unit}"

    @property
    def running_text(self) -> str:
        """``3/3 running``: live leases against the cap ("" without one)."""
        if self.scope.cap is None:
            return ""
        return f"{self.running}/{self.scope.cap} running"


@dataclass(frozen=True)
class QueueFlow:
    """A queue's limits and ordered groups now."""

    queue: str
    scopes: tuple[ScopeFlow, ...] = ()
    #: Messages held behind an earlier message of their group.
    held: int = 0
    #: Groups whose first message is failing.
    blocked: int = 0
    #: The first ``BLOCKED_NAMES`` of them, the longest blocked first.
    blocked_groups: tuple[str, ...] = ()

    @property
    def throttled(self) -> bool:
        return any(s.throttled for s in self.scopes)

    @property
    def limited(self) -> bool:
        return bool(self.scopes)


def known_queues(using: str | None = None) -> list[str]:
    """Queues with a handler, with settings, or with messages (a loose index scan)."""
    # Keys of DELAYQ["QUEUES"] that are not queue names (E006) name no queue.
    names = set(registry.queues()) | {q for q in get_config()["QUEUES"] if isinstance(q, str)}
    names |= set(distinct_values("queue", using=using))
    return sorted(names)


def flow_stats(
    queues: Collection[str] | None = None, *, using: str | None = None
) -> list[QueueFlow]:
    """The flow control of ``queues`` (default: :func:`known_queues`), by queue name:
    only queues with limits, messages held behind their group, or blocked groups.

    A handful of indexed queries whatever the number of queues: one for the
    held messages, one for the blocked groups (and one per queue that has
    some, for their names), one for the live leases of the capped queues, one
    per rate for its window, and, for a scope that is full, one probe for a
    due message.
    """
    alias = queue_alias(using, read=True)
    names = sorted(set(known_queues(alias) if queues is None else queues))
    if not names:
        return []
    rows = Message.objects.using(alias).in_queues(names)
    held = _by_queue(rows.waiting_for_group())
    heads = rows.blocked_group_heads(continuing_queues())
    blocked = _by_queue(heads)
    scopes = {queue: found for queue in names if (found := limits_of(queue))}
    running = _live_leases(alias, [q for q, found in scopes.items() if any(s.cap for s in found)])
    flows = []
    for queue in names:
        if queue not in scopes and not held.get(queue) and not blocked.get(queue):
            continue
        groups: tuple[str, ...] = ()
        if blocked.get(queue):
            first = heads.filter(queue=queue).order_by("pk").values_list("group", flat=True)
            groups = tuple(first[:BLOCKED_NAMES])
        flows.append(
            QueueFlow(
                queue=queue,
                scopes=tuple(_scope(alias, s, running) for s in scopes.get(queue, ())),
                held=held.get(queue, 0),
                blocked=blocked.get(queue, 0),
                blocked_groups=groups,
            )
        )
    return flows


def _by_queue(rows: QuerySet[Message]) -> dict[str, int]:
    counted = rows.values("queue").order_by().annotate(n=Count("queue"))
    return {row["queue"]: row["n"] for row in counted}


def _live_leases(alias: str, queues: list[str]) -> dict[tuple[str, str], int]:
    """Running messages per (queue, kind) of ``queues`` as their caps count them
    (``limits.kept_running``: a live worker's lapsed lease too)."""
    if not queues:
        return {}
    rows = (
        kept_running(Message.objects.using(alias).in_queues(queues))
        .values("queue", "kind")
        .order_by()
        .annotate(n=Count("status"))
    )
    return {(row["queue"], row["kind"]): row["n"] for row in rows}


def _scope(alias: str, scope: Scope, running: dict[tuple[str, str], int]) -> ScopeFlow:
    leases = 0
    if scope.cap is not None:
        leases = sum(
            n for (q, kind), n in running.items() if q == scope.queue and scope.kind in ("", kind)
        )
    started = starts_in_window(scope, using=alias)
    flow = ScopeFlow(scope, started=started, running=leases)
    if flow.window_full or flow.at_cap:
        due = Message.objects.using(alias).filter(queue=scope.queue).due()
        if scope.kind:
            due = due.filter(kind=scope.kind)
        flow = ScopeFlow(scope, started=started, running=leases, throttled=due.exists())
    return flow
