"""``delayq_pipeline report``: delivery figures per queue and day from the archive.

Definitions (documented in the README, checked by a hand-computed test):

- **day**: the UTC date the message finished (the archive's ``date`` partition).
- **delivery lag**: first start minus originally scheduled time. The table
  keeps ``scheduled_time`` (the first due time) and ``last_attempt_time``
  (the start of the last attempt) but not the first start, so the lag is
  measured exactly on messages that ran once (``attempt_count == 1``, where
  the last start is the first) and not at all on retried ones, whose last
  start includes the retry backoff; ``lag_samples`` says how many it covers.
- **processing time**: ``finished_at - last_attempt_time`` of succeeded and
  failed messages (the last attempt's run time).
- **percentiles**: nearest rank (the smallest value with at least p of the
  values at or below it), from Spark's ``percentile_approx`` with accuracy
  10,000 (exact below that many messages per group; rank error under 0.01%
  above).
- **error fingerprints**: the stored ``error_fingerprint`` (exception type
  plus normalised message, ``django_delayq.fingerprint``), computed from
  ``last_error`` for rows archived without one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from datetime import date
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_delayq import fingerprint
from django_delayq.contrib.spark import PipelineError, database, jdbc, session
from django_delayq.contrib.spark.sources import is_url
from django_delayq.contrib.spark.storage import java_message

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

PERCENTILES = (0.5, 0.95, 0.99)
ACCURACY = 10_000
ATTEMPT_BUCKETS = ("0", "1", "2", "3", "4", "5+")
TOP_ERRORS = 10
TOP_ERRORS_PER_DAY = 3
NEEDED = (
    "queue",
    "date",
    "status",
    "attempt_count",
    "scheduled_time",
    "last_attempt_time",
    "finished_at",
    "last_error",
    "error_fingerprint",
)


@dataclass(frozen=True)
class ReportOptions:
    source: str
    out: str = "delayq-report"
    since: date | None = None
    include_live: bool = False  # also finished messages still in the table
    database: str | None = None


@dataclass(frozen=True)
class Figures:
    """One queue on one day (``day`` None: the queue over the whole period)."""

    queue: str
    day: date | None
    messages: int
    succeeded: int
    failed: int
    cancelled: int
    attempts: dict[str, int]  # bucket -> messages
    attempts_mean: float
    attempts_max: int
    lag: tuple[float, float, float] | None  # p50, p95, p99 in seconds
    lag_samples: int
    processing: tuple[float, float, float] | None
    processing_samples: int
    top_errors: list[tuple[str, int]] = field(default_factory=list)  # (fingerprint, count)

    def rate(self, status: str) -> float:
        return getattr(self, status) / self.messages if self.messages else 0.0


@dataclass(frozen=True)
class ErrorGroup:
    queue: str
    fingerprint: str
    count: int
    failed: int  # of them, messages that ended failed
    error: str  # the normal form: "module.Type: message with <n> and '…'"
    first_day: date
    last_day: date


@dataclass(frozen=True)
class Report:
    source: str
    since: date | None
    rows: int
    days: list[Figures]
    queues: list[Figures]
    errors: list[ErrorGroup]
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)


def validate_options(options: ReportOptions) -> ReportOptions:
    if not is_url(options.source) and not os.path.isdir(options.source):
        raise PipelineError(f"--source {options.source} is not a directory")
    if is_url(options.out):
        raise PipelineError("--out must be a local directory (the report is a few small files)")
    try:
        os.makedirs(options.out, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise PipelineError(f"--out {options.out} is not writable: {exc}") from exc
    if not os.access(options.out, os.W_OK):
        raise PipelineError(f"--out {options.out} is not writable")
    if options.include_live:
        alias = database.resolve_alias(options.database)
        session.require_jdbc_driver(connections[alias])
        return replace(options, database=alias)
    return options


def load(spark: SparkSession, options: ReportOptions) -> DataFrame:
    """The archived rows (and the finished live ones), one per message."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    schema = jdbc.archive_schema()
    try:
        df = spark.read.schema(schema).parquet(options.source)
    except Exception as exc:
        raise PipelineError(f"cannot read {options.source}: {java_message(exc)}") from exc
    if options.include_live:
        live = _live(spark, str(options.database))
        if live is not None:
            # A row can be in both (archived, then kept because it changed, or
            # an interrupted run): its latest version counts, once.
            latest = Window.partitionBy("id").orderBy(F.col("updated_at").desc())
            df = (
                df.unionByName(live)
                .withColumn("_n", F.row_number().over(latest))
                .filter("_n = 1")
                .drop("_n")
            )
    if options.since is not None:
        df = df.filter(F.col("date") >= F.lit(options.since))
    return df


