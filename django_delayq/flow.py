"""Flow control across every worker: rate limits, concurrency caps, ordered groups.

Three controls that hold for all workers and hosts together, because every
worker claims from the same table:

* **Rate limits** (``DELAYQ["QUEUES"][q]["RATE_LIMIT"] = "100/m"``, or
  ``@handler(..., rate_limit="5/s")`` for one kind): at most N messages
  *started* (claimed) in any window of one period, a sliding window with no
  burst beyond N. Messages over the limit stay pending, no attempt spent,
  and start as soon as the window allows.
* **Concurrency caps** (``"GLOBAL_CONCURRENCY": 3``, or
  ``@handler(..., global_concurrency=3)``): at most N messages running at
  once, counting live leases only, so a crashed worker's slot frees when its
  lease expires or it is found dead.
* **Ordered groups** (``enqueue(..., group="order-42")``): the messages of
  one group in one queue run one at a time, in the order they were enqueued
  (their ids). A message waiting for its retry blocks its group; so does a
  failed one, unless the queue says ``"GROUP_AFTER_FAILURE": "continue"``.

The claim enforces them itself (``store.limits.claim_limited``, under a
row lock per limit; groups in the claim's own pick), never a check followed
by a claim, so workers started at the same instant cannot overshoot. This
module parses and resolves the configuration; a handler's option applies to
its kind (a catch-all handler's to its whole queue) and wins over the
setting, as other handler options do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django_delayq.exceptions import DelayQError
from django_delayq.values import check_text

PERIODS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1)}
RATE_RE = re.compile(r"(?P<count>[0-9]+)\s*/\s*(?P<period>[smh])")
#: The most starts a rate may allow per period (its sliding window is a log).
MAX_RATE = 100_000
#: The largest global concurrency cap (``GLOBAL_CONCURRENCY``, ``global_concurrency=``).
MAX_CAP = 1_000_000
GROUP_AFTER_FAILURE = ("block", "continue")
GROUP_MAX_LENGTH = 200


class FlowError(DelayQError, ValueError):
    """A rate, cap or group option that cannot be used."""


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any window of ``period``."""

    count: int
    period: timedelta

    def __str__(self) -> str:
        unit = next(k for k, v in PERIODS.items() if v == self.period)
        return f"{self.count}/{unit}"


def parse_rate(value: object, name: str = "rate_limit") -> Rate:
    """``"N/s"``, ``"N/m"`` or ``"N/h"``, with 1 <= N <= ``MAX_RATE``."""
    if not isinstance(value, str):
        raise FlowError(f"{name} must be a str such as '100/m', got {type(value).__name__}")
    match = RATE_RE.fullmatch(value.strip())
    if match is None:
        raise FlowError(
            f"{name} {value!r} is not a rate: write 'N/s', 'N/m' or 'N/h' (e.g. '100/m')"
        )
    digits = match["count"].lstrip("0")
    # More digits than MAX_RATE's is over it (and int() refuses thousands of them).
    if len(digits) > len(str(MAX_RATE)) or not 1 <= int(digits or "0") <= MAX_RATE:
        raise FlowError(f"{name} {value!r}: the count must be from 1 to {MAX_RATE}")
    return Rate(int(digits), PERIODS[match["period"]])


def parse_cap(value: object, name: str = "global_concurrency") -> int:
    """A cap on running messages: an int from 1 to ``MAX_CAP``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FlowError(f"{name} must be a positive integer, got {value!r}")
    if value > MAX_CAP:
        raise FlowError(f"{name} must be at most {MAX_CAP:,}, got {value!r}")
    return value


def check_group(group: object, where: str = "") -> str:
    """A group name: a str of at most ``GROUP_MAX_LENGTH`` characters, no NUL ("": none)."""
    return check_text(group, "group", GROUP_MAX_LENGTH, where, nul=True)


@dataclass(frozen=True)
class Scope:
    """The global limits of one scope: a queue (``kind`` "") or one kind in it."""

    queue: str
    kind: str = ""
    rate: Rate | None = None
    cap: int | None = None

    @property
    def name(self) -> str:
        return f"{self.queue}/{self.kind}" if self.kind else self.queue


def limits_of(queue: str) -> list[Scope]:
    """The limits of ``queue``: its own (its catch-all handler's, else its settings'),
    then its kinds' (their handlers'). Empty: the queue is not limited."""
    from django_delayq.conf import get_config
    from django_delayq.registry import registry

    setting: dict[str, Any] = get_config()["QUEUES"].get(queue, {})
    specs = {s.kind: s for s in registry.for_queue(queue)}
    catch_all = specs.get(None)
    rate = catch_all.rate_limit if catch_all else None
    cap = catch_all.global_concurrency if catch_all else None
    if rate is None and setting.get("RATE_LIMIT") is not None:
        rate = parse_rate(setting["RATE_LIMIT"], "RATE_LIMIT")
    if cap is None and setting.get("GLOBAL_CONCURRENCY") is not None:
        cap = parse_cap(setting["GLOBAL_CONCURRENCY"], "GLOBAL_CONCURRENCY")
    found = [Scope(queue, "", rate, cap)] if rate or cap else []
    for kind, spec in sorted(specs.items(), key=lambda item: item[0] or ""):
        if kind is not None and (spec.rate_limit or spec.global_concurrency):
            found.append(Scope(queue, kind, spec.rate_limit, spec.global_concurrency))
    return found


def failure_blocks(queue: str) -> bool:
    """Whether a failed message of ``queue`` keeps the later messages of its group waiting
    (``GROUP_AFTER_FAILURE``: "block", the default, or "continue")."""
    from django_delayq.conf import get_config

    return get_config()["QUEUES"].get(queue, {}).get("GROUP_AFTER_FAILURE", "block") != "continue"


def continuing_queues() -> list[str]:
    """The queues whose failed messages let the rest of their group go on
    (``GROUP_AFTER_FAILURE: "continue"``); every other queue blocks on failure."""
    from django_delayq.conf import get_config

    queues = get_config()["QUEUES"]
    # A key that is not a queue name (E006) names no queue: left out, not sorted
    # beside the names (a TypeError on every page that asked).
    return sorted(q for q in queues if isinstance(q, str) and not failure_blocks(q))
