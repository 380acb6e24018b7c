"""The procrastinate App and tasks of the benchmark (imported by its worker too).

The connection string is read from ``BENCH_DATABASE_URL`` at import, so the
adapter sets it before importing this module.
"""

from __future__ import annotations

import os
import threading
import time

import procrastinate
import psycopg

from benchmarks.systems import probe

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DATABASE_URL", ""))
)
_local = threading.local()


@app.task(queue="noop", name="noop")
def noop(i: int) -> None:
    probe.tick(i)


@app.task(queue="sleep", name="sleep")
def sleep(i: int) -> None:
    """A job of 1 ms."""
    probe.tick(i)
    time.sleep(0.001)


@app.task(queue="write", name="write")
def write(i: int) -> None:
    """One row in its own transaction, on a connection per worker thread."""
    probe.tick(i)
    if not hasattr(_local, "conn"):
        _local.conn = psycopg.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)
    _local.conn.execute("INSERT INTO bench_sink (n) VALUES (%s)", (i,))
