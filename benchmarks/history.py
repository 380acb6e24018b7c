"""Ten million finished messages kept for retention (PostgreSQL, on its own cluster).

    .venv/bin/python -m benchmarks.history [--rows 10000000] [--runs 5] [--rounds 2] [--keep]

``make bench-history``. What a queue that keeps its history costs once the
history is large: the same measurements on an empty installation and on one
holding ``--rows`` finished messages (succeeded, failed and cancelled, over a
week, as ``benchmarks/admin_1m.py`` fills them), side by side:

* ``enqueue``: one message per transaction (milliseconds, median and p99);
* claim: one message per claim, and ten per claim, among 2,000 due ones;
* worker start-up: ``run_delayq --burst`` on an empty queue, spawn to exit;
* ``delayq_status``, spawn to exit;
* the admin's pages (``admin_1m.measure``);

then, on the full installation, retention (``django_delayq.retention.prune``)
removing all of them while a probe thread enqueues and claims a message every
20 ms (the claim's latency before and during the prune says whether it blocks
workers), and the table's and its indexes' sizes before the prune, after it,
after a ``VACUUM`` (what autovacuum does on its own), and after as many new
finished messages as a tenth of the history arrive again (the space freed is
reused: nothing grows).

It runs on the pressure benchmark's cluster (``.pgdata-pressure``, port 54331,
PostgreSQL's default settings with autovacuum on: ``benchmarks/pressure.py``),
never the shared server. Results: ``benchmarks/results/history-<stamp>.md``
and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DATABASES = {"empty": "delayq_history_empty", "full": "delayq_history_full"}
QUEUE = "history-probe"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def spread(values: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(values), "p99": p99(values), "max": max(values)}


def timed_ms(action: Any) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def spawn_ms(command: list[str], env: dict[str, str], runs: int) -> float:
    """Median wall time of ``command`` from spawn to exit (after one run not counted)."""
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True)
        if i:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def sizes() -> dict[str, float]:
    """The message table's and its indexes' sizes (MB), and its dead tuples."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_table_size('django_delayq_message'), "
            "pg_indexes_size('django_delayq_message'), "
            "(SELECT n_dead_tup FROM pg_stat_user_tables "
            " WHERE relname = 'django_delayq_message')"
        )
        table, indexes, dead = cursor.fetchone()
    return {"table_mb": table / 2**20, "indexes_mb": indexes / 2**20, "dead": dead or 0}


def setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["BENCH_ADMIN"] = "1"
    import django

    django.setup()


def claim_one(batch: int = 1) -> int:
    from datetime import timedelta

    from django_delayq.store import claim

    result = claim.claim(
        [QUEUE], batch, worker="history-bench", lease=timedelta(minutes=5), using="default"
    )
    return len(result.messages)


def measure(url: str, runs: int) -> dict[str, Any]:
    """Every figure of one installation (run in a process of its own)."""
    setup(url)
    from benchmarks import admin_1m
    from django_delayq import enqueue

    out: dict[str, Any] = {"sizes": sizes()}
    enqueue(QUEUE, {"warm": True})
    claim_one()
    out["enqueue_ms"] = spread([timed_ms(lambda: enqueue(QUEUE, {"n": 1})) for _ in range(2000)])
    out["claim1_ms"] = spread([timed_ms(claim_one) for _ in range(1000)])
    out["claim10_ms"] = spread([timed_ms(lambda: claim_one(10)) for _ in range(100)])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    django = [sys.executable, "-m", "django"]
    out["startup_ms"] = spawn_ms(
        [*django, "run_delayq", "--burst", "--queue", "noop", "-v0"], env, runs
    )
    out["status_ms"] = spawn_ms([*django, "delayq_status"], env, runs)
    out["admin"] = {
        label: {"median_ms": median, "max_ms": worst, "queries": queries}
        for label, median, worst, queries in admin_1m.measure(runs, False)
    }
    return out


