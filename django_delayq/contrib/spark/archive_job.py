"""``delayq_pipeline archive``: finished messages to Parquet, verified, then deleted.

It never deletes a row it has not durably written. A run goes through these
steps, each recorded in a journal under ``DEST/_delayq/runs/<run>/``:

1. ``run.json``: the run exists, and which database it belongs to.
2. **Stage**: the selected rows are read through JDBC (in parallel, by id
   range) and written as Parquet (zstd) partitioned by ``queue`` and finish
   ``date`` under ``<run>/staging``; the write itself counts the rows and
   checksums their ids (``DataFrame.observe``), so what is verified is what
   was read, not a second read of a table that may have moved on.
3. **Verify**: the staged files are read back; their row count and id
   checksums must equal the write's.
4. ``plan.json`` lists the files; **publish** renames each into
   ``DEST/queue=.../date=.../`` (same file system: atomic per file).
   Files are written mode 0600 and the directories the run creates 0700
   (``storage``): the archive holds payloads and errors.
5. ``published.json``; **delete** exactly the archived rows, each only if
   it is still the version archived (``dbapi.delete_partition``): a message
   retried from the admin meanwhile stays.
6. ``done.json``.

A run interrupted anywhere leaves every row in the table, in the archive, or
both, never neither. The next run first rolls its database's unfinished runs
forward: one without a plan is discarded (nothing of it was published or
deleted); one with a plan is published and deleted to the end. Only then does
it select, so rows archived by the interrupted run are not archived twice. A
lock per database (``database.archive_lock``) keeps two runs apart; it is
checked before each step that writes the plan, publishes, deletes or closes
the journal, and a run that lost it (its PostgreSQL connection ended, say)
stops there with :class:`database.ArchiveLockLost`, for the next run to
complete.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Count, Max, Min

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.contrib.spark import (
    PipelineError,
    check_seconds,
    database,
    dbapi,
    jdbc,
    session,
)
from django_delayq.contrib.spark.storage import Storage
from django_delayq.exceptions import DelayQError
from django_delayq.models import Dependency, Message
from django_delayq.registry import validate_queue_name
from django_delayq.store.dependencies import needed
from django_delayq.store.features import features

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FINISHED = tuple(str(s) for s in Message.FINISHED_STATUSES)
JOURNAL = "_delayq/runs"
# Hook points (tests stop a run at each of them).
STAGES = ("staged", "verified", "planned", "publishing", "published", "deleted")

StageHook = Callable[[str], None]
# The run's lock check (``ArchiveLock.check``), given the step about to start.
LockCheck = Callable[[str], None]


class ArchiveError(DelayQError):
    """The archive could not be verified or published; nothing was deleted."""


@dataclass(frozen=True)
class ArchiveOptions:
    dest: str
    older_than: float | None = None  # seconds; None: DELAYQ["RETENTION"]
    queues: tuple[str, ...] = ()  # empty: every queue
    statuses: tuple[str, ...] = FINISHED
    dry_run: bool = False
    database: str | None = None


@dataclass(frozen=True)
class ArchiveSummary:
    dest: str
    cutoff: datetime
    archived: int  # rows written and verified by this run
    deleted: int  # of them, deleted from the table
    kept: int  # archived but left in the table: they changed since they were read
    recovered_runs: int = 0  # interrupted earlier runs completed first
    recovered_deleted: int = 0
    run_id: str | None = None
    seconds: float = 0.0
    dry_run: bool = False
    # Dry run: what would move, per queue: (count, first finish, last finish).
    by_queue: dict[str, tuple[int, datetime, datetime]] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.archived / self.seconds if self.seconds > 0 else 0.0


def validate_options(options: ArchiveOptions) -> ArchiveOptions:
    if not options.dest:
        raise PipelineError("--dest is required")
    check_seconds("--older-than", options.older_than)
    unknown = [s for s in options.statuses if s not in FINISHED]
    if unknown or not options.statuses:
        raise PipelineError(
            f"--status takes finished statuses only ({', '.join(FINISHED)}), got "
            f"{', '.join(unknown) or 'none'}"
        )
    for queue in options.queues:
        try:
            validate_queue_name(queue)
        except (TypeError, ValueError) as exc:
            raise PipelineError(str(exc)) from exc
    return replace(options, database=database.resolve_alias(options.database))


def cutoff_for(options: ArchiveOptions) -> datetime:
    retention = to_timedelta(
        get_config()["RETENTION"] if options.older_than is None else options.older_than
    )
    return clock.now() - retention


def _selection(options: ArchiveOptions, cutoff: datetime) -> Any:
    alias = str(options.database)
    return needed(
        Message.objects.using(alias)
        .filter(status__in=list(options.statuses), finished_at__lt=cutoff)
        .in_queues(list(options.queues))
    )


def _where_sql(options: ArchiveOptions, cutoff: datetime) -> str:
    """The selection as SQL for the JDBC query (values validated above, so inlined)."""
    connection = connections[str(options.database)]
    qn = connection.ops.quote_name

    def literal(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    if features(connection).naive_datetimes:  # the text Django stores: the ORM's comparison
        cut = literal(str(connection.ops.adapt_datetimefield_value(cutoff)))
    else:  # an instant with its offset, as the column's own values are
        cut = f"{literal(cutoff.isoformat())}::timestamptz"
    parts = [
        f"{qn('status')} IN ({', '.join(literal(s) for s in options.statuses)})",
        f"{qn('finished_at')} < {cut}",
    ]
    if options.queues:
        parts.append(f"{qn('queue')} IN ({', '.join(literal(q) for q in options.queues)})")
    # A workflow's parent stays while a child that needs it may still run:
    # waiting, running, or failed or cancelled (a retry runs it again), as
    # pruning keeps it (store.dependencies.needed).
    table = qn(Message._meta.db_table)
    parts.append(
        f"NOT ({qn('has_children')} AND EXISTS (SELECT 1 FROM {qn(Dependency._meta.db_table)} d"
        f" JOIN {table} c ON c.{qn('id')} = d.{qn('child_id')}"
        f" WHERE d.{qn('parent_id')} = {table}.{qn('id')}"
        f" AND c.{qn('status')} <> 'succeeded'))"
    )
    return " AND ".join(parts)


# -- dry run (no Spark) --------------------------------------------------------


def dry_run(options: ArchiveOptions) -> ArchiveSummary:
    """What a run would archive now; and, for a local DEST, unfinished runs it would complete."""
    options = validate_options(options)
    cutoff = cutoff_for(options)
    rows = (
        _selection(options, cutoff)
        .order_by()
        .values("queue")
        .annotate(n=Count("id"), first=Min("finished_at"), last=Max("finished_at"))
    )
    by_queue = {r["queue"]: (r["n"], r["first"], r["last"]) for r in rows}
    pending = 0
    journal = os.path.join(options.dest, *JOURNAL.split("/"))
    if "://" not in options.dest and os.path.isdir(journal):
        pending = sum(
            1
            for run in os.listdir(journal)
            if os.path.exists(os.path.join(journal, run, "plan.json"))
            and not os.path.exists(os.path.join(journal, run, "done.json"))
        )
    return ArchiveSummary(
        dest=options.dest,
        cutoff=cutoff,
        archived=sum(n for n, _, _ in by_queue.values()),
        deleted=0,
        kept=0,
        recovered_runs=pending,
        dry_run=True,
        by_queue=by_queue,
    )


# -- the run ----------------------------------------------------------------------


class _Run:
    """One run's journal and steps; also how an interrupted run is rolled forward."""

    def __init__(
        self, spark: SparkSession, storage: Storage, alias: str, run_id: str, check: LockCheck
    ) -> None:
        self.spark = spark
        self.storage = storage
        self.alias = alias
        self.id = run_id
        self.check = check  # raises if the run's lock is gone; before each destructive step
        self.dir = f"{JOURNAL}/{run_id}"
        self.staging = f"{self.dir}/staging"

    def path(self, name: str) -> str:
        return f"{self.dir}/{name}"

    def stage(self, df: DataFrame) -> dict[str, Any]:
        """Write ``df`` to staging; the write's own count and id checksums."""
        from pyspark.sql import Observation

        observation = Observation(f"delayq_archive_{self.id.replace('-', '_')}")
        observed = df.observe(observation, *_checksums())
        (
            observed.write.mode("errorifexists")
            .partitionBy("queue", "date")
            .option("compression", "zstd")
            .parquet(self.storage.uri(self.staging))
        )
        # Private before anything is published (a session this command did not
        # start may have written them with a wider umask): in the run's private
        # directory until then.
        self.storage.make_private(self.staging)
        return _normalise(observation.get)

    def verify(self, expected: dict[str, Any]) -> None:
        staged = self.spark.read.schema(jdbc.archive_schema()).parquet(
            self.storage.uri(self.staging)
        )
        row = staged.agg(*_checksums()).first()
        found = _normalise(row.asDict() if row is not None else {})
        if found != expected:
            raise ArchiveError(
                f"staged archive does not match what was read (read {expected}, "
                f"staged {found}); nothing was deleted"
            )

    def publish(self, files: list[str], on_stage: StageHook) -> None:
        for n, rel in enumerate(files):
            staged = f"{self.staging}/{rel}"
            if self.storage.exists(staged):
                self.storage.rename(staged, rel)
            elif not self.storage.exists(rel):
                raise ArchiveError(f"{self.storage.uri(rel)} is neither staged nor published")
            if n == 0:
                on_stage("publishing")

    def delete(self, files: list[str]) -> tuple[int, int]:
        """Delete the rows of the published ``files`` still as archived; (deleted, kept)."""
        from pyspark.sql import functions as F

        if not files:
            return 0, 0
        archived = (
            self.spark.read.schema(jdbc.archive_schema())
            .option("basePath", self.storage.uri())
            .parquet(*[self.storage.uri(rel) for rel in files])
            .select(
                "id",
                "status",
                "attempt_count",
                F.unix_micros("updated_at"),
                F.unix_micros("finished_at"),
            )
        )
        writer = functools.partial(dbapi.delete_partition, database.delete_plan(self.alias))
        results = archived.rdd.mapPartitions(writer).collect()
        return sum(r[0] for r in results), sum(r[1] for r in results)

    def finish(self, files: list[str], on_stage: StageHook) -> tuple[int, int]:
        """Steps 4-6 from a written plan: safe to repeat after any interruption."""
        if not self.storage.exists(self.path("published.json")):
            self.check(f"publishing run {self.id}")
            self.publish(files, on_stage)
            self.storage.write_json(self.path("published.json"), {"files": len(files)})
        on_stage("published")
        self.check(f"deleting the rows archived by run {self.id}")
        deleted, kept = self.delete(files)
        on_stage("deleted")
        self.check(f"closing the journal of run {self.id}")
        self.storage.write_json(
            self.path("done.json"),
            {"deleted": deleted, "kept": kept, "finished": clock.now().isoformat()},
        )
        if self.storage.exists(self.staging):
            self.storage.delete(self.staging)
        return deleted, kept


