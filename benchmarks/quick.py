"""Quick throughput check: enqueue_many rate, and processing rate of one
worker process at a few concurrencies (no-op handler).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/delayq_bench \
        .venv/bin/python -m benchmarks.quick [--messages 20000]

The database named in DATABASE_URL is dropped and re-created (PostgreSQL)
or deleted (SQLite) first: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def reset_database(url: str) -> None:
    import environ

    config = environ.Env.db_url_config(url)
    if config["ENGINE"].endswith("sqlite3"):
        for suffix in ("", "-wal", "-shm"):
            Path(config["NAME"] + suffix).unlink(missing_ok=True)
        return
    import psycopg

    admin = dict(
        host=config["HOST"] or "127.0.0.1",
        port=config["PORT"] or 5432,
        user=config["USER"] or "postgres",
        dbname="postgres",
        autocommit=True,
    )
    if config["PASSWORD"]:
        admin["password"] = config["PASSWORD"]
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{config["NAME"]}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{config["NAME"]}"')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args()
    url = os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/delayq_bench")
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    reset_database(url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"], check=True, env=env, cwd=ROOT
    )

    import django

    django.setup()
    from django_delayq import enqueue_many
    from django_delayq.models import Message

    n = args.messages
    print(f"database: {url.split('@')[-1]}  messages: {n}")
    start = time.perf_counter()
    enqueue_many("noop", [{"n": i} for i in range(n)])
    elapsed = time.perf_counter() - start
    print(f"enqueue_many        {n / elapsed:10,.0f} messages/s  ({elapsed:.2f} s)")

    for concurrency in args.concurrency:
        Message.objects.all().delete()
        enqueue_many("noop", [{"n": i} for i in range(n)])
        batch = args.batch_size or max(concurrency, 10)
        command = [
            sys.executable,
            "-m",
            "django",
            "run_delayq",
            "--burst",
            "--queue",
            "noop",
            "--concurrency",
            str(concurrency),
            "--batch-size",
            str(batch),
            "-v0",
        ]
        start = time.perf_counter()
        subprocess.run(command, check=True, env=env, cwd=ROOT)
        elapsed = time.perf_counter() - start
        done = Message.objects.filter(status="succeeded").count()
        assert done == n, f"only {done} of {n} succeeded"
        print(
            f"process c={concurrency} b={batch:<3}  {n / elapsed:10,.0f} messages/s  "
            f"({elapsed:.2f} s, includes process start-up)"
        )


if __name__ == "__main__":
    main()
