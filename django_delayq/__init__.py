"""django-delayq: a durable, transactional, delayed message queue in your Django database."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "Discard",
    "EnqueueResult",
    "MessageFailed",
    "Outcome",
    "Retry",
    "aenqueue",
    "aenqueue_many",
    "await_result",
    "enqueue",
    "enqueue_many",
    "handler",
    "schedule",
    "tick_of",
    "wait",
]

from django_delayq.exceptions import Discard, MessageFailed, Retry

if TYPE_CHECKING:
    from django_delayq.cron.declared import schedule
    from django_delayq.cron.ticks import tick_of
    from django_delayq.enqueuing import (
        EnqueueResult,
        Outcome,
        aenqueue,
        aenqueue_many,
        enqueue,
        enqueue_many,
    )
    from django_delayq.registry import handler
    from django_delayq.workflows import await_result, wait


def __getattr__(name: str) -> Any:
    # The enqueue API and @handler touch the Message model, which may only be
    # imported once apps are loaded; resolving them lazily keeps
    # ``import django_delayq`` safe in settings and app configs.
    if name in ("enqueue", "enqueue_many", "aenqueue", "aenqueue_many", "Outcome", "EnqueueResult"):
        from django_delayq import enqueuing as module

        return getattr(module, name)
    if name == "handler":
        from django_delayq.registry import handler

        return handler
    if name in ("wait", "await_result"):
        from django_delayq import workflows

        return getattr(workflows, name)
    if name == "schedule":
        from django_delayq.cron.declared import schedule

        return schedule
    if name == "tick_of":
        from django_delayq.cron.ticks import tick_of

        return tick_of
    raise AttributeError(f"module 'django_delayq' has no attribute {name!r}")
