"""Where pytest-xdist sends the tests (scripts/dev.sh runs ``--dist loadfile``).

A file's tests go to one process and run in their order (they share
fixtures), and the Spark pipeline's go to two: each process that runs one
starts a Spark session, a JVM of most of a gigabyte and seconds of CPU, so
two per run rather than one per process, each with about half of the
pipeline's time (the archive and the standalone cluster; the rest).

The units that take longest are handed out first, by the times in
``durations.json`` (seconds on the PostgreSQL leg, written by
``scripts/test_durations.py`` from a JUnit report). xdist's own order, the
units with most tests first, left a few slow files of few tests (the
adversary run, the pipeline, the standalone cluster) for the end, each then
running alone while the other processes had finished.

No Django here: ``scripts/test_durations.py`` imports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PIPELINE = "tests/pipeline/"
PIPELINE_ARCHIVE = ("tests/pipeline/test_archive.py", "tests/pipeline/test_cluster.py")
DURATIONS = Path(__file__).with_name("durations.json")
# A unit durations.json does not know yet (a new test file): per test.
UNKNOWN_TEST_SECONDS = 0.2


def work_unit(nodeid: str) -> str:
    """The unit of work pytest-xdist gives one process: a file, or a half of the pipeline."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(PIPELINE):
        return "pipeline-archive" if path in PIPELINE_ARCHIVE else "pipeline"
    return path


def expected_seconds(unit: str, tests: int, durations: dict[str, float]) -> float:
    """How long ``unit`` (of ``tests`` tests) is expected to take."""
    return durations.get(unit, tests * UNKNOWN_TEST_SECONDS)


def scheduler(config: Any, log: Any) -> Any:
    """xdist's file scheduling, by our units, longest first."""
    from xdist.scheduler import LoadFileScheduling

    durations = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}

    class Grouped(LoadFileScheduling):
        _sorted = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The queue of units is sorted once, before the first is handed
            # out. (Each process runs the tests it is sent by their index in
            # its own collection: the collections themselves keep their order.)
            if not self._sorted:
                self._sorted = True
                units = sorted(
                    self.workqueue.items(),
                    key=lambda item: -expected_seconds(item[0], len(item[1]), durations),
                )
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return Grouped(config, log)
