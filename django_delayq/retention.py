"""Removing finished messages once their retention (``DELAYQ["RETENTION"]``) has passed.

The policy lives here; the bounded batched delete is ``store.retention.prune``.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django_delayq import clock
from django_delayq.conf import (
    MAX_PRUNE_BATCH_SIZE,
    check_count,
    check_max_delay,
    get_config,
    to_timedelta,
)
from django_delayq.store import retention as store_retention

#: The longest ``pause``: a hundred times as long as each batch took.
MAX_PRUNE_PAUSE = 100.0


def prune(
    *,
    older_than: timedelta | float | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    queues: list[str] | None = None,
    using: str | None = None,
    pause: float = 0.0,
) -> int:
    """Delete finished messages that finished more than ``older_than`` (``RETENTION``) ago.

    ``pause``: after each batch, wait this many times as long as the batch
    took. Deleting millions of rows as fast as the server goes competes with
    the workers for its disk and CPU (a claim's p99 went from 4 to 85 ms);
    ``delayq_prune`` waits as long as it deleted (``--pause 1``) unless told
    otherwise. The worker's own pruning paces itself by rounds instead
    (``worker.maintenance``).
    """
    config = get_config()
    name = "DELAYQ['RETENTION']" if older_than is None else "older_than"
    retention = to_timedelta(config["RETENTION"] if older_than is None else older_than, name)
    if retention < timedelta(0):
        raise ValueError(f"{name} must not be negative")
    check_max_delay(retention, name, older_than)
    size = check_count(
        config["PRUNE_BATCH_SIZE"] if batch_size is None else batch_size,
        "DELAYQ['PRUNE_BATCH_SIZE']" if batch_size is None else "batch_size",
        MAX_PRUNE_BATCH_SIZE,
    )
    if not 0 <= pause <= MAX_PRUNE_PAUSE:
        raise ValueError(f"pause must be from 0 to {MAX_PRUNE_PAUSE}, not {pause!r}")
    return store_retention.prune(
        clock.now() - retention,
        batch_size=size,
        max_batches=max_batches,
        queues=queues,
        using=using,
        between=(lambda took: time.sleep(took * pause)) if pause else None,
    )
