"""Pickup as a user sees it: commit of a message -> its handler's first line.

    python -m benchmarks.pickup                       # this checkout, 200 samples
    python -m benchmarks.pickup --root /path/to/other/checkout --root . --rounds 3
    python -m benchmarks.pickup --rate 200 --seconds 20   # under a steady load

A real serving worker (``python -m django run_delayq``) runs at the product's
default settings (CONCURRENCY, ACK_DELAY, CLAIM_DELAY, POLL_INTERVAL, NOTIFY
on PostgreSQL: nothing is set) in a process of its own, over a queue whose
handler takes ``time.time()`` on its first line and then writes a row with
the ORM, as a real handler does (it stores that time in the row). A producer
process commits one message every 100-200 ms (randomised), each in its own
transaction (``enqueue`` outside any atomic block), and notes ``time.time()``
once the commit returned; the latency is the handler's first line minus that
(a handler may start a fraction of a millisecond before its producer hears of
the commit). The worker's CPU time over the sampling window is reported too,
per message.

``--rate R`` replaces the idle pacing by a steady load of R messages a second
(a monotonic schedule, late ones caught up) and ``--sleep-ms`` makes the
handler sleep after its write (a job that takes time): pickup under load.

Nothing of the checkout under test is imported here: the project (settings,
an app with one model and its migration, the handler) is written to a
temporary directory, and the worker and the producer run with ``PYTHONPATH``
set to the checkout and that directory, on a freshly created database whose
migrations are those of the checkout. So any commit can be measured, for a
bisection: ``git worktree add /tmp/old <commit>`` and ``--root /tmp/old``.
With several roots and ``--rounds``, the runs alternate (A B A B ...) and
the medians of the rounds are printed per root: a busy machine's slow spell
then falls on all of them.

``PICKUP_POSTGRES`` (default ``postgres://postgres@127.0.0.1:5432``) is the
server; ``--db`` the database's name (dropped and created for each run).
``--sqlite`` runs on a fresh SQLite file instead (the embedded default: the
worker is woken through its local socket, ``store/localwake.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.systems.common import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("PICKUP_POSTGRES", "postgres://postgres@127.0.0.1:5432")

SETTINGS = """
import json, os
import environ
SECRET_KEY = "pickup-probe"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": environ.Env().db_url_config(os.environ["PICKUP_DATABASE_URL"])}
INSTALLED_APPS = ["django_delayq", "pickup_probe"]
LOGGING = {"version": 1}
# Nothing but what the run asks for: the product's defaults.
DELAYQ = json.loads(os.environ.get("PICKUP_DELAYQ") or "{}")
"""

MODELS = """
from django.db import models


class Sample(models.Model):
    i = models.BigIntegerField(unique=True)
    started = models.FloatField()
"""

MIGRATION = """
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.CreateModel(
            name="Sample",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("i", models.BigIntegerField(unique=True)),
                ("started", models.FloatField()),
            ],
        ),
    ]
"""

HANDLERS = """
import os
import time

from django_delayq import handler

from pickup_probe.models import Sample

SLEEP = float(os.environ.get("PICKUP_SLEEP_MS") or 0) / 1000


@handler("pickup")
def pickup(message):
    started = time.time()
    Sample.objects.create(i=message.payload["i"], started=started)
    if SLEEP:
        time.sleep(SLEEP)
"""

PRODUCER = """
import json, os, random, sys, time
import django

django.setup()
import django_delayq
from django_delayq import enqueue
from pickup_probe.models import Sample

root = os.environ["PICKUP_ROOT"]
assert django_delayq.__file__.startswith(root), (django_delayq.__file__, root)
samples, rate = int(sys.argv[1]), float(sys.argv[2])
rng = random.Random(int(sys.argv[3]))


def wait_for(n, timeout):
    deadline = time.monotonic() + timeout
    while Sample.objects.filter(i__gte=0).count() < n:
        if time.monotonic() > deadline:
            sys.exit(f"only {Sample.objects.filter(i__gte=0).count()} of {n} samples ran")
        time.sleep(0.05)


# The worker is up (and has run one message) once this one ran.
enqueue("pickup", {"i": -1})
deadline = time.monotonic() + 120
while not Sample.objects.filter(i=-1).exists():
    if time.monotonic() > deadline:
        sys.exit("the worker did not start")
    time.sleep(0.05)
time.sleep(1.0)
print(json.dumps({"event": "start"}), flush=True)
committed = {}
due = time.monotonic()
for i in range(samples):
    if rate:
        due += 1 / rate
    else:
        due = time.monotonic() + 0.1 + rng.random() * 0.1
    delay = due - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    enqueue("pickup", {"i": i})
    committed[i] = time.time()
