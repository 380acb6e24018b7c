"""A queue under database pressure: a steady load through clean → pressure → recovery.

    python -m benchmarks.systems.<adapter> pressure --scenario xmin --rate 100 \\
        --phases 60,120,60 --concurrency 16 --queue sleep --db NAME

One serving worker runs ``queue`` (``sleep``: 1 ms jobs) while this process
enqueues ``rate`` messages a second, one per transaction, for the three
phases. During the middle one the database is put under ``scenario``:

* ``xmin``: another session holds a transaction that has a transaction id,
  idle, as an ``idle in transaction`` application would: vacuum can remove no
  row version that died after it began;
* ``readers``: four sessions under ``REPEATABLE READ`` keep scanning the
  system's tables in transactions that last the phase (their snapshots hold
  the horizon too, and they compete for the tables);
* ``overload``: the producer offers ``overload`` times the rate.

Every ``SAMPLE`` seconds a sampler reads, for the system's tables, their dead
tuples (``pg_stat_user_tables``) and their size with indexes, the worker's
progress, and its resident memory (with its child processes). The result
is one JSON line: per phase, the completion rate, the pickup p50/p99 of
the messages enqueued in it (commit to handler start), dead tuples, size
and the worker's memory at its end, and the time series, which the
runner (``benchmarks/pressure.py``) tabulates and charts. It asserts
nothing. It measures on the server ``BENCH_POSTGRES`` names: a dedicated
cluster with production settings (autovacuum on), never a shared one.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import psycopg

from benchmarks.systems.common import System, _warm_worker

SAMPLE = 2.0
SCENARIOS = ("xmin", "readers", "overload")
READERS = 4


def _tables(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT relname FROM pg_stat_user_tables WHERE schemaname = current_schema()"
    ).fetchall()
    return [r[0] for r in rows]


def _table_figures(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Dead tuples and bytes (with indexes and TOAST) of the database's own tables."""
    row = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0), "
        "coalesce(sum(pg_total_relation_size(relid)), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = current_schema()"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


class _Pressure:
    """What the middle phase does to the database, on threads of its own."""

    def __init__(self, url: str, scenario: str) -> None:
        self.url = url
        self.scenario = scenario
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.scans = 0

    def start(self) -> None:
        if self.scenario == "xmin":
            self._threads.append(threading.Thread(target=self._hold, daemon=True))
        elif self.scenario == "readers":
            self._threads += [
                threading.Thread(target=self._read, daemon=True) for _ in range(READERS)
            ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _hold(self) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute("SELECT txid_current()")  # a transaction id, then idle
            self._stop.wait()
            conn.rollback()

    def _read(self) -> None:
        with psycopg.connect(self.url) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            tables = _tables(conn)
            while not self._stop.is_set():
                for table in tables:
                    conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
                    self.scans += 1
                    if self._stop.is_set():
                        break
            conn.rollback()


def _rss_bytes(pids: list[int]) -> int:
    """Resident memory of these processes and their children (Linux's /proc)."""
    total = 0
    todo = list(pids)
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                todo += [int(child) for child in children.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def measure_pressure(
    system: System,
    scenario: str,
    rate: float,
    phases: tuple[float, float, float],
    *,
    overload: float = 1.5,
    concurrency: int = 16,
    queue: str = "sleep",
) -> dict[str, Any]:
    """See the module's docstring."""
    system.install()
    workers = _warm_worker(
        system, {"BENCH_PROBE_SAMPLES": "1"}, concurrency=concurrency, queue=queue
    )
    pressure = _Pressure(system.url, scenario)
    committed: dict[str, float] = {}
    phase_of: dict[str, int] = {}
    series: list[dict[str, Any]] = []
    stop_sampling = threading.Event()
    bounds: list[float] = []

    def sample() -> None:
        with psycopg.connect(system.url, autocommit=True) as conn:
            last = (time.monotonic(), workers.count())
            while not stop_sampling.wait(SAMPLE):
                now, done = time.monotonic(), workers.count()
                dead, size = _table_figures(conn)
                series.append(
                    {
                        "t": now - bounds[0],
                        "done_per_s": (done - last[1]) / (now - last[0]),
                        "backlog": len(committed) - (done - 1),
                        "dead_tuples": dead,
                        "bytes": size,
                        "worker_rss": _rss_bytes([proc.pid for proc in workers.procs]),
                    }
                )
                last = (now, done)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        start = due = time.monotonic()
        bounds.append(start)
        sampler.start()
        i = 0
        for number, seconds in enumerate(phases):
            if number == 1:
                pressure.start()
            offered = rate * (overload if number == 1 and scenario == "overload" else 1)
            end = time.monotonic() + seconds
            while due < end:
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                system.enqueue_one(i, queue)
                committed[str(i)] = time.monotonic()
                phase_of[str(i)] = number
                i += 1
                due += 1 / offered
            if number == 1:
                pressure.stop()
            bounds.append(time.monotonic())
        probes = workers.wait_for(i + 1, 900)
        stop_sampling.set()
        sampler.join(30)
    finally:
        stop_sampling.set()
        pressure.stop()
        workers.stop()
        system.close()
    starts = {k: v for p in probes for k, v in p["starts"].items()}
    names = ("clean", scenario, "recovery")
    out: list[dict[str, Any]] = []
    for number, name in enumerate(names):
        keys = [k for k, p in phase_of.items() if p == number]
        lat = sorted((starts[k] - committed[k]) * 1000 for k in keys if k in starts)
        begin, end = bounds[number] - start, bounds[number + 1] - start
        inside = [s for s in series if begin <= s["t"] < end] or series[-1:]
        done = [s["done_per_s"] for s in inside]
        out.append(
            {
                "phase": name,
                "seconds": end - begin,
                "offered_per_s": len(keys) / (end - begin),
                "done_per_s": statistics.mean(done) if done else None,
                "pickup_p50_ms": statistics.median(lat) if lat else None,
                "pickup_p99_ms": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
                if lat
                else None,
                "dead_tuples_end": inside[-1]["dead_tuples"] if inside else None,
                "bytes_end": inside[-1]["bytes"] if inside else None,
                "backlog_max": max(s["backlog"] for s in inside) if inside else None,
                "worker_rss_end": inside[-1].get("worker_rss") if inside else None,
            }
        )
    return {
        "value": out[1]["pickup_p99_ms"],
        "unit": "ms",
        "scenario": scenario,
        "rate": rate,
        "phases": out,
        "bounds": [b - start for b in bounds],
        "series": series,
        "reader_scans": pressure.scans,
    }