def _live(spark: SparkSession, alias: str) -> DataFrame | None:
    from django.db.models import Count, Max, Min
    from pyspark.sql import functions as F

    from django_delayq.models import Message

    bounds = (
        Message.objects.using(alias)
        .finished()
        .aggregate(rows=Count("id"), lower=Min("id"), upper=Max("id"))
    )
    if not bounds["rows"]:
        return None
    statuses = ", ".join(f"'{s}'" for s in Message.FINISHED_STATUSES)
    df = jdbc.read_messages(
        spark,
        alias,
        where=f"status IN ({statuses}) AND finished_at IS NOT NULL",
        lower=bounds["lower"],
        upper=bounds["upper"],
        rows=bounds["rows"],
    )
    df = df.withColumn("date", F.to_date("finished_at"))
    return df.select(*[f.name for f in jdbc.archive_schema().fields])


def _seconds(later: str, earlier: str) -> Column:
    from pyspark.sql import functions as F

    return (F.unix_micros(later) - F.unix_micros(earlier)) / 1e6


def _aggregates() -> list[Column]:
    from pyspark.sql import functions as F

    status = F.col("status")
    attempts = F.col("attempt_count")
    lag = F.when(
        (attempts == 1) & F.col("last_attempt_time").isNotNull(),
        _seconds("last_attempt_time", "scheduled_time"),
    )
    processing = F.when(
        status.isin("succeeded", "failed")
        & F.col("last_attempt_time").isNotNull()
        & F.col("finished_at").isNotNull(),
        _seconds("finished_at", "last_attempt_time"),
    )
    buckets = [F.count_if(attempts == int(b)).alias(f"a{b}") for b in ATTEMPT_BUCKETS[:-1]]
    return [
        F.count(F.lit(1)).alias("messages"),
        F.count_if(status == "succeeded").alias("succeeded"),
        F.count_if(status == "failed").alias("failed"),
        F.count_if(status == "cancelled").alias("cancelled"),
        *buckets,
        F.count_if(attempts >= 5).alias("a5+"),
        F.avg(attempts).alias("attempts_mean"),
        F.max(attempts).alias("attempts_max"),
        F.percentile_approx(lag, list(PERCENTILES), ACCURACY).alias("lag"),
        F.count(lag).alias("lag_samples"),
        F.percentile_approx(processing, list(PERCENTILES), ACCURACY).alias("processing"),
        F.count(processing).alias("processing_samples"),
    ]


def _figures(row: Any, day: date | None, top: list[tuple[str, int]]) -> Figures:
    def triple(value: Any) -> tuple[float, float, float] | None:
        return (float(value[0]), float(value[1]), float(value[2])) if value else None

    return Figures(
        queue=row["queue"],
        day=day,
        messages=int(row["messages"]),
        succeeded=int(row["succeeded"]),
        failed=int(row["failed"]),
        cancelled=int(row["cancelled"]),
        attempts={b: int(row[f"a{b}"]) for b in ATTEMPT_BUCKETS},
        attempts_mean=float(row["attempts_mean"] or 0),
        attempts_max=int(row["attempts_max"] or 0),
        lag=triple(row["lag"]),
        lag_samples=int(row["lag_samples"]),
        processing=triple(row["processing"]),
        processing_samples=int(row["processing_samples"]),
        top_errors=top,
    )


