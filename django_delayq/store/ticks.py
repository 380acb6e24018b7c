"""Cron ticks: installed ticks deleted, cancelled (missed) or missed when claimed late.

``cron/install.py`` removes the ticks that a schedule no longer wants and
cancels the missed ones (:func:`delete_ticks`, :func:`cancel_ticks`), in
statements that leave alone a tick a worker claimed meanwhile; a worker that
claimed a tick past its grace cancels it instead of running it
(:func:`miss_tick`, ``cron/missed.py``). New ticks are enqueued
(``store.write``).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from django.db import transaction

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.status import Status
from django_delayq.store.columns import batches
from django_delayq.store.settle import update_held


def delete_ticks(ids: Collection[int], *, using: str) -> int:
    """Delete cron ticks that are still pending and were never attempted.

    The condition is in the statement: a tick a worker claimed meanwhile
    (now running) is left alone.
    """
    if not ids:
        return 0
    rows = Message.objects.using(using).untouched()
    with transaction.atomic(using=using):
        return sum(rows.filter(id__in=chunk).delete()[0] for chunk in batches(list(ids)))


def miss_tick(message_id: int, token: uuid.UUID, *, reason: str, using: str) -> int:
    """Cancel a cron tick a worker claimed past its grace, instead of running it;
    returns 1 if it was still held under ``token``.

    It ends as :func:`cancel_ticks` leaves a missed tick: never attempted
    (the claim's attempt is given back, and its start time, which was this
    claim's), so the schedule's last run stays the last one that ran.
    """
    changes = {
        **_missed(reason, clock.sql_now()),
        "lock_token": None,
        "attempt_count": 0,
        "last_attempt_time": None,
    }
    return int(update_held([message_id], token, changes, using=using, model=Message))


def cancel_ticks(ids: Collection[int], *, reason: str, now: datetime, using: str) -> int:
    """Cancel cron ticks that are still pending and were never attempted (missed ticks)."""
    rows = Message.objects.using(using).untouched()
    changes = _missed(reason, now)
    with transaction.atomic(using=using):
        return sum(rows.filter(id__in=chunk).update(**changes) for chunk in batches(list(ids)))


def _missed(reason: str, now: object) -> dict[str, object]:
    """A missed tick's end: cancelled now, with the reason as its error."""
    return {
        "status": Status.CANCELLED,
        "next_attempt_time": None,
        "finished_at": now,
        "updated_at": now,
        "last_error": reason,
    }
