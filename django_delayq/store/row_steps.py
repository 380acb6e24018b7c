"""Rows of ``QueueFields`` models in workflows: a row as a parent, and as a step.

A row takes part in a workflow through its *stand-in*: a message of the
queue ``delayq.row:<app label>.<model>`` whose key is the row's primary key,
created the first time the row is named in ``after=`` or scheduled ``after=``
others. The edges, their release and their cancellation are the stand-in's
(``store/dependencies.py``), so rows and messages wait for each other under
one set of rules, with the same exactly-once release; no worker consumes a
stand-in's queue. This module keeps a row and its stand-in in step:

* The row ends (succeeded, failed, cancelled): its stand-in ends with the
  same status, and what waits for it goes on. The worker that ran the row
  does it right after the outcome commits (``dependencies.settle_without_waiting``
  with the row's model); an operator's operation does it in its transaction;
  the sweep of every worker's maintenance does what a crash left undone.
* The stand-in is released (its parents have finished): the row is
  scheduled at the stand-in's due time, and the stand-in is held again: it
  ends when the row does.
* The stand-in is cancelled (a parent failed, ``on_parent_failure="cancel"``):
  the row is cancelled with the same error.
* The row is queued again after it finished (``schedule()``, the admin's
  retry): its stand-in is pending again, and the descendants its failure
  cancelled wait again (``dependencies.reopen``).
* The row is deleted: the sweep deletes its stand-in, and the children left
  with no parent to wait for go (``dependencies.orphaned``), as after an
  operator's delete of a message.

Rows and stand-ins must share a database (the queue's), and a row's primary
key must be an integer or text: it is the stand-in's key, compared with the
row's key in the sweep's statements.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import connections, models, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.functions import Cast

from django_delayq import clock
from django_delayq.models import STAND_IN_PREFIX, Message, QueueColumns
from django_delayq.routers import model_alias
from django_delayq.status import ACTIVE, FINISHED, Status
from django_delayq.store import dependencies
from django_delayq.store.columns import batches, rows_with_literals
from django_delayq.store.wakeup import notify

#: The start of every stand-in's queue (``enqueue`` refuses it).
PREFIX = STAND_IN_PREFIX

#: How long "this model has no stand-in" is believed before it is read again.
ABSENT_FOR = 1.0
#: How long "this model has stand-ins" is believed before it is read again.
PRESENT_FOR = 60.0
#: How often the sweep looks for rows still waiting whose stand-in was cancelled
#: (a worker that died between the two): a read of every stand-in of the model,
#: where the rest of the sweep reads only those still pending.
CANCELLED_EVERY = 600.0
#: Every sweep looks for the stand-ins cancelled this long ago or since whose rows
#: still wait: ``follow`` passes a row another transaction locks.
RECENTLY_CANCELLED = timedelta(seconds=60)

_INTEGER_KEYS = (models.AutoField, models.BigAutoField, models.SmallAutoField, models.IntegerField)


def queue_for(model: type[models.Model]) -> str:
    """The queue of ``model``'s stand-ins."""
    return PREFIX + model._meta.label_lower


def model_for(queue: str) -> type[models.Model] | None:
    """The model whose rows ``queue``'s stand-ins stand for, or None."""
    if not queue.startswith(PREFIX):
        return None
    try:
        model = apps.get_model(queue[len(PREFIX) :])
    except (LookupError, ValueError):
        return None
    return model if issubclass(model, QueueColumns) and model is not Message else None


def check_model(model: type[models.Model], using: str) -> None:
    """Refuse a model whose rows cannot take part in workflows, with the reason."""
    if model is Message or not issubclass(model, QueueColumns):
        raise TypeError(f"{model.__name__} has no queue columns (QueueFields)")
    pk = model._meta.pk
    if not isinstance(pk, _INTEGER_KEYS + (models.CharField,)):
        raise TypeError(
            f"{model._meta.label}: a row in a workflow needs an integer or text primary key, "
            f"not {type(pk).__name__}"
        )
    if model_alias(model, using) != model_alias(Message, using):
        raise ValueError(
            f"{model._meta.label}: a row in a workflow must be on the queue's database "
            f"({model_alias(Message, using)!r}), not {model_alias(model, using)!r}"
        )


def _key_ref(model: type[models.Model]) -> Any:
    """The stand-in's key (``OuterRef``) as the row's primary key type, for lookups by pk."""
    pk = model._meta.pk
    if isinstance(pk, models.CharField):
        return OuterRef("key")
    return Cast(OuterRef("key"), output_field=models.BigIntegerField())