def _errors(df: DataFrame) -> DataFrame:
    """Rows with an error, each with its fingerprint (computed where none was stored)."""
    from pyspark.sql import functions as F

    errors = df.filter(F.coalesce(F.col("last_error"), F.lit("")) != "").select(
        "queue", "date", "status", "last_error", "error_fingerprint"
    )
    stored = F.coalesce(F.col("error_fingerprint"), F.lit("")) != ""
    # Plain pickled rows: Arrow would need pandas, for a few error strings.
    compute = F.udf(fingerprint.fingerprint, "string", useArrow=False)
    return errors.filter(stored).unionByName(
        errors.filter(~stored).withColumn("error_fingerprint", compute("last_error"))
    )


def run_report(spark: SparkSession, options: ReportOptions) -> Report:
    """Compute the figures; ``render.write_report`` writes them under ``options.out``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    options = validate_options(options)
    started = time.perf_counter()
    # Only what the figures read: payloads and tracebacks stay on disk.
    df = load(spark, options).select(*NEEDED).cache()
    try:
        rows = df.count()
        if not rows:
            since = f" since {options.since}" if options.since else ""
            raise PipelineError(f"no archived messages under {options.source}{since}")
        per_day = df.groupBy("queue", "date").agg(*_aggregates()).collect()
        per_queue = df.groupBy("queue").agg(*_aggregates()).collect()
        errors = _errors(df)
        groups = (
            errors.groupBy("queue", "error_fingerprint")
            .agg(
                F.count(F.lit(1)).alias("count"),
                F.count_if(F.col("status") == "failed").alias("failed"),
                F.first("last_error").alias("example"),
                F.min("date").alias("first_day"),
                F.max("date").alias("last_day"),
            )
            .withColumn(
                "rank",
                F.row_number().over(
                    Window.partitionBy("queue").orderBy(F.desc("count"), "error_fingerprint")
                ),
            )
            .filter(F.col("rank") <= TOP_ERRORS)
            .collect()
        )
        daily = (
            errors.groupBy("queue", "date", "error_fingerprint")
            .agg(F.count(F.lit(1)).alias("count"))
            .withColumn(
                "rank",
                F.row_number().over(
                    Window.partitionBy("queue", "date").orderBy(
                        F.desc("count"), "error_fingerprint"
                    )
                ),
            )
            .filter(F.col("rank") <= TOP_ERRORS_PER_DAY)
            .collect()
        )
    finally:
        df.unpersist()

    top_by_day: dict[tuple[str, date], list[tuple[str, int]]] = {}
    for r in sorted(daily, key=lambda r: r["rank"]):
        top_by_day.setdefault((r["queue"], r["date"]), []).append(
            (r["error_fingerprint"], int(r["count"]))
        )
    top_by_queue: dict[str, list[tuple[str, int]]] = {}
    error_groups = []
    for r in sorted(groups, key=lambda r: (r["queue"], r["rank"])):
        top_by_queue.setdefault(r["queue"], []).append((r["error_fingerprint"], int(r["count"])))
        error_groups.append(
            ErrorGroup(
                queue=r["queue"],
                fingerprint=r["error_fingerprint"],
                count=int(r["count"]),
                failed=int(r["failed"]),
                error=fingerprint.normalise(r["example"]),
                first_day=r["first_day"],
                last_day=r["last_day"],
            )
        )
    days = sorted(
        (_figures(r, r["date"], top_by_day.get((r["queue"], r["date"]), [])) for r in per_day),
        key=lambda f: (f.queue, f.day or date.min),
    )
    queues = sorted(
        (_figures(r, None, top_by_queue.get(r["queue"], [])) for r in per_queue),
        key=lambda f: f.queue,
    )
    return Report(
        source=options.source,
        since=options.since,
        rows=rows,
        days=days,
        queues=queues,
        errors=error_groups,
        seconds=time.perf_counter() - started,
    )
