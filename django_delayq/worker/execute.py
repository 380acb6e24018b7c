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
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from django.db import InterfaceError, OperationalError, connections, transaction
from django.dispatch import Signal

from django_delayq import guard, signals
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
from django_delayq.logs import duration as duration_text
from django_delayq.logs import message_fields, who
from django_delayq.models import Message
from django_delayq.payload import encode_payload
from django_delayq.registry import HandlerSpec, max_attempts_of, registry
from django_delayq.retry import get_default_policy, resolve_policy
from django_delayq.store import dependencies, groups, leases, settle
from django_delayq.values import escape_surrogates
from django_delayq.worker import aio
from django_delayq.worker.background import DB_ERRORS

if TYPE_CHECKING:
    from django_delayq.worker.acks import Settler, Unwritten
    from django_delayq.worker.inflight import InFlight

logger = logging.getLogger("django_delayq.worker")


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
    # PostgreSQL text cannot hold NUL, and no database a lone surrogate (a
    # file name decoded with surrogateescape); an exception message may hold
    # either, and its outcome must still be recorded.
    return escape_surrogates(text.replace("\x00", "\\x00"))


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
# the settler thread (or, with none, to its lease). Sending it twice is
# harmless: it is a compare-and-set on the lock token, so a repeat after a
# commit whose reply was lost matches nothing (and the row tells that it ended).
SETTLE_RETRIES = 4
SETTLE_BACKOFF_CAP = 2.0


def _settle(using: str, write: Callable[[], int]) -> tuple[int, bool]:
    """``write()``'s row count, and whether it was sent again after a lost connection
    (so an earlier send may have committed, its reply lost)."""
    for attempt in range(SETTLE_RETRIES + 1):
        try:
            return write(), attempt > 0
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
    except BaseException as error:
        # Not only Exceptions: a policy is the project's code (see guard.py).
        if guard.interrupts(error):
            raise
        logger.exception("retry policy %r failed; retrying %s in 60s", policy, who(message))
        delta = timedelta(seconds=60)
    # Longer than any due time a database could store: cut to the longest.
    return min(delta, MAX_DELAY)


class Held(Protocol):
    """What the worker tells :func:`execute` of an attempt it holds (``runner.py``)."""

    #: The attempt in the worker's book.
    item: InFlight
    #: Where outcomes go that this thread cannot write now, and (when it batches)
    #: successes; None: every outcome is written here, waiting for locks if need be.
    settler: Settler | None

    def returned(self) -> bool:
        """The handler returned or raised: False if its attempt was taken meanwhile
        (its time limit passed), so no outcome of it may be written."""
        ...


class _Unwritten(enum.Enum):
    """An outcome :func:`execute` did not write: handed to the settler (or, for a
    time limit, to the keeper's next round)."""

    DEFERRED = "deferred"
    BLOCKED = "blocked"


DEFERRED = _Unwritten.DEFERRED


class SwallowedDatabaseError(DelayQError):
    """An atomic handler returned after a database error in its transaction.

    The transaction cannot commit (Django marked it for rollback, or
    PostgreSQL aborted it), so none of the handler's writes would: the
    attempt fails like an error the handler raised, and is retried.
    """


def _past_time_limit(item: InFlight) -> timedelta | None:
    """``item``'s time limit if its handler has run past it, else None (read
    before the attempt is marked returned, which ends its time limit)."""
    started, limit = item.started_at, item.time_limit
    if limit is None or started is None:
        return None
    return limit if time.monotonic() - started > limit.total_seconds() else None


def _limit_seconds(item: InFlight) -> float:
    return item.time_limit.total_seconds() if item.time_limit is not None else 0.0


def _swallowed(using: str) -> bool:
    """Whether the open transaction on ``using`` met a database error it cannot go past."""
    connection = connections[using]
    if connection.needs_rollback:
        return True
    if connection.vendor == "postgresql" and connection.connection is not None:
        from psycopg.pq import TransactionStatus

        return bool(connection.connection.info.transaction_status == TransactionStatus.INERROR)
    return False


