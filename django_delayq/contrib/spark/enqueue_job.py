"""``delayq_pipeline enqueue``: one message per row of a data set, idempotently.

The job in three steps, all but the last read-only:

1. **Options and schema** are checked before Spark reads a row: the queue,
   kind and priority as ``enqueue`` checks them; the key, payload and run-at
   columns exist and have types JSON can hold.
2. **Every row is validated in the JVM** (a key that is null, empty, over 255
   characters or holds NUL; a NaN or an infinity, which JSON cannot hold; a
   NUL character, which PostgreSQL's JSON cannot store; a payload over
   ``MAX_PAYLOAD_SIZE``; a run-at value that is no timestamp). If more than
   ``max_reject_rate`` of the rows fail, the job stops with the first
   reason and nothing is written; otherwise the failing rows go to a rejects
   file and the rest go on. The rejects file is created new (``O_EXCL``,
   mode 0600, never through a symlink): a path where anything exists is
   refused before Spark starts, and one where something appeared since is
   refused by the create itself, still before any row is written.
3. **Each partition upserts its rows** through one connection
   (``dbapi.write_partition``): COPY into a temporary table, then one
   ``INSERT ... SELECT ... ON CONFLICT (queue, key)`` per 50,000 rows, each
   its own transaction with one NOTIFY (MariaDB/MySQL: multi-row inserts
   into the temporary table, ``INSERT IGNORE ... SELECT``, then with
   ``update`` ``ON DUPLICATE KEY UPDATE``). Keys make it idempotent: a
   retried task, or a re-run of the whole job, finds its rows already there.

**Workflow steps** (``--after-column``): each row may name its parents'
keys; the rows without parents are written as above, then the driver
writes the rest, each waiting for its parents (``steps.py``).

**Ordered groups** (``--group-column``): each row's group is that column's
value as text (null or empty: no group; over 200 characters or holding NUL:
a rejected row). The rows are repartitioned by group, so that all the rows
of a group are written by one task, one transaction after another, in
their input order: by ``--order-column`` (nulls last), then by the order
Spark read them in, which is each file's own order (Spark reads the files
of a directory in an order of its own, larger ones first). Their ids follow
that order, which is the order their group runs in. In each transaction,
after the insert, the rows that an earlier message of their group holds
back are marked held (``store.groups.hold_back_loaded``), as
``enqueue_many`` does. The claim keeps a group's order with or without it;
the hold keeps waiting messages out of the claim's way. It runs on the
executors, in the insert's transaction, rather than once from the driver
at the end: each commit then leaves what ``enqueue_many`` would (workers
start on the first rows while the rest load, and would otherwise step over
every waiting message until the end), and a job that dies midway leaves no
unheld rows behind for a last step that never ran.

Payloads are encoded by Spark's ``to_json`` in the JVM, so the Python
workers only stream three strings per row into COPY (re-encoding the few
whose floats Java wrote with an exponent, as ``enqueue`` writes them: see
``dbapi.write_partition``). JSON lines are the exception: Spark's schema
inference is not used at all (it changes the types of ragged input, drops
objects whose keys are ``""``, stops at keys that differ only in case), the
columns are the lines' top-level keys (``dbapi.scan_lines``) and each
payload is parsed from its line's own text by the rules of ``enqueue``
(``dbapi.decode_line``). A payload nested deeper than ``MAX_PAYLOAD_DEPTH``
is refused before anything is written: by its column's type (Parquet), or
as a rejected row (JSON lines).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from django_delayq import clock
from django_delayq.contrib.spark import PipelineError, check_seconds, database, dbapi, steps
from django_delayq.contrib.spark.rejects import (
    check_rejects_option,
    default_rejects_path,
    refuse_existing_rejects,
    write_rejects,
)
from django_delayq.contrib.spark.row_checks import prepare
from django_delayq.contrib.spark.sources import (
    FORMATS,
    check_schema,
    infer_format,
    is_url,
    read_source,
)
from django_delayq.contrib.spark.storage import java_message
from django_delayq.enqueuing import check_priority
from django_delayq.registry import validate_kind, validate_queue_name
from django_delayq.workflows import check_policy

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ON_CONFLICT = ("ignore", "update")
DEFAULT_MAX_REJECT_RATE = 0.01


@dataclass(frozen=True)
class EnqueueOptions:
    source: str
    queue: str
    format: str | None = None  # inferred from the file names when None
    key_column: str | None = None  # None: a SHA-256 of the whole row
    payload_columns: tuple[str, ...] | None = None  # None: every column
    kind: str = ""
    priority: int = 0
    delay: float | None = None  # seconds; every row due at start + delay
    run_at_column: str | None = None
    on_conflict: str = "ignore"
    partitions: int | None = None  # None: the source's own partitioning
    database: str | None = None
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE
    rejects_path: str | None = None  # None: beside the source
    group_column: str | None = None  # each row's ordered group; None: no groups
    order_column: str | None = None  # the order of a group's rows; None: as read
    after_column: str | None = None  # each row's parents' keys; None: no parents
    after_queue: str | None = None  # the parents' queue; None: the load's
    on_parent_failure: str = "cancel"


@dataclass(frozen=True)
class EnqueueSummary:
    source: str
    format: str
    queue: str
    rows: int  # rows read
    created: int
    updated: int
    ignored: int
    rejected: int
    rejects_path: str | None
    partitions: int
    transactions: int
    seconds: float  # from reading to the last commit (the session was already up)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def validate_options(options: EnqueueOptions) -> EnqueueOptions:
    """Everything that can be checked without Spark; returns the options completed."""
    try:
        validate_queue_name(options.queue)
        validate_kind(options.kind)
        check_priority(options.priority)
    except (TypeError, ValueError) as exc:
        raise PipelineError(str(exc)) from exc
    if options.delay is not None and options.run_at_column is not None:
        raise PipelineError("pass either --delay or --run-at-column, not both")
    check_seconds("--delay", options.delay)
    if options.on_conflict not in ON_CONFLICT:
        raise PipelineError(f"--on-conflict must be ignore or update, got {options.on_conflict!r}")
    if options.partitions is not None and options.partitions < 1:
        raise PipelineError(f"--partitions must be at least 1, got {options.partitions}")
    if not 0 <= options.max_reject_rate <= 1:
        raise PipelineError(f"--max-reject-rate must be from 0 to 1, got {options.max_reject_rate}")
    if options.payload_columns is not None and not options.payload_columns:
        raise PipelineError("--payload-columns names no column")
    if options.order_column is not None and options.group_column is None:
        raise PipelineError("--order-column orders the rows of each group: pass --group-column too")
    if options.after_column is None:
        if options.after_queue is not None:
            raise PipelineError("--after-queue names the parents' queue: pass --after-column too")
    else:
        try:
            check_policy(options.on_parent_failure)
            if options.after_queue is not None:
                validate_queue_name(options.after_queue)
        except (TypeError, ValueError) as exc:
            raise PipelineError(str(exc)) from exc
        if options.on_conflict == "update":
            raise PipelineError(
                "--after-column cannot be combined with --on-conflict update: a message's "
                "parents are set when it is created"
            )
        if options.group_column is not None:
            raise PipelineError(
                "--after-column cannot be combined with --group-column: the rows with "
                "parents are written after the rest, which would change their group's order"
            )
    if options.format is not None and options.format not in FORMATS:
        raise PipelineError(f"--format must be csv, parquet or json, got {options.format!r}")
    source = options.source
    if not is_url(source):
        if not os.path.exists(source):
            raise PipelineError(f"SOURCE {source} does not exist")
        if not os.access(source, os.R_OK) or (
            os.path.isdir(source) and not os.access(source, os.X_OK)
        ):
            raise PipelineError(f"SOURCE {source} is not readable")
    fmt = options.format or infer_format(source)
    alias = database.resolve_alias(options.database)
    if options.rejects_path is None:
        rejects = default_rejects_path(source)
    else:
        rejects = check_rejects_option(options.rejects_path)
    refuse_existing_rejects(rejects)
    return replace(options, format=fmt, database=alias, rejects_path=rejects)


# -- the job --------------------------------------------------------------------


def in_group_order(valid: DataFrame, options: EnqueueOptions) -> DataFrame:
    """``(key, payload, due, group)`` rows, each group's in one partition, in its order.

    Rows are spread by group (an ungrouped row by its key, so that rows
    without a group do not all land in one partition) over ``--partitions``
    partitions, else as many as the source had; within a partition they are
    sorted by ``--order-column`` (nulls last), then by the order they were
    read in, which is the order the partition's writer gives them ids in.
    """
    from pyspark.sql import functions as F

    count = options.partitions or valid.rdd.getNumPartitions()
    spread = F.when(F.col("group") != "", F.col("group")).otherwise(F.col("key"))
    order = [F.col("seq")]
    if options.order_column is not None:
        order.insert(0, F.col("sort").asc_nulls_last())
    return (
        valid.repartition(count, spread)
        .sortWithinPartitions(*order)
        .select("key", "payload", "due", "group")
    )


def run_enqueue(spark: SparkSession, options: EnqueueOptions) -> EnqueueSummary:
    """Validate, then enqueue every valid row; see the module docstring."""
    from pyspark.sql import functions as F

    options = validate_options(options)
    started = time.perf_counter()
    now = clock.now()
    fmt = str(options.format)
    alias = str(options.database)
    sc = spark.sparkContext
    source = read_source(spark, options)
    columns, payload = check_schema(source, options)
    prepared = prepare(source, options, columns, payload, now)
    if options.after_column is not None:
        prepared = steps.check_parents(spark, prepared, options)

    sc.setJobDescription(f"delayq enqueue: validate {options.source}")
    try:
        stats = prepared.agg(
            F.count(F.lit(1)).alias("rows"),
            F.count("reason").alias("rejected"),
            F.first(
                F.when(
                    F.col("reason").isNotNull(),
                    F.concat(F.col("reason"), F.lit(" in row "), F.substring("row", 1, 200)),
                ),
                ignorenulls=True,
            ).alias("first"),
        ).first()
    except Exception as exc:
        raise PipelineError(f"cannot read {options.source}: {java_message(exc)}") from exc
    assert stats is not None
    rows, rejected = int(stats["rows"]), int(stats["rejected"])
    if rejected and (rejected == rows or rejected > options.max_reject_rate * rows):
        raise PipelineError(
            f"{rejected} of {rows} row(s) of {options.source} are invalid, over "
            f"--max-reject-rate {options.max_reject_rate:g}; nothing was written. "
            f"First: {stats['first']}"
        )
    rejects_path = None
    if rejected:
        rejects_path = str(options.rejects_path)
        write_rejects(prepared, rejects_path, lines=source.lines)

    valid = prepared.filter(F.col("reason").isNull())
    with_parents = None
    if options.after_column is not None:
        valid, with_parents = steps.step_rows(valid)
    if options.group_column is not None:
        good = in_group_order(valid, options)
    else:
        good = valid.select("key", "payload", "due")
        if options.partitions:
            good = good.repartition(options.partitions)
    plan = database.load_plan(
        alias,
        queue=options.queue,
        kind=options.kind,
        priority=options.priority,
        on_conflict=options.on_conflict,
        now=now,
        grouped=options.group_column is not None,
    )
    sc.setJobDescription(f"delayq enqueue: write {rows - rejected} rows to {options.queue}")
    rdd = good.rdd
    results = rdd.mapPartitions(functools.partial(dbapi.write_partition, plan)).collect()
    total = [sum(r[i] for r in results) for i in range(6)]
    stepped = dbapi.LoadCounts()
    if with_parents is not None:
        sc.setJobDescription(f"delayq enqueue: write the rows with parents to {options.queue}")
        stepped = steps.write_steps(with_parents, options)
    sc.setJobDescription(None)  # type: ignore[arg-type]
    return EnqueueSummary(
        source=options.source,
        format=fmt,
        queue=options.queue,
        rows=rows,
        created=total[1] + stepped.created,
        updated=total[2],
        ignored=total[3] + stepped.ignored,
        rejected=rejected,
        rejects_path=rejects_path,
        partitions=rdd.getNumPartitions(),
        transactions=total[4] + stepped.transactions,
        seconds=time.perf_counter() - started,
    )
