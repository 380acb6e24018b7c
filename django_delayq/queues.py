"""Pausing and resuming queues.

A paused queue keeps accepting messages; workers just stop claiming from it
(within one poll interval: they read the paused set at most that often) and
log the transition. Messages a worker already holds run to completion.
The state lives in ``QueueState``, one row per queue ever paused.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction

from django_delayq import clock
from django_delayq.models import QueueState
from django_delayq.registry import validate_queue_name
from django_delayq.routers import queue_alias


def pause_queue(queue: str, *, by: str = "", reason: str = "", using: str | None = None) -> bool:
    """Stop workers claiming from ``queue``; False if it was already paused.

    The name is checked like ``enqueue``'s (a queue need not have a handler here).

    Pausing a paused queue changes nothing (it keeps its first ``paused_at``,
    ``paused_by`` and ``reason``).
    """
    queue = validate_queue_name(queue)
    for name, text in (("reason", reason), ("by", by)):
        if "\x00" in text:  # PostgreSQL's text cannot hold it
            raise ValueError(f"{name} contains a NUL character (\\x00)")
    alias = queue_alias(using)
    now = clock.now()
    changes = {
        "paused": True,
        "paused_at": now,
        "paused_by": by[:150],
        "reason": reason[:255],
        "updated_at": now,
    }
    with transaction.atomic(using=alias):
        state, created = QueueState.objects.using(alias).get_or_create(
            queue=queue, defaults=changes
        )
        if created:
            return True
        # Guarded by paused=False, so two operators pausing at once make one change.
        return bool(
            QueueState.objects.using(alias).filter(pk=state.pk, paused=False).update(**changes)
        )


def resume_queue(queue: str, *, using: str | None = None) -> bool:
    """Let workers claim from ``queue`` again; False if it was not paused."""
    queue = validate_queue_name(queue)
    alias = queue_alias(using)
    return bool(
        QueueState.objects.using(alias)
        .filter(queue=queue, paused=True)
        .update(paused=False, paused_at=None, paused_by="", reason="", updated_at=clock.now())
    )


def paused_queues(queues: Iterable[str] | None = None, *, using: str | None = None) -> set[str]:
    """The paused queues among ``queues`` (all paused queues if None)."""
    rows = QueueState.objects.using(queue_alias(using, read=True)).filter(paused=True)
    if queues is not None:
        rows = rows.filter(queue__in=list(queues))
    return set(rows.values_list("queue", flat=True))


def queue_states(
    queues: Iterable[str] | None = None, *, using: str | None = None
) -> dict[str, QueueState]:
    """The stored state of each queue that has one (paused or resumed)."""
    rows = QueueState.objects.using(queue_alias(using, read=True)).all()
    if queues is not None:
        rows = rows.filter(queue__in=list(queues))
    return {state.queue: state for state in rows}
