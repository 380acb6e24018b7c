"""The Spark pipeline at scale: enqueue, archive and report of 1,000,000 rows (not asserted).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/delayq_bench_spark \\
        .venv/bin/python -m benchmarks.pipeline_1m [--rows 1000000] [--master local[2]]

(``make bench-pipeline``.) The database named in DATABASE_URL is dropped and
re-created first: point it at a scratch PostgreSQL database. Spark's start-up
is timed on its own; each job's time starts once the session is up.

Targets on the 2-core development machine: enqueue from Parquet at 40,000
rows/s or more; archive (select, stage, verify, publish, delete) at 30,000
rows/s or more end to end; report over the archived rows in under 30 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.quick import ROOT, reset_database

# Finished over three days, 2% failed after three attempts (base: five days ago).
MARK_FINISHED = """
UPDATE django_delayq_message SET
    scheduled_time = %(base)s + (id %% 259200) * interval '1 second',
    last_attempt_time = %(base)s + (id %% 259200) * interval '1 second'
        + (id %% 997) * interval '1 millisecond',
    finished_at = %(base)s + (id %% 259200) * interval '1 second'
        + (id %% 997 + id %% 89) * interval '1 millisecond',
    status = CASE WHEN id %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
    attempt_count = CASE WHEN id %% 50 = 0 THEN 3 ELSE 1 END,
    last_error = CASE WHEN id %% 50 = 0 THEN 'ValueError: bad customer ' || id ELSE '' END,
    next_attempt_time = NULL
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    url = os.environ.setdefault(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/delayq_bench_spark"
    )
    if not url.startswith("postgres"):
        sys.exit("this benchmark needs PostgreSQL (DATABASE_URL=postgres://...)")
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ.setdefault("DELAYQ_SPARK_UI", "0")
    reset_database(url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"], check=True, env=env, cwd=ROOT
    )

    import django

    django.setup()
    from django.db import connection
    from django.utils import timezone
    from pyspark.sql import functions as F

    from django_delayq.contrib.spark import archive_job, enqueue_job, render, report_job, session
    from django_delayq.models import Message

    n = args.rows
    print(f"database: {url.split('@')[-1]}  rows: {n:,}  master: {args.master}")
    started = time.perf_counter()
    spark = session.get_session(args.master, ui=False)
    spark.range(1).count()  # the first job warms the JVM and the Python workers
    print(f"Spark start-up                   {time.perf_counter() - started:8.1f} s")

    work = Path(tempfile.mkdtemp(prefix="delayq-bench-"))
    source = str(work / "customers.parquet")
    (
        spark.range(n, numPartitions=2)
        .select(
            F.col("id").alias("customer_id"),
            F.concat(F.lit("customer"), F.col("id"), F.lit("@example.com")).alias("email"),
            F.concat(F.lit("Customer "), F.col("id")).alias("name"),
            (F.col("id") % 1000 / 7).alias("amount"),
            (F.col("id") % 2 == 0).alias("vip"),
            F.when(F.col("id") % 3 == 0, "new").otherwise("regular").alias("segment"),
        )
        .write.parquet(source)
    )

    summary = enqueue_job.run_enqueue(
        spark,
        enqueue_job.EnqueueOptions(source=source, queue="campaign", key_column="email"),
    )
    assert summary.created == n == Message.objects.count(), summary
    print(
        f"enqueue {n:,} rows from Parquet   {summary.seconds:8.1f} s  {summary.rate:10,.0f} rows/s"
        f"  ({summary.partitions} partitions, {summary.transactions} transactions)"
    )

    with connection.cursor() as cursor:
        cursor.execute(MARK_FINISHED, {"base": timezone.now() - timezone.timedelta(days=5)})
        cursor.execute("VACUUM ANALYZE django_delayq_message")

    archived = archive_job.run_archive(
        spark, archive_job.ArchiveOptions(dest=str(work / "archive"), older_than=86400)
    )
    assert archived.archived == archived.deleted == n, archived
    assert not Message.objects.exists()
    print(
        f"archive {n:,} rows end to end     {archived.seconds:8.1f} s  "
        f"{archived.rate:10,.0f} rows/s  (selected, staged, verified, published, deleted)"
    )

    started = time.perf_counter()
    report = report_job.run_report(
        spark,
        report_job.ReportOptions(source=str(work / "archive"), out=str(work / "report")),
    )
    render.write_report(report, str(work / "report"))
    elapsed = time.perf_counter() - started
    assert report.rows == n, report.rows
    print(f"report over {n:,} archived rows  {elapsed:8.1f} s  (written to {work / 'report'})")
    spark.stop()


if __name__ == "__main__":
    main()
