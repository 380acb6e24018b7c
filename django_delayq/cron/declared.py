"""The schedules in force: those declared in code (``schedule``), overridden by
``DELAYQ["SCHEDULES"]``, which can also switch one off (``None``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import wraps
from typing import ParamSpec

from django.core.exceptions import ImproperlyConfigured

from django_delayq.conf import get_config
from django_delayq.cron.spec import Schedule, ScheduleError, build_schedule, parse_schedule

logger = logging.getLogger("django_delayq.worker")

P = ParamSpec("P")

_declared: dict[str, Schedule] = {}


def _declaring(build: Callable[P, Schedule], doc: str) -> Callable[P, Schedule]:
    """``build``'s schedule, declared in code; ``build``'s options (its signature and
    type hints), and ``doc``."""

    @wraps(build)
    def declare(*args: P.args, **kwargs: P.kwargs) -> Schedule:
        result = replace(build(*args, **kwargs), source="code")
        existing = _declared.get(result.name)
        if existing is not None and existing != result:
            raise ImproperlyConfigured(f"schedule {result.name!r} is declared twice, differently")
        _declared[result.name] = result
        return result

    declare.__name__ = declare.__qualname__ = "schedule"
    declare.__doc__ = doc
    return declare


schedule = _declaring(
    build_schedule,
    """Declare a schedule in code (an app's ``handlers.py``); same options as the setting.

    Call it, or use it as a decorator over the function that handles the
    ticks (which it then registers with ``@handler``)::

        @schedule("nightly-report", queue="reports", cron="0 2 * * *", timezone="Europe/Paris")
        def nightly_report(message): ...

    Options are validated here, so a typo fails at import, like
    ``@handler``'s. A ``DELAYQ["SCHEDULES"]`` entry of the same name
    replaces the declaration (``None`` switches it off).
    """,
)


def unregister_schedule(name: str) -> None:
    """Forget a schedule declared with :func:`schedule` (tests, plugins)."""
    _declared.pop(name, None)


def _settings_entries() -> dict[str, object]:
    entries = get_config().get("SCHEDULES") or {}
    return dict(entries) if isinstance(entries, Mapping) else {}


def schedule_problems() -> list[tuple[str, ScheduleError]]:
    """``(name, error)`` for every unusable ``DELAYQ["SCHEDULES"]`` entry (for the checks)."""
    entries = get_config().get("SCHEDULES") or {}
    if not isinstance(entries, Mapping):
        return [("", ScheduleError("DELAYQ['SCHEDULES'] must be a dict of name to options"))]
    problems = []
    for name, options in entries.items():
        if options is None and name in _declared:
            continue
        try:
            parse_schedule(name, options)
        except ScheduleError as exc:
            problems.append((str(name), exc))
    return problems


def get_schedules(*, log: bool = True) -> dict[str, Schedule]:
    """Every schedule in force, by name: code declarations overridden by the setting.

    Invalid setting entries are left out (and logged): the system checks
    report them at start-up, and a worker must never crash on them.
    """
    schedules = dict(_declared)
    for name, options in _settings_entries().items():
        if options is None:
            schedules.pop(name, None)
            continue
        try:
            schedules[name] = parse_schedule(name, options)
        except ScheduleError as exc:
            schedules.pop(name, None)
            if log:
                logger.error("schedule %r is ignored: %s", name, exc)
    return dict(sorted(schedules.items()))
