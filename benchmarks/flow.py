"""What flow control costs, on PostgreSQL: rate limits, concurrency caps, ordered groups.

    .venv/bin/python -m benchmarks.flow [--messages 10000] [--repeat 3] [--claims 300]
                                        [--backlog 100000] [--database delayq_bench_flow]
                                        [--only drain|claims|explain ...] [--no-save]

Three parts, in one run, on a scratch database (dropped and created again:
``--database`` on the server ``BENCH_POSTGRES`` names, by default the local
one):

* **Drain**: ``--messages`` no-op messages run by one worker (the
  ``run_delayq --burst`` worker, in this process, ``--concurrency`` handler
  threads), for a plain queue, a rate-limited queue whose limit is far above
  the achieved rate (100,000/s; and 100,000/min, whose window holds every
  start of the drain), a queue whose concurrency cap equals the worker's
  concurrency, and grouped messages (``--groups`` groups of ten). Messages
  per second, and CPU milliseconds per message in the worker and in the
  database server (the worker's backends, read from ``/proc`` when the
  server is on this machine). The cases take turns, ``--repeat`` times;
  the tables show medians.
* **Claims**: the time of one claim (``claim.claim``, or
  ``limits.claim_limited`` for a limited queue, ten messages asked for),
  median and 95th percentile of ``--claims`` calls, on another queue and on
  the limited or grouped queue itself, in three situations: the baseline
  (1,000 due messages in each queue, the grouped queue's in 1,000 groups of
  ten), with ``--backlog`` messages held behind one blocked group (its head
  failed) in the grouped queue, and with ``--backlog`` due messages in a
  throttled queue (20/min, its window full). Each claim runs in autocommit,
  as the worker's does; what it claimed is put back (not timed) before the
  next one. The ordered groups' own statements are timed too: letting a
  group go on after one of its messages ended, and the maintenance sweep of
  every group.
* **Plans**: ``EXPLAIN (ANALYZE, BUFFERS)`` of the statements of those claims
  (captured as Django sends them), run in a transaction that is rolled back.

Prints the tables and the plans; writes the figures, the machine and the
load to ``benchmarks/results/flow-<date>.json`` and the tables to
``flow-<date>.md`` beside it (``--no-save``: neither). It prints; it never
asserts, but a drain that did not run every message is an error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SERVER = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")
SETTINGS = "benchmarks.flow_settings"
WORKER = "flow-bench"
CLAIM = 10  # messages asked for by each timed claim

# (key, label, queue) of the drains.
DRAINS = [
    ("plain", "plain queue", "flow-plain"),
    ("rate", "rate limit 100000/s (far above)", "flow-rate"),
    ("rate_minute", "rate limit 100000/m (window holds all)", "flow-rate-minute"),
    ("cap", "concurrency cap = worker's concurrency", "flow-cap"),
    ("groups", "ordered groups (groups of 10)", "flow-group"),
]


# -- the database ---------------------------------------------------------------------


def setup(name: str, concurrency: int) -> str:
    """Create the database afresh, configure Django for it, migrate; returns its URL."""
    from benchmarks.quick import reset_database

    url = f"{SERVER}/{name}"
    reset_database(url)
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["BENCH_FLOW_CAP"] = str(concurrency)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def vacuum() -> None:
    sql("VACUUM ANALYZE django_delayq_message")
    sql("VACUUM ANALYZE django_delayq_flowstart")


def clear() -> None:
    sql("TRUNCATE django_delayq_message, django_delayq_flowstart, django_delayq_workerstate")
    vacuum()


FILL = """
INSERT INTO django_delayq_message (
    queue, key, kind, payload, message_group, status, priority, next_attempt_time,
    scheduled_time, attempt_count, last_error, last_traceback, error_fingerprint,
    locked_by, created_at, updated_at
)
SELECT %(queue)s, %(prefix)s || g, '', jsonb_build_object('i', g), %(group)s, 'pending', 0,
       CASE WHEN %(held)s THEN NULL ELSE due END, due, 0, '', '', '', '', now(), now()
