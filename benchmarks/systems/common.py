"""The measurements every system adapter shares, and its command line.

An adapter module (``benchmarks/systems/<name>.py``) defines a subclass of
:class:`System` that knows how to create its schema, enqueue, fill its table
quickly, and start a worker process; the measurements themselves live here,
once, so every system is timed by the same code:

    python -m benchmarks.systems.<name> <metric> [--n N] [--backlog N] ...
    python -m benchmarks.systems.<name> cpu --rate R --seconds S
    python -m benchmarks.systems.<name> {idle --seconds S | startup_burst | startup_first}

prints one JSON line with the figure. The runner (``benchmarks/bench.py``)
starts one such process per system and metric, each on a freshly created
database. Only the standard library and psycopg are used here, so the peers'
virtualenv can import it too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent.parent
SERVER = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")


# Every database a run creates is named PREFIX + <name> (BENCH_DATABASE_PREFIX):
# two runs on one server at once (two checkouts) each need their own.
PREFIX = os.environ.get("BENCH_DATABASE_PREFIX", "delayq_bench_")


def database_url(name: str) -> str:
    return f"{SERVER}/{PREFIX}{name}"


def fresh_database(name: str) -> str:
    """Drop and create ``<PREFIX><name>``; returns its URL."""
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{PREFIX}{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{PREFIX}{name}"')
    return database_url(name)


def drop_database(name: str) -> None:
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{PREFIX}{name}" WITH (FORCE)')


class System:
    """One queue under benchmark; subclasses fill in the system-specific parts."""

    name = "?"
    #: Environment for this system's worker processes (on top of os.environ).
    worker_env: dict[str, str] = {}

    def __init__(self, url: str) -> None:
        self.url = url

    # -- to implement -----------------------------------------------------------

    def install(self) -> None:
        """Create the system's tables in the (empty) database."""
        raise NotImplementedError

    def enqueue_one(self, i: int, queue: str = "noop") -> None:
        """Enqueue one message (``noop``, or ``write``: its handler writes a row) in its
        own transaction."""
        raise NotImplementedError

    def enqueue_batch(self, n: int) -> None:
        """Enqueue ``n`` no-op messages with the system's batch API."""
        raise NotImplementedError

    def enqueue_delayed(self, i: int, run_at: dt.datetime) -> None:
        """Enqueue one no-op message due at ``run_at`` (aware, UTC), in its own transaction."""
        raise NotImplementedError

    def fill(self, n: int, *, future: bool = False, queue: str = "noop") -> None:
        """Insert ``n`` messages fast (not measured): due now, or due in a day."""
        raise NotImplementedError

    def enqueue_chain(self, n: int) -> None:
        """Enqueue ``n`` no-op messages (payload ``i``), each to run after the one before."""
        raise NotImplementedError

    def enqueue_fan(self, n: int, *, child: bool) -> None:
        """Enqueue ``n`` no-op messages, and (``child``) one (``i`` "child") after them all."""
        raise NotImplementedError

    def enqueue_and_wait(self, i: int, queue: str) -> None:
        """Enqueue one message (payload ``i``) and block until it has run (its result)."""
        raise NotImplementedError

    def enqueue_fan_in_child(self, n: int) -> float:
        """With ``n`` messages in the queue, enqueue one after them all; the seconds it took."""
        raise NotImplementedError

    def worker_command(self, *, concurrency: int, queue: str = "noop") -> list[str]:
        """A command that runs one worker process over ``queue``."""
        raise NotImplementedError

    def burst_command(self, queue: str = "noop") -> list[str] | None:
        """A one-shot worker: runs what is due, then exits (None: the system has none)."""
        return None

    def processed_ok(self, n: int, queue: str) -> int:
        """How many of the ``queue`` messages are recorded as done (a sanity check)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections opened by ``enqueue_one``/``enqueue_batch``."""

    def supports(self, metric: str, concurrency: int = 1) -> bool:
        """Whether ``metric`` means something for this system (False: n/a in the table).

        ``startup_burst`` is also n/a wherever :meth:`burst_command` is None.
        """
        return True

    # -- shared helpers --------------------------------------------------------

    def sql(self, statement: str, params: Any = None) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(statement, params)

    def analyze(self) -> None:
        self.sql("VACUUM ANALYZE")


