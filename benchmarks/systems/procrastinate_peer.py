"""procrastinate: ``defer`` / ``batch_defer`` and its worker (LISTEN/NOTIFY on).

    benchmarks/.venv-peers/bin/python -m benchmarks.systems.procrastinate_peer <metric> ...

The App and its tasks are in ``procrastinate_app.py``; handlers are
synchronous functions (procrastinate runs them in threads).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import psycopg

from benchmarks.systems.common import System, main


class Procrastinate(System):
    name = "procrastinate"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        os.environ["BENCH_DATABASE_URL"] = url
        from benchmarks.systems.procrastinate_app import app

        self.app = app
        self._open = False

    def _ensure_open(self) -> None:
        if not self._open:
            self.app.open()
            self._open = True

    def install(self) -> None:
        self._ensure_open()
        self.app.schema_manager.apply_schema()
        self.sql("CREATE TABLE bench_sink (id bigserial PRIMARY KEY, n bigint NOT NULL)")

    def enqueue_one(self, i: int, queue: str = "noop") -> None:
        self.app.tasks[queue].defer(i=i)

    def enqueue_delayed(self, i: int, run_at: Any) -> None:
        self.app.tasks["noop"].configure(schedule_at=run_at).defer(i=i)

    def enqueue_batch(self, n: int) -> None:
        self.app.tasks["noop"].batch_defer(*({"i": i} for i in range(n)))

    def fill(self, n: int, *, future: bool = False, queue: str = "noop") -> None:
        self.sql(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args, scheduled_at) "
            "SELECT %s, %s, jsonb_build_object('i', g), "
            "CASE WHEN %s THEN now() + interval '1 day' END "
            "FROM generate_series(1, %s) g",
            (queue, queue, future, n),
        )

    def worker_command(self, *, concurrency: int, queue: str = "noop") -> list[str]:
        return [
            sys.executable, "-m", "procrastinate",
            "--app=benchmarks.systems.procrastinate_app.app", "worker",
            "--queues", queue, "--concurrency", str(concurrency),
        ]  # fmt: skip

    def burst_command(self, queue: str = "noop") -> list[str] | None:
        # procrastinate 3: --one-shot is --wait's negative (wait=False):
        # process what is there, then exit.
        return [*self.worker_command(concurrency=1, queue=queue), "--one-shot"]

    def processed_ok(self, n: int, queue: str) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM procrastinate_jobs "
                "WHERE queue_name = %s AND status = 'succeeded'",
                (queue,),
            ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        if self._open:
            self.app.close()
            self._open = False


if __name__ == "__main__":
    main(Procrastinate)
