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
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any, Protocol

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.dispatch import Signal

from django_delayq import signals
from django_delayq.conf import MAX_DELAY, get_config, to_timedelta
from django_delayq.cron.missed import skip_missed
from django_delayq.exceptions import (
    DelayQError,
    Discard,
    HandlerNotFound,
    MessageAbandoned,
    Retry,
    TimeLimitExceeded,
)
from django_delayq.flow import failure_blocks
from django_delayq.logs import message_fields
from django_delayq.models import Message
from django_delayq.registry import HandlerSpec, max_attempts_of, registry
from django_delayq.retry import get_default_policy, resolve_policy
from django_delayq.store import changes

logger = logging.getLogger("django_delayq.worker")

_MAIN_THREAD = threading.main_thread()


class Result(enum.StrEnum):
    """How an attempt ended, as the worker counts it (and the metrics' ``outcome``)."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    SNOOZED = "snoozed"
    FAILED = "failed"
    DISCARDED = "discarded"
    # The row was claimed again by then: nothing of this attempt was recorded.
    LEASE_LOST = "lease_lost"
    # The outcome could not be written (the database failed): the message
    # keeps its lease and is redelivered when it expires.
    UNRECORDED = "unrecorded"
    # A cron tick claimed past its grace: cancelled as missed, not run.
    MISSED = "missed"


class _LeaseLost(DelayQError):
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


# A settling statement that lost its connection is sent again this many times
# (after a reconnect, with a capped backoff) before the message is left to
# its lease. Sending it twice is harmless: it is a compare-and-set on the
# lock token, so a repeat after a commit whose reply was lost matches nothing.
SETTLE_RETRIES = 4
SETTLE_BACKOFF_CAP = 2.0


def settle(using: str, write: Callable[[], int]) -> int:
    """Run one settling statement, reconnecting if the connection was lost."""
    for attempt in range(SETTLE_RETRIES + 1):
        try:
            return write()
        except (OperationalError, InterfaceError):
            connection = connections[using]
            if attempt == SETTLE_RETRIES or connection.in_atomic_block:
                raise
            backoff = min(SETTLE_BACKOFF_CAP, 0.1 * 2**attempt)
            logger.warning(
                "database connection lost while recording an outcome; reconnecting in %.1f s",
                backoff,
            )
            connection.close()
            time.sleep(backoff)
    raise AssertionError("unreachable")  # pragma: no cover


def _retry_time(message: Message, spec: HandlerSpec | None, exc: BaseException) -> timedelta | None:
    """How long until the next attempt after this failure, or None to give up."""
    if message.attempt_count >= max_attempts_of(message, spec):
        return None
    if spec is not None:
        policy = spec.effective_retry()
    else:
        queue_policy = get_config()["QUEUES"].get(message.queue, {}).get("RETRY_POLICY")
        policy = resolve_policy(queue_policy) if queue_policy else get_default_policy()
    try:
        delay = policy.next_delay(message.attempt_count, exc)
        if delay is None:
            return None
        delta = to_timedelta(delay, "retry delay")
    except Exception:
        logger.exception("retry policy %r failed; retrying message %s in 60 s", policy, message.pk)
        delta = timedelta(seconds=60)
    # Longer than any due time a database could store: cut to the longest.
    return min(delta, MAX_DELAY)


class AckSink(Protocol):
    """Where a worker collects the acknowledgements it commits together (``worker/acks.py``)."""

    def add(self, message: Message, token: uuid.UUID, duration: float) -> None: ...


def execute(
    message: Message,
    token: uuid.UUID,
    *,
    using: str,
    acks: AckSink | None = None,
    later: list[Callable[[], None]] | None = None,
    group_acks: list[tuple[Message, uuid.UUID]] | None = None,
) -> Result:
    """Run ``message``'s handler and record the outcome under ``token``.

    With ``acks``, the success of a non-atomic handler is handed to it instead
    of being committed here; it commits a batch at once and then calls
    :func:`record_success`. Failures, retries and atomic handlers are always
    recorded here, one statement each. With ``later``, the caller runs this
    in a transaction of its own and commits it: the outcome's log line and
    signal are appended to ``later``, to run after that commit. With
    ``group_acks`` too, an atomic handler's success is appended there instead
    of being acknowledged here: the caller acknowledges the group in one
    statement before its commit (``runner.py``).
    """
    if skip_missed(message, token, using=using, later=later):
        return Result.MISSED
    try:
        spec: HandlerSpec | None = registry.lookup_for(message)
    except HandlerNotFound as exc:
        # A worker that lacks the handler (an older deployment during a
        # rolling release, a typo in kind) must not lose the message: it is
        # failed like any error, so it is retried and stays visible.
        return _record_failure(message, token, None, exc, "", using, later)

    assert spec is not None
    limit = max_attempts_of(message, spec)
    if message.attempt_count > limit:
        # The previous attempts ended without an outcome (the worker was
        # killed, or the message outlived its lease): a message that kills its
        # worker must not be redelivered forever.
        error = (
            f"gave up: attempt {message.attempt_count - 1} of {limit} ended without an "
            "outcome (worker crash or lease expiry)"
        )
        return _record(
            Result.FAILED,
            {"error": error, "retry_at": None},
            ("message %s (%s/%s) %s", message.pk, message.queue, message.key, error),
            message,
            token,
            using,
            later,
            exception=MessageAbandoned(error),
        )
    signals.send(
        signals.message_started, message=message, attempt=message.attempt_count, using=using
    )
    started = time.monotonic()
    try:
        if spec.atomic:
            with transaction.atomic(using=using):
                spec.func(message)
                if group_acks is None and not changes.ack(
                    [message.pk], token, using=using, model=type(message)
                ):
                    raise _LeaseLost
        else:
            spec.func(message)
    except _LeaseLost:
        return lease_lost(message)
    except Retry as exc:
        return _record(
            Result.SNOOZED,
            {"run_at": exc.delay, "max_attempts": max_attempts_of(message, spec) + 1},
            ("message %s snoozed for %s %s", message.pk, exc.delay, exc.reason),
            message,
            token,
            using,
            later,
            started=started,
            exception=exc,
            delay=exc.delay,
        )
    except Discard as exc:
        error = _clean(f"Discarded: {exc.reason}" if exc.reason else "Discarded")
        return _record(
            Result.DISCARDED,
            {"error": error, "retry_at": None},
            ("message %s discarded: %s", message.pk, exc.reason),
            message,
            token,
            using,
            later,
            started=started,
            reason=exc.reason,
        )
    except BaseException as exc:
        # Not only Exceptions: a handler (or library code under it) may raise
        # asyncio.CancelledError, KeyboardInterrupt or SystemExit. Any of them
        # ends the attempt like an error; letting one escape would kill the
        # executor thread with the message still held and its slot lost.
        result = _record_failure(message, token, spec, exc, traceback.format_exc(), using, later)
        if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is _MAIN_THREAD:
            # Only the main thread receives a real Ctrl-C (a worker's handlers
            # run in executor threads): recorded, and it still interrupts.
            raise
        return result

    if not spec.atomic and acks is not None:
        acks.add(message, token, time.monotonic() - started)
        return Result.SUCCEEDED
    if spec.atomic and group_acks is not None:
        group_acks.append((message, token))
    if not spec.atomic and not settle(
        using, lambda: changes.ack([message.pk], token, using=using, model=type(message))
    ):
        return lease_lost(message)
    _announce(later, partial(record_success, message, time.monotonic() - started, using=using))
    return Result.SUCCEEDED


def record_success(message: Message, duration: float, *, using: str) -> None:
    """Log and signal a success whose acknowledgement is committed.

    Sent once the acknowledgement is committed: a receiver never hears of a
    success that could still be rolled back.
    """
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "message %s (%s/%s) succeeded in %.3f s",
            message.pk,
            message.queue,
            message.key,
            duration,
            extra=message_fields(message, outcome=Result.SUCCEEDED, duration=duration),
        )
    signals.send(
        signals.message_succeeded,
        message=message,
        attempt=message.attempt_count,
        duration=duration,
        using=using,
    )
    _group_goes_on(message, using)


def _group_goes_on(message: Message, using: str) -> None:
    """Let the next message of ``message``'s group go, now that ``message`` is done.

    After the commit of its outcome, so the next message never starts
    before it has ended. If this fails (or the worker dies first), a sweep
    of every worker's maintenance lets it go a little later.
    """
    group = getattr(message, "group", "")
    if not group:
        return
    try:
        changes.release_groups([(message.queue, group)], using=using)
    except DatabaseError:
        logger.warning(
            "could not let group %s of queue %s go on; the groups' sweep will",
            group,
            message.queue,
            exc_info=True,
        )
        connections[using].close()


def record_time_limit(
    message: Message, token: uuid.UUID, limit: timedelta, *, using: str
) -> Result:
    """Fail an attempt that ran past ``limit`` while its handler is still running.

    Called by the worker's lease keeper, not by the handler's thread (which
    Python cannot interrupt). The failure replaces the lock token, so what the
    handler does when it finally returns (acknowledge, fail, snooze) matches
    nothing and is discarded; with ``atomic=True`` its writes roll back.
    """
    spec: HandlerSpec | None
    try:
        spec = registry.lookup_for(message)
    except HandlerNotFound:
        spec = None
    exc = TimeLimitExceeded(f"the handler ran for more than {limit.total_seconds():g} s")
    # Skip a row locked by the handler's own group transaction: it finished
    # meanwhile, and its outcome waits for that commit.
    return _record_failure(message, token, spec, exc, "", using, skip_locked=True)


def _record_failure(
    message: Message,
    token: uuid.UUID,
    spec: HandlerSpec | None,
    exc: BaseException,
    tb: str,
    using: str,
    later: list[Callable[[], None]] | None = None,
    *,
    skip_locked: bool = False,
) -> Result:
    retry_in = _retry_time(message, spec, exc)
    error = describe(exc)
    values = {
        "error": error,
        "traceback": _clean(tb),
        "retry_at": None,
        "retry_in": retry_in,
        "skip_locked": skip_locked,
    }
    where = (message.pk, message.queue, message.key, message.attempt_count)
    if retry_in is None:
        return _record(
            Result.FAILED,
            values,
            ("message %s (%s/%s) failed after %s attempt(s): %s", *where, error),
            message,
            token,
            using,
            later,
            # The last attempt's traceback (when the handler raised), so that
            # this one line says everything about the failure.
            exc_info=(type(exc), exc, exc.__traceback__) if tb else None,
            exception=exc,
        )
    return _record(
        Result.RETRYING,
        values,
        ("message %s (%s/%s) attempt %s failed, retrying in %s: %s", *where, retry_in, error),
        message,
        token,
        using,
        later,
        exception=exc,
        delay=retry_in,
    )


# Outcomes that leave a message failed: its group goes on past it where the
# queue says so (GROUP_AFTER_FAILURE = "continue").
_GIVEN_UP = frozenset({Result.FAILED, Result.DISCARDED})

# What records each outcome but success, the signal that announces it and its log level.
_OUTCOMES: dict[Result, tuple[Callable[..., int], Signal, int]] = {
    Result.SNOOZED: (changes.snooze, signals.message_retried, logging.INFO),
    Result.RETRYING: (changes.fail, signals.message_retried, logging.WARNING),
    Result.FAILED: (changes.fail, signals.message_failed, logging.ERROR),
    Result.DISCARDED: (changes.fail, signals.message_discarded, logging.INFO),
}


def _record(
    result: Result,
    values: dict[str, Any],
    log: tuple[Any, ...],
    message: Message,
    token: uuid.UUID,
    using: str,
    later: list[Callable[[], None]] | None,
    *,
    started: float | None = None,
    exc_info: Any = None,
    **sent: Any,
) -> Result:
    """Record how an attempt ended (``values`` go to ``changes.fail`` or ``snooze``), then
    log and signal it once the statement is committed (see :func:`_announce`).

    ``log`` is the log line and its arguments; with ``started``, the record
    carries the attempt's duration. ``sent`` are the signal's arguments
    beside the message, its attempt and the database.
    """
    write, signal, level = _OUTCOMES[result]
    if not settle(
        using, lambda: write(message.pk, token, using=using, model=type(message), **values)
    ):
        return lease_lost(message)
    fields = {} if started is None else {"duration": time.monotonic() - started}

    def announce() -> None:
        logger.log(
            level, *log, exc_info=exc_info, extra=message_fields(message, outcome=result, **fields)
        )
        signals.send(signal, message=message, attempt=message.attempt_count, using=using, **sent)
        if result in _GIVEN_UP and not failure_blocks(message.queue):
            _group_goes_on(message, using)

    _announce(later, announce)
    return result


def _announce(later: list[Callable[[], None]] | None, announce: Callable[[], None]) -> None:
    """Log and signal an outcome once its statement is committed.

    On its own (autocommit) the statement is committed already: at once.
    Inside a worker's group transaction (atomic handlers committed together,
    see ``worker.py``) the worker runs ``later`` after the group commits, and
    drops it if the group rolls back: a receiver never hears of an outcome
    that did not happen.
    """
    if later is None:
        announce()
    else:
        later.append(announce)


def unrecorded(using: str, text: str, *args: Any, **log: Any) -> None:
    """Outcomes could not be committed (the database went away, a receiver raised):
    log ``text`` with the traceback and close the connection. The messages keep
    their leases and are redelivered when they expire."""
    logger.exception(text, *args, stacklevel=2, **log)
    connections[using].close()


def lease_lost(message: Message) -> Result:
    """Log an attempt whose row another claim holds now; nothing of it is recorded."""
    logger.warning(
        "message %s (%s/%s): lease lost before the outcome was recorded; "
        "it is left to whoever holds it now",
        message.pk,
        message.queue,
        message.key,
        extra=message_fields(message, outcome=Result.LEASE_LOST),
    )
    return Result.LEASE_LOST