def _stand_ins(model: type[models.Model], alias: str) -> QuerySet[Message]:
    return Message._base_manager.using(alias).filter(queue=queue_for(model))


def _rows(model: type[models.Model], alias: str) -> QuerySet[Any]:
    return model._base_manager.using(alias)


# -- whether a model has stand-ins -------------------------------------------------------

# (model, alias): whether a stand-in was there, and when that was read (monotonic).
_known: dict[tuple[type[models.Model], str], tuple[bool, float]] = {}


def in_use(model: type[models.Model], alias: str) -> bool:
    """Whether rows of ``model`` take part in workflows (a stand-in exists).

    Asked after every outcome of a row, so it is read at most once per
    :data:`ABSENT_FOR` while there is none; a stand-in created meanwhile by
    another process is seen by then, and what its row's end left undone in
    that time, the sweep does. Once there are some, it is read again every
    :data:`PRESENT_FOR` (retention may have pruned them all).
    """
    seen = _known.get((model, alias))
    if seen is not None:
        found, at = seen
        if time.monotonic() - at < (PRESENT_FOR if found else ABSENT_FOR):
            return found
    found = _stand_ins(model, alias).exists()
    _known[(model, alias)] = (found, time.monotonic())
    return found


def _seen(model: type[models.Model], alias: str) -> None:
    _known[(model, alias)] = (True, time.monotonic())


# -- a row named in after= ---------------------------------------------------------------


def stand_in_ids(rows: Sequence[models.Model], using: str) -> list[int]:
    """The stand-ins of ``rows`` (saved rows of ``QueueFields`` models), in order,
    created where missing: the parents ``after=`` waits for.

    A stand-in shows its row's state as it is now: finished with the row's
    status if the row has finished (its children then go at once), pending
    (held) if it has not; one left finished by an earlier run of a row queued
    again since is pending again. Run in the caller's transaction.
    """
    by_model: dict[type[models.Model], list[Any]] = {}
    for i, row in enumerate(rows):
        if row.pk is None:
            raise ValueError(f"after[{i}]: the {type(row).__name__} row was never saved")
        by_model.setdefault(type(row), []).append(row.pk)
    ids: dict[tuple[type[models.Model], str], int] = {}
    for model, pks in by_model.items():
        check_model(model, using)
        for chunk in batches(list(dict.fromkeys(pks))):
            ids.update(((model, key), pk) for key, pk in _ensure(model, chunk, using).items())
    return [ids[(type(row), str(row.pk))] for row in rows]


def _ensure(model: type[models.Model], pks: list[Any], alias: str) -> dict[str, int]:
    """Stand-ins of ``pks`` (one batch), created or brought up to date: key: id."""
    states = dict(_rows(model, alias).filter(pk__in=pks).values_list("pk", "status"))
    missing = [pk for pk in pks if pk not in states]
    if missing:
        raise ValueError(f"after: {model._meta.label} {missing[0]!r} does not exist")
    stand_ins = _stand_ins(model, alias)
    keys = {str(pk): status for pk, status in states.items()}
    found = {
        key: (pk, status)
        for key, pk, status in stand_ins.filter(key__in=list(keys)).values_list(
            "key", "pk", "status"
        )
    }
    now = clock.now()
    new = [
        Message(
            queue=queue_for(model),
            key=key,
            status=status if status in FINISHED else Status.PENDING,
            next_attempt_time=None,
            scheduled_time=now,
            finished_at=now if status in FINISHED else None,
        )
        for key, status in keys.items()
        if key not in found
    ]
    if new:
        Message._base_manager.using(alias).bulk_create(new, ignore_conflicts=True)
        _seen(model, alias)
    # One that exists but shows another state than its row's now.
    ended = {
        key: status
        for key, status in keys.items()
        if key in found and status in FINISHED and found[key][1] == Status.PENDING
    }
    for status in set(ended.values()):
        _end([found[k][0] for k, s in ended.items() if s == status], status, alias)
    again = [
        found[key][0]
        for key, status in keys.items()
        if key in found and status not in FINISHED and found[key][1] in FINISHED
    ]
    if again:
        _reopen(again, alias)
    return dict(stand_ins.filter(key__in=list(keys)).values_list("key", "pk"))


