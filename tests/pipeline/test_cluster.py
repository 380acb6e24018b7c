"""The same command on a real standalone Spark cluster: a master and one worker on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_delayq.contrib.spark import session
from django_delayq.models import Message
from tests.conftest import ROOT, wait_for
from tests.pipeline.conftest import write_csv

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``spark://127.0.0.1:PORT`` with one registered worker (1 core); its work directory."""
    spark_class = str(session.spark_home() / "bin" / "spark-class")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(session.spark_home())}
    url = f"spark://127.0.0.1:{free_port()}"
    work = tmp_path / "worker"
    work.mkdir()
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "worker")}
    commands = {
        "master": [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--webui-port", "0",
        ],
        "worker": [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--cores", "1", "--memory", "2g", "--webui-port", "0",
            "--work-dir", str(work), url,
        ],
    }  # fmt: skip
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("master", "worker"):
            with open(logs[name], "wb") as log:
                started.append(
                    subprocess.Popen(commands[name], env=env, stdout=log, stderr=subprocess.STDOUT)
                )
        wait_for(
            lambda: (
                "Successfully registered with master" in logs["worker"].read_text()
                or any(p.poll() is not None for p in started)
            ),
            timeout=120,
            message="the worker to register with the master",
        )
        assert all(p.poll() is None for p in started), logs["worker"].read_text()[-2000:]
        yield url, work
    finally:
        for process in reversed(started):
            _stop(process)


def test_enqueue_and_archive_on_a_standalone_cluster(
    standalone_cluster: tuple[str, Path], pipeline_env: dict[str, str], tmp_path: Path
) -> None:
    url, work = standalone_cluster
    rows = [[f"user{i}@example.com", i] for i in range(50)]
    source = write_csv(tmp_path / "in.csv", ["email", "n"], rows)
    dest = tmp_path / "archive"
    # One driver process for both commands: one JVM start instead of two.
    script = textwrap.dedent(
        f"""
        import django
        django.setup()
        from django.core.management import call_command
        from django.utils import timezone
        from django_delayq.models import Message

        def run(*args):
            return call_command("delayq_pipeline", *args, "--master", {url!r})

        s = run("enqueue", {str(source)!r}, "--queue", "c", "--key-column", "email",
                "--partitions", "2")
        print("enqueued", s.created, s.ignored, s.partitions, flush=True)
        now = timezone.now()
        Message.objects.update(status="succeeded", finished_at=now, updated_at=now)
        a = run("archive", "--dest", {str(dest)!r}, "--older-than", "0")
        print("archived", a.archived, a.deleted, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=pipeline_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "enqueued 50 0 2" in done.stdout
    assert "archived 50 50" in done.stdout
    assert not Message.objects.exists()
    assert len(list(dest.glob("queue=c/date=*/*.zstd.parquet"))) >= 1
    # The tasks ran in an executor the worker launched, not in the driver.
    executor_logs = list(work.glob("app-*/*/stderr"))
    assert executor_logs, "no executor ran on the worker"
    assert any("Running task" in log.read_text() for log in executor_logs)
