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
(``store/settle.py``), and an operator must not pull a message out from
under it. Leases are judged by the database's clock, the one every lease is
written with, not by the web server's.
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

from django.db import connections, transaction
from django.db.models import Count, Expression, Q, QuerySet

from django_delayq import clock
from django_delayq.enqueuing import check_priority, resolve_run_at
from django_delayq.entity import is_queue_model, queue_of
from django_delayq.models import Message
from django_delayq.routers import model_alias, queue_alias
from django_delayq.store import dependencies, groups, operators
from django_delayq.store.columns import batches
from django_delayq.store.queries import QueueQuerySet, categories
from django_delayq.store.wakeup import notify
from django_delayq.values import is_int_between

S = Message.Status

#: Largest ``extra_attempts`` accepted by :func:`retry_failed`.
MAX_EXTRA_ATTEMPTS = 1000

#: Queues notified at most per operation (PostgreSQL NOTIFY); beyond that,
#: workers find the messages at their next poll.
MAX_NOTIFIED_QUEUES = 100
# The count of the selection's messages in ordered groups (beside its categories).
GROUPED = "grouped"
# ... and of its messages in workflows (steps, parents).
STEPS = "steps"

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
    write: Callable[[QuerySet[Message], Expression], int],
    *,
    dry_run: bool,
    wake: datetime | None = None,
) -> OperationResult:
    """Count the selection by category, then ``write`` the eligible rows, in one transaction.

    The eligibility condition is repeated in the write's WHERE, so a row a
    worker claims between the count and the write is left alone (and
    reported as changed meanwhile). Both are judged on the database's clock.
    """
    model = queryset.model
    if not is_queue_model(model):
        raise TypeError(
            "expected a Message queryset or one of a model with QueueFields, "
            f"got one of {model.__name__}"
        )
    alias = model_alias(model, cast(Any, queryset)._db)
    queryset = queryset.using(alias).order_by()
    now = clock.sql_now()
    conditions = categories(now)
    counters = {name: Count("pk", filter=q) for name, q in conditions.items()}
    if model is Message:
        counters[GROUPED] = Count("pk", filter=~Q(group=""))
        counters[STEPS] = Count("pk", filter=Q(has_children=True) | ~Q(on_parent_failure=""))
    with transaction.atomic(using=alias):
        if model is Message:
            grouped = queryset.values("queue").order_by("queue").annotate(**counters)
            rows = cast(list[dict[str, Any]], list(grouped))
        else:
            # A model's rows are one queue, the one its handler consumes.
            rows = [{"queue": queue_of(model), **queryset.aggregate(**counters)}]
        counts: Counter[str] = Counter()
        for row in rows:
            counts.update({name: row[name] for name in conditions})
        expected = sum(counts[name] for name in plan.eligible)
        if dry_run or not expected:
            changed = expected if dry_run else 0
        else:
            eligible = reduce(operator.or_, (conditions[name] for name in plan.eligible))
            # What the change finishes (or deletes, or makes due) may let the
            # next message of an ordered group go.
            in_groups = any(row.get(GROUPED) for row in rows)
            affected = groups.groups_of(queryset.filter(eligible)) if in_groups else set()
            # ... and the children of a workflow's steps go on, or wait again.
            steps = _steps(queryset.filter(eligible)) if any(r.get(STEPS) for r in rows) else []
            parents = [pk for pk, has_children in steps if has_children]
            orphans = _children(parents, alias) if parents and plan is _DELETE else []
            # A QueueFields model's rows in workflows (their stand-ins).
            in_workflows = _rows_in_workflows(queryset.filter(eligible), model, alias)
            changed = write(queryset.filter(eligible), now)
            if in_workflows:
                _rows_go_on(model, in_workflows, plan, alias)
            if affected:
                groups.release_groups(affected, using=alias)
            if plan is _DELETE:
                if steps:
                    dependencies.forget([pk for pk, _ in steps], using=alias)
                if orphans:
                    dependencies.orphaned(orphans, using=alias)
            elif parents and plan is _RETRY:
                dependencies.reopen(parents, using=alias)
            elif parents:
                dependencies.settle(parents, using=alias)
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


def _rows_in_workflows(rows: QuerySet[Any], model: type[Any], alias: str) -> list[Any]:
    """The primary keys of ``rows`` where their model's rows take part in workflows."""
    from django_delayq.store import row_steps

    if model is Message or not row_steps.in_use(model, alias):
        return []
    return list(rows.values_list("pk", flat=True))


