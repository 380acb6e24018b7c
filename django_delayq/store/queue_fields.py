"""Rows of ``QueueFields`` models, queued by the application: their queue columns.

A project's own model with ``entity.QueueFields`` carries the columns of
``models.QueueColumns``: the application queues its rows (:func:`schedule`,
:func:`schedule_row`, or :func:`mark_scheduled` for its own save), and a
row's plain ``save()`` writes every loaded column but those
(:func:`plain_save_fields`), which the store alone writes. ``entity.py``
calls these.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Case, F, Field, Model, QuerySet, Value, When

from django_delayq.models import QueueColumns
from django_delayq.status import FINISHED, Status
from django_delayq.store.columns import model_field
from django_delayq.store.queries import held_condition


def _scheduled(when: datetime | None) -> dict[str, Any]:
    return {
        "status": Status.PENDING,
        "next_attempt_time": when,
        "lock_token": None,
        "locked_by": "",
    }


def _rerun(value: Any, field: Field[Any, Any]) -> Case:
    """``value`` for a finished row, else the column as it is: a finished row queued
    again starts a new round of attempts (its last error goes with the old round)."""
    return Case(
        When(status__in=FINISHED, then=Value(value, output_field=field)),
        default=F(field.name),
        output_field=field,
    )


def schedule(rows: QuerySet[Any], when: datetime | None) -> int:
    """Queue the selected rows to run at ``when``, but the ones a worker holds
    (``None``: pending with no due time, as a workflow's step waiting for its
    parents is).

    A finished row starts again from its first attempt: with its old
    attempt count it would be claimed and given up at once, its handler
    never run.
    """
    model = rows.model
    restart = {
        name: _rerun(value, model_field(model, name))
        for name, value in (("attempt_count", 0), ("last_error", ""), ("last_traceback", ""))
    }
    # The restart first: MariaDB/MySQL evaluate SET from left to right, each
    # assignment seeing the ones before it, so after "status = 'pending'" no
    # row would look finished any more.
    return rows.exclude(held_condition()).order_by().update(**restart, **_scheduled(when))


def mark_scheduled(row: Model, when: datetime) -> None:
    """Set a row's queue columns to "queued at ``when``", for the caller's own save
    (which then writes them: see :func:`plain_save_fields`)."""
    marked = row.__dict__.setdefault(_MARKED, set())
    marked.update(_set_scheduled(row, when))


def _set_scheduled(row: Model, when: datetime) -> list[str]:
    """Set a row's queue columns to "queued at ``when``" in memory; their names."""
    changed = list(_scheduled(when))
    if getattr(row, "status", None) in FINISHED:
        row.attempt_count, row.last_error, row.last_traceback = 0, "", ""  # type: ignore[attr-defined]
        changed += ["attempt_count", "last_error", "last_traceback"]
    for name, value in _scheduled(when).items():
        setattr(row, name, value)
    return changed


def schedule_row(row: Model, when: datetime, *, using: str) -> bool:
    """Queue one row at ``when``; False if a worker holds it (or it is gone).

    A new row is saved whole; an existing one gets only the queue columns,
    with the same condition as :func:`schedule` (the row in memory then shows
    them, but a later plain save does not write them again: a worker may have
    claimed it by then).
    """
    if row._state.adding:
        mark_scheduled(row, when)
        row.save(using=using)
        return True
    if not schedule(type(row)._base_manager.using(using).filter(pk=row.pk), when):
        return False
    _set_scheduled(row, when)
    return True


# The attribute of a row naming the queue columns its caller's own save is to
# write (mark_scheduled).
_MARKED = "_delayq_queue_columns_to_save"


#: The columns of ``models.QueueColumns``: a row's place in the queue, written by
#: the store alone (a ``QueueFields`` row's plain ``save()`` leaves them out).
QUEUE_COLUMN_NAMES = frozenset(f.name for f in QueueColumns._meta.fields)


def plain_save_fields(row: Model) -> list[str]:
    """What a plain ``save()`` of an existing ``QueueFields`` row writes: its loaded
    columns but the queue columns (``QUEUE_COLUMN_NAMES``).

    The row in memory holds the queue columns as they were when it was
    loaded; a worker may have claimed or settled it since, and writing them
    back would undo that (the claim's token cleared, so its outcome is lost;
    a finished row running again). The queue columns that
    :func:`mark_scheduled` set for the caller's own save are written.
    """
    marked = row.__dict__.get(_MARKED, set())
    deferred = row.get_deferred_fields()
    return [
        field.name
        for field in type(row)._meta.concrete_fields
        if not field.primary_key
        and field.attname not in deferred
        and (field.name not in QUEUE_COLUMN_NAMES or field.name in marked)
    ]


def saved(row: Model) -> None:
    """The row was saved: what :func:`mark_scheduled` set is written."""
    row.__dict__.pop(_MARKED, None)
