"""System checks for the ``DELAYQ`` setting (ids ``django_delayq.E0xx``; see docs/checks.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.checks import Error, Tags, Warning, register

from django_delayq.conf import DEFAULTS, DURATION_SETTINGS

POSITIVE_INTS = ("BATCH_SIZE", "CONCURRENCY", "MAX_ATTEMPTS", "PRUNE_BATCH_SIZE")
QUEUE_KEYS = ("LEASE", "MAX_ATTEMPTS", "RETRY_POLICY", "CONCURRENCY")
# Settings later features read; accepted here so that they are not flagged.
KNOWN_EXTRA: tuple[str, ...] = ()


def _duration(value: Any) -> timedelta | None:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    return None


def _check_value(name: str, value: Any, where: str) -> list[Error]:
    errors = []
    if name in DURATION_SETTINGS:
        if value is None and name == "PRUNE_INTERVAL":
            return []
        td = _duration(value)
        if td is None:
            errors.append(
                Error(
                    f"{where}{name} must be a datetime.timedelta or a number of seconds, "
                    f"got {value!r}",
                    id="django_delayq.E002",
                )
            )
        elif td < timedelta(0) or (td == timedelta(0) and name != "RETENTION"):
            errors.append(
                Error(f"{where}{name} must be positive, got {value!r}", id="django_delayq.E003")
            )
    elif name in POSITIVE_INTS:
        if name == "BATCH_SIZE" and value is None:
            return []
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                Error(
                    f"{where}{name} must be a positive integer, got {value!r}",
                    id="django_delayq.E004",
                )
            )
    elif name == "MAX_PAYLOAD_SIZE":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            errors.append(
                Error(
                    f"{where}MAX_PAYLOAD_SIZE must be a positive integer or None, got {value!r}",
                    id="django_delayq.E004",
                )
            )
    elif name == "RETRY_POLICY":
        from django_delayq.retry import resolve_policy

        try:
            resolve_policy(value)
        except (ImportError, TypeError, ValueError) as exc:
            errors.append(
                Error(f"{where}RETRY_POLICY is not usable: {exc}", id="django_delayq.E005")
            )
    elif name == "NOTIFY":
        if not isinstance(value, bool):
            errors.append(
                Error(
                    f"{where}NOTIFY must be True or False, got {value!r}", id="django_delayq.E004"
                )
            )
    return errors


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    from django.conf import settings

    user = getattr(settings, "DELAYQ", {})
    if not isinstance(user, dict):
        return [Error(f"DELAYQ must be a dict, got {type(user).__name__}", id="django_delayq.E001")]
    errors: list[Error | Warning] = []
    for name, value in user.items():
        if name not in DEFAULTS and name not in KNOWN_EXTRA:
            errors.append(
                Warning(
                    f"DELAYQ[{name!r}] is not a known setting",
                    hint=f"known settings: {', '.join(sorted(DEFAULTS))}",
                    id="django_delayq.W001",
                )
            )
            continue
        errors.extend(_check_value(name, value, "DELAYQ: "))
    queues = user.get("QUEUES", {})
    if not isinstance(queues, dict):
        errors.append(
            Error(
                "DELAYQ['QUEUES'] must be a dict of queue name to overrides",
                id="django_delayq.E006",
            )
        )
        return errors
    for queue, overrides in queues.items():
        where = f"DELAYQ['QUEUES'][{queue!r}]: "
        if not isinstance(overrides, dict):
            errors.append(Error(f"{where}must be a dict", id="django_delayq.E006"))
            continue
        for name, value in overrides.items():
            if name not in QUEUE_KEYS:
                errors.append(
                    Error(
                        f"{where}{name!r} cannot be set per queue",
                        hint=f"per-queue settings: {', '.join(QUEUE_KEYS)}",
                        id="django_delayq.E006",
                    )
                )
                continue
            errors.extend(_check_value(name, value, where))
    return errors


@register(Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """``DELAYQ["SCHEDULES"]`` and ``@schedule`` declarations (E010-E015).

    Every problem names its schedule, so a typo stops ``manage.py check``
    and ``run_delayq`` at start-up instead of a worker meeting it later.
    """
    from django.conf import settings

    from django_delayq.exceptions import HandlerNotFound
    from django_delayq.registry import registry
    from django_delayq.scheduling import get_schedules, schedule_problems

    if not isinstance(getattr(settings, "DELAYQ", {}), dict):
        return []  # E001 already says so
    errors: list[Error | Warning] = []
    for name, problem in schedule_problems():
        where = f"DELAYQ['SCHEDULES'][{name!r}]: " if name else ""
        errors.append(Error(f"{where}{problem}", id=problem.check_id))
    schedules = get_schedules(log=False)
    if schedules and not settings.USE_TZ:
        errors.append(
            Error(
                f"schedules ({', '.join(map(repr, schedules))}) need USE_TZ = True: "
                "tick times are aware datetimes",
                id="django_delayq.E010",
            )
        )
    for sched in schedules.values():
        try:
            registry.lookup(sched.queue, sched.kind)
        except HandlerNotFound:
            what = f"queue {sched.queue!r}" + (f" and kind {sched.kind!r}" if sched.kind else "")
            errors.append(
                Error(
                    f"schedule {sched.name!r}: no handler for {what}; its ticks would never run",
                    hint="define one with @handler in an installed app's handlers.py",
                    id="django_delayq.E015",
                )
            )
    return errors
