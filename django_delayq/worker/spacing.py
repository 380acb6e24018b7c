"""How densely something comes (notifications, successes): what decides whether a wait
for company pays.

A wait that gathers several messages into one statement (a claim, an
acknowledgement) saves CPU per message only where others are expected within
it; anywhere else it only adds latency. Both the claim loop
(``Claimer.hold``) and the acknowledgement thread (``Settler.add``) ask this
of a moving average of the time between two events.
"""

from __future__ import annotations

# The longest time between two events that counts in the average: after a
# quiet spell it comes back within a few events.
GAP_CAP = 0.25


class Spacing:
    """The time between two events lately (a moving average), and when the last came."""

    __slots__ = ("gap", "last")

    def __init__(self) -> None:
        self.gap: float | None = None
        self.last: float | None = None

    def heard(self, now: float, count: int = 1) -> None:
        """``count`` events were seen at ``now`` (several read together count one each)."""
        if count <= 0:
            return
        if self.last is not None:
            sample = min((now - self.last) / count, GAP_CAP)
            self.gap = sample if self.gap is None else 0.7 * self.gap + 0.3 * sample
        self.last = now

    def expects(self, count: float, within: float, now: float) -> bool:
        """Whether at least ``count`` more events are expected within ``within`` seconds
        of ``now``: never after a quiet spell of ``within`` or more."""
        if within <= 0 or self.last is None or now - self.last >= within:
            return False
        gap = now - self.last if self.gap is None else self.gap
        return gap * count <= within