def _end(ids: list[int], status: str, alias: str, *, skip_locked: bool = False) -> int:
    """Stand-ins of rows that ended with ``status``: ended with it (those still pending).

    ``skip_locked`` (a worker's call, and the sweep's): a stand-in another
    transaction holds is passed, not waited for. A producer naming the row
    ``after=`` holds it until its commit (the stand-in is marked as having
    children), and the executor that ran the row would wait as long, its
    slot taken; the sweep ends it once the lock is gone.
    """
    now = clock.sql_now()
    rows = Message._base_manager.using(alias).filter(pk__in=ids, status=Status.PENDING)
    changes = {"status": status, "next_attempt_time": None, "finished_at": now, "updated_at": now}
    if not (skip_locked and connections[alias].features.has_select_for_update_skip_locked):
        return rows.update(**changes)
    with transaction.atomic(using=alias):
        free = list(rows.select_for_update(skip_locked=True).values_list("pk", flat=True))
        return rows.filter(pk__in=free).update(**changes) if free else 0


def _reopen(ids: list[int], alias: str) -> None:
    """Stand-ins of rows queued again after they finished: pending (held) again, and
    the descendants their failure cancelled waiting again."""
    Message._base_manager.using(alias).filter(pk__in=ids, status__in=list(FINISHED)).update(
        status=Status.PENDING,
        next_attempt_time=None,
        finished_at=None,
        last_error="",
        error_fingerprint="",
        updated_at=clock.sql_now(),
    )
    dependencies.reopen(ids, using=alias)


# -- a row as a step ---------------------------------------------------------------------


def make_steps(
    rows: QuerySet[Any], parents: list[int], policy: str, when: datetime, *, using: str
) -> list[Any]:
    """Make the selected rows (but those a worker holds) wait for ``parents``, then run
    at ``when``; returns their primary keys. Run in the caller's transaction.

    Each row is pending with no due time until its stand-in is released; a
    row that finished before starts a new round of attempts. A row already
    waiting for parents, or that finished as a step, cannot be made one again.
    """
    from django_delayq.store import queue_fields
    from django_delayq.store.queries import held_condition

    model = rows.model
    check_model(model, using)
    pks = list(rows.exclude(held_condition()).order_by().values_list("pk", flat=True))
    if not pks:
        return []
    stand_ins = _stand_ins(model, using)
    for chunk in batches(pks):
        taken = (
            stand_ins.filter(key__in=[str(pk) for pk in chunk])
            .exclude(on_parent_failure="")
            .values_list("key", flat=True)
            .first()
        )
        if taken is not None:
            raise ValueError(
                f"{model._meta.label} {taken} is a workflow's step already: a row waits "
                "for parents once"
            )
    queue_fields.schedule(_rows(model, using).filter(pk__in=pks), None)
    ids: list[int] = []
    for chunk in batches(pks):
        found = _ensure(model, chunk, using)
        ids += [found[str(pk)] for pk in chunk]
    # A message is new when it is given parents, so it cannot be an ancestor of
    # one; a row's stand-in may be one already (a parent named before).
    if _reaches(ids, set(parents), using):
        raise ValueError(
            f"{model._meta.label}: a row cannot wait for itself or for what waits for it "
            "(after= would make a cycle)"
        )
    for chunk in batches(ids):
        Message._base_manager.using(using).filter(pk__in=chunk).update(scheduled_time=when)
    dependencies.attach(ids, parents, policy, using=using)
    return pks


def _reaches(start: list[int], targets: set[int], alias: str) -> bool:
    """Whether any of ``targets`` is one of ``start`` or waits for one, down the graph."""
    from django_delayq.models import Dependency

    edges = Dependency.objects.using(alias)
    seen: set[int] = set()
    frontier = set(start)
    while frontier:
        if frontier & targets:
            return True
        seen |= frontier
        following: set[int] = set()
        for chunk in batches(sorted(frontier)):
            following.update(edges.filter(parent_id__in=chunk).values_list("child_id", flat=True))
        frontier = following - seen
    return False


# -- a row ended, or was queued again ------------------------------------------------------


def ended_parents(
    model: type[models.Model], pks: Collection[Any], alias: str, *, skip_locked: bool = False
) -> list[int]:
    """The stand-ins of those of ``pks`` that have ended (those still pending ended now,
    with their row's status): the parents whose edges end next. ``skip_locked``:
    see :func:`_end` (one passed stays pending: its edges stay open)."""
    if not pks or not in_use(model, alias):
        return []
    stand_ins = _stand_ins(model, alias)
    ids: list[int] = []
    for chunk in batches(list(pks)):
        states = dict(
            _rows(model, alias)
            .filter(pk__in=chunk, status__in=list(FINISHED))
            .values_list("pk", "status")
        )
        if not states:
            continue
        found = dict(stand_ins.filter(key__in=[str(pk) for pk in states]).values_list("key", "pk"))
        for status in set(states.values()):
            ended = [found[str(pk)] for pk, s in states.items() if s == status and str(pk) in found]
            _end(ended, status, alias, skip_locked=skip_locked)
        ids += found.values()
    return ids


