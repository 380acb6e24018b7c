"""Leases of held rows: given back, extended, read; dead workers' rows handed back.

A worker gives back what it claimed but will not run (:func:`release`) and
pushes the lease of what it runs (:func:`extend`), with the compare-and-set
on ``(id, lock_token)`` of every worker's change (``settle.update_held``); the
reads (:func:`held_ids`, :func:`states`) tell it whether an attempt is still
its own. The Tasks backend's payload writes are a held row's writes too
(:func:`write_payload`), and a live worker hands back the messages of dead
ones (:func:`release_workers`), and its own that no claim reply reached
(:func:`release_unheld`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, Expression, F, Model, Q, Value, When

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.status import Status
from django_delayq.store.columns import db_alias, has_column, model_field, rows_with_literals
from django_delayq.store.groups import wake
from django_delayq.store.queries import QueueQuerySet
from django_delayq.store.settle import ending, update_held


def release(
    ids: Iterable[Any],
    token: uuid.UUID,
    *,
    started: bool,
    using: str | None = None,
    model: type[Model] = Message,
) -> int:
    """Give rows back for immediate redelivery (shutdown).

    Rows that were claimed but never started get their attempt back. A row
    locked by an open transaction (a group of atomic handlers still running
    past the shutdown grace) is left alone: its transaction ends with the
    process, and the row comes back when its lease expires.
    """
    now = clock.sql_now()
    changes: dict[str, object] = {
        "status": Status.PENDING,
        "next_attempt_time": now,
        "lock_token": None,
        "updated_at": now,
    }
    if not started:
        # Not GREATEST(attempt_count - 1, 0): on MariaDB/MySQL the column is
        # unsigned, and 0 - 1 is an error there before GREATEST sees it.
        changes["attempt_count"] = Case(
            When(attempt_count__gt=0, then=F("attempt_count") - 1), default=Value(0)
        )
    return int(update_held(ids, token, changes, using=using, model=model, skip_locked=True))


def extend(
    ids: Iterable[Any],
    token: uuid.UUID,
    lease: timedelta,
    *,
    model: type[Model] = Message,
    using: str | None = None,
    wait: bool = False,
) -> set[Any]:
    """Push the lease of rows still held; returns the ids extended.

    Rows locked by another transaction are skipped rather than waited for,
    so the lease keeper never stalls behind an open transaction; ``wait``
    waits for them instead (the keeper's waiters, one row each: while one
    waits for a lock, no other worker's claim can take that row, which
    skips locked rows, and the extension lands the moment the lock goes).
    """
    changes = {
        "next_attempt_time": _lease_until(model, clock.sql_now_plus(lease)),
        "updated_at": clock.sql_now(),
    }
    return set(
        update_held(
            ids,
            token,
            changes,
            using=using,
            model=model,
            same_as=("extend", lease),
            skip_locked=not wait,
            returning=True,
        )
    )


def _lease_until(model: type[Model], expiry: Expression) -> Expression:
    """A lease ending at ``expiry``, written so that a waiting newer version keeps its time.

    ``next_attempt_time`` is when a row may next be claimed. While a newer
    version waits (``superseded_at``), that is the later of the lease and the
    new version's due time (``scheduled_time``, as enqueue's update wrote it):
    an extension must not pull it back to the lease alone, or a worker killed
    after it would have the new version run as soon as the lease lapsed.
    """
    if not has_column(model, "superseded_at"):
        return expiry
    return Case(
        When(
            Q(superseded_at__isnull=False, scheduled_time__gt=expiry),
            then=F("scheduled_time"),
        ),
        default=expiry,
        output_field=model_field(model, "next_attempt_time"),
    )


def held_ids(
    ids: Iterable[Any], token: uuid.UUID, *, using: str | None = None, model: type[Model] = Message
) -> set[Any]:
    """Which of ``ids`` are still running under ``token`` (a plain read, no lock)."""
    rows = model._base_manager.using(db_alias(using, model))
    held = rows.filter(pk__in=list(ids), lock_token=token, status=Status.RUNNING)
    return set(held.values_list("pk", flat=True))


@dataclass(frozen=True)
class RowState:
    """What a row says of the attempt that last claimed it (a plain read, no lock)."""

    status: str
    lock_token: uuid.UUID | None
    last_attempt_time: datetime | None

    def holds(self, token: uuid.UUID) -> bool:
        """Still running under ``token``: an outcome under it can still be written."""
        return self.status == Status.RUNNING and self.lock_token == token

    def ended(self, token: uuid.UUID, attempted_at: datetime | None) -> bool:
        """Ended by the attempt that was claimed at ``attempted_at`` (not claimed again
        since: a claim moves ``last_attempt_time``): its outcome was written, though its
        writer never heard back (a connection lost with the commit's reply)."""
        return (
            self.status != Status.RUNNING
            and self.lock_token != token
            and self.last_attempt_time is not None
            and self.last_attempt_time == attempted_at
        )


def states(
    ids: Iterable[Any], *, using: str | None = None, model: type[Model] = Message
) -> dict[Any, RowState]:
    """The :class:`RowState` of each of ``ids`` that still exists."""
    rows = model._base_manager.using(db_alias(using, model)).filter(pk__in=list(ids))
    found = rows.values_list("pk", "status", "lock_token", "last_attempt_time")
    return {pk: RowState(status, token, at) for pk, status, token, at in found}


def write_payload(
    message_id: int, token: uuid.UUID, payload: object, *, using: str | None = None
) -> int:
    """Replace the payload of a message still held; returns 1 if it was ours.

    The Django Tasks backend keeps a task's outcome (return value, errors)
    beside its call in the payload; like every write of a worker, it is a
    compare-and-set on the lock token.
    """
    changes = {"payload": payload, "updated_at": clock.now()}
    return int(update_held([message_id], token, changes, using=using, model=Message))


def release_workers(
    names: Collection[str],
    *,
    using: str | None = None,
    models: Collection[type[Model]] = (),
) -> dict[str, int]:
    """Hand back the running messages of these (dead) workers; returns counts by worker.

    ``models``: the ``QueueFields`` tables to look in beside the messages' (each
    on its own database): their rows a dead worker held came back only once
    their leases lapsed, long after its death was known.

    The messages become due at once and keep their attempt count
    (:func:`_hand_back`). Clearing the lock token fences off the "dead"
    worker should it only have been frozen.

    A row another transaction locks (a producer's upsert of its key, a bulk
    reprioritise) is skipped, never waited for: the live workers look for
    dead ones every heartbeat and hand it back once it is free. Waiting,
    one locked row held back every other row of that worker for as long as
    the lock lasted, and live workers releasing the same dead one at once
    deadlocked on MariaDB.
    """
    released: dict[str, int] = {}
    tables: dict[type[Model], None] = dict.fromkeys([Message, *models])
    for model in tables:
        alias = db_alias(using, model)
        for name in names:
            rows: QueueQuerySet[Any] = QueueQuerySet(model, using=alias).held_by([name])
            with transaction.atomic(using=alias):
                free = _unlocked(rows, alias)
                count = _hand_back(rows.filter(pk__in=free), alias, model) if free else 0
            if count:
                released[name] = released.get(name, 0) + count
    return released


def release_unheld(
    name: str,
    held: Callable[[], Collection[Any] | None],
    *,
    using: str | None = None,
    limit: int = 1000,
    model: type[Model] = Message,
) -> int:
    """Hand back the running messages (rows of ``model``) of this live worker that it
    does not hold and whose lease lapsed; returns how many.

    A claim whose commit's reply was lost (the connection cut as it
    committed) leaves its rows running under the worker's name, yet in no
    book: nothing runs them and nothing extends their leases, and since the
    worker lives, no claim takes them back (``queries.claimable_condition``).
    Under a global cap they held its places for good. A worker restarted
    under the name of one that died leaves the same.

    ``held`` returns every id the worker's book holds, or None while one of
    its claims is on its way into the book (then nothing is handed back: the
    caller asks again later). It is asked *after* the lapsed rows are read,
    so that a claim landing in between is either in the book or on its way
    (read first, a claim landing after it was handed back under its running
    attempt once a thread stalled for a lease). A row that left the book
    meanwhile has ended, or is handed back only if it is still running with
    its lease lapsed, which the update checks again.
    """
    alias = db_alias(using, model)
    lapsed: QueueQuerySet[Any] = (
        QueueQuerySet(model, using=alias)
        .held_by([name])
        .filter(next_attempt_time__lt=clock.sql_now())
    )
    candidates = {pk for (pk,) in rows_with_literals(lapsed.values_list("pk")[:limit], alias)}
    if not candidates:
        return 0
    holding = held()
    if holding is None:
        return 0
    unheld = candidates - set(holding)
    if not unheld:
        return 0
    # A row another transaction locks is skipped, never waited for: the keeper
    # calling this extends every other lease, and must not stall behind it.
    with transaction.atomic(using=alias):
        ids = _unlocked(lapsed.filter(pk__in=unheld), alias)
        return _hand_back(lapsed.filter(pk__in=ids), alias, model) if ids else 0


def _unlocked(rows: Any, alias: str) -> list[Any]:
    """The ids of ``rows`` no other transaction locks, locked now (in the caller's
    transaction). SQLite has no row locks: there they are read with the
    statement's constants written in, so that its partial indexes apply."""
    if connections[alias].vendor == "sqlite":
        return [pk for (pk,) in rows_with_literals(rows.values_list("pk"), alias)]
    return list(rows.select_for_update(skip_locked=True).values_list("pk", flat=True))


def _hand_back(rows: Any, alias: str, model: type[Model] = Message) -> int:
    """Make running ``rows`` due again at once, keeping their attempt count (the
    attempt was spent: a message that kills every worker that runs it still stops
    at ``max_attempts``); clearing the lock token fences off their holder."""
    handed_back: dict[str, Any] = {
        "status": Status.PENDING,
        "next_attempt_time": clock.sql_now(),
        "lock_token": None,
    }
    if has_column(model, "updated_at"):
        handed_back["updated_at"] = clock.sql_now()
    if has_column(model, "queue"):
        queues = set(rows.order_by().values_list("queue", flat=True).distinct())
    else:  # a QueueFields model is its own queue, its handler's
        from django_delayq.entity import queue_of

        queue = queue_of(model)
        queues = set() if queue is None else {queue}
    count = int(rows.update(**ending(model, handed_back)))
    if count:
        wake(queues, using=alias)
    return count