FROM generate_series(1, %(n)s) AS g,
     -- A due time of its own for each (as real traffic has): equal keys would
     -- share index entries (deduplication) and look cheaper than they are.
     LATERAL (SELECT %(due)s::timestamptz - g * interval '1 millisecond' AS due) AS t
"""


def fill(queue: str, n: int, due: dt.datetime, *, prefix: str, group: str = "", held=False):
    """``n`` pending messages of ``queue`` due by ``due``, a millisecond apart (``held``:
    waiting behind their group, no due time), written directly (fast, not measured)."""
    params = {"queue": queue, "prefix": prefix, "group": group, "held": held, "due": due, "n": n}
    sql(FILL, params)


# -- CPU of the worker's database backends ------------------------------------------


class BackendCpu:
    """CPU time of the server processes serving this database, sampled from ``/proc``.

    The backends are the postmaster's children whose title names the
    database; each one's last reading counts (a backend that exits loses at
    most one interval). The sampler's own CPU is kept apart, so the caller
    can leave it out of the process's.
    """

    INTERVAL = 0.1

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname
        self.tick = os.sysconf("SC_CLK_TCK")
        self.postmaster = self._postmaster()
        self.titles: dict[int, bool] = {}
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.own_cpu = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.postmaster is not None

    def _postmaster(self) -> int | None:
        try:
            (pid,) = sql("SELECT pg_backend_pid()")[0]
            stat = Path(f"/proc/{pid}/stat").read_text()
            return int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def _ticks(self, pid: int) -> int | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return int(fields[11]) + int(fields[12])  # utime + stime

    def _ours(self, pid: int) -> bool:
        known = self.titles.get(pid)
        if known is None:
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                return False
            known = self.titles[pid] = f" {self.dbname} ".encode() in title
        return known

    def sample(self, *, baseline: bool = False) -> None:
        assert self.postmaster is not None
        path = Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children")
        try:
            children = [int(p) for p in path.read_text().split()]
        except OSError:
            return
        for pid in children:
            if not self._ours(pid):
                continue
            ticks = self._ticks(pid)
            if ticks is None:
                continue
            if pid not in self.first:
                self.first[pid] = ticks if baseline else 0
            self.last[pid] = ticks

    def _loop(self) -> None:
        start = time.thread_time()
        while not self._stop.wait(self.INTERVAL):
            self.sample()
        self.sample()
        self.own_cpu = time.thread_time() - start

    def start(self) -> None:
        if not self.available:
            return
        self.sample(baseline=True)
        self._thread = threading.Thread(target=self._loop, name="backend-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """Seconds of CPU the backends used since ``start``."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        return sum(self.last[p] - self.first[p] for p in self.last) / self.tick


# -- part 1: drains -----------------------------------------------------------------------


def drain_once(key: str, queue: str, n: int, groups: int, concurrency: int, dbname: str):
    from django.db import connections

    from django_delayq import enqueue_many
    from django_delayq.models import Message
    from django_delayq.worker import Worker

    clear()
    payloads = [{"i": i} for i in range(n)]
    if key == "groups":
        enqueue_many(queue, payloads, groups=[f"g{i % groups}" for i in range(n)])
    else:
        enqueue_many(queue, payloads)
    vacuum()
    load = os.getloadavg()[0]
    backends = BackendCpu(dbname)
    worker = Worker([queue], concurrency=concurrency, burst=True, name=WORKER)
    backends.start()
    wall, cpu = time.perf_counter(), time.process_time()
    worker.run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    db_cpu = backends.stop()
    cpu -= backends.own_cpu
    connections.close_all()
    done = Message.objects.filter(queue=queue, status="succeeded").count()
    if done != n:
        raise RuntimeError(f"{key}: {done} of {n} messages succeeded")
    return {
        "msgs_per_s": n / wall,
        "cpu_ms": cpu * 1000 / n,
        "db_cpu_ms": None if db_cpu is None else db_cpu * 1000 / n,
        "seconds": wall,
        "load": load,
    }


