"""Global rate limits and concurrency caps, enforced by the claim itself.

A limited claim is one transaction: it locks the row of each limit that
applies (``FlowState``, one per queue or kind, always in the same order, so
claims never deadlock), measures the room the limits leave, claims at most
that, and records the starts, then commits. Every worker on every host
claims a limited queue through the same rows, so claims of one limit take
turns and never overshoot together, however many workers start at the same
instant; claims of other queues never touch these rows.

* A **rate** (``N`` per period) is a sliding window: at most ``N`` starts
  in any window of one period, counted in ``FlowStart`` (one row per start,
  stamped with the claim's own time on the database's clock). All ``N`` may
  start at once: the burst is the whole allowance, and the next start waits
  until the oldest one leaves the window.
* A **cap** counts the scope's running messages that no claim may take
  back: under a live lease, or held by a live worker whose lease lapsed. A
  crashed worker's message stops counting when its lease has run out and the
  worker is gone (or when it is found dead and the message handed back).

Messages the limits hold back are not touched: they stay pending, with no
attempt spent and no error recorded, and start when there is room.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, QuerySet, Value

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.flow import Rate, Scope
from django_delayq.models import FlowStart, FlowState, Message
from django_delayq.routers import queue_alias
from django_delayq.status import ACTIVE, Status
from django_delayq.store.claim import Claim, claim
from django_delayq.store.columns import count_with_literals
from django_delayq.store.features import features
from django_delayq.store.queries import claimable_condition

# Starts older than two periods and this are deleted (a claim that began
# before a later one, but locked after it, still counts every start of its
# own window).
PRUNE_MARGIN = timedelta(minutes=1)


@dataclass(frozen=True)
class LimitedClaim:
    """What a limited claim got, and whether the limits (not a lack of due
    messages) kept it short."""

    claim: Claim
    held_back: bool
    # When the rate's window lets the next message start (on the database's
    # clock); None: a cap held them back (room comes when a running message
    # ends), or nothing did.
    retry_at: datetime | None = None
    # How long from the claim until then, measured on the database's clock:
    # what a worker waits, on its own clock (which may be set differently).
    retry_in: timedelta | None = None


# (alias, queue, kind) -> the pk of its FlowState row.
_flow_ids: dict[tuple[str, str, str], int] = {}
# (alias, flow pk) -> when this process last pruned its starts (monotonic).
_pruned: dict[tuple[str, int], float] = {}


def claim_limited(
    queues: Collection[str],
    limit: int,
    scopes: Sequence[Scope],
    *,
    worker: str,
    lease: timedelta,
    leases: Mapping[tuple[str, str | None], timedelta] | None = None,
    using: str | None = None,
    kinds: tuple[Collection[str], bool] | None = None,
) -> LimitedClaim:
    """Claim up to ``limit`` due messages of ``queues`` within every limit of ``scopes``.

    ``kinds`` narrows the claim as :func:`claim.claim` does (a limited
    kind is claimed apart from the rest of its queue).
    """
    alias = queue_alias(using)
    ordered = sorted(scopes, key=lambda s: (s.queue, s.kind))
    with transaction.atomic(using=alias):
        flows = [_lock(alias, scope) for scope in ordered]
        room = limit
        oldest: datetime | None = None
        frees_in: timedelta | None = None
        for scope, flow in zip(ordered, flows, strict=True):
            if scope.rate is not None:
                used, first, wait = _starts(alias, flow, scope.rate)
                room = min(room, scope.rate.count - used)
                if first is not None and (oldest is None or first + scope.rate.period < oldest):
                    oldest = first + scope.rate.period
                if wait is not None and (frees_in is None or wait < frees_in):
                    frees_in = wait
            if scope.cap is not None:
                room = min(room, scope.cap - _running(alias, scope))
        if room <= 0:
            return LimitedClaim(
                Claim(uuid.uuid4(), []),
                held_back=True,
                retry_at=oldest,
                retry_in=None if frees_in is None else max(frees_in, timedelta(0)),
            )
        got = claim(
            queues, room, worker=worker, lease=lease, leases=leases, using=alias, kinds=kinds
        )
        rated = [f for s, f in zip(ordered, flows, strict=True) if s.rate is not None]
        if rated and got.messages:
            FlowStart.objects.using(alias).bulk_create(
                FlowStart(flow_id=flow, started_at=m.last_attempt_time)
                for flow in rated
                for m in got.messages
            )
    held_back = room < limit and len(got.messages) == room
    retry_at = retry_in = None
    if held_back:
        retry_at = _next_start(ordered, got.messages, oldest)
        retry_in = _next_start_in(ordered, frees_in)
    return LimitedClaim(got, held_back=held_back, retry_at=retry_at, retry_in=retry_in)


def _next_start(
    scopes: Sequence[Scope], claimed: Sequence[Message], oldest: datetime | None
) -> datetime | None:
    """When a rate next lets a message start, after a claim that used all its room."""
    periods = [s.rate.period for s in scopes if s.rate is not None]
    if not periods:
        return None
    first = min((m.last_attempt_time for m in claimed if m.last_attempt_time), default=None)
    times = [t for t in (oldest, first and first + min(periods)) if t is not None]
    return min(times) if times else None


def _next_start_in(scopes: Sequence[Scope], frees_in: timedelta | None) -> timedelta | None:
    """:func:`_next_start` as a wait from the claim, on the database's clock.

    The starts the claim just recorded leave their window one period after
    it; an older start leaves it ``frees_in`` after it (both measured by the
    database), whichever comes first. A worker adds this to its own clock:
    comparing the database's instant with its own clock held the lane for as
    long as that clock was behind, or not at all when it was ahead.
    """
    periods = [s.rate.period for s in scopes if s.rate is not None]
    if not periods:
        return None
    waits = [min(periods), *([] if frees_in is None else [frees_in])]
    return max(min(waits), timedelta(0))


def _lock(alias: str, scope: Scope) -> int:
    """Lock the scope's row (creating it the first time); its pk.

    The lock is a write: on SQLite it takes the database's write lock at
    the start of the transaction, so the claim never has to upgrade a read.
    """
    key = (alias, scope.queue, scope.kind)
    for _ in range(2):
        flow = _flow_ids.get(key)
        if flow is None:
            state, _ = FlowState.objects.using(alias).get_or_create(
                queue=scope.queue, kind=scope.kind
            )
            flow = _flow_ids[key] = state.pk
        if FlowState.objects.using(alias).filter(pk=flow).update(claimed_at=clock.sql_now()):
            return flow
        _flow_ids.pop(key, None)  # deleted meanwhile (a flushed database): make it again
    raise RuntimeError(f"could not lock the flow state of {scope.name}")


def _starts(alias: str, flow: int, rate: Rate) -> tuple[int, datetime | None, timedelta | None]:
    """How many starts the rate's window holds now, the oldest of them, and how long
    until it leaves the window (the database's clock, in the same statement).

    Counted without an upper bound: a claim whose transaction began before
    another's (so its clock reads earlier) but locked after it still counts
    the other's starts.
    """
    _prune(alias, flow, rate)
    starts = FlowStart.objects.using(alias).filter(flow_id=flow)
    window = starts.filter(started_at__gt=clock.sql_now_plus(-rate.period))
    leaves = ExpressionWrapper(
        F("started_at") + Value(rate.period) - clock.sql_now(), output_field=DurationField()
    )
    found = window.aggregate(n=Count("pk"), oldest=Min("started_at"), wait=Min(leaves))
    return int(found["n"]), found["oldest"], found["wait"]


def _prune(alias: str, flow: int, rate: Rate) -> None:
    """Delete starts long out of the window, at most once per period per process."""
    now = time.monotonic()
    if now - _pruned.get((alias, flow), float("-inf")) < rate.period.total_seconds():
        return
    _pruned[(alias, flow)] = now
    cutoff = clock.sql_now_plus(-(2 * rate.period + PRUNE_MARGIN))
    FlowStart.objects.using(alias).filter(flow_id=flow, started_at__lt=cutoff).delete()


def kept_running(rows: QuerySet[Message]) -> QuerySet[Message]:
    """The running ``rows`` that no claim may take back: what a cap counts.

    Those under a live lease, and those whose lease lapsed while their worker
    lives (the claim's own rule, ``queries.claimable_condition``). The cap
    (:func:`_running`) and what reports it (``flowstats``) count the same.
    """
    connection = connections[rows.db]
    taken_back = claimable_condition(
        clock.sql_now(),
        to_timedelta(get_config()["WORKER_DEAD_AFTER"]),
        function=features(connection).group_function,
        pids=connection.vendor == "sqlite",
    )
    # The claim indexes' own status condition, said again: SQLite uses a partial
    # index only for a condition that contains its own ("running" alone is not
    # seen to be one of the two), and counted a capped queue's every row,
    # finished ones included, at each of its claims.
    return rows.filter(status__in=ACTIVE).filter(status=Status.RUNNING).exclude(taken_back)


def _running(alias: str, scope: Scope) -> int:
    """The scope's running messages that no claim may take back.

    Those under a live lease, and those whose lease lapsed while their worker
    lives (the claim's own rule, ``queries.claimable_condition``): a keeper
    that could not extend a lease (a producer held the row's lock; on SQLite,
    a long transaction held the database's) leaves its worker running the
    message, and a cap that freed its place would start another beside it.
    """
    rows = kept_running(Message.objects.using(alias).filter(queue=scope.queue))
    if scope.kind:
        rows = rows.filter(kind=scope.kind)
    return count_with_literals(rows, alias)


def starts_in_window(scope: Scope, *, using: str | None = None) -> int:
    """How many starts the scope's rate window holds now (the database's clock).

    For reading (the admin, ``delayq_status``, metrics): it locks, prunes and
    creates nothing. ``delayq_flowstart_idx`` answers: the scope's range of
    starts newer than one period ago (at most the rate's count of them).
    """
    if scope.rate is None:
        return 0
    alias = queue_alias(using, read=True)
    return (
        FlowStart.objects.using(alias)
        .filter(
            flow__queue=scope.queue,
            flow__kind=scope.kind,
            started_at__gt=clock.sql_now_plus(-scope.rate.period),
        )
        .count()
    )
