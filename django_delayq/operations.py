"""Operator operations on a set of messages: run now, retry, cancel, reschedule,
reprioritise, delete.

Each takes a ``Message`` queryset (any filter: a selection of ids, a search,
a whole queue), or a queryset of a model with ``entity.QueueFields`` (the
rows are the messages), and is set-based: one grouped ``COUNT`` that sorts the
selection into the categories below (for the report), then one ``UPDATE`` or
``DELETE`` whose ``WHERE`` repeats the eligibility condition. No row is ever
loaded into Python, so "all 800,000 matching" costs two statements.

**Running messages are refused** by every operation that would change their
status, due time or lock: while a worker holds a valid lease its
acknowledgement is a compare-and-set on ``(id, lock_token, status='running')``
(``claim.py``), and an operator must not pull a message out from under it.
A ``running`` row whose lease has *expired* is different: its worker is gone
(or has lost it), any worker may claim it again, and the operations treat it
like a pending message. Because the condition is in the ``UPDATE`` itself, a
worker that claims or extends a row between the count and the update makes
the update skip that row (PostgreSQL re-checks the condition on the new row
version), and the row is reported as "changed meanwhile".

The admin's actions and buttons call these functions; so can your code::

    from django_delayq import operations
    from django_delayq.models import Message

    failed = Message.objects.filter(queue="emails", status="failed")
    result = operations.retry_failed(failed, extra_attempts=3)
    result.changed      # how many messages are pending again
    result.skipped      # {"running": 2, ...}: reason -> how many were left alone
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import reduce
from typing import Any, cast

from django.db import connections, router, transaction
from django.db.models import Count, F, Q, QuerySet

from django_delayq import clock
from django_delayq.claim import _fit
from django_delayq.entity import is_queue_model, queue_of
from django_delayq.models import Message
from django_delayq.producer import check_priority, notify, resolve_run_at

S = Message.Status

#: Largest ``extra_attempts`` accepted by :func:`retry_failed`.
MAX_EXTRA_ATTEMPTS = 1000

#: Queues notified at most per operation (PostgreSQL NOTIFY); beyond that,
#: workers find the messages at their next poll.
MAX_NOTIFIED_QUEUES = 100

# Skip reasons: the keys of ``OperationResult.skipped``.
RUNNING = "running"
ALREADY_DUE = "already due"
PENDING = "pending"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
CHANGED_MEANWHILE = "changed meanwhile"

#: What each skip reason means, for messages shown to operators.
REASONS: dict[str, str] = {
    RUNNING: "running: a worker holds its lease (wait until the attempt ends)",
    ALREADY_DUE: "already due",
    PENDING: "still pending",
    SUCCEEDED: "already succeeded",
    FAILED: "failed (use Retry to run it again)",
    CANCELLED: "cancelled (use Retry to run it again)",
    CHANGED_MEANWHILE: "changed by a worker meanwhile",
}


@dataclass(frozen=True)
class OperationResult:
    """How many messages an operation changed, and why it left the others alone."""

    changed: int
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    @property
    def total(self) -> int:
        return self.changed + self.skipped_total

    def __str__(self) -> str:
        text = f"{self.changed} changed"
        if self.skipped:
            reasons = ", ".join(f"{n} {reason}" for reason, n in self.skipped.items())
            text += f", {self.skipped_total} skipped ({reasons})"
        return text


def _categories(now: datetime) -> dict[str, Q]:
    """Disjoint conditions covering every row (the status check constraint sees to that)."""
    not_later = Q(next_attempt_time__lte=now) | Q(next_attempt_time__isnull=True)
    return {
        "pending_due": Q(status=S.PENDING, next_attempt_time__lte=now),
        # A pending row without a due time would never be claimed: "run now" fixes it.
        "pending_later": Q(status=S.PENDING)
        & (Q(next_attempt_time__gt=now) | Q(next_attempt_time__isnull=True)),
        "running": Q(status=S.RUNNING, next_attempt_time__gt=now),
        "lease_expired": Q(status=S.RUNNING) & not_later,
        "succeeded": Q(status=S.SUCCEEDED),
        "failed": Q(status=S.FAILED),
        "cancelled": Q(status=S.CANCELLED),
    }


@dataclass(frozen=True)
class _Plan:
    """Which categories an operation changes, and the skip reason of each other one."""

    eligible: tuple[str, ...]
    reasons: Mapping[str, str]


_FINISHED_REASONS = {"succeeded": SUCCEEDED, "failed": FAILED, "cancelled": CANCELLED}

_RUN_NOW = _Plan(
    eligible=("pending_later",),
    reasons={
        "pending_due": ALREADY_DUE,
        "lease_expired": ALREADY_DUE,
        "running": RUNNING,
        **_FINISHED_REASONS,
    },
)
_RETRY = _Plan(
    eligible=("failed", "cancelled"),
    reasons={
        "pending_due": PENDING,
        "pending_later": PENDING,
        "running": RUNNING,
        "lease_expired": RUNNING,
        "succeeded": SUCCEEDED,
    },
)
# Cancel and reschedule: everything that may still run, except a held lease.
_WAITING = _Plan(
    eligible=("pending_due", "pending_later", "lease_expired"),
    reasons={"running": RUNNING, **_FINISHED_REASONS},
)
# Priority is inert while a message runs and the worker never writes it, so a
# running message may be reprioritised (it matters if it is retried).
_REPRIORITISE = _Plan(
    eligible=("pending_due", "pending_later", "running", "lease_expired"),
    reasons=_FINISHED_REASONS,
)
_DELETE = _Plan(
    eligible=("pending_due", "pending_later", "lease_expired", "succeeded", "failed", "cancelled"),
    reasons={"running": RUNNING},
)


def _apply(
    queryset: QuerySet[Message],
    plan: _Plan,
    now: datetime,
    write: Callable[[QuerySet[Message]], int],
    *,
    dry_run: bool,
    wake: datetime | None = None,
) -> OperationResult:
    model = queryset.model
    if not is_queue_model(model):
        raise TypeError(
            "expected a Message queryset or one of a model with QueueFields, "
            f"got one of {model.__name__}"
        )
    alias = cast(Any, queryset)._db or router.db_for_write(model)
    queryset = queryset.using(alias).order_by()
    categories = _categories(now)
    counters = {name: Count("pk", filter=q) for name, q in categories.items()}
    with transaction.atomic(using=alias):
        if model is Message:
            grouped = queryset.values("queue").order_by("queue").annotate(**counters)
            rows = cast(list[dict[str, Any]], list(grouped))
        else:
            # A model's rows are one queue, the one its handler consumes.
            rows = [{"queue": queue_of(model), **queryset.aggregate(**counters)}]
        counts: Counter[str] = Counter()
        for row in rows:
            counts.update({name: row[name] for name in categories})
        expected = sum(counts[name] for name in plan.eligible)
        if dry_run or not expected:
            changed = expected if dry_run else 0
        else:
            eligible = reduce(operator.or_, (categories[name] for name in plan.eligible))
            changed = write(queryset.filter(eligible))
            if wake is not None and changed:
                queues = [
                    r["queue"] for r in rows if r["queue"] and any(r[n] for n in plan.eligible)
                ]
                for queue in queues[:MAX_NOTIFIED_QUEUES]:
                    notify(connections[alias], queue, wake)

    skipped: Counter[str] = Counter()
    for name, reason in plan.reasons.items():
        if counts[name]:
            skipped[reason] += counts[name]
    if changed < expected:
        skipped[CHANGED_MEANWHILE] += expected - changed
    elif changed > expected and skipped[RUNNING]:
        # Rows a worker released between the count and the update.
        skipped[RUNNING] -= min(changed - expected, skipped[RUNNING])
    return OperationResult(changed, {k: n for k, n in skipped.items() if n})


def run_now(queryset: QuerySet[Message], *, dry_run: bool = False) -> OperationResult:
    """Make pending messages due now (a later due time becomes now).

    Messages already due keep their place (moving them to "now" would put
    them behind messages due since). Running and finished messages are
    skipped; use :func:`retry_failed` for failed or cancelled ones.
    """
    now = clock.now()

    def write(qs: QuerySet[Message]) -> int:
        return qs.update(**_fit(qs.model, {"next_attempt_time": now, "updated_at": now}))

    return _apply(queryset, _RUN_NOW, now, write, dry_run=dry_run, wake=now)


def retry_failed(
    queryset: QuerySet[Message], *, extra_attempts: int = 1, dry_run: bool = False
) -> OperationResult:
    """Send failed and cancelled messages back to pending, due now.

    ``max_attempts`` becomes ``attempt_count + extra_attempts``, so exactly
    that many more attempts are allowed whatever the handler's setting; the
    last error stays visible until the next attempt replaces it.
    """
    if (
        isinstance(extra_attempts, bool)
        or not isinstance(extra_attempts, int)
        or not 1 <= extra_attempts <= MAX_EXTRA_ATTEMPTS
    ):
        raise ValueError(
            f"extra_attempts must be an integer from 1 to {MAX_EXTRA_ATTEMPTS}, "
            f"got {extra_attempts!r}"
        )
    now = clock.now()

    def write(qs: QuerySet[Message]) -> int:
        return qs.update(
            **_fit(
                qs.model,
                {
                    "status": S.PENDING,
                    "next_attempt_time": now,
                    "max_attempts": F("attempt_count") + extra_attempts,
                    "finished_at": None,
                    "lock_token": None,
                    "updated_at": now,
                },
            )
        )

    return _apply(queryset, _RETRY, now, write, dry_run=dry_run, wake=now)


def cancel(queryset: QuerySet[Message], *, dry_run: bool = False) -> OperationResult:
    """Stop pending messages from running: they become ``cancelled`` (finished).

    A running message is refused while its lease is valid (its worker would
    otherwise finish it anyway); one whose lease expired is cancelled.
    """
    now = clock.now()

    def write(qs: QuerySet[Message]) -> int:
        return qs.update(
            **_fit(
                qs.model,
                {
                    "status": S.CANCELLED,
                    "next_attempt_time": None,
                    "finished_at": now,
                    "lock_token": None,
                    "updated_at": now,
                },
            )
        )

    return _apply(queryset, _WAITING, now, write, dry_run=dry_run)


def reschedule(
    queryset: QuerySet[Message],
    *,
    run_at: datetime | None = None,
    delay: timedelta | int | float | None = None,
    dry_run: bool = False,
) -> OperationResult:
    """Set the due time of pending messages to ``run_at`` or now + ``delay`` (now if neither).

    The arguments are checked like ``enqueue``'s (an aware ``run_at``, a
    non-negative delay, not both). ``scheduled_time`` keeps the first
    schedule, so a rescheduled message's history stays visible.
    """
    now = clock.now()
    when = resolve_run_at(run_at, delay, now)

    def write(qs: QuerySet[Message]) -> int:
        return qs.update(
            **_fit(
                qs.model,
                {
                    "status": S.PENDING,
                    "next_attempt_time": when,
                    "lock_token": None,
                    "updated_at": now,
                },
            )
        )

    return _apply(queryset, _WAITING, now, write, dry_run=dry_run, wake=when)


def reprioritise(
    queryset: QuerySet[Message], priority: int, *, dry_run: bool = False
) -> OperationResult:
    """Set the priority (higher runs first) of messages that may still run.

    A ``QueueFields`` model needs a ``priority`` column of its own.
    """
    check_priority(priority)
    if not has_priority(queryset.model):
        raise TypeError(f"{queryset.model.__name__} has no priority column to change")
    now = clock.now()

    def write(qs: QuerySet[Message]) -> int:
        return qs.update(**_fit(qs.model, {"priority": priority, "updated_at": now}))

    return _apply(queryset, _REPRIORITISE, now, write, dry_run=dry_run)


def delete(queryset: QuerySet[Message], *, dry_run: bool = False) -> OperationResult:
    """Delete messages, except running ones whose worker still holds the lease."""
    now = clock.now()

    def write(qs: QuerySet[Message]) -> int:
        _, per_model = qs.delete()
        return per_model.get(qs.model._meta.label, 0)

    return _apply(queryset, _DELETE, now, write, dry_run=dry_run)


def has_priority(model: type[Any]) -> bool:
    """True if ``model``'s rows have a priority (messages do; a ``QueueFields`` model may)."""
    return any(f.name == "priority" for f in model._meta.concrete_fields)


# -- one message -----------------------------------------------------------------

_PLANS: dict[str, _Plan] = {
    "run_now": _RUN_NOW,
    "retry_failed": _RETRY,
    "cancel": _WAITING,
    "reschedule": _WAITING,
    "reprioritise": _REPRIORITISE,
    "delete": _DELETE,
}


def category(message: Message, now: datetime | None = None) -> str:
    """The category of :func:`_categories` that ``message`` falls in (its Python twin)."""
    now = now or clock.now()
    due = message.next_attempt_time
    if message.status == S.PENDING:
        return "pending_due" if due is not None and due <= now else "pending_later"
    if message.status == S.RUNNING:
        return "running" if due is not None and due > now else "lease_expired"
    return str(message.status)


def applicable(message: Message, now: datetime | None = None) -> list[str]:
    """Names of the operations that would change ``message`` (for the change page's buttons)."""
    current = category(message, now)
    return [name for name, plan in _PLANS.items() if current in plan.eligible]


def holds_lease(message: Message, now: datetime | None = None) -> bool:
    """True while a worker holds ``message``: running, with a lease that has not expired."""
    return category(message, now) == "running"