def drains(args: argparse.Namespace, dbname: str) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in DRAINS}
    for round_no in range(args.repeat):
        # The cases take turns: a burst of other work on the machine falls on
        # one round of each, not on every round of one case.
        order = DRAINS if round_no % 2 == 0 else DRAINS[::-1]
        for key, label, queue in order:
            found = drain_once(key, queue, args.messages, args.groups, args.concurrency, dbname)
            runs[key].append(found)
            print(
                f"  drain {label:<40} {found['msgs_per_s']:8,.0f} msg/s  "
                f"cpu {found['cpu_ms']:.3f} ms/msg  "
                f"db {found['db_cpu_ms'] or float('nan'):.3f} ms/msg  "
                f"(load {found['load']:.1f})",
                flush=True,
            )
    out = {}
    for key, label, queue in DRAINS:
        rows = runs[key]
        out[key] = {
            "label": label,
            "queue": queue,
            "runs": rows,
            **{
                field: statistics.median(r[field] for r in rows)
                for field in ("msgs_per_s", "cpu_ms", "seconds")
            },
            "db_cpu_ms": None
            if rows[0]["db_cpu_ms"] is None
            else statistics.median(r["db_cpu_ms"] for r in rows),
        }
    return out


# -- part 2: claims --------------------------------------------------------------------


class Table:
    """The claims' table: the baseline and the backlog situations."""

    def __init__(self, backlog: int) -> None:
        self.backlog = backlog
        self.t0 = sql("SELECT date_trunc('second', now()) - interval '1 hour'")[0][0]

    def baseline(self) -> None:
        clear()
        for queue in ("flow-other", "flow-rate", "flow-cap", "flow-throttled"):
            fill(queue, 1_000, self.t0, prefix="b-")
        # The grouped queue as the drains leave it at first: 1,000 groups of
        # ten, their heads due, the rest held behind them.
        from django_delayq import enqueue_many

        payloads = [{"i": i} for i in range(10_000)]
        enqueue_many("flow-group", payloads, groups=[f"g{i % 1000}" for i in range(10_000)])
        sql(
            "UPDATE django_delayq_message SET next_attempt_time = %s, scheduled_time = %s"
            " WHERE queue = 'flow-group'",
            [self.t0, self.t0],
        )
        sql(
            "UPDATE django_delayq_message SET next_attempt_time = NULL WHERE queue = 'flow-group'"
            " AND id NOT IN (SELECT min(id) FROM django_delayq_message"
            " WHERE queue = 'flow-group' GROUP BY message_group)"
        )
        vacuum()

    def add_blocked_group(self) -> None:
        """A group whose head failed, ``backlog`` messages held behind it."""
        fill("flow-group", 1, self.t0, prefix="stuck-head-", group="stuck")
        sql(
            "UPDATE django_delayq_message SET status = 'failed', next_attempt_time = NULL,"
            " finished_at = now(), attempt_count = 1, last_error = 'boom'"
            " WHERE queue = 'flow-group' AND message_group = 'stuck'"
        )
        fill("flow-group", self.backlog, self.t0, prefix="stuck-", group="stuck", held=True)
        vacuum()

    def remove_blocked_group(self) -> None:
        sql("DELETE FROM django_delayq_message WHERE message_group = 'stuck'")
        vacuum()

    def add_throttled_backlog(self) -> None:
        fill("flow-throttled", self.backlog, self.t0, prefix="t-")
        vacuum()

    def remove_throttled_backlog(self) -> None:
        sql(
            "DELETE FROM django_delayq_message WHERE queue = 'flow-throttled' AND key LIKE %s",
            ["t-%"],
        )
        vacuum()

    def put_back(self, ids: list[int]) -> None:
        """Claimed messages pending and due again, as they were."""
        if ids:
            sql(
                "UPDATE django_delayq_message SET status = 'pending', next_attempt_time = %s,"
                " attempt_count = 0, lock_token = NULL, locked_by = '', last_attempt_time = NULL"
                " WHERE id = ANY(%s)",
                [self.t0, ids],
            )

    def postpone(self, queue: str, days: int) -> None:
        """Move the due messages of ``queue`` ``days`` later (negative: back)."""
        sql(
            "UPDATE django_delayq_message SET next_attempt_time = next_attempt_time + %s"
            " WHERE queue = %s AND next_attempt_time IS NOT NULL AND status = 'pending'",
            [dt.timedelta(days=days), queue],
        )
        vacuum()

    def fill_window(self, queue: str) -> None:
        """Use up the rate of ``queue`` (its window holds its count of starts)."""
        from django_delayq.flow import limits_of
        from django_delayq.store import limits

        scopes = limits_of(queue)
        rate = scopes[0].rate
        assert rate is not None
        got = limits.claim_limited([queue], rate.count, scopes, worker=WORKER, lease=LEASE)
        assert len(got.claim.messages) == rate.count, got
        self.put_back([m.pk for m in got.claim.messages])

    def clear_starts(self) -> None:
        sql("DELETE FROM django_delayq_flowstart")


