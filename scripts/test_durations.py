"""Write tests/durations.json, how long each unit of work of the suite took, from
a JUnit report of a parallel run (``pytest -n 4 --dist loadfile --junitxml=...``):
the suite's scheduler (tests/scheduling.py) hands out the longest units first.

    python scripts/test_durations.py report.xml [tests/durations.json]

Refresh it when a file's time changes much; a unit it does not know is
estimated from its number of tests.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.scheduling import work_unit  # noqa: E402


def test_file(classname: str) -> str:
    """The file of a JUnit ``classname`` (``tests.store.test_claim.TestX``: the module's)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).exists():
            return path
    return classname


def durations(report: Path) -> dict[str, float]:
    """Seconds per unit of work (a file, or a part of the pipeline), longest first."""
    totals: dict[str, float] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        group = work_unit(test_file(case.get("classname", "")))
        totals[group] = totals.get(group, 0.0) + float(case.get("time") or 0)
    return {g: round(t, 1) for g, t in sorted(totals.items(), key=lambda item: -item[1])}


def main() -> None:
    report = Path(sys.argv[1])
    target = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests" / "durations.json"
    target.write_text(json.dumps(durations(report), indent=1) + "\n")
    print(f"{target}: {len(json.loads(target.read_text()))} units")


if __name__ == "__main__":
    main()