def execute(
    message: Message,
    token: uuid.UUID,
    *,
    using: str,
    held: Held | None = None,
    later: list[Callable[[], None]] | None = None,
    group_acks: list[tuple[Message, uuid.UUID]] | None = None,
) -> Result | _Unwritten:
    """Run ``message``'s handler and record the outcome under ``token``.

    ``held``: the worker's attempt (its book entry, the settler, the hook
    that marks the handler returned). A success of a non-atomic handler is
    then handed to the settler when it batches, and any outcome whose row
    another transaction has locked, or whose connection was lost, is handed
    to it too (:data:`DEFERRED`): the settler writes and announces it. Without
    ``held`` (the testing helpers), every outcome is written here. With
    ``later``, the caller runs this in a transaction of its own and commits
    it: the outcome's log line and signal are appended to ``later``, to run
    after that commit. With ``group_acks`` too, an atomic handler's success
    is appended there instead of being acknowledged here: the caller
    acknowledges the group in one statement before its commit (``runner.py``).
    """
    if skip_missed(message, token, using=using, later=later):
        return Result.MISSED
    try:
        spec: HandlerSpec | None = registry.lookup_for(message)
    except HandlerNotFound as exc:
        # A worker that lacks the handler (an older deployment during a
        # rolling release, a typo in kind) must not lose the message: it is
        # failed like any error, so it is retried and stays visible.
        if held is not None and not held.returned():
            return late(message)
        return _record_failure(message, token, None, exc, "", using, later, held=held)

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
        if held is not None and not held.returned():
            return late(message)
        return _record(
            Result.FAILED,
            {"error": error, "retry_at": None},
            ("%s %s", who(message), error),
            message,
            token,
            using,
            later,
            held=held,
            exception=MessageAbandoned(error),
        )
    signals.send(
        signals.message_started, message=message, attempt=message.attempt_count, using=using
    )
    started = time.monotonic()
    try:
        if spec.atomic:
            with transaction.atomic(using=using):
                if held is not None and _past_time_limit(held.item) is not None:
                    # Its transaction began past the time limit (on SQLite
                    # BEGIN IMMEDIATE waits for the database's write lock,
                    # held by another long transaction): the handler must not
                    # start at all, beside the retry the keeper may have
                    # started already.
                    if not held.returned():
                        raise _LeaseLost
                    raise TimeLimitExceeded(
                        "the handler's transaction began after its time limit of "
                        f"{_limit_seconds(held.item):g} s"
                    )
                returned = result_of(call_handler(spec, message))
                over = _past_time_limit(held.item) if held is not None else None
                if held is not None and not held.returned():
                    raise _LeaseLost
                if over is not None:
                    # The keeper records a time limit as soon as it sees one,
                    # but it may not have been able to (on SQLite this very
                    # transaction holds the database's write lock): the
                    # handler's writes, in this transaction, must not commit
                    # after the limit either way.
                    raise TimeLimitExceeded(
                        f"the handler ran for more than {over.total_seconds():g} s"
                    )
                if _swallowed(using):
                    # Raised inside the block: Django rolls back to its
                    # savepoint, which PostgreSQL allows in an aborted
                    # transaction, and the failure is recorded after it.
                    raise SwallowedDatabaseError(
                        "the handler returned after a database error in its transaction "
                        "(caught and not raised again?); none of its writes can commit"
                    )
                # A result is written with its own acknowledgement (the
                # group's one statement writes none).
                if (group_acks is None or returned is not None) and not settle.ack(
                    [message.pk], token, using=using, model=type(message), result=returned
                ):
                    raise _LeaseLost
        else:
            returned = result_of(call_handler(spec, message))
    except _LeaseLost:
        if held is not None and not held.returned():
            return late(message)
        return lease_lost(message)
    except Retry as exc:
        if held is not None and not held.returned():
            return late(message)
        return _record(
            Result.SNOOZED,
            {"run_at": exc.delay, "max_attempts": max_attempts_of(message, spec) + 1},
            (
                "%s snoozed for %s%s",
                who(message),
                duration_text(exc.delay.total_seconds()),
                f": {exc.reason}" if exc.reason else "",
            ),
            message,
            token,
            using,
            later,
            held=held,
            started=started,
            exception=exc,
            delay=exc.delay,
        )
    except Discard as exc:
        if held is not None and not held.returned():
            return late(message)
        error = _clean(f"Discarded: {exc.reason}" if exc.reason else "Discarded")
        return _record(
            Result.DISCARDED,
            {"error": error, "retry_at": None},
            ("%s discarded: %s", who(message), exc.reason or "(no reason given)"),
            message,
            token,
            using,
            later,
            held=held,
            started=started,
            reason=exc.reason,
        )
    except BaseException as exc:
        # Not only Exceptions: a handler (or library code under it) may raise
        # asyncio.CancelledError, KeyboardInterrupt or SystemExit. Any of them
        # ends the attempt like an error; letting one escape would kill the
        # executor thread with the message still held and its slot lost.
        if held is not None and not held.returned():
            return late(message)
        tb = traceback.format_exc()
        result = _record_failure(message, token, spec, exc, tb, using, later, held=held)
        if guard.interrupts(exc):
            # Only the main thread receives a real Ctrl-C (a worker's handlers
            # run in executor threads): recorded, and it still interrupts.
            raise
        return result

    duration = time.monotonic() - started
    if spec.atomic:
        if group_acks is not None and returned is None:
            group_acks.append((message, token))
        _announce(later, partial(record_success, message, duration, using=using))
        return Result.SUCCEEDED
    if held is not None and not held.returned():
        return late(message)
    # A success others wait for (a workflow's parent) is written at once when
    # the worker has nothing else in hand (a chain's next step starts as soon
    # as it commits), and batched when it has (a fan-in's parents: their
    # child then changes once per batch, not once per parent).
    if (
        returned is None
        and held is not None
        and held.settler is not None
        and held.settler.batching
        and (not getattr(message, "has_children", False) or _busy(held))
    ):
        held.settler.add(held.item, duration)
        return DEFERRED

    def acknowledge(skip_locked: bool) -> int:
        if getattr(message, "has_children", False):
            # A workflow's parent: its children are released by the same
            # statement where that can be (PostgreSQL, autocommit).
            both = settle.ack_releasing(
                message.pk, token, using=using, skip_locked=skip_locked, result=returned
            )
            if both is not None:
                took, released = both
                if took:
                    message.__dict__[RELEASED_WITH_OUTCOME] = released
                return took
        return settle.ack(
            [message.pk],
            token,
            using=using,
            model=type(message),
            skip_locked=skip_locked,
            result=returned,
        )

    return _write(
        Result.SUCCEEDED,
        acknowledge,
        partial(record_success, message, duration, using=using),
        message,
        token,
        using,
        later,
        held,
    )