def prune(url: str, rows: int, paced_seconds: float) -> dict[str, Any]:
    """Retention removing the whole history under a probe; sizes before and after.

    First for ``paced_seconds`` as a worker prunes (``Maintenance.prune``:
    ``PRUNE_BATCHES`` batches a round, the next round ``PRUNE_CATCH_UP`` later
    while there is more), then half the rest as ``delayq_prune`` does (its
    pause), then the other half as fast as the server goes (``--pause 0``).
    """
    setup(url)
    from django.db import connection, connections

    from benchmarks import admin_1m
    from django_delayq import enqueue, retention
    from django_delayq.conf import get_config
    from django_delayq.management.commands.delayq_prune import DEFAULT_PAUSE as PAUSE
    from django_delayq.worker.maintenance import PRUNE_BATCHES, PRUNE_CATCH_UP

    out: dict[str, Any] = {"before": sizes()}
    claims: list[tuple[float, float]] = []
    stop = threading.Event()

    def probe() -> None:
        try:
            while not stop.wait(0.02):
                enqueue(QUEUE, {"probe": True})
                claims.append((time.perf_counter(), timed_ms(claim_one)))
        finally:
            connections.close_all()

    def during(start: float, end: float) -> dict[str, float]:
        return spread([ms for at, ms in claims if start <= at <= end])

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(3)  # the probe's figures before the prune
    start = time.perf_counter()
    paced = 0
    while time.perf_counter() - start < paced_seconds:
        deleted = retention.prune(older_than=0, max_batches=PRUNE_BATCHES, using="default")
        paced += deleted
        if not deleted:
            break
        time.sleep(PRUNE_CATCH_UP)
    # Half of what is left as ``delayq_prune`` deletes it (a pause as long as
    # each batch took), the other half with no pause (``--pause 0``).
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_delayq_message WHERE status <> 'pending'")
        (left,) = cursor.fetchone()
    middle = time.perf_counter()
    size = int(get_config()["PRUNE_BATCH_SIZE"])
    halfway = retention.prune(
        older_than=0, max_batches=max(1, left // 2 // size), pause=PAUSE, using="default"
    )
    paused_end = time.perf_counter()
    rest = retention.prune(older_than=0, using="default")
    end = time.perf_counter()
    time.sleep(1)
    stop.set()
    thread.join()
    out["claim_before_ms"] = spread([ms for at, ms in claims if at < start])
    out["paced"] = {
        "deleted": paced,
        "seconds": middle - start,
        "rows_per_s": paced / (middle - start),
        "claim_ms": during(start, middle),
    }
    out["paused"] = {
        "deleted": halfway,
        "seconds": paused_end - middle,
        "rows_per_s": halfway / max(paused_end - middle, 1e-9),
        "claim_ms": during(middle, paused_end),
    }
    out["at_once"] = {
        "deleted": rest,
        "seconds": end - paused_end,
        "rows_per_s": rest / max(end - paused_end, 1e-9),
        "claim_ms": during(paused_end, end),
    }
    out["after_prune"] = sizes()
    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM django_delayq_message")
    out["vacuum_s"] = time.perf_counter() - began
    out["after_vacuum"] = sizes()
    admin_1m.fill(rows // 10, admin_1m.FINISHED)
    out["after_refill"] = sizes()
    out["refill_rows"] = rows // 10
    return out


def checkpoint(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def merged(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of every figure (the nested dicts' leaves)."""
    first = rounds[0]
    if isinstance(first, dict):
        return {key: merged([r[key] for r in rounds]) for key in first}
    return statistics.median(rounds)


def child(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.history", kind, "--url", url]
    command += ["--rows", str(args.rows), "--runs", str(args.runs), "--paced", str(args.paced)]
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict[str, Any], args: argparse.Namespace, server: str) -> str:
    empty, full, pruned = results["empty"], results["full"], results["prune"]

    def row(label: str, a: float, b: float, unit: str = "ms") -> str:
        return f"| {label} | {a:.2f} {unit} | {b:.2f} {unit} | {b / a:.2f}x |"

    lines = [
        f"# {args.rows:,} finished messages kept, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"- command: `python -m benchmarks.history --rows {args.rows} --runs {args.runs} "
        f"--rounds {args.rounds}` (each figure: the median of its rounds)",
        f"- server: {server} (the pressure cluster: PostgreSQL defaults, autovacuum on)",
        "",
        "| figure | empty | with the history | ratio |",
        "|---|---|---|---|",
    ]
    for key, label in [
        ("enqueue_ms", "enqueue, one per transaction"),
        ("claim1_ms", "claim one"),
        ("claim10_ms", "claim ten"),
    ]:
        for stat in ("p50", "p99"):
            lines.append(row(f"{label} ({stat})", empty[key][stat], full[key][stat]))
    lines.append(row("worker start-up (`run_delayq --burst`)", empty["startup_ms"],
                     full["startup_ms"]))  # fmt: skip
    lines.append(row("`delayq_status`", empty["status_ms"], full["status_ms"]))
    for page, figures in full["admin"].items():
        lines.append(row(f"admin: {page} (median)", empty["admin"][page]["median_ms"],
                         figures["median_ms"]))  # fmt: skip
    table = full["sizes"]["table_mb"] + full["sizes"]["indexes_mb"]

    def claim(figures: dict[str, float]) -> str:
        return f"p50 {figures['p50']:.2f} / p99 {figures['p99']:.2f} / max {figures['max']:.1f} ms"

    lines += [
        "",
        f"The message table and its indexes held {table:,.0f} MB with the history. Retention "
        "(`retention.prune`) then removed it while a probe enqueued and claimed a message "
        f"every 20 ms; the probe's claim took {claim(pruned['claim_before_ms'])} before.",
        "",
        "| pruning | deleted | seconds | rows a second | the probe's claim meanwhile |",
        "|---|---|---|---|---|",
    ]
    for key, label in [
        ("paced", "as a worker prunes (10 batches, then 1 s)"),
        ("paused", "half the rest as `delayq_prune` does (`--pause 1`)"),
        ("at_once", "the other half at once (`delayq_prune --pause 0`)"),
    ]:
        part = pruned[key]
        lines.append(
            f"| {label} | {part['deleted']:,} | {part['seconds']:.0f} | "
            f"{part['rows_per_s']:,.0f} | {claim(part['claim_ms'])} |"
        )
    lines += [
        "",
        "| moment | table MB | indexes MB | dead tuples |",
        "|---|---|---|---|",
    ]
    for key, label in [
        ("before", "before the prune"),
        ("after_prune", "after it"),
        ("after_vacuum", f"after a VACUUM ({pruned['vacuum_s']:.0f} s)"),
        ("after_refill", f"after {pruned['refill_rows']:,} new finished messages"),
    ]:
        s = pruned[key]
        lines.append(f"| {label} | {s['table_mb']:,.0f} | {s['indexes_mb']:,.0f} | "
                     f"{s['dead']:,} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", nargs="?", default="all", choices=["all", "measure", "prune"])
    parser.add_argument("--url", help="(measure, prune) the installation's database")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each, alternating")
    parser.add_argument(
        "--paced", type=float, default=60, help="seconds of pruning at a worker's pace first"
    )
    parser.add_argument("--keep", action="store_true", help="reuse a filled history")
    args = parser.parse_args()
    if args.step == "measure":
        print(json.dumps(measure(args.url, args.runs)))
        return
    if args.step == "prune":
        print(json.dumps(prune(args.url, args.rows, args.paced)))
        return

    from benchmarks.pressure import cluster
    from benchmarks.quick import reset_database

    server = cluster()
    urls = {kind: f"{server}/{name}" for kind, name in DATABASES.items()}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_ADMIN": "1",
           "DJANGO_SETTINGS_MODULE": "benchmarks.settings"}  # fmt: skip
    for kind, url in urls.items():
        if not (args.keep and kind == "full"):
            reset_database(url)
        subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"],
                       env={**env, "DATABASE_URL": url}, cwd=ROOT, check=True)  # fmt: skip
    fill = (
        "import django; django.setup(); from benchmarks import admin_1m; "
        "from django_delayq.models import Message; "
        f"Message.objects.exists() or admin_1m.fill({args.rows}, admin_1m.FINISHED)"
    )
    subprocess.run([sys.executable, "-c", fill], env={**env, "DATABASE_URL": urls["full"]},
                   cwd=ROOT, check=True)  # fmt: skip
    # Rounds in alternating order (empty, full, full, empty, ...), each after a
    # checkpoint: the fill's dirty pages written out do not land on one side.
    rounds: dict[str, list[dict[str, Any]]] = {"empty": [], "full": []}
    for i in range(args.rounds):
        for kind in ("empty", "full") if i % 2 == 0 else ("full", "empty"):
            print(f"measuring: {kind}, round {i + 1} of {args.rounds}", flush=True)
            checkpoint(urls[kind])
            rounds[kind].append(child("measure", urls[kind], args))
    results: dict[str, Any] = {kind: merged(found) for kind, found in rounds.items()}
    results["rounds"] = rounds
    print("pruning the history", flush=True)
    results["prune"] = child("prune", urls["full"], args)
    text = report(results, args, server.split("@")[-1])
    print(text)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"history-{stamp}.md").write_text(text)
    (RESULTS / f"history-{stamp}.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"written: benchmarks/results/history-{stamp}.md, .json")


if __name__ == "__main__":
    main()