def _ids_of(model: type[models.Model], pks: list[Any], alias: str, **where: Any) -> list[int]:
    """The ids of the stand-ins of rows ``pks`` (one batch) matching ``where``."""
    keys = [str(pk) for pk in pks]
    return list(_stand_ins(model, alias).filter(key__in=keys, **where).values_list("pk", flat=True))


def queued_again(model: type[models.Model], pks: Collection[Any], alias: str) -> None:
    """Rows of ``pks`` that finished were queued again: their stand-ins reopen."""
    if not pks or not in_use(model, alias):
        return
    for chunk in batches(list(pks)):
        ids = _ids_of(model, chunk, alias, status__in=list(FINISHED))
        if ids:
            _reopen(ids, alias)


def deleted(model: type[models.Model], pks: Collection[Any], alias: str) -> None:
    """Rows of ``pks`` were deleted: their stand-ins go (see :func:`_forget`)."""
    if not pks or not in_use(model, alias):
        return
    for chunk in batches(list(pks)):
        ids = _ids_of(model, chunk, alias)
        if ids:
            _forget(ids, alias)


def finished_rows(rows: QuerySet[Any]) -> list[Any]:
    """The primary keys of the selected rows that have finished, where their model's
    rows take part in workflows (else none: nothing to reopen)."""
    model = rows.model
    if model is Message or not in_use(model, rows.db):
        return []
    return list(rows.filter(status__in=list(FINISHED)).values_list("pk", flat=True))


# -- a stand-in released or cancelled ----------------------------------------------------


def follow(alias: str, ids: Iterable[int]) -> None:
    """Stand-ins of ``ids`` were released or cancelled: their rows follow them.

    A released one's row is scheduled at the stand-in's due time (if it is
    still waiting: pending with no due time), and the stand-in is held again
    until the row ends; a cancelled one's row is cancelled with its error. A row
    another transaction locks is passed (``_unlocked``): its stand-in stays
    released, or cancelled, for the sweep.
    """
    ids = sorted(set(ids))
    for chunk in batches(ids):
        with transaction.atomic(using=alias):
            _follow_batch(alias, chunk)


def _follow_batch(alias: str, ids: list[int]) -> None:
    stand_ins = Message._base_manager.using(alias).filter(pk__in=ids)
    found = list(
        stand_ins.values_list("pk", "queue", "key", "status", "next_attempt_time", "last_error")
    )
    released: list[int] = []
    for pk, queue, key, status, due, error in found:
        model = model_for(queue)
        if model is None:
            continue
        waiting = _rows(model, alias).filter(
            pk=key, status=Status.PENDING, next_attempt_time__isnull=True
        )
        if status == Status.CANCELLED:
            free = _unlocked(waiting, alias)
            if free:  # None: the application holds the row; the sweep cancels it later
                waiting.filter(pk__in=free).update(
                    status=Status.CANCELLED, last_error=error, lock_token=None
                )
        elif status == Status.PENDING and due is not None:
            free = _unlocked(waiting, alias)
            if free is None:
                continue  # the application holds the row: the sweep schedules it later
            if free and waiting.filter(pk__in=free).update(next_attempt_time=due):
                notify(connections[alias], queue_of_rows(model), due)
            released.append(pk)
    if released:
        stand_ins.filter(pk__in=released, status=Status.PENDING).update(next_attempt_time=None)


def _unlocked(rows: models.QuerySet[Any], alias: str) -> list[Any] | None:
    """The pks of ``rows``, locked now in the caller's transaction; None if another
    transaction locks one of them.

    The rows are the application's own, and it may hold one for as long as it
    likes (``select_for_update`` while it edits it): the worker that follows a
    release (the thread acknowledging, or an executor with its slot) waited
    for it, and nothing else of that worker ended meanwhile. Passed, it is
    followed by the sweep (``worker.maintenance``) once it is free.
    """
    if not connections[alias].features.has_select_for_update_skip_locked:
        return [pk for (pk,) in rows.values_list("pk")]
    free = list(rows.select_for_update(skip_locked=True).values_list("pk", flat=True))
    if not free and rows.exists():
        return None
    return free


def queue_of_rows(model: type[models.Model]) -> str:
    from django_delayq.entity import queue_of

    return queue_of(model) or model._meta.label_lower


