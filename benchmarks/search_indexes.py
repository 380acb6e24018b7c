"""What the opt-in search indexes cost an enqueue (PostgreSQL).

    .venv/bin/python -m benchmarks.search_indexes [--rows 200000] [--enqueues 5000] [--rounds 3]

Fills a scratch database (``delayq_bench_search`` on the local PostgreSQL, or
the one ``BENCH_SEARCH_DATABASE_URL`` names: it is dropped and re-created)
with ``--rows`` messages as ``benchmarks.admin_1m`` does, then times
``--enqueues`` calls of ``enqueue()``, each in its own transaction (as a web
request enqueues), with no search index, with each index of
``django_delayq.contrib.search_indexes`` alone, and with all of them. The
variants take turns in every round (a different order each round) so that a
busy machine weighs on all of them alike. It prints per variant the median
over the rounds of the enqueues per second, the change from no index, and
the WAL written per enqueue (bytes: a measure of the write that does not
depend on the machine's load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.quick import reset_database

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/delayq_bench_search"


def run(count: int, offset: int) -> tuple[float, float]:
    """Seconds for ``count`` enqueues, each committed alone, and WAL bytes per enqueue."""
    from django.db import connection, transaction

    from django_delayq import enqueue

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        (wal_start,) = cursor.fetchone()
    start = time.perf_counter()
    for i in range(offset, offset + count):
        payload = {
            "companyId": i % 5000,
            "orderId": i,
            "email": f"user{i}@example.com",
            "amount": (i % 997) * 1.5,
            "tags": [f"t{i % 7}", "bulk"],
        }
        with transaction.atomic():
            enqueue("orders", payload, kind="orders.v2")
    elapsed = time.perf_counter() - start
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", [wal_start])
        (wal,) = cursor.fetchone()
    return elapsed, float(wal) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--enqueues", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("BENCH_SEARCH_DATABASE_URL", DEFAULT_URL)
    if not url.startswith("postgres"):
        sys.exit("this benchmark needs PostgreSQL (BENCH_SEARCH_DATABASE_URL=postgres://...)")
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    reset_database(url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"], check=True, env=env, cwd=ROOT
    )

    import django

    django.setup()
    from django.db import connection

    from benchmarks.admin_1m import fill
    from django_delayq.contrib.search_indexes import indexes
    from django_delayq.models import Message

    print(f"database: {url.split('@')[-1]}")
    fill(args.rows)
    variants = [("no search index", ())]
    variants += [(index.name, (index,)) for index in indexes.INDEXES]
    variants.append(("all four", indexes.INDEXES))
    rates: dict[str, list[float]] = {label: [] for label, _ in variants}
    wal: dict[str, list[float]] = {label: [] for label, _ in variants}
    offset = 10 * args.rows
    for round_no in range(args.rounds):
        shift = round_no % len(variants)
        for label, chosen in variants[shift:] + variants[:shift]:
            indexes.drop(connection, concurrently=False)
            indexes.create(connection, Message, chosen, concurrently=False)
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE django_delayq_message")
                cursor.execute("CHECKPOINT")
            elapsed, wal_per = run(args.enqueues, offset)
            offset += args.enqueues
            rates[label].append(args.enqueues / elapsed)
            wal[label].append(wal_per)
            print(
                f"round {round_no + 1}: {label:<28} {args.enqueues / elapsed:8,.0f}/s", flush=True
            )
    base = statistics.median(rates[variants[0][0]])
    base_wal = statistics.median(wal[variants[0][0]])
    print(f"\n{'indexes':<28} {'enqueue/s':>10} {'change':>8} {'WAL B/enqueue':>14}")
    for label, _ in variants:
        rate = statistics.median(rates[label])
        wal_per = statistics.median(wal[label])
        print(
            f"{label:<28} {rate:>10,.0f} {(rate / base - 1) * 100:>+7.1f}% "
            f"{wal_per:>8,.0f} ({wal_per - base_wal:+,.0f})"
        )


if __name__ == "__main__":
    main()
