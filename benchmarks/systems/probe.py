"""What every benchmarked handler calls: counts, timestamps, memory.

A worker process under benchmark imports this module; when ``BENCH_PROBE_DIR``
is set, each handler call is counted and a background thread writes the
process's figures to ``$BENCH_PROBE_DIR/<pid>.json`` five times a second (and
its latency samples to ``<pid>.starts``: ``read`` joins them), so
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
from typing import Any

_DIR = os.environ.get("BENCH_PROBE_DIR")
_SAMPLES = os.environ.get("BENCH_PROBE_SAMPLES") == "1"
# Samples compared with due times (wall clock) rather than commit times.
_WALL = os.environ.get("BENCH_PROBE_WALL") == "1"
_MARK = int(os.environ.get("BENCH_PROBE_MEMORY_MARK", "0") or 0)
_lock = threading.Lock()
_write_lock = threading.Lock()  # one writer at a time: the samples before the counts
_state: dict[str, object] = {"count": 0, "first": None, "last": None, "starts": {}}
_writer: threading.Thread | None = None


def rss_mib() -> float:
    """Resident set size of this process, in MiB (Linux)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _write() -> None:
    """Append the samples taken since the last write to ``<pid>.starts``, then replace
    ``<pid>.json`` with the counts (a reader that sees a count finds its samples).

    Only what is new is written, outside the lock ``tick`` takes: writing every
    sample each time, under it, cost time in proportion to the messages seen,
    and at hundreds of thousands of them the handlers waited on the probe."""
    assert _DIR is not None
    path = Path(_DIR) / f"{os.getpid()}.json"
    with _write_lock:
        with _lock:
            new, _state["starts"] = _state["starts"], {}
            data = {key: value for key, value in _state.items() if key != "starts"}
        if new:
            with path.with_suffix(".starts").open("a") as starts:
                starts.write(json.dumps(new) + "\n")
        data["rss_mib"] = rss_mib()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


def read(path: Path, *, starts: bool = True) -> dict[str, Any]:
    """What a worker's probe wrote (``<pid>.json``), with its samples (``starts``)."""
    data: dict[str, Any] = json.loads(path.read_text())
    data["starts"] = {}
    samples = path.with_suffix(".starts")
    if starts and samples.exists():
        for line in samples.read_text().splitlines():
            if line.endswith("}"):  # a line being appended is read next time
                data["starts"].update(json.loads(line))
    return data


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