def _checksums() -> list[Any]:
    """Row count and two id checksums: a lost, extra or repeated row changes them."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.col("id").cast("decimal(38,0)")).alias("id_sum"),
        F.bit_xor(F.xxhash64("id")).alias("id_xor"),
    ]


def _normalise(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "rows": int(metrics.get("rows") or 0),
        "id_sum": str(metrics.get("id_sum") or 0),
        "id_xor": int(metrics.get("id_xor") or 0),
    }


def recover(
    spark: SparkSession, storage: Storage, alias: str, on_stage: StageHook, check: LockCheck
) -> tuple[int, int]:
    """Roll forward this database's interrupted runs; (runs completed, rows deleted)."""
    identity = database.identity(alias)
    runs = deleted = 0
    for run_id in storage.list_dirs(JOURNAL):
        run = _Run(spark, storage, alias, run_id, check)
        if storage.exists(run.path("done.json")):
            continue
        if not storage.exists(run.path("run.json")):
            continue  # being created by a run we cannot tell anything about: not ours to touch
        if storage.read_json(run.path("run.json")).get("database") != identity:
            continue  # another database's run: its own next run completes it
        if not storage.exists(run.path("plan.json")):
            check(f"discarding unplanned run {run_id}")
            storage.delete(run.dir)  # nothing of it was published, nothing deleted
            continue
        plan = storage.read_json(run.path("plan.json"))
        done, _ = run.finish(list(plan["files"]), on_stage)
        runs += 1
        deleted += done
    return runs, deleted