def _rows_go_on(model: type[Any], pks: list[Any], plan: _Plan, alias: str) -> None:
    """What waits for the rows an operation changed: a retried row's stand-in reopens;
    one that finished ends its stand-in, and its children go on; a deleted one's
    stand-in goes, its children left to go on without it."""
    from django_delayq.store import row_steps

    if plan is _RETRY:
        row_steps.queued_again(model, pks, alias)
    elif plan is _DELETE:
        row_steps.deleted(model, pks, alias)
    else:
        parents = row_steps.ended_parents(model, pks, alias)
        if parents:
            dependencies.settle(parents, using=alias)


def _steps(rows: QuerySet[Message]) -> list[tuple[int, bool]]:
    """The workflow steps and parents of ``rows``: (id, has children)."""
    wanted = rows.filter(Q(has_children=True) | ~Q(on_parent_failure=""))
    return list(wanted.values_list("pk", "has_children"))


def _children(parents: list[int], alias: str) -> list[int]:
    from django_delayq.models import Dependency

    found: set[int] = set()
    for chunk in batches(parents):
        edges = Dependency.objects.using(alias).filter(parent_id__in=chunk)
        found.update(edges.values_list("child_id", flat=True))
    return sorted(found)


def run_now(queryset: QuerySet[Message], *, dry_run: bool = False) -> OperationResult:
    """Make pending messages due now (a later due time becomes now).

    Messages already due keep their place (moving them to "now" would put
    them behind messages due since). Running and finished messages are
    skipped; use :func:`retry_failed` for failed or cancelled ones.
    """
    return _apply(queryset, _RUN_NOW, operators.run_now, dry_run=dry_run, wake=clock.now())


def retry_failed(
    queryset: QuerySet[Message], *, extra_attempts: int = 1, dry_run: bool = False
) -> OperationResult:
    """Send failed and cancelled messages back to pending, due now.

    ``max_attempts`` becomes ``attempt_count + extra_attempts``, so exactly
    that many more attempts are allowed whatever the handler's setting; the
    last error stays visible until the next attempt replaces it.
    """
    if not is_int_between(extra_attempts, 1, MAX_EXTRA_ATTEMPTS):
        raise ValueError(
            f"extra_attempts must be an integer from 1 to {MAX_EXTRA_ATTEMPTS}, "
            f"got {extra_attempts!r}"
        )

    def write(rows: QuerySet[Message], now: Expression) -> int:
        return operators.retry(rows, extra_attempts, now)

    return _apply(queryset, _RETRY, write, dry_run=dry_run, wake=clock.now())


def cancel(queryset: QuerySet[Message], *, dry_run: bool = False) -> OperationResult:
    """Stop pending messages from running: they become ``cancelled`` (finished).

    A running message is refused while its lease is valid (its worker would
    otherwise finish it anyway); one whose lease expired is cancelled.
    """
    return _apply(queryset, _WAITING, operators.cancel, dry_run=dry_run)


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
    when = resolve_run_at(run_at, delay, clock.now())

    def write(rows: QuerySet[Message], now: Expression) -> int:
        return operators.reschedule(rows, when, now)

    return _apply(queryset, _WAITING, write, dry_run=dry_run, wake=when)


def reprioritise(
    queryset: QuerySet[Message], priority: int, *, dry_run: bool = False
) -> OperationResult:
    """Set the priority (higher runs first) of messages that may still run.

    A ``QueueFields`` model needs a ``priority`` column of its own.
    """
    check_priority(priority)
    if not has_priority(queryset.model):
        raise TypeError(f"{queryset.model.__name__} has no priority column to change")

    def write(rows: QuerySet[Message], now: Expression) -> int:
        return operators.reprioritise(rows, priority, now)

    return _apply(queryset, _REPRIORITISE, write, dry_run=dry_run)


def delete(queryset: QuerySet[Message], *, dry_run: bool = False) -> OperationResult:
    """Delete messages, except running ones whose worker still holds the lease."""

    def write(rows: QuerySet[Message], now: Expression) -> int:
        return operators.delete(rows)

    return _apply(queryset, _DELETE, write, dry_run=dry_run)


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
    """The category of :func:`~django_delayq.store.queries.categories` ``message`` falls in.

    Asked of the database, on its clock (one indexed read), unless ``now`` is
    given: then judged here, on that time.
    """
    if now is None:
        alias = message._state.db or queue_alias(read=True)
        rows: QueueQuerySet[Any] = QueueQuerySet(type(message)).using(alias).filter(pk=message.pk)
        counts = rows.categorised()
        found = next((name for name, n in counts.items() if n), None)
        if found is not None:
            return found
        now = clock.now()  # the row is gone: judge what the page still shows
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
