"""The queues under database pressure, side by side: ``make bench-pressure``.

    .venv/bin/python -m benchmarks.pressure [--systems delayq procrastinate pgqueuer]
        [--scenarios xmin readers overload] [--rate 100] [--phases 60,120,60]
        [--rate-of delayq=400 procrastinate=60] [--concurrency 16] [--overload 1.5]

Each system, for each scenario, runs a steady load through three phases
(clean, the pressure, recovery; ``benchmarks/systems/pressure.py``) with one
worker of 16 slots and 1 ms jobs, on a PostgreSQL cluster of its own started
for the run with PostgreSQL's default settings (autovacuum on, as in
production; ``scripts/ensure-postgres.sh`` with ``DELAYQ_PG_DEFAULTS=1``, in
``.pgdata-pressure`` on port 54331): the shared server of a
development machine runs with autovacuum off, which would measure nothing
of what matters here.

Prints, per scenario and phase, each system's completion rate, pickup
p50/p99, dead tuples and table size; writes the table (Markdown), every
result (JSON) and a chart per scenario (PNG: completions, pickup p99, dead
tuples and size over time, the pressure phase shaded) to
``benchmarks/results/pressure-<date>.*``. It prints; it never asserts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench import PEERS_PYTHON, RESULTS, ROOT, ensure_peers, machine, markdown, plain

SYSTEMS = {
    "delayq": ("django-delayq", "benchmarks.systems.delayq", False),
    "procrastinate": ("procrastinate", "benchmarks.systems.procrastinate_peer", True),
    "pgqueuer": ("PGQueuer", "benchmarks.systems.pgqueuer_peer", True),
}
PGDATA = ROOT / ".pgdata-pressure"
PORT = "54331"


def cluster() -> str:
    """The run's own cluster (started if need be); returns its server URL (no database)."""
    env = {
        **os.environ,
        "DELAYQ_PG_PROBE_PORT": "1",  # never the shared server
        "PGDATA_DIR": str(PGDATA),
        "PGPORT_LOCAL": PORT,
        "DELAYQ_PG_DEFAULTS": "1",
    }
    env.pop("DATABASE_URL", None)
    url = subprocess.run(
        [str(ROOT / "scripts" / "ensure-postgres.sh")],
        env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return url.rsplit("/", 1)[0]


def rate_of(key: str, args: argparse.Namespace) -> float:
    """The rate offered to this system: ``--rate``, or its own ``--rate-of``."""
    for item in args.rate_of or ():
        name, _, rate = item.partition("=")
        if name == key:
            return float(rate)
    return float(args.rate)


def run(key: str, scenario: str, args: argparse.Namespace, server: str) -> dict[str, Any]:
    _, module, peer = SYSTEMS[key]
    python = str(PEERS_PYTHON) if peer else sys.executable
    command = [
        python, "-m", module, "pressure", "--scenario", scenario,
        "--rate", str(rate_of(key, args)), "--phases", args.phases,
        "--overload", str(args.overload),
        "--concurrency", str(args.concurrency), "--queue", "sleep", "--db", f"pressure_{key}",
    ]  # fmt: skip
    env = {**os.environ, "BENCH_POSTGRES": server, "PYTHONPATH": str(ROOT)}
    env["PYTHONWARNINGS"] = "ignore"
    total = sum(float(s) for s in args.phases.split(","))
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=total + 1200
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:] or ["?"]
        return {"error": " | ".join(tail)[:300]}
    return json.loads(lines[-1])


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def rows(results: dict[str, dict[str, dict[str, Any]]]) -> list[list[str]]:
    out = []
    for scenario, by_system in results.items():
        for key, result in by_system.items():
            if "error" in result or "phases" not in result:
                error = result.get("error") or f"no phases: {json.dumps(result)[:200]}"
                out.append([scenario, SYSTEMS[key][0], "error", error, "", "", "", "", ""])
                continue
            for phase in result["phases"]:
                out.append(
                    [
                        scenario,
                        SYSTEMS[key][0],
                        phase["phase"],
                        f"{_fmt(phase['done_per_s'])} / {_fmt(phase['offered_per_s'])}",
                        f"{_fmt(phase['pickup_p50_ms'])} / {_fmt(phase['pickup_p99_ms'])}",
                        f"{phase['dead_tuples_end'] or 0:,}",
                        f"{(phase['bytes_end'] or 0) / 2**20:,.1f}",
                        f"{phase['backlog_max'] or 0:,}",
                        _fmt((phase.get("worker_rss_end") or 0) / 2**20, 0),
                    ]
                )
    return out