LEASE = dt.timedelta(seconds=60)


def claim_call(queue: str) -> Callable[[], tuple[list[int], bool]]:
    """One claim of ``queue`` as the worker makes it: (the ids claimed, held back)."""
    from django_delayq.flow import limits_of
    from django_delayq.store import claim, limits

    scopes = limits_of(queue)
    if scopes:

        def limited() -> tuple[list[int], bool]:
            got = limits.claim_limited([queue], CLAIM, scopes, worker=WORKER, lease=LEASE)
            return [m.pk for m in got.claim.messages], got.held_back

        return limited

    def plain() -> tuple[list[int], bool]:
        got = claim.claim([queue], CLAIM, worker=WORKER, lease=LEASE)
        return [m.pk for m in got.messages], False

    return plain


# (key, label, queue, how the queue stands: "due" or "idle")
CLAIMS = [
    ("other", "other queue, 1,000 due", "flow-other", "due"),
    ("other_idle", "other queue, nothing due (idle poll)", "flow-other", "idle"),
    ("group", "grouped queue, 1,000 heads due", "flow-group", "due"),
    ("group_idle", "grouped queue, nothing due (idle poll)", "flow-group", "idle"),
    ("rate", "rate-limited queue (100000/s), 1,000 due", "flow-rate", "due"),
    ("cap", "capped queue (cap 4), 1,000 due", "flow-cap", "due"),
    ("throttled", "throttled queue (20/min, window full)", "flow-throttled", "due"),
]
# Ordered groups' own statements: (key, label, the call).
GROUP_CALLS = [
    ("release_one", "let a group of 10 go on (after an ack)", [("flow-group", "g17")]),
    ("release_stuck", "let the blocked group go on (after an ack)", [("flow-group", "stuck")]),
    ("sweep", "maintenance sweep of every group", None),
]
SITUATIONS = [
    ("baseline", "baseline"),
    ("blocked", "+ {n} held behind a blocked group"),
    ("throttled", "+ {n} due in a throttled queue"),
]


