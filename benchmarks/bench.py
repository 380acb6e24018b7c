"""Side-by-side benchmark: the physical limit, django-delayq and its peers.

    make bench                      # full run (about two hours on 2 cores)
    make bench ARGS=--quick         # small sizes, for development (about 35 minutes)
    make bench ARGS="--baseline origin/main"   # and the code of another commit beside it
    .venv/bin/python -m benchmarks.bench [--quick] [--systems delayq raw-one ...]
                                         [--metrics process_c1 latency ...]
                                         [--baseline REF] [--repeat N] [--repeat-all]

Every figure comes from its own subprocess
(``python -m benchmarks.systems.<adapter> <metric>``) on a freshly created
database (``delayq_bench_<system>`` on the local PostgreSQL, or the server
``BENCH_POSTGRES`` names; ``BENCH_DATABASE_PREFIX`` replaces ``delayq_bench_``
where two runs share a server), one system at a time, so no two measurements
share a process, a table or the machine. The peers (procrastinate,
django-tasks with django-tasks-db, PGQueuer, the hand-written ORM loop) run in
their own virtualenv, ``benchmarks/.venv-peers``, created and upgraded to the
latest releases on PyPI by this command (``--no-install`` skips the upgrade).

Besides throughput, latency and memory, the everyday costs of a worker:
its CPU per message at 20, 200 and 1,000 messages/s, its CPU when idle, and
its start-up (a one-shot run on an empty queue; a serving worker up to its
first message).

Prints one table (metric x system, with django-delayq's ratio to the
physical limit and to the best peer) and writes it, with the machine, the
versions and the date, to ``benchmarks/results/`` as Markdown and as a PNG
chart, and every result in full as JSON. It prints; it never asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / "benchmarks" / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = [
    "procrastinate",
    "django-tasks",
    "django-tasks-db",
    "pgqueuer",
    "psycopg[binary,pool]",
    "Django",
]
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class SystemSpec:
    key: str
    label: str
    module: list[str]
    peer: bool  # runs in the peers' virtualenv
    limit: bool = False
    env: tuple[tuple[str, str], ...] = ()
    # Another checkout of django-delayq to run (--baseline): its package and
    # its benchmark adapter are imported from there.
    root: Path | None = None


SYSTEMS = [
    SystemSpec(
        "raw-one", "raw: claim one + delete", ["benchmarks.systems.raw", "one"], False, True
    ),
    SystemSpec(
        "raw-batch", "raw: claim 100, batched ack", ["benchmarks.systems.raw", "batch"], False, True
    ),  # noqa: E501
    SystemSpec("delayq", "django-delayq", ["benchmarks.systems.delayq"], False),
    # The same code with Django's DATABASES OPTIONS server_side_binding and
    # prepare_threshold (benchmarks/settings.py): psycopg prepares the
    # queue's statements, whose text stays the same from call to call.
    SystemSpec(
        "delayq-prepared",
        "django-delayq, prepared statements",
        ["benchmarks.systems.delayq"],
        False,
        env=(("BENCH_PREPARED", "1"),),
    ),
    SystemSpec("procrastinate", "procrastinate", ["benchmarks.systems.procrastinate_peer"], True),
    SystemSpec(
        "django-tasks-db", "django-tasks-db", ["benchmarks.systems.django_tasks_peer"], True
    ),
    SystemSpec("pgqueuer", "PGQueuer", ["benchmarks.systems.pgqueuer_peer"], True),
    SystemSpec("orm-loop", "ORM skip-locked loop", ["benchmarks.systems.orm_loop"], True),
]


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    args: list[str]
    field: str = "value"
    ratios: bool = True  # False where a ratio means nothing (growth near zero)
    repeat: bool = False  # short and noisy: measured --repeat times, the median kept


def metrics(quick: bool) -> list[Metric]:
    """The work, at full or ``--quick`` size."""
    one = 500 if quick else 5_000
    process = 2_000 if quick else 10_000
    atomic = 500 if quick else 2_000
    samples = 20 if quick else 100
    claim = 1_000 if quick else 2_000
    big = 100_000 if quick else 1_000_000
    memory = 10_000 if quick else 100_000
    # Everyday costs: seconds at each steady rate (a few thousand messages at
    # full size), the idle window, and the spawns behind each start-up figure.
    steady = {20: 10, 200: 5, 1000: 3} if quick else {20: 60, 200: 30, 1000: 10}
    idle = 10 if quick else 30
    steady_args = ["cpu", "--rate", "200", "--concurrency", "16", "--queue", "sleep", "--seconds"]
    spawns = 3 if quick else 5
    chain = 200 if quick else 1_000
    fan = 2_000 if quick else 10_000
    return [
        Metric("enqueue_one", f"enqueue, one per transaction ({one:,})", "msg/s", True,
               ["enqueue_one", "--n", str(one)], repeat=True),
        Metric("enqueue_batch", "enqueue a batch of 10,000", "msg/s", True,
               ["enqueue_batch", "--n", "10000"], repeat=True),
        Metric("process_c1", f"process {process:,} no-op, 1 process, concurrency 1", "msg/s",
               True, ["process", "--n", str(process)], repeat=True),
        Metric("process_c4", f"process {process:,} no-op, 1 process, concurrency 4", "msg/s",
               True, ["process", "--n", str(process), "--concurrency", "4"]),
        Metric("process_p2", f"process {process:,} no-op, 2 processes", "msg/s", True,
               ["process", "--n", str(process), "--processes", "2"]),
        Metric("process_atomic", f"process {atomic:,}, handler writes a row (atomic)", "msg/s",
               True, ["process", "--n", str(atomic), "--queue", "write"], repeat=True),
        Metric("latency_p50", "pickup p50, idle worker, handler writes a row", "ms", False,
               ["latency", "--n", str(samples)]),
        Metric("latency_p95", "pickup p95, idle worker, handler writes a row", "ms", False,
               ["latency", "--n", str(samples)], "p95"),
        Metric("delayed_p50", "delayed message: start after due time, p50", "ms", False,
               ["delayed", "--n", str(samples)]),
        Metric("delayed_p95", "delayed message: start after due time, p95", "ms", False,
               ["delayed", "--n", str(samples)], "p95"),
        # A median too: 2,000 messages are a tenth of a second's work for
        # the fastest systems, and one run moves by 15 % from the next.
        Metric("claim_small", f"process {claim:,} with 10,000 future messages", "msg/s", True,
               ["process", "--n", str(claim), "--backlog", "10000"], repeat=True),
        Metric("claim_big", f"process {claim:,} with {big:,} future messages", "msg/s", True,
               ["process", "--n", str(claim), "--backlog", str(big)]),
        Metric("memory", f"worker RSS after {memory:,} messages (DEBUG=True)", "MiB", False,
               ["memory", "--n", str(memory)]),
        Metric("memory_growth", f"worker RSS growth, {memory // 10:,} -> {memory:,} messages",
               "MiB", False, ["memory", "--n", str(memory)], "growth", ratios=False),
        # In rounds too: how often a worker wakes for one message rather than
        # a few depends on the machine's load, and so its CPU per message.
        *(Metric(f"cpu_{rate}", f"worker CPU per message at {rate:,} msg/s ({rate * s:,} in {s} s)",
                 "CPU ms/msg", False, ["cpu", "--rate", str(rate), "--seconds", str(s)],
                 repeat=True)
          for rate, s in steady.items()),
        # A service's steady load: 1 ms jobs (they wait on something), 16
        # at once, 200 a second; CPU without the probe's samples, pickup with.
        Metric("steady_cpu", "1 ms jobs at 200 msg/s, concurrency 16: CPU per message",
               "CPU ms/msg", False, [*steady_args, str(steady[200])], repeat=True),
        Metric("steady_p50", "1 ms jobs at 200 msg/s, concurrency 16: pickup p50", "ms", False,
               [*steady_args, str(steady[200]), "--samples"], "pickup_p50_ms", repeat=True),
        Metric("steady_p95", "1 ms jobs at 200 msg/s, concurrency 16: pickup p95", "ms", False,
               [*steady_args, str(steady[200]), "--samples"], "pickup_p95_ms", repeat=True),
        Metric("idle_cpu", f"idle worker CPU ({idle} s)", "% of a core", False,
               ["idle", "--seconds", str(idle)], repeat=True),
        Metric("startup_burst", f"one-shot worker start-up + exit, empty queue ({spawns} spawns)",
               "ms", False, ["startup_burst", "--n", str(spawns)], repeat=True),
        Metric("startup_first", f"start-up to first message, serving worker ({spawns} spawns)",
               "ms", False, ["startup_first", "--n", str(spawns)], repeat=True),
        # Workflows (enqueue(..., after=)): no peer has them (n/a).
        Metric("chain", f"workflow: a chain of {chain:,} no-op steps, 1 worker", "steps/s",
               True, ["chain", "--n", str(chain)]),
        Metric("chain_step", "workflow: a chain's step, its start after its parent's, p50",
               "ms", False, ["chain", "--n", str(chain)], "step_p50_ms"),
        Metric("fan_in", f"workflow: {fan:,} no-op and one after them all, wall time / "
               "without it", "x", False, ["fan_in", "--n", str(fan), "--concurrency", "4"],
               ratios=False),
        Metric("fan_in_child", "workflow: that child's start after the last parent's", "ms",
               False, ["fan_in", "--n", str(fan), "--concurrency", "4"],
               "child_after_last_parent_ms"),
        Metric("enqueue_fan_in", f"workflow: enqueue one message after {fan:,}", "ms", False,
               ["enqueue_fan_in", "--n", str(fan)]),
        Metric("wait_p50", "wait(): handler's first line -> wait() returns, p50", "ms", False,
               ["wait", "--n", str(samples)]),
        Metric("wait_p95", "wait(): handler's first line -> wait() returns, p95", "ms", False,
               ["wait", "--n", str(samples)], "p95"),
    ]  # fmt: skip


WORKFLOW_KEYS = (
    "chain",
    "chain_step",
    "fan_in",
    "fan_in_child",
    "enqueue_fan_in",
    "wait_p50",
    "wait_p95",
)
WORKFLOWS = (
    "Workflows (the `chain`, `fan_in`, `enqueue_fan_in` and `wait` rows; "
    "benchmarks/systems/common.py): no peer here lets a message wait for others (n/a). A "
    "chain: N no-op steps, each enqueued `after=` the one before, in one transaction, then "
    "one serving worker (concurrency 1); steps per second from the first step's start to the "
    "last's, and the median time from a step's start to its child's (the parent's run, its "
    "acknowledgement, the release, the claim). Fan-in: N no-op messages and one enqueued "
    "after them all, one worker at concurrency 4, against the same N without the child (each "
    "on a fresh table, VACUUM ANALYZE before the worker starts): the wall time from the first "
    "start to the last (with the child: its start), their ratio, and the child's start after "
    "the last parent's. Enqueueing a fan-in's child: `enqueue(..., after=<N Messages>)` with "
    "the N in the table, the median of 5. `wait`: an idle serving worker, the handler writes "
    "a row; one message at a time, 100-200 ms apart, enqueued and then waited for with "
    "`wait()`: from the handler's first line to `wait()` returning (the write, the "
    "acknowledgement, and how the waiter learns of it: a notification on PostgreSQL)."
)
EVERYDAY_KEYS = (
    "cpu_20", "cpu_200", "cpu_1000", "steady_cpu", "steady_p50", "steady_p95", "idle_cpu",
    "startup_burst", "startup_first",
)  # fmt: skip
EVERYDAY = (
    "Everyday costs (the CPU, idle and start-up rows; benchmarks/systems/common.py): one "
    "serving worker process, concurrency 1, no-op handler (django-delayq: `run_delayq`, "
    "woken by LISTEN/NOTIFY). CPU per message: once the worker has run a first message (and "
    "1 s later), the runner enqueues messages one per transaction at the steady rate (a "
    "monotonic schedule; the runner's own CPU is not counted), waits until the worker has "
    "started the last one, and divides the worker process's CPU time over that window "
    "(utime + stime of all its threads and of any child process, from /proc/<pid>/stat, in "
    "1/100 s ticks) by the messages. A cell says `sent N/s` when the runner reached less "
    "than 95 % of the rate, and `N s behind` when the last message started more than 1.5 s "
    "after its enqueue: the worker did not keep up, and the figure includes its catching "
    "up; the achieved rate, the messages processed when the enqueuing ended and the lag are "
    "in the .json file beside this one. Idle CPU: the same worker with nothing to do, after "
    "its first message, in % of one core (one tick over 30 s is 0.03 %). Every worker under "
    "benchmark runs the probe's thread (benchmarks/systems/probe.py), which writes a small "
    "file five times a second: the same cost for every system, included in these rows (in a "
    "bare Python process it is about 0.3 % of a core on a 2-core test machine: most of the "
    "idle figure). One-shot start-up + exit: wall time from spawn to exit on an empty queue "
    "of `run_delayq --burst`, `procrastinate worker --one-shot`, `db_worker --batch "
    "--no-startup-delay`, PGQueuer's `QueueManager.run(mode=drain)` (about 4 s of which is "
    "its shutdown) and the raw loops' `--burst`; the ORM loop has no one-shot mode. "
    "Start-up to first message: from spawning a serving worker to its handler's start, with "
    "one message due. Start-up figures are the median of the spawns (after one not counted) "
    "and of the rounds; the Django-based workers (django-delayq, django-tasks-db, the ORM "
    "loop) load a project of only the queue and the benchmark's handlers "
    "(benchmarks/settings.py, benchmarks/peer_settings.py): each app a real project adds "
    "costs every one of them the same. The raw loops poll every 10 ms: their CPU at a "
    "steady rate and idle is the polling's and no floor, so n/a. django-delayq runs with "
    "the benchmark settings (POLL_INTERVAL 1 s, pruning off: benchmarks/settings.py), the "
    "peers with their defaults (procrastinate and PGQueuer listen and also poll; "
    "django-tasks-db and the ORM loop poll once a second when idle, so at a low rate they "
    "run the messages of a second in one go: less CPU per message, for the pickup latency "
    "of the rows above)."
)


def ensure_peers(install: bool) -> None:
    if not PEERS_PYTHON.exists():
        print(f"creating {PEERS_VENV.relative_to(ROOT)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        install = True
    if install:
        print("installing the peers' latest releases: " + ", ".join(PEER_PACKAGES), flush=True)
        subprocess.run(
            [str(PEERS_PYTHON), "-m", "pip", "install", "-q", "--upgrade", "pip", *PEER_PACKAGES],
            check=True,
        )


def versions(python: Path | str, names: list[str]) -> dict[str, str]:
    code = (
        "import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "out = {}\nfor n in sys.argv[1:]:\n"
        "    try: out[n] = version(n)\n    except PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(done.stdout or "{}")


def machine() -> dict[str, str]:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "?"
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{kib / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    import psycopg

    server = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")
    with psycopg.connect(f"{server}/postgres") as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "cpu": f"{cpu} x {os.cpu_count()}",
        "memory": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgresql": row[0] if row else "?",
    }


def run_one(spec: SystemSpec, metric: Metric, timeout: float) -> dict[str, Any]:
    python = str(PEERS_PYTHON) if spec.peer else sys.executable
    db = spec.key.replace("-", "_")
    command = [python, "-m", *spec.module, *metric.args, "--db", db]
    root = spec.root or ROOT
    env = {**os.environ, **dict(spec.env), "PYTHONPATH": str(root), "PYTHONWARNINGS": "ignore"}
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        return {"error": tail[0][:200]}
    result = json.loads(lines[-1])
    result["seconds"] = time.monotonic() - start
    return result


BASELINE = ROOT / "benchmarks" / ".baseline"


def baseline(ref: str) -> SystemSpec:
    """django-delayq as of git ``ref``, checked out (detached) in ``benchmarks/.baseline``.

    A refactor is compared with the code before it in one run, on the same
    machine and server, rather than with a table measured another day.
    """
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if BASELINE.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(BASELINE)], cwd=ROOT)
    subprocess.run(
        ["git", "worktree", "add", "--force", "--detach", str(BASELINE), sha],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return SystemSpec(
        "delayq-baseline",
        f"django-delayq @ {sha[:8]}",
        ["benchmarks.systems.delayq"],
        False,
        root=BASELINE,
    )


def median_run(runs: list[dict[str, Any]], field: str) -> dict[str, Any]:
    """The run whose ``field`` is the median of the successful runs (or the first error)."""
    ok = [r for r in runs if "error" not in r and r.get(field) is not None]
    if not ok:
        return runs[0]
    ok.sort(key=lambda r: r[field])
    chosen = dict(ok[(len(ok) - 1) // 2])
    if len(ok) > 1:
        chosen["runs"] = [r[field] for r in ok]
    return chosen


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms" or unit == "MiB":
        return f"{value:,.1f}"
    if unit in ("CPU ms/msg", "% of a core", "x"):
        return f"{value:,.2f}"
    return f"{value:,.0f}"


def cell(result: dict[str, Any], unit: str, field: str = "value") -> str:
    """A table cell: the figure, and what the measurement flagged (a rate not reached...)."""
    if "error" in result:
        return "error"
    text = fmt(result.get(field), unit)
    return f"{text} ({result['flag']})" if result.get("flag") else text


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return ""
    r = a / b
    # Two significant digits below 0.1 (a latency 200 times lower is not "0.00x").
    return f"{r:.2f}x" if r >= 0.1 or r == 0 else f"{r:.2g}x"


OURS = ("delayq", "delayq-prepared")


def ratios(values: dict[str, float | None], other: float | None) -> str:
    """django-delayq's ratio to ``other``, default and prepared side by side."""
    cells = [ratio(values.get(key), other) for key in OURS if key in values]
    return " · ".join(cell or "–" for cell in cells) if any(cells) else ""


