"""What every benchmarked handler calls: counts, timestamps, memory.

A worker process under benchmark imports this module; when ``BENCH_PROBE_DIR``
is set, each handler call is counted and a background thread writes the
process's figures to ``$BENCH_PROBE_DIR/<pid>.json`` five times a second, so
the runner can follow progress without touching the system's own tables
(and without adding a query per message). Unset, ``tick`` does nothing.

Times are ``time.monotonic()``, which is one clock for every process of the
machine, so ticks of two worker processes and the runner's enqueue times can
be compared directly; with ``BENCH_PROBE_WALL=1`` samples are ``time.time()``,
to compare with the due times the runner gave delayed messages.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

_DIR = os.environ.get("BENCH_PROBE_DIR")
_SAMPLES = os.environ.get("BENCH_PROBE_SAMPLES") == "1"
# Samples compared with due times (wall clock) rather than commit times.
_WALL = os.environ.get("BENCH_PROBE_WALL") == "1"
_MARK = int(os.environ.get("BENCH_PROBE_MEMORY_MARK", "0") or 0)
_lock = threading.Lock()
_state: dict[str, object] = {"count": 0, "first": None, "last": None, "starts": {}}
_writer: threading.Thread | None = None


def rss_mib() -> float:
    """Resident set size of this process, in MiB (Linux)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _write() -> None:
    assert _DIR is not None
    path = Path(_DIR) / f"{os.getpid()}.json"
    with _lock:
        data = {**_state, "rss_mib": rss_mib()}
        text = json.dumps(data)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _loop() -> None:
    while True:
        time.sleep(0.2)
        _write()


def tick(sample: object = None) -> None:
    """Record one handler start; ``sample`` names a latency probe message."""
    global _writer
    if _DIR is None:
        return
    now = time.monotonic()
    with _lock:
        count = int(_state["count"]) + 1  # type: ignore[call-overload]
        _state["count"] = count
        if _state["first"] is None:
            _state["first"] = now
        _state["last"] = now
        if _SAMPLES and sample is not None:
            _state["starts"][str(sample)] = time.time() if _WALL else now  # type: ignore[index]
        if _MARK and count == _MARK:
            _state["rss_at_mark"] = rss_mib()
    if _writer is None:
        _writer = threading.Thread(target=_loop, name="bench-probe", daemon=True)
        _writer.start()


def ready() -> None:
    """Announce a started worker (written before its first message)."""
    if _DIR is not None:
        _write()