def timed(call: Callable[[], Any], after: Callable[[Any], None], calls: int) -> list[float]:
    """``calls`` timings of ``call`` in µs (after a few untimed ones), ``after`` between."""
    for _ in range(max(5, calls // 20)):
        after(call())
    found = []
    for _ in range(calls):
        start = time.perf_counter()
        result = call()
        found.append((time.perf_counter() - start) * 1e6)
        after(result)
    return found


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_us": statistics.median(ordered),
        "p95_us": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
    }


def measure_claims(table: Table, calls: int) -> dict[str, dict[str, float]]:
    from django_delayq.store import groups

    out: dict[str, dict[str, float]] = {}
    for key, _label, queue, state in CLAIMS:
        call = claim_call(queue)
        if key == "throttled":
            table.fill_window(queue)
        if state == "idle":
            table.postpone(queue, 1)

        def after(result: tuple[list[int], bool]) -> None:
            table.put_back(result[0])

        out[key] = summary(timed(call, after, calls))
        sql("VACUUM django_delayq_message")  # the claims' and put_back's dead row versions
        out[key].update(on_server(call, after))
        if state == "idle":
            table.postpone(queue, -1)
        if key == "throttled":
            table.clear_starts()
        sql("VACUUM django_delayq_message")
    for key, _label, pairs in GROUP_CALLS:
        release = functools.partial(groups.release_groups, pairs)
        out[key] = summary(timed(release, lambda _: None, calls // 3))
        out[key].update(on_server(release, lambda _: None))
    return out


SERVER_RUNS = 15
EXECUTION_RE = re.compile(r"^Execution Time: ([0-9.]+) ms$", re.MULTILINE)
# Django sends each claim as text, so PostgreSQL plans it on every call (unless
# psycopg prepares it: BENCH_PREPARED=1, see benchmarks/settings.py).
PLANNING_RE = re.compile(r"^Planning Time: ([0-9.]+) ms$", re.MULTILINE)
BUFFERS_RE = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")


def on_server(call: Callable[[], Any], after: Callable[[Any], None]) -> dict[str, float]:
    """What the statements of one ``call`` cost the server: their execution and planning
    times (µs, medians of ``SERVER_RUNS`` runs under ``EXPLAIN ANALYZE``) and the
    buffers they touch.

    Less sensitive to a busy machine than the client's time: no round trip,
    no Python, no wait for the client's turn on a CPU.
    """
    result, statements = captured(call)
    after(result)
    statements = [s for s in statements if interesting(s)]
    runs, planning, buffers = [], [], 0
    for _ in range(SERVER_RUNS):
        total, planned, buffers = 0.0, 0.0, 0
        for statement in statements:
            plan = explain(statement, timing=False)
            total += float(EXECUTION_RE.search(plan)[1])  # type: ignore[index]
            found = PLANNING_RE.search(plan)
            planned += float(found[1]) if found else 0.0
            buffers += plan_buffers(plan)
        runs.append(total * 1000)
        planning.append(planned * 1000)
    sql("VACUUM django_delayq_message")
    return {
        "server_us": statistics.median(runs),
        "plan_us": statistics.median(planning),
        "buffers": buffers,
    }


def plan_buffers(plan: str) -> int:
    """Shared buffers hit or read by the statement (its plan's top node), 0 if none."""
    top = plan.split("\nPlanning", 1)[0]
    found = BUFFERS_RE.search(top)
    return sum(int(n) for n in found.groups() if n) if found else 0


def claims(args: argparse.Namespace) -> dict[str, Any]:
    table = Table(args.backlog)
    found: dict[str, dict[str, list[dict[str, float]]]] = {s: {} for s, _ in SITUATIONS}
    for round_no in range(args.repeat):
        table.baseline()
        for situation, _ in SITUATIONS:
            if situation == "blocked":
                table.add_blocked_group()
            elif situation == "throttled":
                table.add_throttled_backlog()
            load = os.getloadavg()[0]
            figures = measure_claims(table, args.claims)
            for key, value in figures.items():
                found[situation].setdefault(key, []).append({**value, "load": load})
            print(
                f"  claims round {round_no + 1}, {situation:<10} (load {load:.1f}): "
                + ", ".join(
                    f"{k} {v['median_us']:.0f} ({v['server_us']:.0f}, {v['buffers']} buf)"
                    for k, v in figures.items()
                )
                + " µs (on the server)",
                flush=True,
            )
            if situation == "blocked":
                table.remove_blocked_group()
            elif situation == "throttled":
                table.remove_throttled_backlog()
    out: dict[str, Any] = {}
    for situation, _ in SITUATIONS:
        out[situation] = {
            key: {
                **{
                    field: statistics.median(r[field] for r in rows)
                    for field in ("median_us", "p95_us", "server_us", "plan_us", "buffers")
                },
                "runs": rows,
            }
            for key, rows in found[situation].items()
        }
    return out


# -- part 3: plans ---------------------------------------------------------------------


def captured(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        result = call()
    return result, [q["sql"] for q in queries.captured_queries]


def explain(statement: str, *, timing: bool = True) -> str:
    """The plan of ``statement``, run for real in a transaction rolled back."""
    from django.db import connection, transaction

    options = "ANALYZE, BUFFERS" + ("" if timing else ", TIMING OFF")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN ({options}) " + statement)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def interesting(statement: str) -> bool:
    """The statements worth a plan: the claim, the limits' reads, the groups' release."""
    text = statement.lstrip().upper()
    if text.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK", "COMMIT", "BEGIN")):
        return False
    return "DJANGO_DELAYQ_MESSAGE" in text or "DJANGO_DELAYQ_FLOWSTART" in text


def plans(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, str]]]]:
    """The plans of every claim and group statement of part 2, in each situation."""
    from django_delayq.store import groups

    table = Table(args.backlog)
    table.baseline()
    out: dict[str, dict[str, list[dict[str, str]]]] = {}
    for situation, _ in SITUATIONS:
        if situation == "blocked":
            table.add_blocked_group()
        elif situation == "throttled":
            table.add_throttled_backlog()
        out[situation] = {}
        for key, _label, queue, state in CLAIMS:
            if key == "throttled":
                table.fill_window(queue)
            if state == "idle":
                table.postpone(queue, 1)
            result, statements = captured(claim_call(queue))
            table.put_back(result[0])
            out[situation][key] = plans_of(statements)
            if state == "idle":
                table.postpone(queue, -1)
            table.clear_starts()
        for key, _label, pairs in GROUP_CALLS:
            _, statements = captured(functools.partial(groups.release_groups, pairs))
            out[situation][key] = plans_of(statements)
        vacuum()
        for key, found in out[situation].items():
            for one in found:
                print(f"  {situation:<10} {key:<14} {plan_summary(one['plan'])}", flush=True)
        if situation == "blocked":
            table.remove_blocked_group()
        elif situation == "throttled":
            table.remove_throttled_backlog()
    if args.plans:
        for situation, found in out.items():
            for key, statements in found.items():
                for one in statements:
                    print(f"\n-- {situation}: {key}\n{one['sql']}\n{one['plan']}")
    return out


def plans_of(statements: list[str]) -> list[dict[str, str]]:
    return [{"sql": s, "plan": explain(s)} for s in statements if interesting(s)]


SCAN_RE = re.compile(r"(Seq Scan on \S+|(?:Bitmap )?Index (?:Only )?Scan (?:using|on) \S+)")


def plan_summary(plan: str) -> str:
    """One line: the statement's top node, the scans it makes, buffers and time."""
    top = plan.splitlines()[0].split("  (")[0]
    scans = []
    for line in plan.splitlines():
        if "never executed" in line:
            continue
        for scan in SCAN_RE.findall(line):
            if scan not in scans:
                scans.append(scan)
    time_ms = EXECUTION_RE.search(plan)
    return (
        f"{top}: {', '.join(scans) or 'no scan'}; {plan_buffers(plan)} buffers, "
        f"{float(time_ms[1]) if time_ms else float('nan'):.3f} ms"
    )


# -- report ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import django

    (server,) = sql("SHOW server_version")[0]
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": server,
        "platform": platform.platform(),
    }


