"""What a schedule is: its options checked, its tick times and its ticks' keys.

A schedule (``DELAYQ["SCHEDULES"]``, or ``schedule`` in an app's
``handlers.py``: ``cron/declared.py``) produces *ticks*: messages whose key
embeds the schedule name, a hash of its configuration and the tick time::

    cron:nightly-report:3fa9c1e07b:2026-03-29T00:00:00Z

Tick times are computed the same way everywhere (cron expressions in the
schedule's time zone with the DST rules below, ``every`` periods aligned to
the Unix epoch), so concurrent installers compute the same keys. No
database here: ``cron/ticks.py`` plans what to install, ``cron/install.py``
reads and writes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from django_delayq import durations
from django_delayq.conf import MAX_DELAY, check_max_delay, to_timedelta
from django_delayq.exceptions import DelayQError
from django_delayq.models import MAX_ATTEMPTS_LIMIT, PRIORITY_MAX, PRIORITY_MIN
from django_delayq.registry import validate_kind, validate_queue_name
from django_delayq.values import is_int_between

if TYPE_CHECKING:
    from django_delayq.registry import HandlerFunc


def _croniter() -> Any:
    """croniter, imported when a cron expression is first read: a worker (or any
    command) of a project without cron schedules never loads it."""
    from croniter import croniter

    return croniter


F = TypeVar("F", bound="HandlerFunc")

KEY_PREFIX = "cron:"
# Both matched whole (``fullmatch``): ``$`` would also match before a final newline.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
NAME_MAX_LENGTH = 100
HASH_LENGTH = 10
TICK_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
KEY_RE = re.compile(
    r"cron:(?P<name>[A-Za-z0-9][A-Za-z0-9_.\-]*):(?P<hash>[0-9a-f]{10}):"
    r"(?P<time>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z)"
)
# Bumped when tick times of an unchanged configuration would change (a new
# DST rule, say): every schedule then gets a new hash and fresh ticks.
HASH_VERSION = 1

CATCH_UP_CHOICES = ("skip", "latest")
DEFAULT_AHEAD = 3
MAX_AHEAD = 1000
# A tick's default grace is the interval to the next tick, at most this.
MAX_DEFAULT_GRACE = timedelta(hours=1)
# Consecutive croniter results dropped before giving up (a safety net: a
# repeated hour drops at most 60).
MAX_SKIPPED_TICKS = 1000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
OPTIONS = (
    "queue",
    "cron",
    "every",
    "payload",
    "kind",
    "priority",
    "max_attempts",
    "timezone",
    "catch_up",
    "ahead",
    "grace",
)


class ScheduleError(DelayQError, ImproperlyConfigured, ValueError):
    """A schedule cannot be used; ``check_id`` is the system check that reports it."""

    def __init__(self, message: str, check_id: str = "django_delayq.E010") -> None:
        super().__init__(message)
        self.check_id = check_id


# -- schedules ------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """One recurring message. Build it with :func:`parse_schedule` or
    :func:`~django_delayq.schedule`.

    Exactly one of ``cron`` (a five-field expression, read in ``timezone``)
    and ``every`` (a whole number of seconds, aligned to the Unix epoch so
    every worker computes the same ticks) is set.
    """

    name: str
    queue: str
    cron: str | None = None
    every: timedelta | None = None
    payload: Any = field(default_factory=dict)
    kind: str = ""
    priority: int = 0
    max_attempts: int | None = None
    timezone: str | None = None
    catch_up: str = "skip"
    ahead: int = DEFAULT_AHEAD
    grace: timedelta | None = None
    source: str = field(default="settings", compare=False)

    # -- identity -------------------------------------------------------------

    @cached_property
    def config_hash(self) -> str:
        """A stable digest of everything that shapes a tick message.

        ``ahead``, ``grace`` and ``catch_up`` are left out: changing them
        changes which ticks are installed, not what a tick is, so it must not
        throw away the installed ones.
        """
        config = {
            "v": HASH_VERSION,
            "queue": self.queue,
            "cron": self.cron,
            "every": None if self.every is None else int(self.every.total_seconds()),
            "timezone": self.timezone,
            "payload": self.payload,
            "kind": self.kind,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
        }
        text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]

    @property
    def name_prefix(self) -> str:
        """The key prefix of every tick of this schedule, whatever its configuration."""
        return f"{KEY_PREFIX}{self.name}:"

    @property
    def key_prefix(self) -> str:
        """The key prefix of the ticks of this configuration."""
        return f"{self.name_prefix}{self.config_hash}:"

    def tick_key(self, time: datetime) -> str:
        return f"{self.key_prefix}{time.astimezone(UTC).strftime(TICK_FORMAT)}"

    @property
    def spec(self) -> str:
        """The expression or period, for people: ``cron 0 2 * * *`` / ``every 30s``."""
        if self.cron is not None:
            return f"cron {self.cron}"
        assert self.every is not None
        return f"every {_human(self.every)}"

    @cached_property
    def tzinfo(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or "UTC")

    # -- tick times -----------------------------------------------------------

    def ticks(self, start: datetime, *, inclusive: bool = True) -> Iterator[datetime]:
        """Tick times from ``start`` on (aware, UTC), strictly increasing."""
        if self.every is not None:
            yield from self._every_ticks(start, inclusive)
        else:
            yield from self._cron_ticks(start, inclusive)

    def next_ticks(self, start: datetime, count: int) -> list[datetime]:
        out: list[datetime] = []
        for tick in self.ticks(start):
            if len(out) >= count:
                break
            out.append(tick)
        return out

    def previous_tick(self, at: datetime) -> datetime | None:
        """The last tick at or before ``at``."""
        if self.every is not None:
            period = _micros(self.every)
            return EPOCH + timedelta(microseconds=(_micros(at - EPOCH) // period) * period)
        # croniter's get_prev finds the neighbourhood; the forward walk (the
        # one path that applies the DST rules below) decides.
        try:
            rough = _croniter()(self._expr, at.astimezone(self.tzinfo)).get_prev(datetime)
        except Exception:
            return None
        found = None
        for tick in self._cron_ticks(rough.astimezone(UTC) - timedelta(hours=3), True):
            if tick > at:
                break
            found = tick
        return found

    def grace_for(self, tick: datetime) -> timedelta:
        """How long after its time a waiting tick may still start before it is missed."""
        if self.grace is not None:
            return self.grace
        following = next(self.ticks(tick, inclusive=False), None)
        if following is None:
            return MAX_DEFAULT_GRACE
        return min(following - tick, MAX_DEFAULT_GRACE)

    @property
    def _expr(self) -> str:
        assert self.cron is not None
        return CRON_ALIASES.get(self.cron.strip().lower(), self.cron)

    @cached_property
    def _hours_fixed(self) -> bool:
        """True unless the hour field starts with ``*`` (``*``, ``*/2``).

        On a fall-back night the wall-clock hour is repeated: like Vixie
        cron, a job at fixed hours ("30 2 * * *") runs in the first pass only,
        while a job over every hour ("*/30 * * * *") follows real time and
        runs in both.
        """
        return not self._expr.split()[1].startswith("*")

    def _every_ticks(self, start: datetime, inclusive: bool) -> Iterator[datetime]:
        assert self.every is not None
        period = _micros(self.every)
        since = _micros(start - EPOCH)
        k = -(-since // period)  # ceil
        if not inclusive and k * period == since:
            k += 1
        while True:
            yield EPOCH + timedelta(microseconds=k * period)
            k += 1

    def _cron_ticks(self, start: datetime, inclusive: bool) -> Iterator[datetime]:
        tz = self.tzinfo
        begin = start - timedelta(microseconds=1) if inclusive else start
        it = _croniter()(self._expr, begin.astimezone(tz))
        last = begin.astimezone(UTC)
        skipped = 0
        while skipped < MAX_SKIPPED_TICKS:
            local = it.get_next(datetime)
            tick = local.astimezone(UTC)
            if tick <= last or (self._hours_fixed and _second_occurrence(local, tz)):
                # Two times landing on one instant (02:00 and 02:30 both
                # become 03:00 on a spring-forward night), or a repeat.
                skipped += 1
                continue
            skipped = 0
            last = tick
            yield tick

    # -- declaring in code ----------------------------------------------------

    def __call__(self, func: F) -> F:
        """``@schedule(...)`` over a function: it becomes the ticks' handler.

        The function is registered with ``@handler(queue, kind=...)`` unless
        it is already the handler of that queue and kind (for instance
        because ``@handler`` with options sits under ``@schedule``).
        """
        from django_delayq.registry import handler, registry

        if not callable(func):
            raise TypeError("@schedule must decorate a callable")
        kind = self.kind or None
        if not any(s.func is func and s.kind == kind for s in registry.for_queue(self.queue)):
            handler(self.queue, kind=kind)(func)
        return func


def _second_occurrence(local: datetime, tz: ZoneInfo) -> bool:
    """True for the second pass of a wall-clock time repeated by a fall-back."""
    wall = local.replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    return first < second and local.astimezone(UTC) == second


def _micros(delta: timedelta) -> int:
    return delta // timedelta(microseconds=1)


def _human(delta: timedelta) -> str:
    return durations.exact(int(delta.total_seconds()))


# -- parsing and validation -------------------------------------------------------


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > NAME_MAX_LENGTH:
        raise ScheduleError(
            f"schedule name {name!r} must be a str of letters, digits and _ . - "
            f"(starting with a letter or digit, at most {NAME_MAX_LENGTH} characters)"
        )
    return name


def _check_cron(expr: object) -> str:
    if not isinstance(expr, str):
        raise ScheduleError(
            f"cron must be a str, got {type(expr).__name__}", check_id="django_delayq.E011"
        )
    expanded = CRON_ALIASES.get(expr.strip().lower(), expr)
    fields = expanded.split()
    if len(fields) == 5 and not _croniter().is_valid(expanded):
        raise ScheduleError(
            f"invalid cron expression {expr!r}: {_wrong_field(fields)}",
            check_id="django_delayq.E011",
        )
    if len(fields) != 5:
        raise ScheduleError(
            f"invalid cron expression {expr!r}: expected five fields "
            "(minute hour day-of-month month day-of-week) or @hourly/@daily/@weekly/"
            "@monthly/@yearly; use every= for periods under a minute",
            check_id="django_delayq.E011",
        )
    return expr


#: The five fields in order, with the values each takes.
CRON_FIELDS = (
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31"),
    ("month", "1-12 or jan-dec"),
    ("day-of-week", "0-7 or sun-sat"),
)


def _wrong_field(fields: list[str]) -> str:
    """Name the first field croniter refuses on its own (the others as ``*``):
    croniter says only that the whole expression is not acceptable, and a user
    who wrote five fields needs to know which one is wrong."""
    for index, (name, values) in enumerate(CRON_FIELDS):
        alone = ["*"] * 5
        alone[index] = fields[index]
        if not _croniter().is_valid(" ".join(alone)):
            return f"the {name} field {fields[index]!r} is not valid (it takes {values})"
    return "its fields are each valid but not together"


def _check_every(value: object) -> timedelta:
    try:
        period = to_timedelta(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"every: {exc}", check_id="django_delayq.E014") from None
    if period <= timedelta(0):
        raise ScheduleError(
            f"every must be a positive period, got {value!r}", check_id="django_delayq.E014"
        )
    if period % timedelta(seconds=1):
        raise ScheduleError(
            f"every must be a whole number of seconds, got {value!r}",
            check_id="django_delayq.E014",
        )
    try:
        return check_max_delay(period, "every", value)
    except ValueError as exc:
        raise ScheduleError(str(exc), check_id="django_delayq.E014") from None


def _check_timezone(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ScheduleError(
            f"timezone must be an IANA time zone name such as 'Europe/Paris', got {value!r}",
            check_id="django_delayq.E012",
        )
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {value!r} (expected an IANA name such as 'Europe/Paris')",
            check_id="django_delayq.E012",
        ) from None
    return value


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not is_int_between(value, low, high):
        raise ScheduleError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


def build_schedule(
    name: str,
    *,
    queue: str,
    cron: str | None = None,
    every: timedelta | int | float | None = None,
    payload: Any = None,
    kind: str = "",
    priority: int = 0,
    max_attempts: int | None = None,
    timezone: str | None = None,
    catch_up: str = "skip",
    ahead: int = DEFAULT_AHEAD,
    grace: timedelta | int | float | None = None,
) -> Schedule:
    """Validate the options and return the :class:`Schedule`; raise :class:`ScheduleError`.

    Its ``source`` is "settings"; :func:`~django_delayq.schedule` makes it "code".
    """
    from django_delayq.payload import check_payload

    name = check_name(name)
    if (cron is None) == (every is None):
        raise ScheduleError(
            "set exactly one of cron= (an expression) and every= (a period); got "
            + ("both" if cron is not None else "neither"),
            check_id="django_delayq.E013",
        )
    try:
        validate_queue_name(queue)
        validate_kind(kind)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(str(exc)) from None
    period = None
    if cron is not None:
        cron = _check_cron(cron)
        timezone = _check_timezone(settings.TIME_ZONE if timezone is None else timezone)
    else:
        period = _check_every(every)
        if timezone is not None:
            raise ScheduleError(
                "timezone only applies to cron= schedules (every= periods are aligned to UTC)",
                check_id="django_delayq.E012",
            )
    payload = {} if payload is None else payload
    try:
        check_payload(payload)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(str(exc)) from None
    _check_int("priority", priority, PRIORITY_MIN, PRIORITY_MAX)
    if max_attempts is not None:
        _check_int("max_attempts", max_attempts, 1, MAX_ATTEMPTS_LIMIT)
    if catch_up not in CATCH_UP_CHOICES:
        raise ScheduleError(
            f"catch_up must be one of {', '.join(CATCH_UP_CHOICES)}, got {catch_up!r}"
        )
    _check_int("ahead", ahead, 1, MAX_AHEAD)
    if period is not None and period * ahead > MAX_DELAY:
        # At least ``ahead`` ticks are installed: the last must be a due time
        # every database can store.
        raise ScheduleError(
            f"every ({_human(period)}) times ahead ({ahead}) must be at most "
            f"{MAX_DELAY.days} days (about 1,000 years): that many ticks are installed",
            check_id="django_delayq.E014",
        )
    grace_td = None
    if grace is not None:
        try:
            grace_td = check_max_delay(to_timedelta(grace, "grace"), "grace", grace)
        except (TypeError, ValueError) as exc:
            raise ScheduleError(str(exc)) from None
        if grace_td <= timedelta(0):
            raise ScheduleError(f"grace must be positive, got {grace!r}")
    result = Schedule(
        name=name,
        queue=queue,
        cron=cron,
        every=period,
        payload=payload,
        kind=kind,
        priority=priority,
        max_attempts=max_attempts,
        timezone=timezone,
        catch_up=catch_up,
        ahead=ahead,
        grace=grace_td,
    )
    if cron is not None:
        # Valid syntax that never matches a date ("0 0 30 2 *").
        try:
            next(result.ticks(EPOCH))
        except Exception:
            raise ScheduleError(
                f"cron expression {cron!r} never fires", check_id="django_delayq.E011"
            ) from None
    return result


def parse_schedule(name: str, options: object) -> Schedule:
    """A schedule from its ``DELAYQ["SCHEDULES"]`` entry."""
    if not isinstance(options, Mapping):
        raise ScheduleError(f"must be a dict of options, got {type(options).__name__}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ScheduleError(
            f"unknown option(s) {', '.join(map(repr, unknown))}; known: {', '.join(OPTIONS)}"
        )
    if "queue" not in options:
        raise ScheduleError("queue is required")
    return build_schedule(name, **options)
