"""Running one claimed message and recording how it ended.

This is the only place handler code is called. Whatever the handler does
(returns, raises, snoozes, discards), exactly one compare-and-set statement
records the outcome; if that statement finds the message is no longer ours
(the lease expired and someone else claimed it), nothing is recorded and,
for ``atomic=True`` handlers, the handler's writes are rolled back.
"""

from __future__ import annotations

import enum
import logging
import traceback
import uuid
from datetime import timedelta

from django.db import transaction

from django_delayq import claim, clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.exceptions import Discard, HandlerNotFound, Retry
from django_delayq.models import Message
from django_delayq.registry import HandlerSpec, registry
from django_delayq.retry import get_default_policy, resolve_policy

logger = logging.getLogger("django_delayq.worker")


class Result(enum.StrEnum):
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    SNOOZED = "snoozed"
    FAILED = "failed"
    DISCARDED = "discarded"
    LEASE_LOST = "lease_lost"


class _LeaseLost(Exception):
    """The ack found the message claimed by someone else: undo the handler's writes."""


def _clean(text: str) -> str:
    # PostgreSQL text cannot hold NUL; an exception message may.
    return text.replace("\x00", "\\x00")


def describe(exc: BaseException) -> str:
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    text = str(exc)
    return _clean(f"{name}: {text}" if text else name)


def _max_attempts(message: Message, spec: HandlerSpec | None) -> int:
    if message.max_attempts:
        return message.max_attempts
    if spec is not None:
        return spec.effective_max_attempts()
    config = get_config()
    return int(config["QUEUES"].get(message.queue, {}).get("MAX_ATTEMPTS", config["MAX_ATTEMPTS"]))


def _retry_time(message: Message, spec: HandlerSpec | None, exc: BaseException):
    """When to try again after this failure, or None to give up."""
    if message.attempt_count >= _max_attempts(message, spec):
        return None
    if spec is not None:
        policy = spec.effective_retry()
    else:
        queue_policy = get_config()["QUEUES"].get(message.queue, {}).get("RETRY_POLICY")
        policy = resolve_policy(queue_policy) if queue_policy else get_default_policy()
    try:
        delay = policy.next_delay(message.attempt_count, exc)
    except Exception:
        logger.exception("retry policy %r failed; retrying message %s in 60 s", policy, message.pk)
        delay = timedelta(seconds=60)
    if delay is None:
        return None
    return clock.now() + to_timedelta(delay)


def execute(message: Message, token: uuid.UUID, *, using: str) -> Result:
    """Run ``message``'s handler and record the outcome under ``token``."""
    try:
        spec: HandlerSpec | None = registry.lookup(message.queue, message.kind)
    except HandlerNotFound as exc:
        # A worker that lacks the handler (an older deployment during a
        # rolling release, a typo in kind) must not lose the message: it is
        # failed like any error, so it is retried and stays visible.
        return _record_failure(message, token, None, exc, "", using)

    assert spec is not None
    limit = _max_attempts(message, spec)
    if message.attempt_count > limit:
        # The previous attempts ended without an outcome (the worker was
        # killed, or the message outlived its lease): a message that kills its
        # worker must not be redelivered forever.
        error = (
            f"gave up: attempt {message.attempt_count - 1} of {limit} ended without an "
            "outcome (worker crash or lease expiry)"
        )
        if not claim.fail(message.pk, token, error=error, retry_at=None, using=using):
            return _lease_lost(message)
        logger.error("message %s (%s/%s) %s", message.pk, message.queue, message.key, error)
        return Result.FAILED
    try:
        if spec.atomic:
            with transaction.atomic(using=using):
                spec.func(message)
                if not claim.ack([message.pk], token, using=using):
                    raise _LeaseLost
        else:
            spec.func(message)
    except _LeaseLost:
        return _lease_lost(message)
    except Retry as exc:
        when = clock.now() + exc.delay
        cap = _max_attempts(message, spec) + 1
        if not claim.snooze(message.pk, token, run_at=when, max_attempts=cap, using=using):
            return _lease_lost(message)
        logger.info("message %s snoozed until %s %s", message.pk, when.isoformat(), exc.reason)
        return Result.SNOOZED
    except Discard as exc:
        error = _clean(f"Discarded: {exc.reason}" if exc.reason else "Discarded")
        if not claim.fail(message.pk, token, error=error, retry_at=None, using=using):
            return _lease_lost(message)
        logger.info("message %s discarded: %s", message.pk, exc.reason)
        return Result.DISCARDED
    except (Exception, SystemExit) as exc:
        return _record_failure(message, token, spec, exc, traceback.format_exc(), using)

    if not spec.atomic and not claim.ack([message.pk], token, using=using):
        return _lease_lost(message)
    return Result.SUCCEEDED


def _record_failure(
    message: Message,
    token: uuid.UUID,
    spec: HandlerSpec | None,
    exc: BaseException,
    tb: str,
    using: str,
) -> Result:
    retry_at = _retry_time(message, spec, exc)
    error = describe(exc)
    if not claim.fail(
        message.pk, token, error=error, traceback=_clean(tb), retry_at=retry_at, using=using
    ):
        return _lease_lost(message)
    if retry_at is None:
        logger.error(
            "message %s (%s/%s) failed after %s attempt(s): %s",
            message.pk,
            message.queue,
            message.key,
            message.attempt_count,
            error,
        )
        return Result.FAILED
    logger.warning(
        "message %s (%s/%s) attempt %s failed, retrying at %s: %s",
        message.pk,
        message.queue,
        message.key,
        message.attempt_count,
        retry_at.isoformat(),
        error,
    )
    return Result.RETRYING


def _lease_lost(message: Message) -> Result:
    logger.warning(
        "message %s (%s/%s): lease lost before the outcome was recorded; "
        "it is left to whoever holds it now",
        message.pk,
        message.queue,
        message.key,
    )
    return Result.LEASE_LOST
