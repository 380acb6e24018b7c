"""Operators' changes: run now, retry, cancel, reschedule, reprioritise, delete, edit.

They are set-based updates of a queryset whose condition the caller chose
(``operations.py`` decides who is eligible), not a worker's compare-and-set
on its lock token. An edit of a message's content writes only the columns
edited (:func:`edit`).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db.models import Expression, F, Model, QuerySet

from django_delayq import clock
from django_delayq.exceptions import DelayQError
from django_delayq.models import Message
from django_delayq.status import Status
from django_delayq.store.columns import db_alias, fit, has_column


def run_now(rows: QuerySet[Any], now: datetime | Expression) -> int:
    """Make pending rows due now."""
    return rows.update(**fit(rows.model, {"next_attempt_time": now, "updated_at": now}))


def retry(rows: QuerySet[Any], extra_attempts: int, now: datetime | Expression) -> int:
    """Send finished rows back to pending, due now, with ``extra_attempts`` more attempts."""
    max_attempts = F("attempt_count") + extra_attempts
    return _set_status(rows, Status.PENDING, now, now, max_attempts=max_attempts, finished_at=None)


def cancel(rows: QuerySet[Any], now: datetime | Expression) -> int:
    """Finish waiting rows as ``cancelled``."""
    return _set_status(rows, Status.CANCELLED, None, now, finished_at=now)


def reschedule(rows: QuerySet[Any], when: datetime, now: datetime | Expression) -> int:
    """Make waiting rows pending, due at ``when``."""
    return _set_status(rows, Status.PENDING, when, now)


def _set_status(
    rows: QuerySet[Any],
    status: Status,
    due: datetime | Expression | None,
    now: datetime | Expression,
    **more: Any,
) -> int:
    """Give rows ``status``, due at ``due``, and ``more``: held by no worker (no lock
    token) and with no newer version waiting (``superseded_at``)."""
    changes = {
        "status": status,
        "next_attempt_time": due,
        **more,
        "lock_token": None,
        "superseded_at": None,
        "updated_at": now,
    }
    return rows.update(**fit(rows.model, changes))


def reprioritise(rows: QuerySet[Any], priority: int, now: datetime | Expression) -> int:
    """Set the priority of rows (inert while one runs; the worker never writes it)."""
    return rows.update(**fit(rows.model, {"priority": priority, "updated_at": now}))


def delete(rows: QuerySet[Any]) -> int:
    """Delete rows; returns how many of the queue table went."""
    _, per_model = rows.delete()
    return per_model.get(rows.model._meta.label, 0)


#: The columns that choose a message's handler and the limits it counts against
#: (a global concurrency cap counts the running messages of a queue, or of a
#: queue and kind): a running message's must not change under its worker.
SCOPE_COLUMNS = frozenset({"queue", "kind"})


class EditRefused(DelayQError):
    """An edit of :data:`SCOPE_COLUMNS` of a message that is running (or gone)."""


def edit(message: Model, fields: Collection[str], *, using: str | None = None) -> None:
    """Write an operator's edit of a message's content (not its state), and only those columns,
    so a concurrent worker's changes are kept.

    ``message``: a ``Message``, or a row of a ``QueueFields`` model (the
    admin's change form of either). An edit of its ``SCOPE_COLUMNS`` is one
    ``UPDATE`` that leaves a running message alone, and raises
    :class:`EditRefused` then, writing nothing: moved to another kind while
    it runs, a message would leave its kind's global concurrency cap a place
    free while its handler still runs (and take one in the other's), so the
    cap could be exceeded.
    """
    if not fields:
        return
    written = list(fields)
    if has_column(type(message), "updated_at"):
        message.updated_at = clock.now()  # type: ignore[attr-defined]
        written.append("updated_at")
    if not SCOPE_COLUMNS & set(fields):
        message.save(using=using, update_fields=written)
        return
    alias = using or message._state.db or db_alias(None, type(message))
    rows = type(message)._base_manager.using(alias).filter(pk=message.pk)
    values = {name: getattr(message, name) for name in written}
    if not rows.exclude(status=Status.RUNNING).update(**values):
        raise EditRefused(
            f"message {message.pk} is running (or was deleted): its "
            f"{' and '.join(sorted(SCOPE_COLUMNS & set(fields)))} cannot change while it runs"
        )


def replace_failed_payload(message_id: int, payload: Any, *, using: str) -> bool:
    """Replace a failed message's payload; False if it is not ``failed`` (any more)."""
    rows = Message.objects.using(using).filter(pk=message_id, status=Status.FAILED)
    return bool(rows.update(payload=payload, updated_at=clock.now()))
