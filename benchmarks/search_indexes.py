"""What the opt-in search indexes cost an enqueue (PostgreSQL).

    .venv/bin/python -m benchmarks.search_indexes [--rows 200000] [--enqueues 5000]
        [--explained 1000] [--rounds 3]

Fills a scratch database (``delayq_bench_search`` on the local PostgreSQL, or
the one ``BENCH_SEARCH_DATABASE_URL`` names: it is dropped and re-created)
with ``--rows`` messages as ``benchmarks.admin_1m`` does. Then, with no
search index, with each index of ``django_delayq.contrib.search_indexes``
alone, and with all of them, it times ``--enqueues`` calls of ``enqueue()``,
each in its own transaction (as a web request enqueues), and runs the
statement ``enqueue()`` sends ``--explained`` more times under ``EXPLAIN
(ANALYZE, WAL)``. The variants take turns in every round (a different order
each round) so that a busy machine weighs on all of them alike. Per variant,
the median over the rounds of: enqueues per second; CPU milliseconds per
enqueue of the database server's process (read from ``/proc``, so when the
server runs on this machine) and of this process; and the statement's own
execution time, WAL records and WAL bytes, as the server counts them for
that statement alone (other writers of the same server do not count). On a
busy machine the rate varies from run to run; the WAL records do not, and
the CPU and the statement's time much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks.quick import reset_database

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/delayq_bench_search"


def backend_cpu(pid: int) -> float | None:
    """Seconds of CPU the server process ``pid`` has used (None: not on this machine)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def payload(i: int) -> dict[str, object]:
    return {
        "companyId": i % 5000,
        "orderId": i,
        "email": f"user{i}@example.com",
        "amount": (i % 997) * 1.5,
        "tags": [f"t{i % 7}", "bulk"],
    }


def run(count: int, offset: int) -> dict[str, float | None]:
    """``count`` enqueues, each committed alone: the rate, and the CPU
    milliseconds per enqueue of this process and of its server process."""
    from django.db import connection, transaction

    from django_delayq import enqueue

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    server_start = backend_cpu(pid)
    client_start = time.process_time()
    start = time.perf_counter()
    for i in range(offset, offset + count):
        with transaction.atomic():
            enqueue("orders", payload(i), kind="orders.v2")
    elapsed = time.perf_counter() - start
    client = time.process_time() - client_start
    server_end = backend_cpu(pid)
    server = None if server_start is None or server_end is None else server_end - server_start
    return {
        "rate": count / elapsed,
        "client_ms": client * 1000 / count,
        "server_ms": None if server is None else server * 1000 / count,
    }


def insert_statement() -> tuple[str, str]:
    """The statement ``enqueue()`` sends, and the literal of its key and payload."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from django_delayq import enqueue

    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        result = enqueue("orders", payload(0), kind="orders.v2")
    (sql,) = [q["sql"] for q in captured.captured_queries if "INSERT" in q["sql"]]
    literal = json.dumps([[result.message.key, payload(0)]], separators=(",", ":"))
    assert literal in sql, "the statement's form changed: update this benchmark"
    return sql, literal


def explained(count: int, offset: int, sql: str, literal: str) -> dict[str, float | None]:
    """``count`` runs of the enqueue's statement under ``EXPLAIN (ANALYZE, WAL)``,
    each in its own transaction: per statement, its WAL records and bytes and
    its execution time (the server's own figures, whoever else writes)."""
    from django.db import connection

    records, wal, times = [], [], []
    with connection.cursor() as cursor:
        for i in range(offset, offset + count):
            new = json.dumps([[uuid.uuid4().hex, payload(i)]], separators=(",", ":"))
            cursor.execute(
                "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "
                + sql.replace(literal, new).replace("%", "%%")
            )
            (found,) = cursor.fetchone()
            top = (json.loads(found) if isinstance(found, str) else found)[0]
            records.append(top["Plan"]["WAL Records"])
            wal.append(top["Plan"]["WAL Bytes"])
            times.append(top["Execution Time"])
    return {
        "wal_records": statistics.mean(records),
        "wal": statistics.mean(wal),
        "statement_ms": statistics.median(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--enqueues", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--explained", type=int, default=1_000)
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
    results: dict[str, list[dict[str, float | None]]] = {label: [] for label, _ in variants}
    offset = 10 * args.rows
    sql, literal = insert_statement()
    for round_no in range(args.rounds):
        shift = round_no % len(variants)
        for label, chosen in variants[shift:] + variants[:shift]:
            indexes.drop(connection, concurrently=False)
            indexes.create(connection, Message, chosen, concurrently=False)
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE django_delayq_message")
            found = run(args.enqueues, offset)
            offset += args.enqueues
            found |= explained(args.explained, offset, sql, literal)
            offset += args.explained
            results[label].append(found)
            print(f"round {round_no + 1}: {label:<28} {found}", flush=True)

    def median(label: str, name: str) -> float | None:
        values = [r[name] for r in results[label] if r[name] is not None]
        return statistics.median(values) if values else None

    base = variants[0][0]

    def change(label: str, name: str) -> str:
        value, reference = median(label, name), median(base, name)
        if value is None or reference is None:
            return "n/a"
        return f"{value:.3f} ({(value / reference - 1) * 100:+.0f}%)"

    print(
        f"\n{'indexes':<26} {'enqueue/s':>9} {'server CPU ms':>15} {'client CPU ms':>14} "
        f"{'statement ms':>15} {'WAL records':>11} {'WAL bytes':>15}"
    )
    for label, _ in variants:
        wal, base_wal = median(label, "wal") or 0, median(base, "wal") or 1
        print(
            f"{label:<26} {median(label, 'rate') or 0:>9,.0f} {change(label, 'server_ms'):>15} "
            f"{median(label, 'client_ms') or 0:>14.3f} {change(label, 'statement_ms'):>15} "
            f"{median(label, 'wal_records') or 0:>11.2f} "
            f"{wal:>7,.0f} ({(wal / base_wal - 1) * 100:+.0f}%)"
        )


if __name__ == "__main__":
    main()
