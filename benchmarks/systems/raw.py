"""The physical limit: plain psycopg 3 loops, no framework.

Two variants share the table and the enqueue paths:

- ``raw-one``: claim one message and delete it in one transaction
  (``DELETE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1)``);
- ``raw-batch``: claim 100 in one transaction (an UPDATE of a lease column
  over ``FOR UPDATE SKIP LOCKED``), run them, then delete them in one
  statement: the batched ack.

    python -m benchmarks.systems.raw {one|batch} <metric> --db NAME ...
    python -m benchmarks.systems.raw {one|batch} worker --queue Q --concurrency C [--burst]

With ``--burst`` a worker thread exits once a claim finds nothing: the floor
of a one-shot worker's start-up (an interpreter, psycopg, a connection, a
query). The CPU rows are not applicable: a loop that polls every 10 ms spends
its CPU on the polling, which a worker woken by LISTEN/NOTIFY does not pay,
so it is no floor there.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.systems import probe
from benchmarks.systems.common import System, main

SCHEMA = """
CREATE TABLE raw_queue (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    run_at timestamptz NOT NULL DEFAULT now(),
    locked_until timestamptz
);
CREATE INDEX raw_queue_claim ON raw_queue (queue, run_at);
CREATE TABLE raw_sink (id bigserial PRIMARY KEY, n integer NOT NULL);
"""

CLAIM_ONE = """
DELETE FROM raw_queue WHERE id = (
    SELECT id FROM raw_queue WHERE queue = %s AND run_at <= now()
    ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED
) RETURNING id, payload
"""

CLAIM_BATCH = """
UPDATE raw_queue SET locked_until = now() + interval '60 seconds' WHERE id IN (
    SELECT id FROM raw_queue
    WHERE queue = %s AND run_at <= now() AND (locked_until IS NULL OR locked_until < now())
    ORDER BY run_at LIMIT 100 FOR UPDATE SKIP LOCKED
) RETURNING id, payload
"""


class Raw(System):
    def __init__(self, url: str, mode: str) -> None:
        super().__init__(url)
        self.mode = mode
        self.name = f"raw-{mode}"
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = psycopg.connect(self.url, autocommit=True)
        return self._conn

    def install(self) -> None:
        self.sql(SCHEMA)

    def enqueue_one(self, i: int, queue: str = "noop") -> None:
        # Autocommit: the INSERT is its own transaction.
        self.conn.execute(
            "INSERT INTO raw_queue (queue, payload) VALUES (%s, %s)", (queue, Jsonb({"i": i}))
        )

    def enqueue_delayed(self, i: int, run_at: Any) -> None:
        self.conn.execute(
            "INSERT INTO raw_queue (queue, payload, run_at) VALUES (%s, %s, %s)",
            ("noop", Jsonb({"i": i}), run_at),
        )

    def enqueue_batch(self, n: int) -> None:
        with self.conn.transaction():
            if self.mode == "batch":
                with self.conn.cursor().copy("COPY raw_queue (queue, payload) FROM STDIN") as copy:
                    for i in range(n):
                        copy.write_row(("noop", Jsonb({"i": i})))
            else:
                self.conn.cursor().executemany(
                    "INSERT INTO raw_queue (queue, payload) VALUES (%s, %s)",
                    [("noop", Jsonb({"i": i})) for i in range(n)],
                )

    def fill(self, n: int, *, future: bool = False, queue: str = "noop") -> None:
        self.sql(
            "INSERT INTO raw_queue (queue, payload, run_at) "
            "SELECT %s, jsonb_build_object('i', g), now() + %s * interval '1 day' "
            "FROM generate_series(1, %s) g",
            (queue, 1 if future else 0, n),
        )

    def worker_command(self, *, concurrency: int, queue: str = "noop") -> list[str]:
        return [
            sys.executable, "-m", "benchmarks.systems.raw", self.mode, "worker",
            "--queue", queue, "--concurrency", str(concurrency),
        ]  # fmt: skip

    def processed_ok(self, n: int, queue: str) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM raw_queue WHERE queue = %s AND run_at <= now()", (queue,)
            ).fetchone()
        return n - (row[0] if row else 0)

    def burst_command(self, queue: str = "noop") -> list[str] | None:
        return [*self.worker_command(concurrency=1, queue=queue), "--burst"]

    def supports(self, metric: str, concurrency: int = 1) -> bool:
        # No wake-up mechanism: it polls every 10 ms, so the pickup of a new
        # message says nothing; a delayed one shows what polling costs. For
        # the same reason its CPU at a steady rate or idle is the polling's.
        return metric not in ("latency", "cpu", "idle")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _work_loop(url: str, mode: str, queue: str, burst: bool = False) -> None:
    atomic = queue == "write"
    with psycopg.connect(url) as conn:
        while True:
            if mode == "one":
                with conn.transaction():
                    row = conn.execute(CLAIM_ONE, (queue,)).fetchone()
                    if row is not None:
                        probe.tick(row[1].get("i"))
                        if atomic:
                            conn.execute("INSERT INTO raw_sink (n) VALUES (%s)", (row[0],))
                if row is None:
                    if burst:
                        return
                    time.sleep(0.01)
                continue
            with conn.transaction():
                rows = conn.execute(CLAIM_BATCH, (queue,)).fetchall()
            if not rows:
                if burst:
                    return
                time.sleep(0.01)
                continue
            for row in rows:
                probe.tick(row[1].get("i"))
                if atomic:
                    with conn.transaction():
                        conn.execute("INSERT INTO raw_sink (n) VALUES (%s)", (row[0],))
            with conn.transaction():
                conn.execute("DELETE FROM raw_queue WHERE id = ANY(%s)", ([r[0] for r in rows],))


def worker(mode: str, argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--queue", default="noop")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--burst", action="store_true", help="exit once nothing is due")
    args = parser.parse_args(argv)
    url = os.environ["BENCH_DATABASE_URL"]
    probe.ready()
    threads = [
        threading.Thread(target=_work_loop, args=(url, mode, args.queue, args.burst), daemon=True)
        for _ in range(args.concurrency)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    mode = sys.argv.pop(1)
    if sys.argv[1:2] == ["worker"]:
        worker(mode, sys.argv[2:])
    else:
        main(lambda url: Raw(url, mode))
