"""Retry policies: how long a failed message waits before its next attempt.

A policy is any object with ``next_delay(attempt, exc)``; returning ``None``
gives up at once. ``max_attempts`` is enforced by the worker, not here, so
policies stay pure arithmetic that is easy to test.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

from django.utils.module_loading import import_string

from django_delayq.conf import get_config, to_timedelta


@runtime_checkable
class RetryPolicy(Protocol):
    def next_delay(self, attempt: int, exc: BaseException) -> timedelta | None:
        """Delay before attempt ``attempt + 1`` after ``attempt`` failed with ``exc``."""
        ...


@dataclass(frozen=True)
class ExponentialBackoff:
    """``base * factor ** (attempt - 1)``, capped, with "equal jitter".

    Jitter spreads the retries of messages that failed together (an outage)
    so they do not all come back in the same instant; keeping half of the
    delay fixed guarantees the backoff still grows.
    """

    base: timedelta | float = 2
    factor: float = 2.0
    cap: timedelta | float = 3600
    jitter: bool = True

    def __post_init__(self) -> None:
        if to_timedelta(self.base) <= timedelta(0):
            raise ValueError("ExponentialBackoff base must be positive")
        if self.factor < 1:
            raise ValueError("ExponentialBackoff factor must be >= 1")

    def next_delay(self, attempt: int, exc: BaseException) -> timedelta:
        base = to_timedelta(self.base).total_seconds()
        cap = to_timedelta(self.cap).total_seconds()
        try:
            grown = base * float(self.factor) ** max(0, attempt - 1)
        except OverflowError:  # past about attempt 1,000 with factor 2: the cap
            grown = cap
        delay = min(cap, grown)
        if self.jitter:
            delay = delay / 2 + random.uniform(0, delay / 2)
        return timedelta(seconds=delay)


@dataclass(frozen=True)
class FixedDelay:
    delay: timedelta | float = 60

    def next_delay(self, attempt: int, exc: BaseException) -> timedelta:
        return to_timedelta(self.delay)


@dataclass(frozen=True)
class NoRetry:
    """Fail on the first error, whatever ``max_attempts`` says."""

    def next_delay(self, attempt: int, exc: BaseException) -> None:
        return None


def resolve_policy(value: object) -> RetryPolicy:
    """Accept a policy instance, a policy class, or a dotted path to either."""
    if isinstance(value, str):
        value = import_string(value)
    if isinstance(value, type):
        value = value()
    if not isinstance(value, RetryPolicy):
        raise TypeError(f"{value!r} is not a retry policy (it needs a next_delay(attempt, exc))")
    return value


@functools.cache
def get_default_policy() -> RetryPolicy:
    return resolve_policy(get_config()["RETRY_POLICY"])