HEADER = [
    "scenario",
    "system",
    "phase",
    "done/s / offered/s",
    "pickup p50 / p99 ms",
    "dead tuples",
    "tables MB",
    "max backlog",
    "worker MB",
]


def chart(scenario: str, by_system: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(9, 13), sharex=True)
    panels = [
        ("done_per_s", "completed / s"),
        ("backlog", "backlog (messages)"),
        ("dead_tuples", "dead tuples"),
        ("bytes", "tables + indexes (MB)"),
        ("worker_rss", "worker memory (MB)"),
    ]
    for key, result in by_system.items():
        if "error" in result or "phases" not in result:
            continue
        t = [s["t"] for s in result["series"]]
        for ax, (field, label) in zip(axes, panels, strict=True):
            scale = 2**20 if field in ("bytes", "worker_rss") else 1
            values = [s.get(field, 0) / scale for s in result["series"]]
            ax.plot(t, values, label=SYSTEMS[key][0])
            ax.set_ylabel(label)
        start, end = result["bounds"][1], result["bounds"][2]
        for ax in axes:
            ax.axvspan(start, end, color="0.9")
    axes[0].legend()
    axes[-1].set_xlabel("seconds (the pressure phase shaded)")
    fig.suptitle(f"steady load under pressure: {scenario}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    parser.add_argument(
        "--scenarios", nargs="+", default=["xmin", "readers", "overload"],
        choices=["xmin", "readers", "overload"],
    )  # fmt: skip
    parser.add_argument("--rate", type=float, default=100, help="messages offered per second")
    parser.add_argument("--phases", default="120,600,180", help="clean,pressure,recovery seconds")
    parser.add_argument("--overload", type=float, default=1.5)
    parser.add_argument(
        "--rate-of", nargs="+", metavar="SYSTEM=RATE",
        help="a system's own rate (e.g. half its worker's peak), instead of --rate",
    )  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=16, help="the worker's slots")
    parser.add_argument("--no-install", action="store_true", help="do not upgrade the peers")
    args = parser.parse_args()
    if any(SYSTEMS[key][2] for key in args.systems):
        ensure_peers(not args.no_install)
    server = cluster()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario in args.scenarios:
        results[scenario] = {}
        for key in args.systems:
            print(f"{scenario}: {SYSTEMS[key][0]} ...", flush=True)
            results[scenario][key] = run(key, scenario, args, server)
            # Each system's figures as soon as they are in: a run is long, and
            # one system's failure must not lose the others'.
            print(json.dumps({"scenario": scenario, "system": key, **results[scenario][key]}))
    table = rows(results)
    print(plain(HEADER, table))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M")
    base = RESULTS / f"pressure-{stamp}"
    info = ", ".join(f"{k}: {v}" for k, v in machine().items())
    rates = ", ".join(f"{SYSTEMS[key][0]} {rate_of(key, args):g}" for key in args.systems)
    text = (
        f"# Steady load under database pressure ({stamp})\n\n"
        f"{rates} messages/s offered (x{args.overload:g} in an overload phase), one worker of "
        f"{args.concurrency} slots, 1 ms jobs; phases "
        f"{args.phases} s (clean, pressure, recovery); a PostgreSQL cluster of the run's own "
        f"with default settings. Machine: {info}.\n\n{markdown(HEADER, table)}\n"
    )
    base.with_suffix(".md").write_text(text)
    base.with_suffix(".json").write_text(json.dumps({"args": vars(args), "results": results}))
    for scenario, by_system in results.items():
        chart(scenario, by_system, RESULTS / f"pressure-{stamp}-{scenario}.png")
    print(f"written: {base}.md, .json, -<scenario>.png")


if __name__ == "__main__":
    main()
