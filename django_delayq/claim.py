"""Claiming and settling messages: every status change a worker makes.

Each function here is one set-based statement (or one short transaction),
so a worker can claim and settle whole batches in a round trip, and each
settling statement is a compare-and-set on ``(id, lock_token)`` with
``status = 'running'``: a worker whose lease expired, and whose message was
claimed again by someone else, can no longer change it.

Every function takes the table as ``model``: ``Message`` by default, or a
model with the queue columns of ``entity.QueueFields`` (the row is the
message). Such a model has no queue, kind or priority column unless it
declares them, and none of the message's bookkeeping columns
(``updated_at``, ``finished_at``, ``error_fingerprint``): each change
below names every column a message gets, and :func:`_fit` keeps those the
table has.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import connections, router, transaction
from django.db.models import (
    Case,
    DateTimeField,
    Expression,
    F,
    Model,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.functions import Greatest

from django_delayq import clock
from django_delayq.fingerprint import fingerprint
from django_delayq.models import Message, due_condition

# Matches delayq_claim_idx, so PostgreSQL reads the first rows off the index
# instead of sorting every due row (adding "id" here forces that sort).
CLAIM_ORDER = ("-priority", "next_attempt_time")


@dataclass(frozen=True)
class Claim:
    """A batch of messages claimed together; they share one lock token."""

    token: uuid.UUID
    # Messages, or rows of the ``QueueFields`` model that was claimed.
    messages: list[Any]


def _db(using: str | None, model: type[Model] = Message) -> str:
    return using or router.db_for_write(model)


@cache
def _columns(model: type[Model]) -> frozenset[str]:
    return frozenset(f.name for f in model._meta.concrete_fields)


def _fit(model: type[Model], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` without the columns ``model`` does not have."""
    columns = _columns(model)
    return {name: value for name, value in changes.items() if name in columns}


def claim_order(model: type[Model]) -> tuple[str, ...]:
    """Highest priority first where the table has one, then by due time."""
    return CLAIM_ORDER if "priority" in _columns(model) else ("next_attempt_time",)


def _lease_expression(
    leases: Mapping[tuple[str, str | None], timedelta], default: timedelta
) -> Expression:
    """The database's ``now() + lease``, where the lease depends on queue and kind."""
    whens = []
    # Kind-specific handlers must win over their queue's catch-all.
    for (queue, kind), lease in sorted(leases.items(), key=lambda item: item[0][1] is None):
        if lease == default:
            continue
        condition = Q(queue=queue) if kind is None else Q(queue=queue, kind=kind)
        whens.append(When(condition, then=clock.sql_now_plus(lease)))
    default_value = clock.sql_now_plus(default)
    if not whens:
        return default_value
    return Case(*whens, default=default_value, output_field=DateTimeField())


def claim(
    queues: Collection[str],
    limit: int,
    *,
    worker: str,
    lease: timedelta,
    leases: Mapping[tuple[str, str | None], timedelta] | None = None,
    using: str | None = None,
    model: type[Model] = Message,
) -> Claim:
    """Claim up to ``limit`` due messages of ``queues``, highest priority first.

    Due means pending with ``next_attempt_time <= now``, or running with an
    expired lease (the redelivery of a crashed worker's message). Claimed
    rows become ``running`` with a fresh token, one more attempt, and a lease
    of ``now + lease``. For a ``QueueFields`` model, ``queues`` and
    ``leases`` are ignored (the model is the queue) and every row gets ``lease``.
    """
    alias = _db(using, model)
    now = clock.sql_now()
    token = uuid.uuid4()
    rows = model._base_manager.using(alias)
    due = rows.filter(due_condition(now))
    if "queue" in _columns(model):
        due = due.filter(queue__in=list(queues))
    else:
        leases = None
    order = claim_order(model)
    changes = {
        "status": Message.Status.RUNNING,
        "lock_token": token,
        "locked_by": worker[:255],
        "attempt_count": F("attempt_count") + 1,
        "last_attempt_time": now,
        "next_attempt_time": _lease_expression(leases or {}, lease),
        "updated_at": now,
    }
    changes = _fit(model, changes)
    connection = connections[alias]
    if connection.features.has_select_for_update_skip_locked:
        # PostgreSQL, MySQL 8, MariaDB 10.6: lock the rows we pick and skip
        # those other workers are picking, so claimers never wait on each
        # other and never pick the same row.
        with transaction.atomic(using=alias):
            ids = list(
                due.order_by(*order)
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[:limit]
            )
            if not ids:
                return Claim(token, [])
            rows.filter(pk__in=ids).update(**changes)
    else:
        # SQLite has no row locks: one UPDATE picks and marks the rows, and
        # SQLite runs one write statement at a time, so two workers still
        # never claim the same row.
        picked = due.order_by(*order).values("pk")[:limit]
        if not rows.filter(pk__in=picked).update(**changes):
            return Claim(token, [])
    messages = list(rows.filter(lock_token=token, status="running").order_by(*order))
    return Claim(token, messages)


