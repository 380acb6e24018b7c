"""PGQueuer (psycopg driver): ``Queries.enqueue`` and a ``QueueManager`` worker.

    benchmarks/.venv-peers/bin/python -m benchmarks.systems.pgqueuer_peer <metric> ...
    benchmarks/.venv-peers/bin/python -m benchmarks.systems.pgqueuer_peer worker --queue Q [--drain]

Entrypoints are coroutines in one event loop that dequeues batches of 10
(PGQueuer's default ``batch_size``) and runs a batch concurrently: there is
no thread concurrency to set, so the concurrency-4 row is not applicable
(the pressure runs take it as it is, whatever ``--concurrency`` says).
Its one-shot mode is ``QueueManager.run(mode=QueueExecutionMode.drain)``
(``worker --drain`` here): exit once the queue is empty.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import psycopg

from benchmarks.systems import probe
from benchmarks.systems.common import System, main


class PGQueuer(System):
    name = "pgqueuer"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._conn: psycopg.Connection[Any] | None = None
        self._queries: Any = None

    @property
    def queries(self) -> Any:
        if self._queries is None:
            from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
            from pgqueuer.queries import SyncQueries

            self._conn = psycopg.connect(self.url, autocommit=True)
            self._queries = SyncQueries(SyncPsycopgDriver(self._conn))
        return self._queries

    def install(self) -> None:
        async def go() -> None:
            from pgqueuer import PsycopgDriver, Queries

            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            await Queries(PsycopgDriver(conn)).install()
            await conn.close()

        asyncio.run(go())
        self.sql("CREATE TABLE bench_sink (id bigserial PRIMARY KEY, n bigint NOT NULL)")

    def enqueue_one(self, i: int, queue: str = "noop") -> None:
        self.queries.enqueue(queue, json.dumps({"i": i}).encode())

    def enqueue_delayed(self, i: int, run_at: Any) -> None:
        import datetime as dt

        # PGQueuer takes a delay, added to the database's now().
        delay = run_at - dt.datetime.now(dt.UTC)
        self.queries.enqueue(
            "noop", json.dumps({"i": i}).encode(), 0, execute_after=max(delay, dt.timedelta(0))
        )

    def enqueue_batch(self, n: int) -> None:
        self.queries.enqueue(
            ["noop"] * n, [json.dumps({"i": i}).encode() for i in range(n)], [0] * n
        )

    def fill(self, n: int, *, future: bool = False, queue: str = "noop") -> None:
        self.sql(
            "INSERT INTO pgqueuer (priority, entrypoint, payload, execute_after, status) "
            "SELECT 0, %s, convert_to(jsonb_build_object('i', g)::text, 'utf8'), "
            "now() + %s * interval '1 day', 'queued' FROM generate_series(1, %s) g",
            (queue, int(future), n),
        )

    def worker_command(self, *, concurrency: int, queue: str = "noop") -> list[str]:
        return [
            sys.executable, "-m", "benchmarks.systems.pgqueuer_peer", "worker",
            "--queue", queue, "--concurrency", str(concurrency),
        ]  # fmt: skip

    def burst_command(self, queue: str = "noop") -> list[str] | None:
        return [*self.worker_command(concurrency=1, queue=queue), "--drain"]

    def processed_ok(self, n: int, queue: str) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pgqueuer WHERE entrypoint = %s", (queue,)
            ).fetchone()
        return n - (int(row[0]) if row else 0)

    def supports(self, metric: str, concurrency: int = 1) -> bool:
        # Under pressure the steady load needs a worker, whatever its slots:
        # PGQueuer's are its batch of ten coroutines at once.
        return concurrency == 1 or metric == "pressure"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._queries = None


async def _work(queue: str, concurrency: int, drain: bool = False) -> None:
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    url = os.environ["BENCH_DATABASE_URL"]
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    # A plain blocking connection: the handler's INSERT is its own transaction.
    sink = psycopg.connect(url, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint(queue)
    async def run(job: Job) -> None:
        probe.tick(json.loads(job.payload or b"{}").get("i"))
        if queue == "write":
            sink.execute("INSERT INTO bench_sink (n) VALUES (%s)", (job.id,))
        elif queue == "sleep":
            await asyncio.sleep(0.001)

    probe.ready()
    mode = QueueExecutionMode.drain if drain else QueueExecutionMode.continuous
    await qm.run(batch_size=10, mode=mode)
    sink.close()


def worker(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--queue", default="noop")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    args = parser.parse_args(argv)
    asyncio.run(_work(args.queue, args.concurrency, args.drain))


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2:])
    else:
        main(PGQueuer)
