"""The Spark pipeline at scale: enqueue, archive and report of 1,000,000 rows (not asserted).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/delayq_bench_spark \\
        .venv/bin/python -m benchmarks.pipeline_1m [--rows 1000000] [--master local[2]]

(``make bench-pipeline``.) The database named in DATABASE_URL is dropped and
re-created first: point it at a scratch PostgreSQL or MariaDB/MySQL database
(``mysql://root@127.0.0.1:3306/delayq_bench_spark``). Spark's start-up
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
from datetime import UTC
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

# The same on MariaDB/MySQL.
MARK_FINISHED_MYSQL = """
UPDATE django_delayq_message SET
    scheduled_time = DATE_ADD(%(base)s, INTERVAL id %% 259200 SECOND),
    last_attempt_time = DATE_ADD(%(base)s,
        INTERVAL (id %% 259200) * 1000000 + (id %% 997) * 1000 MICROSECOND),
    finished_at = DATE_ADD(%(base)s,
        INTERVAL (id %% 259200) * 1000000 + (id %% 997 + id %% 89) * 1000 MICROSECOND),
    status = CASE WHEN id %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
    attempt_count = CASE WHEN id %% 50 = 0 THEN 3 ELSE 1 END,
    last_error = CASE WHEN id %% 50 = 0 THEN CONCAT('ValueError: bad customer ', id) ELSE '' END,
    next_attempt_time = NULL
"""


def reset_mysql(url: str) -> None:
    """Drop and re-create the MariaDB/MySQL database of ``url`` (utf8mb4)."""
    import environ
    import MySQLdb

    config = environ.Env.db_url_config(url)
    admin = {
        "host": config["HOST"] or "127.0.0.1",
        "port": int(config["PORT"] or 3306),
        "user": config["USER"] or "root",
    }
    if config["PASSWORD"]:
        admin["password"] = config["PASSWORD"]
    conn = MySQLdb.connect(**admin)
    try:
        cursor = conn.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{config['NAME']}`")
        cursor.execute(f"CREATE DATABASE `{config['NAME']}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    url = os.environ.setdefault(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/delayq_bench_spark"
    )
    mysql = url.startswith("mysql")
    if not (url.startswith("postgres") or mysql):
        sys.exit(
            "this benchmark needs PostgreSQL or MariaDB/MySQL "
            "(DATABASE_URL=postgres://... or mysql://...)"
        )
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ.setdefault("DELAYQ_SPARK_UI", "0")
    if mysql:
        reset_mysql(url)
    else:
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

    base = timezone.now() - timezone.timedelta(days=5)
    with connection.cursor() as cursor:
        if mysql:  # DATETIME: UTC without a zone, as Django stores it
            naive = base.astimezone(UTC).replace(tzinfo=None)
            cursor.execute(MARK_FINISHED_MYSQL, {"base": naive})
            cursor.execute("ANALYZE TABLE django_delayq_message")
            cursor.fetchall()
        else:
            cursor.execute(MARK_FINISHED, {"base": base})
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
