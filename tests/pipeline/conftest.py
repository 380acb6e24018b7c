"""Fixtures of the Spark pipeline tests: one local SparkSession for the whole run.

The pipeline needs Java 17+ and pyspark, which ``make test`` installs: under
CI (``CI=true``) their absence fails these tests; elsewhere they are skipped
with the reason. Tests that write through Spark use ``transaction=True``:
Spark's executors have their own connections and must see committed rows.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_delayq.fingerprint import fingerprint
from django_delayq.models import Message

PIPELINE_ENV = {"DELAYQ_SPARK_UI": "0"}

# The JVMs of these tests (the session's, the pipeline subprocesses', the
# standalone cluster's) run jobs of a few rows: compiling them with the
# optimising compiler and collecting with parallel GC threads is most of
# their CPU. The client compiler alone and a serial collector take about a
# third less CPU for the same tests (a JAVA_TOOL_OPTIONS of your own is kept).
os.environ.setdefault(
    "JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
)


def _spark_missing() -> str | None:
    from django_delayq.contrib.spark import PipelineError, session

    try:
        session.check_environment()
    except PipelineError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``local[1]`` session, UI off, shared by every pipeline test (and the command)."""
    reason = _spark_missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Spark pipeline tests cannot run: {reason}")
        pytest.skip(f"the Spark pipeline tests need Java and pyspark: {reason}")
    from django_delayq.contrib.spark import session

    session_ = session.get_session("local[1]", ui=False)
    yield session_
    session_.stop()


@pytest.fixture(autouse=True)
def _needs_spark(spark: Any) -> None:
    """Every test here needs the session (and so Java and pyspark)."""


@pytest.fixture
def pipeline_env(worker_env: dict[str, str]) -> dict[str, str]:
    """Environment of a ``delayq_pipeline`` subprocess on this test's database."""
    return {**worker_env, **PIPELINE_ENV}


def run_pipeline(*args: str) -> tuple[Any, str]:
    """``manage.py delayq_pipeline ARGS`` in-process: (summary, output)."""
    out = StringIO()
    result = call_command("delayq_pipeline", *args, stdout=out)
    return result, out.getvalue()


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_frame(
    spark: Any, path: Path, rows: list[tuple[Any, ...]], schema: str, fmt: str = "parquet"
) -> Path:
    """A one-file data set written by Spark itself (Parquet or JSON lines)."""
    df = spark.createDataFrame(rows, schema).coalesce(1)
    getattr(df.write.mode("overwrite"), fmt)(str(path))
    return path


def finished(
    queue: str,
    key: str,
    *,
    status: str = "succeeded",
    finished_at: datetime | None = None,
    scheduled: datetime | None = None,
    lag: float = 0.0,
    processing: float = 0.0,
    attempts: int = 1,
    error: str = "",
    stored_fingerprint: bool = True,
    payload: Any = None,
) -> Message:
    """A finished message with exact times (scheduled, started after ``lag``, finished)."""
    if finished_at is None:
        finished_at = timezone.now() - timedelta(days=1)
    started = finished_at - timedelta(seconds=processing)
    if scheduled is None:
        scheduled = started - timedelta(seconds=lag)
    return Message.objects.create(
        queue=queue,
        key=key,
        payload={"key": key} if payload is None else payload,
        status=status,
        scheduled_time=scheduled,
        next_attempt_time=None,
        attempt_count=attempts,
        last_attempt_time=started if attempts else None,
        last_error=error,
        error_fingerprint=fingerprint(error) if stored_fingerprint else "",
        created_at=scheduled,
        updated_at=finished_at,
        finished_at=finished_at,
    )


@pytest.fixture
def read_archive(spark: Any) -> Callable[[Path | str], list[dict[str, Any]]]:
    """The rows of an archive directory, as dicts, sorted by id."""
    from django_delayq.contrib.spark import jdbc

    def read(dest: Path | str) -> list[dict[str, Any]]:
        df = spark.read.schema(jdbc.archive_schema()).parquet(str(dest))
        return sorted((r.asDict() for r in df.collect()), key=lambda r: r["id"])

    return read