def _held(
    ids: Iterable[Any], token: uuid.UUID, using: str | None, model: type[Model] = Message
) -> QuerySet[Any]:
    return model._base_manager.using(_db(using, model)).filter(
        pk__in=list(ids), lock_token=token, status=Message.Status.RUNNING
    )


def ack(
    ids: Iterable[Any], token: uuid.UUID, *, using: str | None = None, model: type[Model] = Message
) -> int:
    """Mark messages succeeded; returns how many were still ours."""
    now = clock.sql_now()
    return _held(ids, token, using, model).update(
        **_fit(
            model,
            {
                "status": Message.Status.SUCCEEDED,
                "next_attempt_time": None,
                "lock_token": None,
                "finished_at": now,
                "updated_at": now,
            },
        )
    )


def ack_held(held: Mapping[uuid.UUID, Collection[int]], *, using: str | None = None) -> set[int]:
    """Mark messages of several claims succeeded at once; returns the ids still ours.

    One transaction: the rows still held under their token are locked, then
    updated, so the caller learns exactly which acknowledgements took (the
    others were claimed again after their lease expired).
    """
    alias = _db(using)
    held_by = Q()
    for token, ids in held.items():
        held_by |= Q(lock_token=token, id__in=list(ids))
    now = clock.sql_now()
    with transaction.atomic(using=alias):
        mine = set(
            Message.objects.using(alias)
            .filter(held_by, status=Message.Status.RUNNING)
            .select_for_update()
            .values_list("id", flat=True)
        )
        if mine:
            Message.objects.using(alias).filter(id__in=list(mine)).update(
                status=Message.Status.SUCCEEDED,
                next_attempt_time=None,
                lock_token=None,
                finished_at=now,
                updated_at=now,
            )
    return mine


def fail(
    message_id: int,
    token: uuid.UUID,
    *,
    error: str,
    traceback: str = "",
    retry_at: datetime | None,
    retry_in: timedelta | None = None,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Record a failed attempt: reschedule, or give up if both times are None.

    ``retry_in`` is measured on the database's clock (what the worker uses);
    ``retry_at`` is an absolute instant.
    """
    now = clock.sql_now()
    changes: dict[str, object] = {
        "last_error": error,
        "error_fingerprint": fingerprint(error),
        "last_traceback": traceback,
        "lock_token": None,
        "updated_at": now,
    }
    if retry_in is not None:
        changes.update(
            status=Message.Status.PENDING, next_attempt_time=clock.sql_now_plus(retry_in)
        )
    elif retry_at is None:
        changes.update(status=Message.Status.FAILED, next_attempt_time=None, finished_at=now)
    else:
        changes.update(status=Message.Status.PENDING, next_attempt_time=retry_at)
    return _held([message_id], token, using, model).update(**_fit(model, changes))


def snooze(
    message_id: int,
    token: uuid.UUID,
    *,
    run_at: datetime | timedelta,
    max_attempts: int,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Reschedule without spending an attempt (``Retry``): raise the cap by one.

    ``run_at`` is an instant, or a delay measured on the database's clock.
    """
    when = clock.sql_now_plus(run_at) if isinstance(run_at, timedelta) else run_at
    return _held([message_id], token, using, model).update(
        **_fit(
            model,
            {
                "status": Message.Status.PENDING,
                "next_attempt_time": when,
                "lock_token": None,
                "max_attempts": max_attempts,
                "updated_at": clock.sql_now(),
            },
        )
    )


def release(
    ids: Iterable[Any],
    token: uuid.UUID,
    *,
    started: bool,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Give messages back for immediate redelivery (shutdown).

    Messages that were claimed but never started get their attempt back.
    """
    now = clock.sql_now()
    changes: dict[str, object] = {
        "status": Message.Status.PENDING,
        "next_attempt_time": now,
        "lock_token": None,
        "updated_at": now,
    }
    if not started:
        changes["attempt_count"] = Greatest(F("attempt_count") - 1, Value(0))
    return _held(ids, token, using, model).update(**_fit(model, changes))


def extend(
    ids: Iterable[Any],
    token: uuid.UUID,
    lease: timedelta,
    *,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Push the lease of messages still held; returns how many were still ours."""
    return _held(ids, token, using, model).update(
        **_fit(
            model,
            {"next_attempt_time": clock.sql_now_plus(lease), "updated_at": clock.sql_now()},
        )
    )


def write_payload(
    message_id: int, token: uuid.UUID, payload: object, *, using: str | None = None
) -> int:
    """Replace the payload of a message still held; returns 1 if it was ours.

    The Django Tasks backend keeps a task's outcome (return value, errors)
    beside its call in the payload; like every write of a worker, it is a
    compare-and-set on the lock token.
    """
    return _held([message_id], token, using).update(payload=payload, updated_at=clock.now())