def us(value: float) -> str:
    return f"{value:,.0f}"


def markdown(result: dict[str, Any]) -> str:
    args = result["args"]
    info = result["machine"]
    lines = [
        f"Run {info['date']} at commit `{info['commit']}`: {info['cpus']} CPUs, load "
        f"{info['load_at_start'][0]:.1f} at the start, PostgreSQL {info['postgresql']}, "
        f"Python {info['python']}, Django {info['django']}.",
        f"`python -m benchmarks.flow {' '.join(result['argv'])}`".replace(" `", "`"),
        "",
    ]
    if "drain" in result:
        base = result["drain"]["plain"]
        lines += [
            f"Draining {args['messages']:,} no-op messages with one worker (concurrency "
            f"{args['concurrency']}), median of {args['repeat']} runs:",
            "",
            "| queue | msg/s | vs plain | worker CPU ms/msg | database CPU ms/msg |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for row in result["drain"].values():
            db = "n/a" if row["db_cpu_ms"] is None else f"{row['db_cpu_ms']:.3f}"
            lines.append(
                f"| {row['label']} | {row['msgs_per_s']:,.0f} | "
                f"{row['msgs_per_s'] / base['msgs_per_s']:.2f}× | {row['cpu_ms']:.3f} | {db} |"
            )
        lines.append("")
    if "claims" in result:
        n = f"{args['backlog']:,}"
        heads = [label.format(n=n) for _, label in SITUATIONS]
        rows = [(k, label) for k, label, _, _ in CLAIMS]
        rows += [(k, label) for k, label, _ in GROUP_CALLS]
        header = ["| statement | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * len(heads)]
        lines += [
            f"One claim ({CLAIM} messages asked for) on the server: execution time, planning "
            f"time in brackets (µs, median of {SERVER_RUNS} runs under `EXPLAIN ANALYZE`, "
            f"median of {args['repeat']} rounds) and shared buffers touched:",
            "",
            *header,
        ]
        for key, label in rows:
            cells = []
            for situation, _ in SITUATIONS:
                found = result["claims"][situation][key]
                cells.append(
                    f"{us(found['server_us'])} ({us(found['plan_us'])}) µs, "
                    f"{found['buffers']:,.0f} buf"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            f"The same from the client (round trip and Python included), µs, median / p95 of "
            f"{args['claims']:,} calls, median of {args['repeat']} rounds:",
            "",
            *header,
        ]
        for key, label in rows:
            cells = []
            for situation, _ in SITUATIONS:
                found = result["claims"][situation][key]
                cells.append(f"{us(found['median_us'])} / {us(found['p95_us'])}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=None, help="default: messages / 10")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--database", default="delayq_bench_flow")
    parser.add_argument("--only", nargs="*", choices=["drain", "claims", "explain"])
    parser.add_argument("--plans", action="store_true", help="print every plan in full")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    args.groups = args.groups or max(1, args.messages // 10)
    parts = args.only or ["drain", "claims", "explain"]
    setup(args.database, args.concurrency)
    result: dict[str, Any] = {"machine": machine(), "args": vars(args), "argv": sys.argv[1:]}
    print(
        f"flow control on PostgreSQL {result['machine']['postgresql']}, "
        f"{result['machine']['cpus']} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if "drain" in parts:
        print(f"\ndraining {args.messages:,} messages, {args.repeat} rounds", flush=True)
        result["drain"] = drains(args, args.database)
    if "claims" in parts:
        print(f"\n{args.claims} claims per figure, {args.repeat} rounds", flush=True)
        result["claims"] = claims(args)
    if "explain" in parts:
        print("\nplans (--plans prints them in full; the JSON has them all)", flush=True)
        result["plans"] = plans(args)
    result["machine"]["load_at_end"] = os.getloadavg()
    report = markdown(result)
    print("\n" + report)
    if not args.no_save:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"flow-{stamp}.json").write_text(json.dumps(result, indent=1, default=str))
        (RESULTS / f"flow-{stamp}.md").write_text(report + "\n")
        print(f"wrote benchmarks/results/flow-{stamp}.json and .md")


if __name__ == "__main__":
    main()
