"""Where a worker's start-up goes, step by step, beside procrastinate's (PostgreSQL).

    .venv/bin/python -m benchmarks.startup [--runs 9]

``make bench``'s start-up rows time each queue's one-shot worker on an empty
queue. This splits that time along what a Django-based worker cannot skip:
the interpreter; psycopg's import and a connection (every PostgreSQL queue
here pays these); Django's set-up and a connection, in a project of no apps;
the same with django-delayq installed; then ``run_delayq --burst`` itself.
Beside them: procrastinate's worker, standalone (its own command, no
Django), and through its Django integration (``manage.py procrastinate
worker``), which is how a Django project runs it.

Every step runs ``--runs`` times, the steps taking turns (one spawn each per
round, so a busy machine weighs on all alike), after one spawn each that is
not counted (it warms the operating system's caches and writes bytecode
caches). Wall time from spawn to exit, median and range. django-delayq's
steps run in this virtualenv, procrastinate's in the peers' one
(``benchmarks/.venv-peers``, as ``make bench`` makes it), each on a
database of its own (``delayq_bench_startup_*``, re-created). It prints; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from benchmarks.bench import PEERS_PYTHON, ensure_peers
from benchmarks.systems.common import ROOT, fresh_database, process_environment

CONNECT = "import psycopg, os; psycopg.connect(os.environ['BENCH_DATABASE_URL']).close()"
DJANGO_CONNECT = (
    "import django; django.setup(); "
    "from django.db import connection; connection.ensure_connection(); connection.close()"
)


@dataclass
class Step:
    label: str
    python: str
    args: list[str]
    database: str  # "delayq" or "procrastinate"
    env: dict[str, str] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)


def steps() -> list[Step]:
    ours, peers = sys.executable, str(PEERS_PYTHON)
    bare = {"DJANGO_SETTINGS_MODULE": "benchmarks.bare_settings"}
    delayq = {"DJANGO_SETTINGS_MODULE": "benchmarks.settings"}
    procrastinate_django = {**bare, "BENCH_APPS": "procrastinate.contrib.django"}
    return [
        Step("Python: the interpreter alone", ours, ["-c", "pass"], "delayq"),
        Step("psycopg: import + connect", ours, ["-c", CONNECT], "delayq"),
        Step("Django, no apps: set-up + connect", ours, ["-c", DJANGO_CONNECT], "delayq", bare),
        Step(
            "Django + django-delayq: set-up + connect",
            ours,
            ["-c", DJANGO_CONNECT],
            "delayq",
            delayq,
        ),
        Step(
            "django-delayq: run_delayq --burst",
            ours,
            ["-m", "django", "run_delayq", "--burst", "--queue", "noop", "-v0"],
            "delayq",
            delayq,
        ),
        Step(
            "procrastinate: worker --one-shot (standalone)",
            peers,
            [
                "-m",
                "procrastinate",
                "--app=benchmarks.systems.procrastinate_app.app",
                "worker",
                "--queues",
                "noop",
                "--one-shot",
            ],
            "procrastinate",
        ),
        Step(
            "procrastinate, Django integration: manage.py procrastinate worker --one-shot",
            peers,
            ["-m", "django", "procrastinate", "worker", "--queues", "noop", "--one-shot"],
            "procrastinate",
            procrastinate_django,
        ),
    ]


def spawn(step: Step, url: str) -> float:
    start = time.monotonic()
    done = subprocess.run(
        [step.python, *step.args],
        env=process_environment(url, step.env),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    elapsed = (time.monotonic() - start) * 1000
    if done.returncode:
        tail = (done.stderr or done.stdout).decode(errors="replace")[-2000:]
        raise SystemExit(f"{step.label}: exited with {done.returncode}:\n{tail}")
    return elapsed


def prepare() -> dict[str, str]:
    """The two databases, with django-delayq's and procrastinate's schemas."""
    urls = {name: fresh_database(f"startup_{name}") for name in ("delayq", "procrastinate")}
    migrate = ["-m", "django", "migrate", "-v0"]
    subprocess.run(
        [sys.executable, *migrate],
        env=process_environment(urls["delayq"], {"DJANGO_SETTINGS_MODULE": "benchmarks.settings"}),
        cwd=ROOT,
        check=True,
    )
    # procrastinate.contrib.django's migrations install procrastinate's schema.
    subprocess.run(
        [str(PEERS_PYTHON), *migrate],
        env=process_environment(
            urls["procrastinate"],
            {
                "DJANGO_SETTINGS_MODULE": "benchmarks.bare_settings",
                "BENCH_APPS": "procrastinate.contrib.django",
            },
        ),
        cwd=ROOT,
        check=True,
    )
    return urls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="counted spawns per step")
    parser.add_argument("--no-install", action="store_true", help="do not upgrade the peers")
    args = parser.parse_args()
    ensure_peers(install=not args.no_install)
    urls = prepare()
    plan = steps()
    for step in plan:  # warm-up, not counted
        spawn(step, urls[step.database])
    for _ in range(args.runs):
        for step in plan:
            step.times.append(spawn(step, urls[step.database]))
    print(f"\nstart-up, wall time from spawn to exit ({args.runs} spawns each, in turns)\n")
    print("| step | median ms | min | max |")
    print("|---|---|---|---|")
    for step in plan:
        t = step.times
        print(f"| {step.label} | {statistics.median(t):.0f} | {min(t):.0f} | {max(t):.0f} |")


if __name__ == "__main__":
    main()
