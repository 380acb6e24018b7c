"""Removing finished messages once their retention has passed.

Deletes go in bounded batches by primary key, so pruning a large backlog
never holds long locks or one huge transaction on a table workers claim from.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import router

from django_delayq import clock
from django_delayq.conf import check_max_delay, get_config, to_timedelta
from django_delayq.models import Message


def prune(
    *,
    older_than: timedelta | float | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    queues: list[str] | None = None,
    using: str | None = None,
) -> int:
    """Delete finished messages that finished more than ``older_than`` ago."""
    config = get_config()
    name = "DELAYQ['RETENTION']" if older_than is None else "older_than"
    retention = to_timedelta(config["RETENTION"] if older_than is None else older_than, name)
    if retention < timedelta(0):
        raise ValueError(f"{name} must not be negative")
    check_max_delay(retention, name, older_than)
    batch = int(batch_size or config["PRUNE_BATCH_SIZE"])
    alias = using or router.db_for_write(Message)
    cutoff = clock.now() - retention
    expired = (
        Message.objects.using(alias).finished().in_queues(queues).filter(finished_at__lt=cutoff)
    )
    total = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        ids = list(expired.order_by().values_list("id", flat=True)[:batch])
        if not ids:
            break
        deleted, _ = expired.filter(id__in=ids).delete()
        total += deleted
        batches += 1
    return total
