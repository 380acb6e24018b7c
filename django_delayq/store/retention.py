"""Pruning: finished messages deleted once their retention passed, and archived rows.

The policy (how long a message is kept, how many rows a batch deletes) is
``django_delayq/retention.py``'s; the deletes are here, bounded and batched.
The Spark pipeline's archive deletes the rows it archived that are still at
their archived version, with the statements of :func:`archived_delete`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from django.db import transaction

from django_delayq.models import Message
from django_delayq.store.columns import batches, db_alias, rows_with_literals
from django_delayq.store.dependencies import forget, in_workflows, needed
from django_delayq.store.features import features
from django_delayq.store.sql import statement


def prune(
    cutoff: datetime,
    *,
    batch_size: int,
    max_batches: int | None = None,
    queues: Collection[str] | None = None,
    using: str | None = None,
    between: Callable[[float], None] | None = None,
) -> int:
    """Delete finished messages that finished before ``cutoff``, ``batch_size`` at a time.

    ``between`` is called after each full batch that another may follow,
    with the seconds it took (the caller's pacing: ``retention.prune``'s
    ``pause``).

    Deletes go in bounded batches by primary key, so pruning a large backlog
    never holds long locks or one huge transaction on a table workers claim
    from (``delayq_finished_idx`` finds them). A batch larger than a
    statement binds (``PRUNE_BATCH_SIZE`` is any positive number) is deleted
    ``IN_BATCH`` ids at a time, in one transaction.
    """
    alias = db_alias(using)
    # A parent stays while a child that needs it (its result) may still run.
    expired = needed(Message.objects.using(alias).in_queues(queues).expired(cutoff))
    total = rounds = 0
    while max_batches is None or rounds < max_batches:
        began = time.monotonic()
        # On SQLite with its constants written in: bound, they kept the read
        # from delayq_finished_idx, and every round read the whole table.
        found = rows_with_literals(
            expired.order_by()
            .annotate(steps=in_workflows())
            .values_list("id", "steps")[:batch_size],
            alias,
        )
        ids = [pk for pk, _ in found]
        if not ids:
            break
        with transaction.atomic(using=alias):
            for chunk in batches(ids):
                total += expired.filter(id__in=chunk).delete()[0]
            # A workflow's finished steps take their edges with them.
            steps = [pk for pk, step in found if step]
            if steps:
                forget(steps, using=alias)
        rounds += 1
        more = len(ids) == batch_size and (max_batches is None or rounds < max_batches)
        if more and between is not None:
            between(time.monotonic() - began)
    return total


def archived_delete(connection: Any) -> dict[str, str]:
    """The statements that delete archived rows still at their archived version (Spark)."""
    can = features(connection)
    table = connection.ops.quote_name(Message._meta.db_table)
    if can.array_parameters:
        return {
            "delete_sql": statement("delete_archived", can).format(table=table),
            "count_sql": statement("count_ids", can).format(table=table),
        }
    return {
        "delete_sql": statement("delete_ids", can).format(table=table),
        "select_sql": statement("archived_versions", can).format(table=table),
    }
