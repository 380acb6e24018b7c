"""Table health under a steady load: dead tuples and size over a long run.

    make soak                                   # one hour at 200 messages/s
    .venv/bin/python -m benchmarks.soak --minutes 60 --rate 200 [--retention 300]

A producer thread enqueues ``--rate`` messages a second (one transaction
each, as web requests would) into a fresh database (``delayq_bench_soak`` on
``BENCH_POSTGRES``); one ``run_delayq`` process consumes them with the
product's defaults, except a short ``RETENTION`` (so pruning starts within
the run) and a ``PRUNE_INTERVAL`` of 30 s. Every minute the message table's
statistics are sampled: live and dead tuples, table and index sizes,
autovacuum runs, the backlog. At the end it prints and writes
``benchmarks/results/soak-<date>.md`` and a PNG chart. Like ``make bench``
it prints figures and never asserts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.bench import save_chart
from benchmarks.systems.common import ROOT, drop_database, fresh_database

RESULTS = ROOT / "benchmarks" / "results"

SETTINGS = """
SELECT string_agg(name || ' = ' || setting, ', ' ORDER BY name) FROM pg_settings
WHERE name IN ('autovacuum', 'autovacuum_naptime', 'shared_buffers', 'synchronous_commit')
"""
SAMPLE = """
SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count,
       pg_table_size('django_delayq_message'), pg_indexes_size('django_delayq_message'),
       (SELECT count(*) FROM django_delayq_message WHERE status IN ('pending', 'running')),
       (SELECT count(*) FROM django_delayq_message WHERE status = 'succeeded')
FROM pg_stat_user_tables WHERE relname = 'django_delayq_message'
"""
COLUMNS = [
    "minute",
    "enqueued",
    "live tuples",
    "dead tuples",
    "autovacuums",
    "autoanalyzes",
    "table MiB",
    "indexes MiB",
    "backlog",
    "succeeded kept",
]


def produce(rate: float, stop: threading.Event, counter: list[int]) -> None:
    """Enqueue at ``rate`` per second, each in its own transaction, until ``stop``."""
    from django.db import connections

    from django_delayq import enqueue

    interval = 1.0 / rate
    next_at = time.monotonic()
    try:
        while not stop.is_set():
            enqueue("noop", {"n": counter[0]})
            counter[0] += 1
            next_at += interval
            pause = next_at - time.monotonic()
            if pause > 0:
                stop.wait(pause)
    finally:
        connections.close_all()


def sample(url: str) -> tuple[Any, ...]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(SAMPLE).fetchone()
    assert row is not None
    return tuple(row)


def chart(path: Path, rows: list[list[Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r[0] for r in rows]
    fig, (tuples, sizes) = plt.subplots(1, 2, figsize=(13, 4))
    tuples.plot(minutes, [r[2] for r in rows], label="live tuples")
    tuples.plot(minutes, [r[3] for r in rows], label="dead tuples")
    tuples.plot(minutes, [r[8] for r in rows], label="backlog (pending + running)")
    tuples.set_xlabel("minute")
    tuples.legend()
    sizes.plot(minutes, [r[6] for r in rows], label="table MiB")
    sizes.plot(minutes, [r[7] for r in rows], label="indexes MiB")
    sizes.set_xlabel("minute")
    sizes.legend()
    save_chart(fig, title, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=200, help="messages per second")
    parser.add_argument("--retention", type=float, default=300, help="seconds (RETENTION)")
    parser.add_argument("--every", type=float, default=60, help="seconds between samples")
    args = parser.parse_args()

    url = fresh_database("soak")
    with psycopg.connect(url) as conn:
        server = conn.execute("SELECT version()").fetchone()
        settings = conn.execute(SETTINGS).fetchone()
    server_info = f"{server[0] if server else '?'}; {settings[0] if settings else '?'}"
    print(f"server: {server_info}", flush=True)
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["BENCH_SOAK_RETENTION"] = str(args.retention)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (RESULTS.parent / ".soak-worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "run_delayq", "--queue", "noop", "-v1"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    stop = threading.Event()
    counter = [0]
    producer = threading.Thread(target=produce, args=(args.rate, stop, counter), daemon=True)
    started = dt.datetime.now(dt.UTC)
    start = time.monotonic()
    producer.start()
    rows: list[list[Any]] = []
    print("  ".join(f"{c:>14}" for c in COLUMNS), flush=True)
    try:
        deadline = start + args.minutes * 60
        next_sample = start
        while True:
            now = time.monotonic()
            if now >= next_sample:
                live, dead, vacuums, analyzes, table, indexes, backlog, kept = sample(url)
                row = [
                    round((now - start) / 60, 1),
                    counter[0],
                    live,
                    dead,
                    vacuums,
                    analyzes,
                    round(table / 2**20, 1),
                    round(indexes / 2**20, 1),
                    backlog,
                    kept,
                ]
                rows.append(row)
                print("  ".join(f"{v:>14,}" for v in row), flush=True)
                next_sample += args.every
            if now >= deadline or worker.poll() is not None:
                break
            time.sleep(min(1.0, max(0.0, next_sample - time.monotonic())))
    finally:
        stop.set()
        producer.join(10)
        worker.terminate()
        worker.wait(60)
        log.close()
    elapsed = (time.monotonic() - start) / 60
    if worker.returncode not in (0, -15):
        print(f"the worker exited with {worker.returncode}; see benchmarks/.soak-worker.log")

    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"soak-{started:%Y%m%d-%H%M}"
    title = (
        f"django-delayq soak, {started:%Y-%m-%d}: {args.rate:g} msg/s for {elapsed:.0f} min, "
        f"retention {args.retention:g} s"
    )
    chart(RESULTS / f"{name}.png", rows, title)
    settled = [r for r in rows if r[0] >= (args.retention / 60) + 5] or rows
    lines = [
        f"# {title}",
        "",
        f"- command: `python -m benchmarks.soak {' '.join(sys.argv[1:])}`".rstrip(),
        f"- server: {server_info}",
        f"- enqueued {counter[0]:,} messages ({counter[0] / (elapsed * 60):,.0f}/s)",
        "- after the retention (+5 min): dead tuples "
        f"{min(r[3] for r in settled):,} to {max(r[3] for r in settled):,}, "
        f"table {min(r[6] for r in settled)} to {max(r[6] for r in settled)} MiB, "
        f"indexes {min(r[7] for r in settled)} to {max(r[7] for r in settled)} MiB, "
        f"backlog at most {max(r[8] for r in settled):,}",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(["---"] * len(COLUMNS)) + "|",
        *("| " + " | ".join(f"{v:,}" for v in r) + " |" for r in rows),
        "",
        f"![chart]({name}.png)",
        "",
    ]
    (RESULTS / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines[:6]))
    print(f"written: benchmarks/results/{name}.md and .png")
    from django.db import connections

    connections.close_all()
    drop_database("soak")


if __name__ == "__main__":
    main()
