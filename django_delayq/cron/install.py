"""Cron schedules, the database half: installing ticks ahead as ordinary messages.

Every worker installs the next ticks of every schedule, every
``CRON_INSTALL_INTERVAL`` (``worker/maintenance.py``). The unique ``(queue,
key)`` constraint turns every duplicate into an ignored insert: no number of
workers can create a tick twice. A changed configuration has a new hash: the
pending ticks of the old one are deleted, and so are those of schedules that
are no longer configured. Ticks that already started (running, or waiting
for a retry) are never deleted by an installer: an occurrence that began is
left to finish.

Reads go through the QuerySet verbs (``ticks``, ``untouched``), deletes and
cancellations through ``store.ticks``, new ticks through ``enqueue``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError, transaction
from django.db.models import Q

from django_delayq import clock
from django_delayq.cron.declared import get_schedules
from django_delayq.cron.spec import KEY_PREFIX, Schedule, ScheduleError, check_name
from django_delayq.cron.ticks import TickRow, missed_reason, parse_key, plan_ticks, tick_of
from django_delayq.models import Message
from django_delayq.routers import queue_alias
from django_delayq.store import ticks
from django_delayq.store.columns import rows_with_literals
from django_delayq.store.server import is_transient

# Tries per schedule when installers deadlock with each other.
INSTALL_TRIES = 3

logger = logging.getLogger("django_delayq.worker")


@dataclass
class InstallResult:
    """What one install did for one schedule."""

    schedule: str
    created: int = 0
    replaced: int = 0
    missed: int = 0
    caught_up: datetime | None = None
    error: str = ""


@dataclass
class InstallReport:
    results: list[InstallResult] = field(default_factory=list)
    removed: int = 0

    @property
    def created(self) -> int:
        return sum(r.created for r in self.results)


def _db(using: str | None) -> str:
    return queue_alias(using)


def _tick_rows(queues: Iterable[str], alias: str) -> list[TickRow]:
    """Active tick messages of ``queues`` (read off the partial ``delayq_due_idx``)."""
    queues = list(queues)
    if not queues:
        return []
    found = rows_with_literals(
        Message.objects.using(alias)
        .ticks(queues, KEY_PREFIX)
        .values_list("id", "queue", "key", "status", "attempt_count"),
        alias,
    )
    rows = []
    for pk, queue, key, status, attempts in found:
        parsed = parse_key(key)
        if parsed is None:
            continue
        untouched = status == Message.Status.PENDING and attempts == 0
        rows.append(TickRow(pk, queue, *parsed, untouched=untouched))
    return rows


def install_schedules(
    now: datetime | None = None,
    *,
    names: Iterable[str] | None = None,
    using: str | None = None,
) -> InstallReport:
    """Install the next ticks of every schedule (or of ``names``); idempotent.

    Safe to run from any number of processes at once: inserts ignore
    existing keys, and deletes and cancellations only touch ticks that are
    pending and were never attempted (a claim that wins the race turns a
    tick ``running``, and the statement then leaves it alone). Without
    ``names``, the pending ticks of schedules no longer configured are
    removed too. One schedule's failure is logged and reported, never
    raised, so one bad schedule cannot stop the others.
    """
    from django_delayq.registry import registry

    alias = _db(using)
    now = now or clock.now()
    schedules = get_schedules()
    selected = schedules if names is None else _select(schedules, names)
    report = InstallReport()
    queues = {s.queue for s in schedules.values()} | set(registry.queues())
    rows = _tick_rows(queues, alias)

    if names is None:
        orphans = [r.id for r in rows if r.untouched and r.name not in schedules]
        if orphans:
            report.removed = ticks.delete_ticks(orphans, using=alias)
            logger.info("removed %d pending tick(s) of removed schedules", report.removed)

    for sched in selected.values():
        result = InstallResult(sched.name)
        report.results.append(result)
        for attempt in range(1, INSTALL_TRIES + 1):
            try:
                _install_one(sched, now, [r for r in rows if r.name == sched.name], alias, result)
            except DatabaseError as exc:
                if attempt < INSTALL_TRIES and is_transient(exc):
                    # Installers racing for the same new ticks deadlocked: the
                    # loser rolled back, and sees the winner's ticks now.
                    rows = _tick_rows(queues, alias)
                    continue
                _failed(result, sched)
            except Exception:
                _failed(result, sched)
            break
    return report


def _failed(result: InstallResult, sched: Schedule) -> None:
    exc = sys.exc_info()[1]
    result.error = f"{type(exc).__name__}: {exc}"
    logger.exception("could not install the ticks of schedule %r", sched.name)


def _select(schedules: dict[str, Schedule], names: Iterable[str]) -> dict[str, Schedule]:
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in schedules]
    if unknown:
        raise ScheduleError(
            f"unknown schedule(s): {', '.join(unknown)}; "
            f"configured: {', '.join(schedules) or 'none'}"
        )
    return {n: schedules[n] for n in names}


def _install_one(
    sched: Schedule, now: datetime, rows: list[TickRow], alias: str, result: InstallResult
) -> None:
    from django_delayq.enqueuing import Outcome, enqueue

    qs = Message.objects.using(alias)
    stale = [r.id for r in rows if r.untouched and r.config_hash != sched.config_hash]
    plan = plan_ticks(
        sched,
        now,
        rows,
        has_history=lambda: qs.filter(queue=sched.queue, key__startswith=sched.key_prefix).exists(),
        exists=lambda t: qs.filter(queue=sched.queue, key=sched.tick_key(t)).exists(),
    )
    if plan.install:
        present = set(
            qs.filter(
                queue=sched.queue, key__in=[sched.tick_key(t) for t in plan.install]
            ).values_list("key", flat=True)
        )
        plan.install = [t for t in plan.install if sched.tick_key(t) not in present]
    if not (stale or plan.install or plan.cancel):
        return
    # One transaction: a changed configuration never leaves a moment with
    # neither the old ticks nor the new ones.
    # Counted into ``result`` only once committed: a transaction the database
    # rolls back (an InnoDB deadlock between installers) created nothing.
    replaced = missed = created = 0
    with transaction.atomic(using=alias):
        if stale:
            replaced = ticks.delete_ticks(stale, using=alias)
        if plan.cancel:
            missed = ticks.cancel_ticks(
                plan.cancel,
                reason=missed_reason(sched),
                now=now,
                using=alias,
            )
        for tick in plan.install:
            outcome = enqueue(
                sched.queue,
                sched.payload,
                key=sched.tick_key(tick),
                kind=sched.kind,
                run_at=tick,
                priority=sched.priority,
                max_attempts=sched.max_attempts,
                on_conflict="ignore",
                using=alias,
            ).outcome
            created += outcome is Outcome.CREATED
    result.replaced, result.missed, result.created = replaced, missed, created
    logger.debug("schedule %s: %d tick(s) installed", sched.name, result.created)
    if result.replaced:
        logger.info(
            "schedule %s: configuration changed; %d pending tick(s) of the old one removed",
            sched.name,
            result.replaced,
        )
    if result.missed:
        logger.warning(
            "schedule %s: %d tick(s) missed (not started in time); cancelled (catch_up=%s)",
            sched.name,
            result.missed,
            sched.catch_up,
        )
    if plan.caught_up is not None:
        result.caught_up = plan.caught_up
        logger.warning(
            "schedule %s: running the missed tick of %s now (catch_up=latest)",
            sched.name,
            plan.caught_up.isoformat(),
        )


def uninstall_schedules(names: Iterable[str] | None = None, *, using: str | None = None) -> int:
    """Delete the pending, never attempted ticks of ``names`` (default: of every schedule).

    Any configuration, any queue. Running workers install configured
    schedules again within ``CRON_INSTALL_INTERVAL``: remove a schedule from
    the configuration to stop it for good.
    """
    alias = _db(using)
    qs = Message.objects.using(alias).untouched().filter(key__startswith=KEY_PREFIX)
    if names is not None:
        prefixes = [f"{KEY_PREFIX}{check_name(n)}:" for n in names]
        if not prefixes:
            return 0
        condition = Q()
        for prefix in prefixes:
            condition |= Q(key__startswith=prefix)
        qs = qs.filter(condition)
    ids = [pk for pk, key in qs.values_list("id", "key") if parse_key(key)]
    return ticks.delete_ticks(ids, using=alias)


# -- overview (delayq_cron list, the admin) -----------------------------------------


@dataclass(frozen=True)
class ScheduleOverview:
    name: str
    queue: str
    spec: str
    timezone: str
    catch_up: str
    source: str
    config_hash: str
    next_runs: list[datetime]
    installed: int
    last_run: datetime | None
    last_status: str
    last_late_by: timedelta | None
    last_error: str
    key_prefix: str


def schedule_overview(
    now: datetime | None = None, *, count: int = 3, using: str | None = None
) -> list[ScheduleOverview]:
    """Every schedule with its next run times and its last run (time and outcome)."""
    alias = _db(using)
    now = now or clock.now()
    qs = Message.objects.using(alias)
    out = []
    for sched in get_schedules().values():
        its_ticks = qs.filter(queue=sched.queue, key__startswith=sched.name_prefix)
        last = (
            its_ticks.filter(last_attempt_time__isnull=False)
            .order_by("-last_attempt_time")
            .only("key", "status", "attempt_count", "last_attempt_time", "last_error")
            .first()
        )
        tick = tick_of(last) if last is not None else None
        status = ""
        if last is not None:
            status = str(last.status)
            if last.status == Message.Status.PENDING:
                status = "retrying"
        out.append(
            ScheduleOverview(
                name=sched.name,
                queue=sched.queue,
                spec=sched.spec,
                timezone=sched.timezone or "UTC",
                catch_up=sched.catch_up,
                source=sched.source,
                config_hash=sched.config_hash,
                next_runs=sched.next_ticks(now, count),
                installed=its_ticks.filter(
                    status=Message.Status.PENDING, key__startswith=sched.key_prefix
                ).count(),
                last_run=last.last_attempt_time if last is not None else None,
                last_status=status,
                last_late_by=tick.late_by if tick is not None else None,
                last_error=last.error_summary() if last is not None else "",
                key_prefix=sched.name_prefix,
            )
        )
    return out
