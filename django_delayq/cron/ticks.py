"""Ticks: which occurrence a tick message is (what its handler sees), and which
ticks of a schedule to install and cancel, decided from what is installed
(``cron/install.py`` does the reading and the writing)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.cron.spec import KEY_RE, TICK_FORMAT, Schedule

if TYPE_CHECKING:
    from django_delayq.models import Message

# ``Tick.is_late``: started more than this after its time.
LATE_TOLERANCE = timedelta(minutes=1)
# Most ticks one install writes for one schedule (an ``every=1`` schedule
# with a long install interval would otherwise write thousands).
MAX_TICKS_PER_INSTALL = 1000


@dataclass(frozen=True)
class Tick:
    """Which occurrence a tick message is (see :func:`tick_of`)."""

    name: str
    time: datetime
    config_hash: str
    late_by: timedelta

    @property
    def is_late(self) -> bool:
        """Started more than ``LATE_TOLERANCE`` (a minute) after its time."""
        return self.late_by > LATE_TOLERANCE


def parse_key(key: str) -> tuple[str, str, datetime] | None:
    """``(name, config hash, tick time)`` of a tick key, or None for any other key."""
    match = KEY_RE.fullmatch(key)
    if match is None:
        return None
    time = datetime.strptime(match["time"], TICK_FORMAT).replace(tzinfo=UTC)
    return match["name"], match["hash"], time


def tick_of(message: Message) -> Tick | None:
    """The schedule name and tick time of a tick message (None for other messages).

    The handler's ``message.payload`` is the schedule's payload, untouched;
    the occurrence lives in the key. ``late_by`` is how long after its time
    this attempt started (0 when on time).
    """
    parsed = parse_key(message.key)
    if parsed is None:
        return None
    name, config_hash, time = parsed
    started = message.last_attempt_time or clock.now()
    return Tick(name, time, config_hash, max(started - time, timedelta(0)))


@dataclass(frozen=True)
class TickRow:
    id: int
    queue: str
    name: str
    config_hash: str
    time: datetime
    untouched: bool  # pending and never attempted: an installer may delete or cancel it


@dataclass
class TickPlan:
    """What to write for one schedule: computed from reads, applied in one transaction."""

    install: list[datetime] = field(default_factory=list)
    cancel: list[int] = field(default_factory=list)
    caught_up: datetime | None = None


def missed_reason(sched: Schedule) -> str:
    """The ``last_error`` of a tick cancelled because it did not start within its grace."""
    return f"Missed: not started within its grace period (catch_up={sched.catch_up})"


def _lookahead() -> timedelta:
    """Install far enough ahead that a running worker never lets the ticks run out.

    Two install intervals (or poll intervals, if longer): an install that
    comes late by a whole interval still finds future ticks in place.
    """
    config = get_config()
    interval = to_timedelta(config["CRON_INSTALL_INTERVAL"])
    poll = to_timedelta(config["POLL_INTERVAL"])
    return 2 * max(interval, poll)


def plan_ticks(
    sched: Schedule,
    now: datetime,
    rows: Iterable[TickRow],
    *,
    has_history: Callable[[], bool] = lambda: False,
    exists: Callable[[datetime], bool] = lambda t: False,
    lookahead: timedelta | None = None,
) -> TickPlan:
    """Decide which ticks of ``sched`` (current configuration) to install and cancel.

    ``rows`` are its active tick messages; ``has_history`` tells whether an
    earlier tick of this configuration exists; ``exists`` whether a tick's
    message exists in any status. Pure apart from those two callbacks, so
    the catch-up rules are unit-tested without a database.

    - Future ticks: every tick from ``now`` on for ``lookahead``, and at
      least ``ahead`` of them.
    - A tick still waiting ``grace`` after its time is *missed* (workers
      were stopped, or its queue was too busy): it is cancelled.
    - ``catch_up="latest"``: the most recent missed tick runs once anyway;
      when the installed ticks ran out while no worker ran, the last tick
      before ``now`` is installed to run at once.
    """
    rows = [r for r in rows if r.config_hash == sched.config_hash]
    known = {r.time for r in rows}
    plan = TickPlan()
    horizon = now + (lookahead if lookahead is not None else _lookahead())
    for n, tick in enumerate(sched.ticks(now)):
        if n >= MAX_TICKS_PER_INSTALL or (n >= sched.ahead and tick > horizon):
            break
        if tick not in known:
            plan.install.append(tick)

    overdue = sorted((r for r in rows if r.untouched and r.time <= now), key=lambda r: r.time)
    missed = [r for r in overdue if r.time + sched.grace_for(r.time) < now]
    if sched.catch_up == "latest":
        newest = overdue[-1] if overdue else None
        previous = sched.previous_tick(now)
        if (
            previous is not None
            and previous < now  # a tick at ``now`` is installed above anyway
            and previous not in known
            and not any(t > previous for t in known)
            and (any(t < previous for t in known) or has_history())
            and not exists(previous)
        ):
            # The installed ticks ran out while no worker ran: the latest
            # occurrence was never installed. Run it now, once.
            plan.install.append(previous)
            plan.caught_up = previous
        elif newest is not None and newest in missed:
            # Keep the newest missed tick, unless a later occurrence up to
            # now runs anyway (or ran): then the schedule is caught up.
            superseded = (
                previous is not None
                and previous > newest.time
                and (previous in known or previous == now or exists(previous))
            )
            if not superseded:
                missed.remove(newest)
                plan.caught_up = newest.time
    plan.cancel = [r.id for r in missed]
    # Every installer inserts in time order, so two of them racing on the
    # same keys wait for each other in one order and never deadlock.
    plan.install.sort()
    return plan