def _best(values: dict[str, float | None], keys: list[str], higher: bool) -> float | None:
    found = [v for k in keys if (v := values.get(k)) is not None]
    if not found:
        return None
    return max(found) if higher else min(found)


def build_table(
    results: dict[tuple[str, str], dict[str, Any]],
    systems: list[SystemSpec],
    mets: list[Metric],
    repeat: int = 1,
) -> tuple[list[str], list[list[str]]]:
    compared = any(s.root is not None for s in systems)
    header = [
        "metric",
        "unit",
        *(s.label for s in systems),
        "delayq / limit (default · prepared)",
        "delayq / best peer (default · prepared)",
        *(["delayq / baseline"] if compared else []),
    ]
    rows = []
    for metric in mets:
        label = metric.label + (f" (median of {repeat})" if metric.repeat and repeat > 1 else "")
        row = [label, metric.unit]
        values: dict[str, float | None] = {}
        for spec in systems:
            result = results.get((spec.key, metric.key), {})
            values[spec.key] = result.get(metric.field)
            row.append(cell(result, metric.unit, metric.field))
        limit = _best(values, [s.key for s in systems if s.limit], metric.higher_is_better)
        peer = _best(values, [s.key for s in systems if s.peer], metric.higher_is_better)
        if metric.ratios:
            row += [ratios(values, limit), ratios(values, peer)]
        else:
            row += ["", ""]
        if compared:
            row.append(ratio(values.get("delayq"), values.get("delayq-baseline")))
        rows.append(row)
    return header, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plain(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def chart(
    path: Path,
    results: dict[tuple[str, str], dict[str, Any]],
    systems: list[SystemSpec],
    mets: list[Metric],
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = (len(mets) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(15, 3.2 * rows), squeeze=False)
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    for ax, metric in zip(axes.flat, mets, strict=False):
        labels, values, shades = [], [], []
        for i, spec in enumerate(systems):
            value = results.get((spec.key, metric.key), {}).get(metric.field)
            if value is None:
                continue
            labels.append(spec.label)
            values.append(value)
            shades.append(colors[i % len(colors)])
        ax.barh(labels, values, color=shades)
        ax.invert_yaxis()
        better = "higher" if metric.higher_is_better else "lower"
        title = textwrap.fill(metric.label, 58)
        ax.set_title(f"{title}\n{metric.unit}, {better} is better", fontsize=9)
        ax.tick_params(labelsize=8)
        for y, value in enumerate(values):
            ax.text(value, y, f" {fmt(value, metric.unit)}", va="center", fontsize=7)
    for ax in list(axes.flat)[len(mets) :]:
        ax.axis("off")
    save_chart(fig, title, path)


def save_chart(fig: Any, title: str, path: Path) -> None:
    """Title, lay out, write and free a matplotlib figure (bench and soak charts alike)."""
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for development")
    parser.add_argument("--systems", nargs="*", choices=[s.key for s in SYSTEMS])
    parser.add_argument("--metrics", nargs="*", help="metric keys (default: all)")
    parser.add_argument("--no-install", action="store_true", help="do not upgrade the peers")
    parser.add_argument("--timeout", type=float, default=3600, help="per measurement, seconds")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each short metric; the median is kept"
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run django-delayq as of this git commit, beside the current code",
    )
    parser.add_argument(
        "--repeat-all",
        action="store_true",
        help="measure every metric --repeat times, not only the short ones (for --baseline: "
        "a row's ratio to the baseline is then a ratio of medians, not of two single runs)",
    )
    args = parser.parse_args()

    systems = [s for s in SYSTEMS if not args.systems or s.key in args.systems]
    if args.baseline:
        ours = [i for i, s in enumerate(systems) if s.key in OURS or s.limit]
        systems.insert(max(ours, default=-1) + 1, baseline(args.baseline))
    mets = [m for m in metrics(args.quick) if not args.metrics or m.key in args.metrics]
    if args.repeat_all:
        mets = [dataclasses.replace(m, repeat=True) for m in mets]
    if any(s.peer for s in systems):
        ensure_peers(install=not args.no_install)
    started = dt.datetime.now(dt.UTC)
    info = machine()
    ours = versions(sys.executable, ["django-delayq", "Django", "psycopg"])
    peers = (
        versions(PEERS_PYTHON, ["procrastinate", "django-tasks", "django-tasks-db", "pgqueuer",
                                "Django", "psycopg"])
        if any(s.peer for s in systems) else {}
    )  # fmt: skip
    print(f"machine: {info}\ndjango-delayq side: {ours}\npeers: {peers}", flush=True)

    results: dict[tuple[str, str], dict[str, Any]] = {}
    cache: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
    # Metric by metric, the systems one after another (and the repeats of a
    # short metric in rounds over all systems), so a slow spell of the
    # machine falls on every system rather than on one.
    for metric in mets:
        todo = [s for s in systems if (s.key, tuple(metric.args)) not in cache]
        rounds = args.repeat if metric.repeat else 1
        runs: dict[str, list[dict[str, Any]]] = {s.key: [] for s in todo}
        for n in range(rounds):
            for spec in todo:
                label = " ".join(metric.args) + (f"  [{n + 1}/{rounds}]" if rounds > 1 else "")
                print(f"{spec.key:>16}  {label:<56}", end=" ", flush=True)
                result = run_one(spec, metric, args.timeout)
                runs[spec.key].append(result)
                shown = result.get("error") or cell(result, metric.unit)
                print(f"{shown}  ({result.get('seconds', 0):.0f} s)", flush=True)
        for spec in todo:
            cache[(spec.key, tuple(metric.args))] = median_run(runs[spec.key], metric.field)
        for spec in systems:
            results[(spec.key, metric.key)] = cache[(spec.key, tuple(metric.args))]

    header, rows = build_table(results, systems, mets, args.repeat)
    elapsed = dt.datetime.now(dt.UTC) - started
    print()
    print(plain(header, rows))

    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%d-%H%M")
    name = f"bench-{stamp}{'-quick' if args.quick else ''}"
    title = f"django-delayq side by side, {started:%Y-%m-%d}{' (--quick)' if args.quick else ''}"
    chart(RESULTS / f"{name}.png", results, systems, mets, title)
    notes = [
        f"# {title}",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC, run time {elapsed.total_seconds() / 60:.0f} min",
        *(f"- {k}: {v}" for k, v in info.items()),
        f"- django-delayq side: {', '.join(f'{k} {v}' for k, v in ours.items())}",
        f"- peers (benchmarks/.venv-peers): {', '.join(f'{k} {v}' for k, v in peers.items())}",
        f"- command: `python -m benchmarks.bench {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        markdown(header, rows),
        "",
        "Ratios: django-delayq divided by the best raw loop (the physical limit) and by the "
        "best peer, with Django's default connection settings and then with prepared "
        "statements (`DATABASES[...]['OPTIONS'] = {'server_side_binding': True, "
        "'prepare_threshold': 5}`); above 1 means more for msg/s, and worse for the other "
        "units (ms, MiB, CPU ms/msg, % of a core: lower is better). "
        "The raw loops, procrastinate and PGQueuer use psycopg's prepared statements by "
        "default; django-tasks-db and the ORM loop run with Django's defaults. n/a: the "
        "system has no such mode (see benchmarks/systems/). Throughput is counted from the "
        "first handler start to the last, so process start-up is left out. A median was "
        "measured in rounds over all systems.",
        *(["", EVERYDAY] if any(m.key in EVERYDAY_KEYS for m in mets) else []),
        *(["", WORKFLOWS] if any(m.key in WORKFLOW_KEYS for m in mets) else []),
        "",
        f"![chart]({name}.png)",
        "",
    ]
    (RESULTS / f"{name}.md").write_text("\n".join(notes))
    # Every figure's whole result (achieved rates, lags, the runs of a median...).
    (RESULTS / f"{name}.json").write_text(
        json.dumps(
            {
                "title": title,
                "command": sys.argv[1:],
                "systems": {s.key: s.label for s in systems},
                "results": [
                    {"system": system, "metric": metric, **result}
                    for (system, metric), result in results.items()
                ],
            },
            indent=1,
        )
    )
    errors = {k: v["error"] for k, v in cache.items() if "error" in v}
    for (system, work), error in errors.items():
        print(f"error: {system} {' '.join(work)}: {error}")
    print(f"\nwritten: {(RESULTS / name).relative_to(ROOT)}.md, .png and .json")


if __name__ == "__main__":
    main()
