"""Behind PgBouncer: what each wake-up mode costs (pickup latency, no-op throughput).

    .venv/bin/python -m benchmarks.pgbouncer [--samples 40] [--polled-samples 20]
        [--messages 2000] [--direct URL] [--pgbouncer URL]

Three configurations of one ``run_delayq --concurrency 1`` worker on the
same PostgreSQL database:

* ``direct``: no pooler; the worker LISTENs on its own connection;
* ``pgbouncer + LISTEN_DATABASE``: every statement through PgBouncer in
  transaction mode, the LISTEN on a direct alias (``DELAYQ["LISTEN_DATABASE"]``);
* ``pgbouncer, polling``: through PgBouncer alone, so the worker polls
  (``POLL_INTERVAL`` at its default, 5 s).

Pickup latency: commit of one due message (through the configuration's own
connection) to its claim (``last_attempt_time``, the database clock of the
same machine), on an idle worker, one message at a time. Throughput: a
serving worker drains ``--messages`` no-op messages enqueued in one
transaction, from its first claim to its last finish (the median of
``--drains`` drains).

The database (``delayq_pgbouncer_bench`` unless ``--direct`` names another) is
dropped and created again; PgBouncer comes from ``scripts/ensure-pgbouncer.sh``
unless ``--pgbouncer`` gives its URL. Figures go to stdout (Markdown).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIRECT = "postgres://postgres@127.0.0.1:5432/delayq_pgbouncer_bench"


def recreate(url: str) -> None:
    import environ
    import psycopg

    config = environ.Env.db_url_config(url)
    admin = {
        "host": config["HOST"] or "127.0.0.1",
        "port": config["PORT"] or 5432,
        "user": config["USER"] or "postgres",
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{config["NAME"]}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{config["NAME"]}"')


def pgbouncer_url(direct: str) -> str:
    out = subprocess.run(
        [str(ROOT / "scripts" / "ensure-pgbouncer.sh"), direct],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


class Mode:
    def __init__(self, name: str, url: str, listen_url: str | None) -> None:
        self.name = name
        self.url = url
        self.listen_url = listen_url

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "benchmarks.pgbouncer_settings",
            "DATABASE_URL": self.url,
            "DELAYQ_LOG_LEVEL": "INFO",
        }
        env.pop("BENCH_LISTEN_URL", None)
        if self.listen_url:
            env["BENCH_LISTEN_URL"] = self.listen_url
        return env


class Worker:
    """One serving ``run_delayq`` process; its log tells when it is up."""

    def __init__(self, mode: Mode, log: Path) -> None:
        self.log = log
        self.out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "run_delayq", "--queue", "noop"]
            + ["--concurrency", "1"],
            cwd=ROOT,
            env=mode.env(),
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while b"wake-up: " not in log.read_bytes():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the worker did not start: {log.read_text()}")
            time.sleep(0.05)

    def wake_up_line(self) -> str:
        for line in self.log.read_text().splitlines():
            if "wake-up: " in line:
                return line[line.index("wake-up: ") :]
        return ""

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.out.close()


def wait_done(ids: list[int], timeout: float) -> None:
    from django_delayq.models import Message

    deadline = time.monotonic() + timeout
    while Message.objects.filter(pk__in=ids).exclude(status="succeeded").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("messages not processed in time")
        time.sleep(0.002)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(mode: Mode, samples: int, messages: int, drains: int, workdir: Path) -> dict[str, Any]:
    from django.db import connections

    from django_delayq import enqueue, enqueue_many
    from django_delayq.models import Message

    connections["default"].close()
    connections["default"].settings_dict.update(_db_settings(mode.url))
    Message.objects.all().delete()
    worker = Worker(mode, workdir / f"{mode.name.replace(' ', '_')}.log")
    try:
        rng = random.Random(7)
        latencies = []
        for _ in range(samples):
            time.sleep(0.05 + rng.random() * 0.05)  # the worker is idle again
            message = enqueue("noop", {}).message
            committed = time.time()
            wait_done([message.pk], 60)
            claimed: datetime = Message.objects.get(pk=message.pk).last_attempt_time
            latencies.append((claimed.timestamp() - committed) * 1000)
        rates = []
        for _ in range(drains):
            Message.objects.all().delete()
            time.sleep(0.2)
            rows = enqueue_many("noop", [{}] * messages)
            wait_done([r.message.pk for r in rows], 600)
            done = Message.objects.filter(queue="noop")
            first = min(m.last_attempt_time for m in done)
            last = max(m.finished_at for m in done)
            rates.append(messages / (last - first).total_seconds())
        line = worker.wake_up_line()
    finally:
        worker.stop()
    return {
        "mode": mode.name,
        "p50": statistics.median(latencies),
        "p95": percentile(latencies, 0.95),
        "samples": samples,
        "rate": statistics.median(rates),
        "line": line,
    }


def _db_settings(url: str) -> dict[str, Any]:
    import environ

    config = environ.Env.db_url_config(url)
    return {k: config[k] for k in ("NAME", "HOST", "PORT", "USER", "PASSWORD")}


def header(args: argparse.Namespace, load_before: float) -> str:
    """Date, command, versions and machine load of the run (a results file's preamble)."""
    import platform

    import django
    import psycopg
    from django.db import connection

    bouncer = subprocess.run(
        ["pgbouncer", "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n")[0]
    command = " ".join(["python -m benchmarks.pgbouncer", *sys.argv[1:]])
    return (
        f"\n{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, `{command}`: one `run_delayq "
        "--concurrency 1` worker, no-op handler, the default `POLL_INTERVAL` (5 s); "
        f"PostgreSQL {connection.pg_version // 10000}.{connection.pg_version % 10000}, "
        f"{bouncer or 'PgBouncer'} (pool_mode = transaction, default_pool_size = 2), "
        f"Python {platform.python_version()}, Django {django.get_version()}, "
        f"psycopg {psycopg.__version__}; {os.cpu_count()} CPUs, load average "
        f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after. Pickup: "
        f"commit to claim, one message at a time, each 50-100 ms after the previous "
        f"one finished; drain: {args.messages:,} messages enqueued at once, first claim "
        f"to last finish, the median of {args.drains} drains.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40, help="latency samples (listening)")
    parser.add_argument("--polled-samples", type=int, default=20, help="latency samples (polling)")
    parser.add_argument("--messages", type=int, default=2000, help="messages of a drain")
    parser.add_argument("--drains", type=int, default=3, help="drains (the median is kept)")
    parser.add_argument("--direct", default=DEFAULT_DIRECT, help="PostgreSQL URL, no pooler")
    parser.add_argument("--pgbouncer", default=None, help="the same database through PgBouncer")
    parser.add_argument("--workdir", default="/tmp/delayq-bench-pgbouncer")
    args = parser.parse_args()

    recreate(args.direct)
    pooled = args.pgbouncer or pgbouncer_url(args.direct)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "benchmarks.pgbouncer_settings",
            "DATABASE_URL": args.direct,
        }
    )
    os.environ.pop("BENCH_LISTEN_URL", None)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    import django

    django.setup()
    modes = [
        (Mode("direct", args.direct, None), args.samples),
        (Mode("pgbouncer + LISTEN_DATABASE", pooled, args.direct), args.samples),
        (Mode("pgbouncer, polling", pooled, None), args.polled_samples),
    ]
    load_before = os.getloadavg()[0]
    results = [
        measure(mode, samples, args.messages, args.drains, workdir) for mode, samples in modes
    ]
    print(header(args, load_before))
    print("| configuration | pickup p50 | pickup p95 | samples | no-op drain |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['mode']} | {r['p50']:,.1f} ms | {r['p95']:,.1f} ms | {r['samples']} "
            f"| {r['rate']:,.0f} msg/s |"
        )
    print()
    for r in results:
        print(f"{r['mode']}: {r['line']}")


if __name__ == "__main__":
    main()