# -- the sweep ---------------------------------------------------------------------------


def queue_models(alias: str) -> list[type[models.Model]]:
    """The project's ``QueueFields`` models on ``alias`` whose rows can be in workflows."""
    found: list[type[models.Model]] = []
    for model in apps.get_models():
        if model is Message or not issubclass(model, QueueColumns):
            continue
        if model._meta.abstract or model._meta.proxy or model_alias(model, None) != alias:
            continue
        if isinstance(model._meta.pk, _INTEGER_KEYS + (models.CharField,)):
            found.append(model)
    return found


def sweep(alias: str, *, skip_locked: bool = False) -> list[int]:
    """What a crash between a row's end (or its stand-in's release) and its follow-up left
    undone; returns the stand-ins it ended (their edges end with the sweep's).

    Per model with stand-ins: the pending stand-ins of rows that have ended
    end; those of rows that are gone are deleted, their children left to go
    on without them; released stand-ins schedule their rows; recently
    cancelled ones cancel rows still waiting.
    """
    ended: list[int] = []
    for model in queue_models(alias):
        if not in_use(model, alias):
            continue
        ended += _sweep_model(model, alias, skip_locked)
    return ended


# (model, alias): when the sweep last looked for cancelled stand-ins (monotonic).
_cancelled_read: dict[tuple[type[models.Model], str], float] = {}


def _sweep_model(model: type[models.Model], alias: str, skip_locked: bool) -> list[int]:
    """One model's part of :func:`sweep`. Its reads name their statuses as literals
    (``rows_with_literals``): SQLite uses a partial index only so, and without one
    each read went through every stand-in of the model."""
    stand_ins = _stand_ins(model, alias)
    row = _rows(model, alias).filter(pk=_key_ref(model))
    # Held, as a stand-in is but between its release and its row's schedule
    # (those are followed below, and held again): delayq_held_idx.
    held = stand_ins.filter(status=Status.PENDING, next_attempt_time__isnull=True)
    ended: list[int] = []
    for status in FINISHED:
        found = held.filter(Exists(row.filter(status=status))).values_list("pk")
        ids = [pk for (pk,) in rows_with_literals(found, alias)]
        if ids:
            _end(ids, status, alias, skip_locked=skip_locked)
            ended += ids
    gone = [pk for (pk,) in rows_with_literals(held.exclude(Exists(row)).values_list("pk"), alias)]
    if gone:
        _forget(gone, alias)
    # Released and not yet followed: due, in a queue no worker claims from.
    due = stand_ins.filter(status__in=list(ACTIVE), next_attempt_time__isnull=False)
    released = [
        pk
        for pk, status in rows_with_literals(due.values_list("pk", "status"), alias)
        if status == Status.PENDING
    ]
    waiting_row = row.filter(status=Status.PENDING, next_attempt_time__isnull=True)
    still = stand_ins.filter(status=Status.CANCELLED, on_parent_failure="cancel").filter(
        Exists(waiting_row)
    )
    now = time.monotonic()
    if now - _cancelled_read.get((model, alias), float("-inf")) >= CANCELLED_EVERY:
        _cancelled_read[(model, alias)] = now
    else:
        # Those cancelled lately only (delayq_finished_idx): a row its
        # application held as its stand-in was cancelled (follow) waits a
        # sweep, not CANCELLED_EVERY.
        still = still.filter(finished_at__gte=clock.sql_now_plus(-RECENTLY_CANCELLED))
    cancelled = [pk for (pk,) in rows_with_literals(still.values_list("pk"), alias)]
    follow(alias, [*released, *cancelled])
    return ended


def _forget(ids: list[int], alias: str) -> None:
    """Stand-ins of deleted rows: gone, with their edges; children left with no parent
    to wait for go on."""
    from django_delayq.models import Dependency

    with transaction.atomic(using=alias):
        children = sorted(
            set(
                Dependency.objects.using(alias)
                .filter(parent_id__in=ids)
                .values_list("child_id", flat=True)
            )
        )
        dependencies.forget(ids, using=alias)
        Message._base_manager.using(alias).filter(pk__in=ids).delete()
    if children:
        dependencies.orphaned(children, using=alias)


def row_of(message: Message) -> models.Model | None:
    """The row a stand-in stands for (None for any other message, or a row gone)."""
    model = model_for(message.queue)
    if model is None:
        return None
    alias = message._state.db or model_alias(Message, None)
    return _rows(model, alias).filter(pk=message.key).first()