def worker_environment(system: System, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker process of ``system`` (probe off unless ``env`` sets it)."""
    return process_environment(system.url, {**system.worker_env, **(env or {})})


def process_environment(url: str, extra: dict[str, str]) -> dict[str, str]:
    """The environment of a benchmark's process on database ``url``, with ``extra``.

    Processes write bytecode caches, as a deployment has them: with
    PYTHONDONTWRITEBYTECODE inherited, every spawn would compile the
    checkout's modules again (the project's, the benchmark's) while the
    packages installed in a virtualenv come compiled, which would weigh on
    the start-up rows unevenly.
    """
    full = {**os.environ, **extra, "BENCH_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    return full


class Workers:
    """Worker processes of one system, followed through their probe files."""

    def __init__(
        self,
        system: System,
        *,
        processes: int,
        concurrency: int,
        queue: str = "noop",
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="delayq-bench-"))
        full_env = worker_environment(system, {**(env or {}), "BENCH_PROBE_DIR": str(self.dir)})
        command = system.worker_command(concurrency=concurrency, queue=queue)
        # Logs go to files: a full pipe would stall a chatty worker.
        self.logs = [(self.dir / f"worker-{i}.log").open("wb") for i in range(processes)]
        #: time.monotonic() just before the first spawn (the probe's clock).
        self.spawned = time.monotonic()
        self.procs = [
            subprocess.Popen(command, env=full_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            for log in self.logs
        ]

    def probes(self, *, starts: bool = True) -> list[dict[str, Any]]:
        """What each worker's probe wrote; ``starts``: with its latency samples."""
        from benchmarks.systems.probe import read

        found = []
        for path in self.dir.glob("*.json"):
            try:
                found.append(read(path, starts=starts))
            except (OSError, ValueError):
                continue
        return found

    def count(self) -> int:
        return sum(int(p["count"]) for p in self.probes(starts=False))

    def wait_for(self, n: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count() >= n:
                return self.probes()
            for proc in self.procs:
                if proc.poll() is not None and self.count() < n:
                    log = (self.dir / f"worker-{self.procs.index(proc)}.log").read_text()
                    raise RuntimeError(f"worker exited with {proc.returncode}:\n{log[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"only {self.count()} of {n} messages were processed in {timeout} s")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the measurements -----------------------------------------------------------


def measure_enqueue_one(system: System, n: int) -> dict[str, Any]:
    system.install()
    for i in range(min(50, n)):  # warm up connections and caches
        system.enqueue_one(-i - 1)
    start = time.perf_counter()
    for i in range(n):
        system.enqueue_one(i)
    elapsed = time.perf_counter() - start
    system.close()
    return {"value": n / elapsed, "unit": "msg/s"}


def measure_enqueue_batch(system: System, n: int) -> dict[str, Any]:
    system.install()
    system.enqueue_batch(100)  # warm up
    start = time.perf_counter()
    system.enqueue_batch(n)
    elapsed = time.perf_counter() - start
    system.close()
    return {"value": n / elapsed, "unit": "msg/s"}


def _throughput(probes: list[dict[str, Any]]) -> float:
    count = sum(int(p["count"]) for p in probes)
    first = min(p["first"] for p in probes if p["first"] is not None)
    last = max(p["last"] for p in probes if p["last"] is not None)
    return (count - 1) / (last - first) if last > first else float("nan")


def measure_process(
    system: System,
    n: int,
    *,
    concurrency: int = 1,
    processes: int = 1,
    queue: str = "noop",
    backlog: int = 0,
    timeout: float = 1800,
) -> dict[str, Any]:
    """Messages per second from the first handler start to the last one.

    Process start-up is left out (it is not what a long-running worker
    pays); the table is filled before any worker starts.
    """
    system.install()
    if backlog:
        system.fill(backlog, future=True, queue=queue)
    system.fill(n, queue=queue)
    system.analyze()
    workers = Workers(system, processes=processes, concurrency=concurrency, queue=queue)
    try:
        probes = workers.wait_for(n, timeout)
    finally:
        workers.stop()
    done = system.processed_ok(n, queue)
    return {"value": _throughput(probes), "unit": "msg/s", "recorded_done": done}


def _idle_writer(system: System) -> Workers:
    """One serving worker with the system's defaults on the ``write`` queue (its
    handler writes a row), up and idle: it has run a first message."""
    system.install()
    workers = Workers(
        system,
        processes=1,
        concurrency=1,
        queue="write",
        env={"BENCH_PROBE_SAMPLES": "1", "BENCH_DEFAULTS": "1"},
    )
    try:
        system.enqueue_one(-1, "write")  # the worker is up once this one ran
        workers.wait_for(1, 120)
    except BaseException:
        workers.stop()
        raise
    return workers


def measure_latency(system: System, samples: int) -> dict[str, Any]:
    """Commit of a due message -> its handler's first line, on an idle worker.

    What a user sees: the worker runs with the system's default settings
    (``BENCH_DEFAULTS=1``: django-delayq's ``DELAYQ`` is empty; its
    concurrency, 1, is every system's default or the benchmark's), the
    handler writes a row (the ``write`` queue; the probe's time stamp is its
    first line), and the messages come one at a time, 100-200 ms apart, each
    committed on its own.
    """
    workers = _idle_writer(system)
    try:
        committed: dict[str, float] = {}
        rng = random.Random(7)
        for i in range(samples):
            time.sleep(0.1 + rng.random() * 0.1)  # the worker goes idle
            system.enqueue_one(i, "write")
            # Once the commit returned: the handler may start a fraction of a
            # millisecond before the client hears of the commit.
            committed[str(i)] = time.monotonic()
            workers.wait_for(i + 2, 30)
        probes = workers.wait_for(samples + 1, 30)
    finally:
        workers.stop()
        system.close()
    starts = {k: v for p in probes for k, v in p["starts"].items()}
    lat = sorted((starts[k] - committed[k]) * 1000 for k in committed if k in starts)
    p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]
    return {"value": statistics.median(lat), "p95": p95, "unit": "ms"}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_wait(system: System, samples: int) -> dict[str, Any]:
    """Enqueue one message and wait for its result, on an idle worker: from the
    handler's first line to the waiter's return (the handler writes a row, the
    ack commits, the waiter hears of it), and the whole round trip. Settings
    and pacing as in :func:`measure_latency`."""
    workers = _idle_writer(system)
    try:
        returned: dict[str, float] = {}
        trips = []
        rng = random.Random(7)
        for i in range(samples):
            time.sleep(0.1 + rng.random() * 0.1)
            started = time.monotonic()
            system.enqueue_and_wait(i, "write")
            returned[str(i)] = time.monotonic()
            trips.append((returned[str(i)] - started) * 1000)
        probes = workers.wait_for(samples + 1, 30)
    finally:
        workers.stop()
        system.close()
    starts = {k: v for p in probes for k, v in p["starts"].items()}
    heard = [(returned[k] - starts[k]) * 1000 for k in returned if k in starts]
    return {
        "value": statistics.median(heard),
        "p95": _percentile(heard, 0.95),
        "round_trip_p50_ms": statistics.median(trips),
        "unit": "ms",
    }


def measure_chain(system: System, n: int) -> dict[str, Any]:
    """A chain of ``n`` no-op steps on one worker (concurrency 1): steps per second from
    the first step's start to the last's, and each step's start after the one before
    (its parent's run, acknowledgement, the release and the claim)."""
    system.install()
    system.enqueue_chain(n)
    system.analyze()
    workers = Workers(system, processes=1, concurrency=1, env={"BENCH_PROBE_SAMPLES": "1"})
    try:
        probes = workers.wait_for(n, 600)
    finally:
        workers.stop()
    starts = {k: v for p in probes for k, v in p["starts"].items()}
    times = [starts[str(i)] for i in range(n)]
    steps = [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)]
    return {
        "value": (n - 1) / (times[-1] - times[0]),
        "unit": "steps/s",
        "step_p50_ms": statistics.median(steps),
        "step_p95_ms": _percentile(steps, 0.95),
        "slow_steps": [(i, round(ms, 1)) for i, ms in enumerate(steps) if ms > 10][:20],
        "recorded_done": system.processed_ok(n, "noop"),
    }


def measure_fan_in(system: System, n: int, *, concurrency: int = 4) -> dict[str, Any]:
    """``n`` no-op messages with one child after them all, against the same ``n``
    without it (each on a fresh table, one worker): the wall time from the first
    start to the last one's (the child's), their ratio, and the child's start after
    the last parent's."""
    spans = {}
    child_after = None
    for with_child in (False, True):
        system.install()
        system.enqueue_fan(n, child=with_child)
        system.analyze()
        total = n + int(with_child)
        env = {"BENCH_PROBE_SAMPLES": "1"}
        workers = Workers(system, processes=1, concurrency=concurrency, env=env)
        try:
            probes = workers.wait_for(total, 600)
        finally:
            workers.stop()
        spans[with_child] = _throughput_span(probes)
        if with_child:
            starts = {k: v for p in probes for k, v in p["starts"].items()}
            last_parent = max(v for k, v in starts.items() if k != "child")
            child_after = (starts["child"] - last_parent) * 1000
        system.sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    return {
        "value": spans[True] / spans[False],
        "unit": "x",
        "plain_s": spans[False],
        "fan_in_s": spans[True],
        "child_after_last_parent_ms": child_after,
    }


def _throughput_span(probes: list[dict[str, Any]]) -> float:
    first = min(p["first"] for p in probes if p["first"] is not None)
    last = max(p["last"] for p in probes if p["last"] is not None)
    return float(last - first)


def measure_enqueue_fan_in(system: System, n: int, runs: int = 5) -> dict[str, Any]:
    """Enqueueing one message after ``n`` others (in the table already): the median of
    ``runs``."""
    system.install()
    system.fill(n)
    system.analyze()
    times = [system.enqueue_fan_in_child(n) for _ in range(runs)]
    ms = [t * 1000 for t in times]
    return {"value": statistics.median(ms), "unit": "ms", "runs_ms": ms}


def measure_memory(system: System, n: int) -> dict[str, Any]:
    """RSS of one worker process after ``n`` messages, and its growth since n/10."""
    system.install()
    system.fill(n)
    system.analyze()
    workers = Workers(
        system,
        processes=1,
        concurrency=1,
        env={"BENCH_PROBE_MEMORY_MARK": str(max(1, n // 10)), "BENCH_DEBUG": "1"},
    )
    try:
        workers.wait_for(n, 3600)
        time.sleep(0.5)  # one more probe write after the last message
        probe = workers.probes()[0]
    finally:
        workers.stop()
    return {
        "value": probe["rss_mib"],
        "growth": probe["rss_mib"] - probe.get("rss_at_mark", probe["rss_mib"]),
        "unit": "MiB",
    }


def measure_delayed(system: System, samples: int) -> dict[str, Any]:
    """How late a delayed message starts after its due time, on an idle worker.

    Every message is enqueued up front, due one after another 100-150 ms
    apart (so the worker is idle before each), the first 1.5 s from now.
    """
    system.install()
    workers = Workers(
        system,
        processes=1,
        concurrency=1,
        env={"BENCH_PROBE_SAMPLES": "1", "BENCH_PROBE_WALL": "1"},
    )
    try:
        system.enqueue_one(-1)  # the worker is up once this one ran
        workers.wait_for(1, 120)
        rng = random.Random(7)
        due: dict[str, float] = {}
        at = time.time() + 1.5
        for i in range(samples):
            due[str(i)] = at
            system.enqueue_delayed(i, dt.datetime.fromtimestamp(at, tz=dt.UTC))
            at += 0.1 + rng.random() * 0.05
        probes = workers.wait_for(samples + 1, at - time.time() + 60)
    finally:
        workers.stop()
        system.close()
    starts = {k: v for p in probes for k, v in p["starts"].items()}
    late = sorted((starts[k] - due[k]) * 1000 for k in due if k in starts)
    p95 = late[min(len(late) - 1, round(0.95 * (len(late) - 1)))]
    return {"value": statistics.median(late), "p95": p95, "unit": "ms"}


# -- everyday costs: CPU at a steady rate, idle CPU, start-up ---------------------

_TICK = os.sysconf("SC_CLK_TCK")
#: Between the worker's first message and the start of a CPU window: what a
#: worker does once after its first message (flushing an ack, starting the
#: probe's thread) is left out.
SETTLE = 1.0
#: A worker kept up with the rate if the last message started within this
#: many seconds of its enqueue. The pollers (django-tasks-db, the ORM loop)
#: look for work once a second when they find none, so their last message
#: can start up to a second late while they keep up on average.
KEPT_UP_S = 1.5


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, utime + stime + cutime + cstime in clock ticks) from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The fields after the command name, which may hold spaces and parentheses:
    # [0] is field 3 (state), so field k of proc(5) is [k - 3].
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), sum(int(tick) for tick in fields[11:15])


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by process ``pid`` and its descendants, in seconds.

    /proc/<pid>/stat counts every thread of a process (utime + stime) and
    the children it has waited for (cutime + cstime); the live descendants
    (a worker that runs child processes) are added from their own stat.
    """
    stats: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _proc_stat(int(entry.name))) is not None:
            stats[int(entry.name)] = found
    children: dict[int, list[int]] = {}
    for child, (parent, _) in stats.items():
        children.setdefault(parent, []).append(child)
    ticks, todo = 0, [pid]
    while todo:
        current = todo.pop()
        if current in stats:
            ticks += stats[current][1]
        todo += children.get(current, [])
    return ticks / _TICK


def _warm_worker(
    system: System, env: dict[str, str] | None = None, *, concurrency: int = 1, queue: str = "noop"
) -> Workers:
    """One serving worker that has processed a first message."""
    workers = Workers(system, processes=1, concurrency=concurrency, queue=queue, env=env)
    try:
        system.enqueue_one(-1, queue)
        workers.wait_for(1, 120)
        time.sleep(SETTLE)
    except BaseException:
        workers.stop()
        raise
    return workers


def measure_cpu(
    system: System,
    rate: float,
    seconds: float,
    samples: bool = False,
    *,
    concurrency: int = 1,
    queue: str = "noop",
) -> dict[str, Any]:
    """The serving worker's CPU milliseconds per message at a steady enqueue rate.

    After a first message, this process enqueues ``rate * seconds`` no-op
    messages one per transaction on a monotonic schedule (a late one is
    caught up, not carried forward as drift), waits until the worker has
    started the last of them, and divides the worker process's CPU time over
    that window (every thread, and any child process) by the messages. This
    process's own CPU (the enqueuing) is not counted.

    ``samples``: also the pickup latency of every message under that load
    (commit to handler start, p50 and p95). The probe then keeps every
    start and writes them all five times a second, which costs the worker
    CPU: the benchmark's CPU rows run without it.

    ``queue="sleep"`` runs jobs of 1 ms (the handler sleeps), ``concurrency``
    handlers at once: a steady load as a service sees it.
    """
    system.install()
    n = max(1, round(rate * seconds))
    workers = _warm_worker(
        system,
        {"BENCH_PROBE_SAMPLES": "1"} if samples else None,
        concurrency=concurrency,
        queue=queue,
    )
    committed: dict[str, float] = {}
    try:
        pid = workers.procs[0].pid
        cpu_before = cpu_seconds(pid)
        start = due = time.monotonic()
        for i in range(n):
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            system.enqueue_one(i, queue)
            if samples:
                committed[str(i)] = time.monotonic()
            due += 1 / rate
        sent = time.monotonic()
        # As the probe file showed when the enqueuing ended (written every 0.2 s).
        processed_at_end = workers.count() - 1
        probes = workers.wait_for(n + 1, 300 + seconds)
        end = time.monotonic()
        cpu = cpu_seconds(pid) - cpu_before
    finally:
        workers.stop()
        system.close()
    achieved = n / (sent - start)
    # The last handler start after the last enqueue: a pickup latency when
    # the worker kept up, how far behind it was when it did not.
    behind = max(0.0, max(p["last"] for p in probes if p["last"] is not None) - sent)
    kept_up = behind <= KEPT_UP_S
    flags = []
    if achieved < 0.95 * rate:
        flags.append(f"sent {achieved:,.0f}/s")
    if not kept_up:
        flags.append(f"{behind:.1f} s behind")
    latency: dict[str, float] = {}
    if samples:
        starts = {k: v for p in probes for k, v in p["starts"].items()}
        lat = sorted((starts[k] - committed[k]) * 1000 for k in committed if k in starts)
        latency = {
            "pickup_p50_ms": statistics.median(lat),
            "pickup_p95_ms": lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))],
        }
    return {
        "value": cpu * 1000 / n,
        "unit": "ms/msg",
        **latency,
        "messages": n,
        "rate": rate,
        "achieved_rate": achieved,
        "processed_at_end": processed_at_end,
        "behind_s": behind,
        "kept_up": kept_up,
        "cpu_s": cpu,
        "window_s": end - start,
        "cpu_percent": cpu / (end - start) * 100,
        **({"flag": "; ".join(flags)} if flags else {}),
    }


def measure_idle(system: System, seconds: float) -> dict[str, Any]:
    """The serving worker's CPU, in % of one core, with nothing to do (after a first message)."""
    system.install()
    workers = _warm_worker(system)
    try:
        pid = workers.procs[0].pid
        cpu_before = cpu_seconds(pid)
        start = time.monotonic()
        time.sleep(seconds)
        cpu = cpu_seconds(pid) - cpu_before
        window = time.monotonic() - start
    finally:
        workers.stop()
        system.close()
    return {"value": cpu / window * 100, "unit": "%", "cpu_s": cpu, "window_s": window}


def _spread(times: list[float]) -> dict[str, Any]:
    return {
        "value": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "runs_ms": [round(t, 1) for t in times],
        "unit": "ms",
    }


def measure_startup_burst(system: System, runs: int) -> dict[str, Any]:
    """Wall time from spawning the system's one-shot worker to its exit, on an empty queue.

    The median of ``runs``; one run before them (not counted) warms the
    operating system's caches and writes any bytecode caches.
    """
    command = system.burst_command()
    assert command is not None
    system.install()
    env = worker_environment(system)
    times = []
    for i in range(runs + 1):
        start = time.monotonic()
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=300)
        elapsed = time.monotonic() - start
        if done.returncode:
            tail = (done.stderr or done.stdout).decode(errors="replace")[-3000:]
            raise RuntimeError(f"one-shot worker exited with {done.returncode}:\n{tail}")
        if i:
            times.append(elapsed * 1000)
    return _spread(times)


def measure_startup_first(system: System, runs: int) -> dict[str, Any]:
    """Wall time from spawning a serving worker to its handler's first start.

    One message is due before each spawn; the handler's start is the
    probe's monotonic time stamp. The median of ``runs``; one run before
    them (not counted) warms the caches.
    """
    system.install()
    times = []
    for i in range(runs + 1):
        system.enqueue_one(i)
        workers = Workers(system, processes=1, concurrency=1)
        try:
            probes = workers.wait_for(1, 120)
        finally:
            workers.stop()
        first = min(p["first"] for p in probes if p["first"] is not None)
        if i:
            times.append((first - workers.spawned) * 1000)
    system.close()
    return _spread(times)


#: What only a system with dependencies between its messages can do.
WORKFLOW_METRICS = ("chain", "fan_in", "enqueue_fan_in", "wait")


def main(factory: Callable[[str], System]) -> None:
    """The command line of an adapter module: one metric, one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "metric",
        choices=[
            "enqueue_one", "enqueue_batch", "process", "latency", "delayed", "memory",
            "cpu", "idle", "startup_burst", "startup_first", "pressure",
            "chain", "fan_in", "enqueue_fan_in", "wait",
        ],
    )  # fmt: skip
    parser.add_argument("--n", type=int, default=10_000, help="messages, samples or runs")
    parser.add_argument("--rate", type=float, default=200, help="cpu: messages per second")
    parser.add_argument("--seconds", type=float, default=30, help="cpu, idle: the window")
    parser.add_argument(
        "--samples", action="store_true", help="cpu: also the pickup latency under the load"
    )
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--queue", default="noop")
    parser.add_argument("--backlog", type=int, default=0)
    parser.add_argument(
        "--scenario", default="xmin", help="pressure: xmin, readers or overload (pressure.py)"
    )
    parser.add_argument(
        "--phases", default="60,120,60", help="pressure: clean,pressure,recovery seconds"
    )
    parser.add_argument("--overload", type=float, default=1.5, help="pressure: the overload")
    parser.add_argument("--db", required=True, help="database name suffix")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    system = factory(fresh_database(args.db))
    workflows = type(system).enqueue_chain is not System.enqueue_chain
    if (
        not system.supports(args.metric, args.concurrency)
        or (args.metric in WORKFLOW_METRICS and not workflows)
        or (args.metric == "startup_burst" and system.burst_command() is None)
    ):
        print(json.dumps({"value": None, "note": "n/a"}))
        return
    try:
        if args.metric == "enqueue_one":
            result = measure_enqueue_one(system, args.n)
        elif args.metric == "enqueue_batch":
            result = measure_enqueue_batch(system, args.n)
        elif args.metric == "process":
            result = measure_process(
                system,
                args.n,
                concurrency=args.concurrency,
                processes=args.processes,
                queue=args.queue,
                backlog=args.backlog,
            )
        elif args.metric == "latency":
            result = measure_latency(system, args.n)
        elif args.metric == "delayed":
            result = measure_delayed(system, args.n)
        elif args.metric == "cpu":
            result = measure_cpu(
                system,
                args.rate,
                args.seconds,
                args.samples,
                concurrency=args.concurrency,
                queue=args.queue,
            )
        elif args.metric == "chain":
            result = measure_chain(system, args.n)
        elif args.metric == "fan_in":
            result = measure_fan_in(system, args.n, concurrency=args.concurrency)
        elif args.metric == "enqueue_fan_in":
            result = measure_enqueue_fan_in(system, args.n)
        elif args.metric == "wait":
            result = measure_wait(system, args.n)
        elif args.metric == "idle":
            result = measure_idle(system, args.seconds)
        elif args.metric == "startup_burst":
            result = measure_startup_burst(system, args.n)
        elif args.metric == "startup_first":
            result = measure_startup_first(system, args.n)
        elif args.metric == "pressure":
            from benchmarks.systems.pressure import measure_pressure

            clean, held, recovery = (float(s) for s in args.phases.split(","))
            result = measure_pressure(
                system,
                args.scenario,
                args.rate,
                (clean, held, recovery),
                overload=args.overload,
                concurrency=args.concurrency,
                queue=args.queue,
            )
        else:
            result = measure_memory(system, args.n)
    finally:
        system.close()
        if not args.keep:
            drop_database(args.db)
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