def run_archive(
    spark: SparkSession, options: ArchiveOptions, *, on_stage: StageHook | None = None
) -> ArchiveSummary:
    """Archive, verify, publish, delete; see the module docstring."""
    hook: StageHook = on_stage or (lambda stage: None)
    options = validate_options(options)
    alias = str(options.database)
    session.require_jdbc_driver(connections[alias])
    started = time.perf_counter()
    storage = Storage(spark, options.dest)
    storage.check_writable()
    with database.archive_lock(alias) as lock:
        recovered_runs, recovered_deleted = recover(spark, storage, alias, hook, lock.check)
        cutoff = cutoff_for(options)
        bounds = _selection(options, cutoff).aggregate(
            rows=Count("id"), lower=Min("id"), upper=Max("id")
        )
        summary = ArchiveSummary(
            dest=storage.uri(),
            cutoff=cutoff,
            archived=0,
            deleted=0,
            kept=0,
            recovered_runs=recovered_runs,
            recovered_deleted=recovered_deleted,
        )
        if not bounds["rows"]:
            return replace(summary, seconds=time.perf_counter() - started)

        run_id = f"{clock.now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        run = _Run(spark, storage, alias, run_id, lock.check)
        storage.write_json(
            run.path("run.json"),
            {"database": database.identity(alias), "cutoff": cutoff.isoformat()},
        )
        spark.sparkContext.setJobDescription(f"delayq archive {run_id}: stage")
        expected = run.stage(_archive_frame(spark, options, cutoff, bounds))
        hook("staged")
        spark.sparkContext.setJobDescription(f"delayq archive {run_id}: verify")
        try:
            run.verify(expected)
        except ArchiveError:
            storage.delete(run.dir)
            raise
        hook("verified")
        if not expected["rows"]:  # everything selected changed before it was read
            storage.delete(run.dir)
            return replace(summary, seconds=time.perf_counter() - started)
        files = storage.list_files(run.staging)
        lock.check(f"writing the plan of run {run_id}")
        storage.write_json(run.path("plan.json"), {"files": files, "expected": expected})
        hook("planned")
        spark.sparkContext.setJobDescription(f"delayq archive {run_id}: delete")
        deleted, kept = run.finish(files, hook)
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]
    return replace(
        summary,
        archived=expected["rows"],
        deleted=deleted,
        kept=kept,
        run_id=run_id,
        seconds=time.perf_counter() - started,
    )


def _archive_frame(
    spark: SparkSession, options: ArchiveOptions, cutoff: datetime, bounds: dict[str, Any]
) -> DataFrame:
    from pyspark.sql import functions as F

    df = jdbc.read_messages(
        spark,
        str(options.database),
        where=_where_sql(options, cutoff),
        lower=bounds["lower"],
        upper=bounds["upper"],
        rows=bounds["rows"],
    )
    df = df.withColumn("date", F.to_date("finished_at"))
    return df.select(*[f.name for f in jdbc.archive_schema().fields])
