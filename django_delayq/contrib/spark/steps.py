"""``delayq_pipeline enqueue --after-column``: rows that are workflow steps.

Each row may name the keys of its parents (one key, or an array of keys,
of messages of ``--after-queue``, by default the load's queue); its message
then runs only once they have finished, as ``enqueue(..., after=...)``
would make it. A parent must exist when its child is written, so a cycle
cannot be written:

- **Checked before anything is written** (:func:`check_parents`): each parent
  is a message already in the database, or a valid row of this load that
  names no parents itself. A row naming anything else is a rejected row,
  with the parent it names. The parents outside the load are read from the
  database by the driver, a few thousand keys per query.
- **Written in two steps**: the rows without parents first, by the
  executors, as any load writes them; then the rows with parents, by the
  driver (:func:`write_steps`), in input order, 1,000 rows per transaction,
  through ``enqueue_many`` and the store's ``attach_each``: the same
  statements, checks and release as ``enqueue(..., after=...)``, so a
  parent that has finished meanwhile releases (or cancels) its child at
  once. The driver writes a few thousand steps a second; rows without
  parents go at the executors' speed.

A job that stops between the two steps, or in the middle of the second,
leaves each step either written with all its parents or not written: a new
run of the same job ignores what is there (``--on-conflict ignore``, the
only choice with parents: a message's parents are set when it is created)
and writes the rest.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from itertools import groupby, islice
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from django_delayq.contrib.spark import PipelineError
from django_delayq.contrib.spark.dbapi import LoadCounts
from django_delayq.workflows import ids_by_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from django_delayq.contrib.spark.enqueue_job import EnqueueOptions

#: Rows with parents written per transaction by :func:`write_steps`.
STEP_CHUNK = 1_000


def parent_queue(options: EnqueueOptions) -> str:
    return options.after_queue or options.queue


def check_parents(spark: SparkSession, prepared: DataFrame, options: EnqueueOptions) -> DataFrame:
    """``prepared`` with each valid row that names a parent that will not exist rejected.

    A parent exists when its child is written if it is a message of the
    parents' queue now, or a valid row of this load without parents (those
    are written first). One Spark job finds the parents that are neither in
    the load; the driver looks them up in the database.
    """
    from pyspark.sql import functions as F

    queue = parent_queue(options)
    roots, children = step_rows(prepared.filter(F.col("reason").isNull()))
    edges = children.select("seq", F.explode("parents").alias("parent"))
    outside = edges.select("parent").distinct()
    if queue == options.queue:
        named_here = roots.select(F.col("key").alias("parent")).distinct()
        outside = outside.join(named_here, "parent", "left_anti")
    spark.sparkContext.setJobDescription(f"delayq enqueue: the parents in {options.source}")
    named = [row["parent"] for row in outside.toLocalIterator()]
    existing = ids_by_key(queue, named, str(options.database))
    missing = [key for key in named if key not in existing]
    if not missing:
        return prepared
    gone = spark.createDataFrame([(key,) for key in missing], "parent string")
    first = (
        edges.join(F.broadcast(gone), "parent")
        .groupBy("seq")
        .agg(F.min("parent").alias("_missing"))
    )
    reason = F.concat(
        F.lit(f"after column {options.after_column!r} names parent '"),
        F.col("_missing"),
        F.lit(
            f"', which is no message of queue {queue!r} and no row of this load without "
            "parents of its own (a load writes those first; load later steps of a chain "
            "in a later run)"
        ),
    )
    named_gone = F.when(F.col("_missing").isNotNull(), reason)
    return (
        prepared.join(first, "seq", "left")
        .withColumn("reason", F.coalesce(F.col("reason"), named_gone))
        .drop("_missing")
    )


def _due(text: str) -> datetime:
    """A row's due time (``row_checks.prepare``'s text) as ``enqueue_many`` takes it."""
    due = datetime.fromisoformat(text)
    if due.tzinfo is None:  # SQLite, MariaDB/MySQL: naive UTC
        due = due.replace(tzinfo=UTC)
    return due if settings.USE_TZ else timezone.make_naive(due)


def write_steps(steps: DataFrame, options: EnqueueOptions) -> LoadCounts:
    """Write the valid rows with parents, in input order, a chunk per transaction."""
    from django_delayq.enqueuing import Outcome, enqueue_many
    from django_delayq.store.dependencies import attach_each

    queue, alias = parent_queue(options), str(options.database)
    counts = LoadCounts()
    rows = steps.orderBy("seq").select("key", "payload", "due", "parents").toLocalIterator()
    while chunk := list(islice(rows, STEP_CHUNK)):
        with transaction.atomic(using=alias):
            named = list(dict.fromkeys(p for row in chunk for p in row["parents"]))
            ids = ids_by_key(queue, named, alias)
            parents_of: dict[int, list[int]] = {}
            for due, same in groupby(chunk, key=lambda row: row["due"]):
                batch = list(same)
                results = enqueue_many(
                    options.queue,
                    [json.loads(row["payload"]) for row in batch],
                    keys=[row["key"] for row in batch],
                    kind=options.kind,
                    priority=options.priority,
                    run_at=_due(due),
                    on_conflict="ignore",
                    using=alias,
                )
                for row, result in zip(batch, results, strict=True):
                    if result.outcome is not Outcome.CREATED:
                        continue
                    gone = [p for p in row["parents"] if p not in ids]
                    if gone:
                        raise PipelineError(
                            f"parent {queue}/{gone[0]} of row {row['key']!r} was deleted "
                            "during the load; the rows written before stay, and a new run "
                            "writes the rest"
                        )
                    parents_of[result.message.pk] = [ids[p] for p in row["parents"]]
            attach_each(parents_of, options.on_parent_failure, using=alias)
        counts.add(len(chunk), created=len(parents_of), updated=0)
    return counts


def step_rows(valid: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The valid rows without parents (the executors') and those with (the driver's)."""
    from pyspark.sql import functions as F

    has = F.size("parents") > 0
    return valid.filter(~has), valid.filter(has)


__all__ = ["STEP_CHUNK", "check_parents", "step_rows", "write_steps"]
