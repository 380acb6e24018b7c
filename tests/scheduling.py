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


def longest_first(nodeids: list[str], durations: dict[str, float]) -> list[str]:
    """``nodeids`` with the units expected to take longest first (a stable sort)."""
    counts: dict[str, int] = {}
    for nodeid in nodeids:
        group = work_unit(nodeid)
        counts[group] = counts.get(group, 0) + 1

    def expected(group: str) -> float:
        return durations.get(group, counts[group] * UNKNOWN_TEST_SECONDS)

    return sorted(nodeids, key=lambda nodeid: -expected(work_unit(nodeid)))


def scheduler(config: Any, log: Any) -> Any:
    """xdist's file scheduling, by our units, longest first."""
    from xdist.scheduler import LoadFileScheduling

    durations = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}

    class Grouped(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def schedule(self) -> None:
            if self.collection is None:
                # Every process collected the same list: each is put in the same order.
                self.config.option.loadscopereorder = False
                for node, collection in self.registered_collections.items():
                    self.registered_collections[node] = longest_first(collection, durations)
            super().schedule()

    return Grouped(config, log)
