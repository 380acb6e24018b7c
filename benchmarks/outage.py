"""How fast a worker's probes and its database outage limit react (PostgreSQL).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/delayq_outage \
        .venv/bin/python -m benchmarks.outage [--trials 3] [--limit 3]

For each trial, a ``run_delayq --health-port`` process connects through a
TCP proxy on 127.0.0.1; the script measures the time from start to
``/readyz`` 200, from cutting the proxy to ``/readyz`` 503 and to the
process's exit (status 75), and the round trip of a ``/healthz`` request.
The database named in DATABASE_URL is dropped and re-created first: point
it at a scratch database.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from benchmarks.quick import ROOT, reset_database
from tests.process.proxy import TcpProxy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, ConnectionError):
        return None


def until(predicate: Callable[[], bool], timeout: float = 60.0) -> float:
    """Seconds until ``predicate()`` holds (polled every 10 ms), or SystemExit."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


def trial(env: dict[str, str], upstream: tuple[str, int], limit: float) -> dict[str, float]:
    proxy = TcpProxy(upstream)
    url = urlsplit(env["DATABASE_URL"])
    user, _, _ = url.netloc.rpartition("@")
    netloc = f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}"
    port = free_port()
    command = [sys.executable, "-m", "django", "run_delayq", "--queue", "noop", "-v0",
               "--health-port", str(port), "--health-address", "127.0.0.1",
               "--database-outage-limit", str(limit)]  # fmt: skip
    worker = subprocess.Popen(
        command,
        env={**env, "DATABASE_URL": url._replace(netloc=netloc).geturl()},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = until(lambda: status(port, "/readyz") == 200)
        rounds = []
        for _ in range(200):
            start = time.perf_counter()
            assert status(port, "/healthz") == 200
            rounds.append(time.perf_counter() - start)
        proxy.cut()
        cut = time.monotonic()
        until(lambda: status(port, "/readyz") == 503)
        unready = time.monotonic() - cut
        code = worker.wait(timeout=limit + 60)
        exited = time.monotonic() - cut
        assert code == 75, code
    finally:
        if worker.poll() is None:
            worker.kill()
        proxy.close()
    return {
        "start to /readyz 200": ready,
        "cut to /readyz 503": unready,
        "cut to exit 75": exited,
        "/healthz round trip (median of 200)": statistics.median(rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--limit", type=float, default=3.0, help="--database-outage-limit")
    args = parser.parse_args()
    url = os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/delayq_outage")
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    reset_database(url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"], check=True, env=env, cwd=ROOT
    )
    parts = urlsplit(url)
    upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
    results = [trial(env, upstream, args.limit) for _ in range(args.trials)]
    print(f"database: {url.split('@')[-1]}  trials: {args.trials}  limit: {args.limit:g} s")
    for name in results[0]:
        values = [r[name] for r in results]
        print(f"{name:<40} median {statistics.median(values) * 1000:9.1f} ms  "
              f"(min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
