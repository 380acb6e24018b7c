"""Bad input: a clear one-line error and exit status 2, before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from django.core.management import CommandError

from django_delayq.models import Message
from tests.conftest import ROOT
from tests.pipeline.conftest import finished, run_pipeline, write_csv, write_frame

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def refused(*args: str) -> str:
    """Run the command, expect exit status 2 with one line; return that line."""
    with pytest.raises(CommandError) as caught:
        run_pipeline(*args)
    assert caught.value.returncode == 2
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.fixture
def csv_source(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "in.csv", ["email", "n"], [["a@x.org", 1], ["b@x.org", 2]])


def test_missing_source(tmp_path: Path) -> None:
    message = refused("enqueue", str(tmp_path / "nope.csv"), "--queue", "q")
    assert message == f"SOURCE {tmp_path / 'nope.csv'} does not exist"


def test_unreadable_source(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"this is not parquet at all")
    assert refused("enqueue", str(broken), "--queue", "q").startswith(
        f"cannot read {broken} as parquet: "
    )
    assert not Message.objects.exists()


def test_key_column_that_does_not_exist(csv_source: Path) -> None:
    message = refused("enqueue", str(csv_source), "--queue", "q", "--key-column", "mail")
    assert message == f"key column 'mail' is not a column of {csv_source} (columns: email, n)"


@pytest.mark.parametrize(
    ("key", "reason"),
    [("", "key column 'email' is null"), ("x" * 256, "is 256 characters, over 255")],
)
def test_bad_key_in_a_small_input(tmp_path: Path, key: str, reason: str) -> None:
    source = write_csv(tmp_path / "k.csv", ["email", "n"], [["a@x.org", 1], [key, 2], ["c", 3]])
    message = refused("enqueue", str(source), "--queue", "q", "--key-column", "email")
    assert message.startswith(f"1 of 3 row(s) of {source} are invalid")
    assert "nothing was written" in message and reason in message
    assert not Message.objects.exists()
    assert not (tmp_path / "_k.csv.rejects.jsonl").exists()


def test_payload_column_json_cannot_hold(spark: object, tmp_path: Path) -> None:
    source = write_frame(
        spark, tmp_path / "b.parquet", [(1, bytearray(b"\x00\x01"))], "id int, blob binary"
    )
    message = refused("enqueue", str(source), "--queue", "q")
    assert message.startswith("payload column 'blob' has type binary, which JSON cannot hold")
    # Leaving it out is the way through.
    summary, _ = run_pipeline("enqueue", str(source), "--queue", "q", "--payload-columns", "id")
    assert summary.created == 1


def test_negative_older_than(tmp_path: Path) -> None:
    message = refused("archive", "--dest", str(tmp_path), "--older-than", "-5")
    assert message == "--older-than must not be negative, got -5"


@pytest.mark.parametrize("seconds", ["1e12", "inf", "nan"])
def test_older_than_beyond_max_delay(tmp_path: Path, seconds: str) -> None:
    message = refused("archive", "--dest", str(tmp_path), "--older-than", seconds)
    assert message.startswith("--older-than must be at most 365000 days (31536000000 s), got ")


@pytest.mark.parametrize("seconds", ["1e12", "inf"])
def test_delay_beyond_max_delay(csv_source: Path, seconds: str) -> None:
    message = refused("enqueue", str(csv_source), "--queue", "q", "--delay", seconds)
    assert message.startswith("--delay must be at most 365000 days (31536000000 s), got ")
    assert not Message.objects.exists()


def test_dest_not_writable(tmp_path: Path) -> None:
    finished("q", "done")
    (tmp_path / "a-file").write_text("")
    message = refused(
        "archive", "--dest", str(tmp_path / "a-file" / "archive"), "--older-than", "0"
    )
    assert "is not writable" in message or "is a file" in message
    assert Message.objects.count() == 1


def test_report_without_archived_messages(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    message = refused("report", "--source", str(tmp_path / "empty"), "--out", str(tmp_path / "r"))
    assert message == f"no archived messages under {tmp_path / 'empty'}"
    assert refused("report", "--source", str(tmp_path / "nope")).endswith("is not a directory")


def test_missing_jdbc_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The archive reads through JDBC: without the driver's jar it stops before it starts."""
    from django.db import connection

    from django_delayq.contrib.spark import session
    from django_delayq.store.features import features

    finished("q", "done")
    missing = tmp_path / "driver.jar"
    can = features(connection)
    elsewhere = replace(can, jdbc=replace(can.jdbc, jar=str(missing)))
    monkeypatch.setattr(session, "features", lambda _: elsewhere)
    monkeypatch.delenv("DELAYQ_SPARK_JARS", raising=False)
    message = refused("archive", "--dest", str(tmp_path / "arch"), "--older-than", "0")
    assert message == (
        f"the JDBC driver for {connection.vendor} is missing ({missing} does not exist): "
        f"apt-get install {can.jdbc.package}, "
        "or name its jar in DELAYQ_SPARK_JARS"
    )
    assert Message.objects.count() == 1
    assert not (tmp_path / "arch").exists()


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "delayq_pipeline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_java(csv_source: Path, pipeline_env: dict[str, str]) -> None:
    env = {**pipeline_env, "JAVA_HOME": "/nonexistent/java"}
    done = run_cli(env, "enqueue", str(csv_source), "--queue", "q")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "CommandError: Java was not found (JAVA_HOME/bin/java); Spark needs Java 17+: "
        "apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"
    )
    assert not Message.objects.exists()


def test_pyspark_not_installed(
    csv_source: Path, pipeline_env: dict[str, str], tmp_path: Path
) -> None:
    shadow = tmp_path / "shadow" / "pyspark"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named pyspark')\n")
    env = {**pipeline_env, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{pipeline_env['PYTHONPATH']}"}
    done = run_cli(env, "enqueue", str(csv_source), "--queue", "q")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("CommandError: pyspark is not installed")
    assert last.endswith('pip install "django-delayq[spark]"')