print(json.dumps({"event": "sent"}), flush=True)
wait_for(samples, 60)
started = dict(Sample.objects.filter(i__gte=0).values_list("i", "started"))
print(json.dumps({"event": "done", "lat": [(started[i] - committed[i]) * 1000 for i in committed]}))
"""


def write_project(where: Path) -> None:
    app = where / "pickup_probe"
    (app / "migrations").mkdir(parents=True)
    (where / "pickup_settings.py").write_text(SETTINGS)
    (where / "producer.py").write_text(PRODUCER)
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(MODELS)
    (app / "handlers.py").write_text(HANDLERS)
    (app / "migrations" / "__init__.py").write_text("")
    (app / "migrations" / "0001_initial.py").write_text(MIGRATION)


def fresh_database(name: str) -> str:
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{SERVER}/{name}"


def drop_database(name: str) -> None:
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(
    root: Path,
    *,
    samples: int,
    rate: float,
    db: str,
    seed: int,
    delayq: dict[str, Any],
    sleep_ms: float,
    python: str,
    sqlite: bool = False,
) -> dict[str, Any]:
    """One run against the checkout at ``root``: the latencies' percentiles and the CPU."""
    project = Path(tempfile.mkdtemp(prefix="delayq-pickup-"))
    write_project(project)
    url = f"sqlite:///{project / 'pickup.sqlite3'}" if sqlite else fresh_database(db)
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}{os.pathsep}{project}",
        "DJANGO_SETTINGS_MODULE": "pickup_settings",
        "PICKUP_DATABASE_URL": url,
        "PICKUP_DELAYQ": json.dumps(delayq),
        "PICKUP_SLEEP_MS": str(sleep_ms),
        "PICKUP_ROOT": str(root),
    }
    env.pop("DATABASE_URL", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    log = (project / "worker.log").open("wb")
    worker = None
    try:
        subprocess.run([python, "-m", "django", "migrate", "-v0"], env=env, cwd=project, check=True)
        worker = subprocess.Popen(
            [python, "-m", "django", "run_delayq", "--queue", "pickup"],
            env=env,
            cwd=project,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        producer = subprocess.Popen(
            [python, "producer.py", str(samples), str(rate), str(seed)],
            env=env,
            cwd=project,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert producer.stdout is not None
        cpu_start = cpu_end = 0.0
        result: dict[str, Any] = {}
        for line in producer.stdout:
            event = json.loads(line)
            if event["event"] == "start":
                cpu_start = cpu_seconds(worker.pid)
            elif event["event"] == "sent":
                cpu_end = cpu_seconds(worker.pid)
            else:
                result = event
        if producer.wait() or not result:
            tail = (project / "worker.log").read_text()[-3000:]
            raise RuntimeError(f"producer exited with {producer.returncode}; worker log:\n{tail}")
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        log.close()
        if not sqlite:
            drop_database(db)
        shutil.rmtree(project, ignore_errors=True)
    lat = result["lat"]
    return {
        "p50": statistics.median(lat),
        "p95": percentile(lat, 0.95),
        "p99": percentile(lat, 0.99),
        "max": max(lat),
        "cpu_ms_per_msg": (cpu_end - cpu_start) * 1000 / samples,
        "samples": len(lat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        action="append",
        type=Path,
        help="a checkout of django-delayq to measure (repeatable; default: this one)",
    )
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1, help="runs per root, alternating")
    parser.add_argument(
        "--rate", type=float, default=0, help="messages/s (default: one every 100-200 ms)"
    )
    parser.add_argument("--seconds", type=float, help="with --rate: samples = rate x seconds")
    parser.add_argument("--sleep-ms", type=float, default=0, help="the handler's sleep after it")
    parser.add_argument(
        "--delayq", default="{}", help="JSON of DELAYQ settings (default: none, the defaults)"
    )
    parser.add_argument("--db", default="delayq_pickup_probe", help="database name")
    parser.add_argument("--sqlite", action="store_true", help="a fresh SQLite file, not PostgreSQL")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", action="store_true", help="print every run as JSON too")
    args = parser.parse_args()
    roots = [r.resolve() for r in (args.root or [ROOT])]
    samples = round(args.rate * args.seconds) if args.rate and args.seconds else args.samples
    runs: dict[Path, list[dict[str, Any]]] = {root: [] for root in roots}
    for n in range(args.rounds):
        for root in roots:
            result = run(
                root,
                samples=samples,
                rate=args.rate,
                db=args.db,
                seed=7 + n,
                delayq=json.loads(args.delayq),
                sleep_ms=args.sleep_ms,
                python=args.python,
                sqlite=args.sqlite,
            )
            runs[root].append(result)
            print(
                f"[{n + 1}/{args.rounds}] {root}: p50 {result['p50']:.2f} ms, "
                f"p95 {result['p95']:.2f}, p99 {result['p99']:.2f}, max {result['max']:.1f}; "
                f"worker CPU {result['cpu_ms_per_msg']:.3f} ms/msg",
                flush=True,
            )
            if args.json:
                print(json.dumps({"root": str(root), **result}), flush=True)
    if args.rounds > 1 or len(roots) > 1:
        print("\nmedians of the rounds:")
        for root, results in runs.items():
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            p50s = ", ".join(f"{r['p50']:.2f}" for r in results)
            print(
                f"{root}: p50 {med['p50']:.2f} ms, p95 {med['p95']:.2f}, "
                f"p99 {med['p99']:.2f}; worker CPU {med['cpu_ms_per_msg']:.3f} ms/msg "
                f"(p50s {p50s})"
            )


if __name__ == "__main__":
    main()
