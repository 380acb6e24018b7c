"""Durations as people read them, in the few styles the app shows them.

One table-driven formatter, so the admin's lists, ``delayq_status`` and the
pipeline's report differ only in their tables: the largest step whose bound
the duration stays under gives its unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# (bound: the step applies below it, None: always; seconds per unit; format)
Steps = Sequence[tuple[float | None, float, str]]

#: The admin's lists and dashboard: whole units, rounded down ("5 min").
LIST: Steps = ((60, 1, "{} s"), (3600, 60, "{} min"), (86400, 3600, "{} h"), (None, 86400, "{} d"))
#: ``delayq_status``: short units ("90s", "5m", "2.5h").
STATUS: Steps = ((1, 1, "0s"), (120, 1, "{:.0f}s"), (7200, 60, "{:.0f}m"), (None, 3600, "{:.1f}h"))
#: The pipeline's report: one decimal, milliseconds below a second.
REPORT: Steps = (
    (1, 0.001, "{:.0f}ms"),
    (120, 1, "{:.1f}s"),
    (7200, 60, "{:.1f}min"),
    (48 * 3600, 3600, "{:.1f}h"),
    (None, 86400, "{:.1f}d"),
)


def human(seconds: float, steps: Steps, *, whole: bool = False) -> str:
    """``seconds`` in the first step whose bound it stays under (by magnitude).

    ``whole``: the magnitude in whole units, rounded down (the list style).
    """
    magnitude = abs(seconds)
    for bound, unit, text in steps:
        if bound is None or magnitude < bound:
            if whole:
                return text.format(math.floor(magnitude) // int(unit))
            return text.format(seconds / unit)
    raise AssertionError("the last step has no bound")  # pragma: no cover


def exact(seconds: int) -> str:
    """A whole number of seconds in the largest unit that divides it ("2h", "90s")."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