def _busy(held: Held) -> bool:
    """Whether the worker holds more than this attempt: messages queued in its lane,
    or successes waiting for the next batch."""
    return bool(held.item.lane.queued) or bool(held.settler and held.settler.pending())


class Returned:
    """A handler's return value other than None, checked to be JSON (``Message.result``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def result_of(value: Any) -> Returned | None:
    """What a handler returned, to store as its message's result; None for None.

    Checked as a payload is, before anything is written: a value JSON cannot
    hold fails the attempt (retried like an error), rather than the
    acknowledgement.
    """
    if value is None:
        return None
    encode_payload(value, "the handler's return value: ")
    return Returned(value)


def call_handler(spec: HandlerSpec, message: Any) -> Any:
    """Call the handler; an ``async def`` one runs to its end on the worker's event
    loop (``aio.py``), or on a loop of its own outside a worker."""
    if spec.is_async:
        return aio.run(spec.func(message))
    return spec.func(message)


def _write(
    result: Result,
    write: Callable[[bool], int],
    announce: Callable[[], None],
    message: Message,
    token: uuid.UUID,
    using: str,
    later: list[Callable[[], None]] | None,
    held: Held | None,
    *,
    elapsed: float = 0.0,
    blocked: bool = False,
) -> Result | _Unwritten:
    """Write one outcome (``write(skip_locked)``, a compare-and-set) and announce it.

    Rows another transaction has locked are not waited for when there is a
    settler: the outcome goes to it. A connection lost for good goes to it
    too. ``blocked``: with no settler either, say so (:data:`_Unwritten.BLOCKED`)
    instead of waiting (the keeper's time limits, tried again next round).
    """
    settler = held.settler if held is not None else None
    if (
        held is not None
        and settler is not None
        and getattr(held, "defer_all", False)
        and not connections[using].in_atomic_block
    ):
        settler.defer(_unwritten(held, result, elapsed, write, announce))
        return DEFERRED
    skip = settler is not None or blocked
    try:
        wrote, resent = _settle(using, lambda: write(skip))
    except (OperationalError, InterfaceError):
        if held is None or settler is None or connections[using].in_atomic_block:
            raise
        connections[using].close()
        settler.defer(_unwritten(held, result, elapsed, write, announce, maybe_written=True))
        return DEFERRED
    if wrote:
        _announce(later, announce)
        return result
    if skip or resent:
        state = leases.states([message.pk], using=using, model=type(message)).get(message.pk)
        if state is not None and state.holds(token):
            if blocked and settler is None:
                return _Unwritten.BLOCKED
            assert held is not None and settler is not None
            settler.defer(_unwritten(held, result, elapsed, write, announce))
            return DEFERRED
        if resent and state is not None and state.ended(token, message.last_attempt_time):
            _announce(later, announce)
            return result
    return lease_lost(message)


def _unwritten(
    held: Held,
    result: Result,
    elapsed: float,
    write: Callable[[bool], int],
    announce: Callable[[], None],
    *,
    maybe_written: bool = False,
) -> Unwritten:
    from django_delayq.worker.acks import Unwritten

    return Unwritten(
        held.item, result, elapsed, lambda: write(True), announce, maybe_written=maybe_written
    )


def record_success(message: Message, duration: float, *, using: str, children: bool = True) -> None:
    """Log and signal a success whose acknowledgement is committed.

    Sent once the acknowledgement is committed: a receiver never hears of a
    success that could still be rolled back.
    """
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s succeeded in %s",
            who(message),
            duration_text(duration),
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
    if children:
        _children_go_on(message, using)


#: Set on a parent's row to what the release after its outcome did (a Settled).
RELEASED_CHILDREN = "_delayq_released_children"
#: Set on a parent's row whose outcome's statement released its children (a
#: Settled), until what follows the release is done (``_children_go_on``).
RELEASED_WITH_OUTCOME = "_delayq_released_with_outcome"


def released_children(message: Message) -> dependencies.Settled:
    """What the release after ``message``'s outcome did (nothing, if none ran): the
    worker's bookkeeping (``Worker._settled``) claims the released ones at once."""
    return message.__dict__.get(RELEASED_CHILDREN) or dependencies.Settled()


def _children_go_on(message: Message, using: str) -> None:
    """Release (or cancel) the messages enqueued ``after=`` ``message``, now that its
    outcome has committed: a chain's next step is due at once, not at the sweep's
    next round (which does it if this fails, or the worker dies first)."""
    model = type(message)
    # A QueueFields row may be a workflow's parent (through its stand-in,
    # store/row_steps.py): a message has a column that says so.
    if model is Message and not message.has_children:
        return
    with_outcome = message.__dict__.pop(RELEASED_WITH_OUTCOME, None)
    try:
        if with_outcome is not None:
            # Released by the statement that wrote its outcome: what follows.
            message.__dict__[RELEASED_CHILDREN] = with_outcome
            dependencies.follow_up(with_outcome, using=using)
            return
        settled = dependencies.settle_without_waiting([message.pk], using=using, model=model)
    except DB_ERRORS:
        logger.warning(
            "could not release the messages waiting for %s; the sweep will",
            who(message),
            exc_info=True,
        )
        connections[using].close()
        return
    # For the worker's bookkeeping (Worker._settled): its next claim may take them.
    message.__dict__[RELEASED_CHILDREN] = settled


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
        groups.release_groups([(message.queue, group)], using=using)
    except DB_ERRORS:
        logger.warning(
            "could not let group %s of queue %s go on; the groups' sweep will",
            group,
            message.queue,
            exc_info=True,
        )
        connections[using].close()


def record_time_limit(
    message: Message, token: uuid.UUID, limit: timedelta, *, using: str
) -> Result | None:
    """Fail an attempt that ran past ``limit`` while its handler is still running.

    Called by the worker's lease keeper, not by the handler's thread (which
    Python cannot interrupt). The failure replaces the lock token, so what the
    handler does when it finally returns (acknowledge, fail, snooze) matches
    nothing and is discarded; with ``atomic=True`` its writes roll back.
    None when another transaction holds the row (the handler's own group, or
    a producer's): nothing was written, and the keeper tries again at its
    next round rather than wait (the attempt stays held meanwhile).
    """
    spec: HandlerSpec | None
    try:
        spec = registry.lookup_for(message)
    except HandlerNotFound:
        spec = None
    exc = TimeLimitExceeded(f"the handler ran for more than {limit.total_seconds():g} s")
    result = _record_failure(message, token, spec, exc, "", using, blocked=True)
    return None if result is _Unwritten.BLOCKED else result  # type: ignore[return-value]


def _record_failure(
    message: Message,
    token: uuid.UUID,
    spec: HandlerSpec | None,
    exc: BaseException,
    tb: str,
    using: str,
    later: list[Callable[[], None]] | None = None,
    *,
    held: Held | None = None,
    blocked: bool = False,
) -> Result | _Unwritten:
    retry_in = _retry_time(message, spec, exc)
    error = describe(exc)
    values = {
        "error": error,
        "traceback": _clean(tb),
        "retry_at": None,
        "retry_in": retry_in,
    }
    where = (who(message), message.attempt_count)
    if retry_in is None:
        # The last attempt's traceback (when the handler raised), so that this
        # one line says everything about the failure: as the exception, for
        # the formatters, unless its text holds what no log file can (a lone
        # surrogate, a NUL), then as the text the row keeps.
        line: tuple[Any, ...] = ("%s failed after %s attempt(s): %s", *where, error)
        exc_info: Any = (type(exc), exc, exc.__traceback__) if tb else None
        if tb and values["traceback"] != tb:
            line, exc_info = (
                ("%s failed after %s attempt(s): %s\n%s", *where, error, values["traceback"]),
                None,
            )
        return _record(
            Result.FAILED,
            values,
            line,
            message,
            token,
            using,
            later,
            held=held,
            blocked=blocked,
            exc_info=exc_info,
            exception=exc,
        )
    return _record(
        Result.RETRYING,
        values,
        (
            "%s attempt %s failed, retrying in %s: %s",
            *where,
            duration_text(retry_in.total_seconds()),
            error,
        ),
        message,
        token,
        using,
        later,
        held=held,
        blocked=blocked,
        exception=exc,
        delay=retry_in,
    )


# Outcomes that leave a message failed: its group goes on past it where the
# queue says so (GROUP_AFTER_FAILURE = "continue").
_GIVEN_UP = frozenset({Result.FAILED, Result.DISCARDED})

# What records each outcome but success, the signal that announces it and its log level.
_OUTCOMES: dict[Result, tuple[Callable[..., int], Signal, int]] = {
    Result.SNOOZED: (settle.snooze, signals.message_retried, logging.INFO),
    Result.RETRYING: (settle.fail, signals.message_retried, logging.WARNING),
    Result.FAILED: (settle.fail, signals.message_failed, logging.ERROR),
    Result.DISCARDED: (settle.fail, signals.message_discarded, logging.INFO),
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
    held: Held | None = None,
    blocked: bool = False,
    started: float | None = None,
    exc_info: Any = None,
    **sent: Any,
) -> Result | _Unwritten:
    """Record how an attempt ended (``values`` go to ``settle.fail`` or ``snooze``), then
    log and signal it once the statement is committed (see :func:`_announce`).

    ``log`` is the log line and its arguments; with ``started``, the record
    carries the attempt's duration. ``sent`` are the signal's arguments
    beside the message, its attempt and the database. ``held`` and
    ``blocked``: see :func:`_write`.
    """
    change, signal, level = _OUTCOMES[result]

    def write(skip_locked: bool) -> int:
        return int(
            change(
                message.pk,
                token,
                using=using,
                model=type(message),
                skip_locked=skip_locked,
                **values,
            )
        )

    fields = {} if started is None else {"duration": time.monotonic() - started}

    def announce() -> None:
        logger.log(
            level, *log, exc_info=exc_info, extra=message_fields(message, outcome=result, **fields)
        )
        signals.send(signal, message=message, attempt=message.attempt_count, using=using, **sent)
        if result in _GIVEN_UP and not failure_blocks(message.queue):
            _group_goes_on(message, using)
        if result in _GIVEN_UP:
            _children_go_on(message, using)

    return _write(
        result,
        write,
        announce,
        message,
        token,
        using,
        later,
        held,
        elapsed=fields.get("duration", 0.0),
        blocked=blocked,
    )


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


def late(message: Message) -> Result:
    """Log an attempt whose handler returned after its time limit: the keeper recorded
    its failure already, and nothing of what the handler did is."""
    logger.warning(
        "%s: its handler returned after its time limit; its outcome is discarded",
        who(message),
        extra=message_fields(message, outcome=Result.LEASE_LOST),
    )
    return Result.LEASE_LOST


def lease_lost(message: Message) -> Result:
    """Log an attempt whose row another claim holds now; nothing of it is recorded."""
    logger.warning(
        "%s: lease lost before the outcome was recorded; it is left to whoever holds it now",
        who(message),
        extra=message_fields(message, outcome=Result.LEASE_LOST),
    )
    return Result.LEASE_LOST
