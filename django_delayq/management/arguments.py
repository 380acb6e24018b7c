"""Argument types of the management commands: every value checked as it is parsed.

A bad value is a usage error (``manage.py``: the usage line, the error and
exit status 2; ``call_command``: a ``CommandError``), before the command
connects to anything: a number is bounded on both sides, a database alias
must be one of ``DATABASES``, a queue name must be one a queue can have.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from django.conf import settings

from django_delayq.conf import MAX_DELAY


def _integer(value: str) -> int:
    text = value.strip()
    # int() would read a thousand digits before the bound refuses them.
    if len(text.lstrip("+-")) > 20:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


def count(high: int) -> Callable[[str], int]:
    """A type: a whole number from 1 to ``high``."""

    def parse(value: str) -> int:
        number = _integer(value)
        if not 1 <= number <= high:
            raise argparse.ArgumentTypeError(
                f"expected a positive integer (1 to {high:,}), got {value!r}"
            )
        return number

    parse.__name__ = "count"  # argparse names the type in some of its errors
    return parse


def port_number(value: str) -> int:
    """A type: a TCP port, 1 to 65535."""
    number = _integer(value)
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {value!r}")
    return number


def seconds(*, zero: bool = False) -> Callable[[str], float]:
    """A type: a number of seconds, positive (or zero, with ``zero``), at most
    ``conf.MAX_DELAY`` (about 1,000 years)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds, got {value!r}"
            ) from None
        if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
            what = "a number of seconds, 0 or more" if zero else "a positive number of seconds"
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
        if number > MAX_DELAY.total_seconds():
            raise argparse.ArgumentTypeError(
                f"expected at most {MAX_DELAY.total_seconds():.0f} seconds "
                f"({MAX_DELAY.days:,} days), got {value!r}"
            )
        return number

    parse.__name__ = "seconds"
    return parse


def factor(high: float) -> Callable[[str], float]:
    """A type: a number from 0 to ``high``."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not 0 <= number <= high:  # NaN too
            raise argparse.ArgumentTypeError(f"expected a number from 0 to {high:g}, got {value!r}")
        return number

    parse.__name__ = "factor"
    return parse


def database_alias(value: str) -> str:
    """A type: an alias of ``DATABASES``."""
    if value not in settings.DATABASES:
        known = ", ".join(repr(a) for a in settings.DATABASES)
        raise argparse.ArgumentTypeError(
            f"database {value!r} is not in DATABASES (known aliases: {known})"
        )
    return value


def queue_name(value: str) -> str:
    """A type: a name a queue can have (``registry.validate_queue_name``)."""
    from django_delayq.registry import validate_queue_name

    try:
        return validate_queue_name(value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def worker_name(value: str) -> str:
    """A type: a worker's name (``run_delayq --name``), which fits its column."""
    from django_delayq.liveness import validate_worker_name

    try:
        return validate_worker_name(value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
