"""Enqueueing messages: the public API, its validation and its outcomes.

Everything is written through the connection and transaction of the queue's
database (``routers.queue_alias``), so a message enqueued inside
``transaction.atomic()`` on that database exists exactly when the business
data that caused it does. When the queue lives on another database than the
business data, a transaction on the business database does not hold the
message: it is written (and committed) on the queue's own connection.
Validation happens before the first statement: a bad argument raises and
writes nothing. The writing itself is ``store.write``'s, the one write path
of new messages.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial, wraps
from typing import Any, Literal, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from django_delayq import clock, signals
from django_delayq.conf import check_delay
from django_delayq.exceptions import DuplicateMessage
from django_delayq.flow import check_group
from django_delayq.models import KEY_MAX_LENGTH, PRIORITY_MAX, PRIORITY_MIN, Message
from django_delayq.payload import encode_payload
from django_delayq.registry import validate_kind, validate_max_attempts, validate_queue_name
from django_delayq.routers import queue_alias
from django_delayq.store import dependencies, new_rows, wakeup, write
from django_delayq.store.new_rows import Outcome
from django_delayq.values import check_text
from django_delayq.workflows import check_policy, parent_ids

OnConflict = Literal["ignore", "update", "error"]
ParentFailure = Literal["cancel", "wait", "run"]
ON_CONFLICT_CHOICES = ("ignore", "update", "error")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class EnqueueResult:
    outcome: Outcome
    message: Message


# -- validation ---------------------------------------------------------------


def _check_key(key: object, where: str = "") -> str:
    key = check_text(key, "key", KEY_MAX_LENGTH, where, nul=True)
    if not key:
        raise ValueError(f"{where}key must not be empty (pass None for a generated key)")
    return key


#: The range of ``run_at`` (its wall-clock time, in whatever time zone it is):
#: MariaDB's DATETIME holds the years 1000 to 9999, and a time at either end of
#: Python's ``datetime`` cannot be shown in every time zone (the admin's pages).
RUN_AT_RANGE = (datetime(1000, 1, 2), datetime(9999, 1, 1))


def resolve_run_at(
    run_at: datetime | None, delay: timedelta | int | float | None, now: datetime
) -> datetime:
    """The due time from ``run_at`` or ``delay`` (at most one of them)."""
    if run_at is not None and delay is not None:
        raise ValueError("pass either run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise TypeError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if settings.USE_TZ and timezone.is_naive(run_at):
            raise ValueError(
                "run_at is a naive datetime while USE_TZ is True; pass an aware datetime "
                "(e.g. django.utils.timezone.now() + timedelta(...))"
            )
        if not settings.USE_TZ and timezone.is_aware(run_at):
            raise ValueError(
                "run_at is an aware datetime while USE_TZ is False; pass a naive datetime "
                "in TIME_ZONE (e.g. django.utils.timezone.make_naive(run_at))"
            )
        earliest, latest = RUN_AT_RANGE
        if not earliest <= run_at.replace(tzinfo=None) < latest:
            raise ValueError(
                f"run_at {run_at.isoformat()} is out of range: it must be from "
                f"{earliest.date()} to {latest.date()}"
            )
        if timezone.is_aware(run_at):
            # The same instant in UTC: a database need not know the caller's
            # offset (PostgreSQL refuses those past 15:59; Python allows 23:59).
            return run_at.astimezone(UTC)
        return run_at
    if delay is not None:
        return now + check_delay(delay, "delay")
    return now


def _check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(f"priority {priority} is out of range [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    return priority


# Public name for the other writers of the queue columns (operations.py).
check_priority = _check_priority


def _check_on_conflict(on_conflict: object) -> str:
    if on_conflict not in ON_CONFLICT_CHOICES:
        raise ValueError(
            f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}; got {on_conflict!r}"
        )
    return str(on_conflict)


# -- public API ---------------------------------------------------------------


def new_key() -> str:
    """A fresh message key: 32 hex digits laid out as a UUIDv7 (RFC 9562).

    Why not a random UUID: the key's unique index holds every message
    retention keeps, millions of entries, and a random key lands on any of
    its pages, most of them out of the database's memory. A key that begins
    with its time of creation lands at the end of its queue's range, on the
    few pages the last enqueues already touched (enqueue beside ten million
    kept messages: ``benchmarks/history.py``). The 74 random bits keep keys
    made in the same millisecond apart.
    """
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 of them used
    value = (millis & (2**48 - 1)) << 80 | 0x7 << 76 | (rand >> 68) << 64
    value |= 0b10 << 62 | rand & (2**62 - 1)
    return uuid.UUID(int=value).hex


def enqueue(
    queue: str,
    payload: Any = None,
    *,
    key: str | None = None,
    group: str = "",
    kind: str = "",
    priority: int = 0,
    run_at: datetime | None = None,
    delay: timedelta | int | float | None = None,
    max_attempts: int | None = None,
    on_conflict: OnConflict = "ignore",
    using: str | None = None,
    after: Iterable[Any] | None = None,
    on_parent_failure: ParentFailure = "cancel",
) -> EnqueueResult:
    """Put one message on ``queue``, due at ``run_at`` / after ``delay`` / now.

    ``key`` de-duplicates within the queue: an existing key is left alone
    (``ignore``), replaced (``update``: a pending message gets the new payload
    and schedule, a finished one is delivered again), or refused (``error``,
    raising :class:`DuplicateMessage`). ``group`` puts it in an ordered
    group: the messages of one group in one queue run one at a time, in the
    order they were enqueued (a message's group is set when it is created).

    ``using`` names the database (default: ``DELAYQ["DATABASE"]``, else the
    routers' choice). The message joins the open transaction of that
    database's connection only: inside ``transaction.atomic()`` on another
    alias it commits at once, whatever that transaction does later.

    ``after``: the message runs only once each of these parents (what
    ``enqueue`` returned, a ``Message`` or a ``(queue, key)`` pair, each
    existing already) has finished; ``on_parent_failure`` says what a parent
    that ends failed or cancelled does: ``"cancel"`` it (and what waits for
    it), keep it waiting (``"wait"``, until an operator retries the parent),
    or ``"run"`` it anyway. Its handler reads the parents' results as
    ``message.parent_results``.
    """
    return enqueue_many(
        queue,
        [payload],
        keys=None if key is None else [key],
        kind=kind,
        run_at=run_at,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
        on_conflict=on_conflict,
        using=using,
        group=group,
        after=after,
        on_parent_failure=on_parent_failure,
    )[0]


def enqueue_many(
    queue: str,
    payloads: Iterable[Any],
    *,
    keys: Sequence[str] | None = None,
    kind: str = "",
    run_at: datetime | None = None,
    delay: timedelta | int | float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    on_conflict: OnConflict = "ignore",
    using: str | None = None,
    group: str = "",
    groups: Sequence[str] | None = None,
    after: Iterable[Any] | None = None,
    on_parent_failure: ParentFailure = "cancel",
) -> list[EnqueueResult]:
    """Enqueue many messages in a few statements; one result per payload, in order.

    ``keys=None`` gives each message a fresh unique key. Repeated keys within
    one call count as conflicts with the first occurrence (``update`` keeps
    the last payload). The whole call is one transaction (or part of the
    caller's): either every message is written or none is. ``group`` puts
    every message in one ordered group, ``groups`` each in its own ("": none),
    in the order of ``payloads``. ``after`` and ``on_parent_failure`` (see
    ``enqueue``) apply to every message of the call.
    """
    validate_queue_name(queue)
    validate_kind(kind)
    check_group(group)
    payloads = _payload_list(payloads)
    group_of = _groups(groups, group, len(payloads))
    if keys is None:
        key_list = [new_key() for _ in payloads]
    else:
        if isinstance(keys, str):
            raise TypeError("keys must be a sequence of str, not a single str")
        key_list = list(keys)
        if len(key_list) != len(payloads):
            raise ValueError(f"got {len(payloads)} payloads but {len(key_list)} keys")
    many = len(payloads) > 1
    encoded: list[str] = []
    for i, (k, p) in enumerate(zip(key_list, payloads, strict=True)):
        where = f"message {i}: " if many else ""
        _check_key(k, where)
        encoded.append(encode_payload(p, where))
    _check_priority(priority)
    max_attempts = validate_max_attempts(max_attempts)
    _check_on_conflict(on_conflict)
    check_policy(on_parent_failure)
    if after is not None and on_conflict == "update":
        raise ValueError(
            "after= cannot be combined with on_conflict='update': a message's parents are "
            "set when it is created (use 'ignore' to enqueue a workflow step idempotently)"
        )
    now = clock.now()
    due = resolve_run_at(run_at, delay, now)
    if not payloads:
        return []

    # Repeated keys in one call: the database may only touch a row once per
    # statement, so collapse them here and report the repeats as conflicts.
    first_index: dict[str, int] = {}
    for i, k in enumerate(key_list):
        if k in first_index:
            if on_conflict == "error":
                raise DuplicateMessage(queue, [k])
            if on_conflict == "update":
                payloads[first_index[k]] = payloads[i]
                encoded[first_index[k]] = encoded[i]
        else:
            first_index[k] = i

    shared = new_rows.template(
        queue,
        kind=kind,
        priority=priority,
        due=due,
        max_attempts=max_attempts,
        now=now,
        group=group,
    )
    alias = queue_alias(using)
    connection = connections[alias]
    parents = parent_ids(after, alias)
    keys = list(first_index)
    texts = {k: encoded[i] for k, i in first_index.items()}
    values = {k: payloads[i] for k, i in first_index.items()}
    per_key = None if group_of is None else {k: group_of[i] for k, i in first_index.items()}
    # A message with parents is due only once they have finished.
    wake = None if parents else wakeup.notify_body(connection, queue, due)
    if (
        on_conflict == "ignore"
        and not group
        and per_key is None
        and wake is not None
        and len(keys) <= write.CHUNK_ROWS
        and not connection.in_atomic_block
        and not signals.message_enqueued.receivers
    ):
        # One statement does it all (insert, NOTIFY): in autocommit it is its
        # own transaction, one round trip instead of BEGIN, INSERT, NOTIFY,
        # COMMIT. Only the read of ignored duplicates may follow, and it writes
        # nothing.
        outcomes = write.write(connection, shared, keys, texts, values, on_conflict, wake=wake)
        return _results(key_list, first_index, outcomes, on_conflict)
    with transaction.atomic(using=alias, savepoint=on_conflict == "error"):
        # The NOTIFY of "ignore" rides on the insert: one round trip less.
        riding = wake if on_conflict == "ignore" else None
        outcomes = write.write(
            connection, shared, keys, texts, values, on_conflict, wake=riding, groups=per_key
        )
        if on_conflict == "error":
            clashes = [k for k, (o, _) in outcomes.items() if o is Outcome.IGNORED]
            if clashes:
                raise DuplicateMessage(queue, clashes)
        if parents:
            created = [m for o, m in outcomes.values() if o is Outcome.CREATED]
            dependencies.attach([m.pk for m in created], parents, on_parent_failure, using=alias)
            for message in created:
                message.on_parent_failure = on_parent_failure
                message.next_attempt_time = None
        if riding is None and wake is not None:
            if any(o is not Outcome.IGNORED for o, _ in outcomes.values()):
                wakeup.notify(connection, queue, due)
        if signals.message_enqueued.receivers:
            # On commit of the caller's transaction: a message rolled back
            # with the business data that caused it is never announced.
            changed = [(o, m) for o, m in outcomes.values() if o is not Outcome.IGNORED]
            transaction.on_commit(partial(_announce, changed, alias), using=alias)

    return _results(key_list, first_index, outcomes, on_conflict)


def _payload_list(payloads: Iterable[Any]) -> list[Any]:
    """``payloads`` as a list: an iterable of payloads, one per message.

    A str, bytes or a mapping is one payload, not several: iterating it would
    enqueue a message per character, byte or key.
    """
    if isinstance(payloads, str | bytes | bytearray | memoryview | Mapping):
        raise TypeError(
            f"payloads must be an iterable of payloads (a list, one per message), not a "
            f"single {type(payloads).__name__}; use enqueue() for one message, or "
            "enqueue_many(queue, [payload])"
        )
    try:
        return list(payloads)
    except TypeError:
        raise TypeError(
            f"payloads must be an iterable of payloads, got {type(payloads).__name__}"
        ) from None


def _groups(groups: Sequence[str] | None, group: str, count: int) -> list[str] | None:
    """Each payload's group, when ``groups`` gives them (checked); None: ``group`` for all."""
    if groups is None:
        return None
    if group:
        raise ValueError("pass either group or groups, not both")
    if isinstance(groups, str):
        raise TypeError("groups must be a sequence of str (one per payload), not a single str")
    found = list(groups)
    if len(found) != count:
        raise ValueError(f"got {count} payloads but {len(found)} groups")
    for i, name in enumerate(found):
        check_group(name, f"message {i}: ")
    return found if any(found) else None


def _results(
    key_list: list[str],
    first_index: dict[str, int],
    outcomes: dict[str, tuple[Outcome, Message]],
    on_conflict: OnConflict,
) -> list[EnqueueResult]:
    """One result per requested key, in order; a key repeated in the call is a conflict."""
    results: list[EnqueueResult] = []
    for i, k in enumerate(key_list):
        outcome, message = outcomes[k]
        if first_index[k] != i:
            outcome = Outcome.UPDATED if on_conflict == "update" else Outcome.IGNORED
        results.append(EnqueueResult(outcome, message))
    return results


def _announce(changed: Sequence[tuple[Outcome, Message]], using: str) -> None:
    for outcome, message in changed:
        signals.send(signals.message_enqueued, message=message, outcome=outcome, using=using)


def _awaitable(
    function: Callable[P, R],
    doc: str,
    arguments: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
) -> Callable[P, Coroutine[Any, Any, R]]:
    """``function`` for async code, with its signature and type hints and ``doc``.

    The call runs in Django's thread for sync code (``sync_to_async`` with
    ``thread_sensitive=True``, as the ORM's async methods do). ``arguments``,
    if given, prepares the call's arguments first, in the caller's thread.
    """
    in_thread: Callable[..., Awaitable[R]] = sync_to_async(function, thread_sensitive=True)

    @wraps(function)
    async def awaitable(*args: P.args, **kwargs: P.kwargs) -> R:
        if arguments is None:
            return await in_thread(*args, **kwargs)
        given, named = arguments(*args, **kwargs)
        return await in_thread(*given, **named)

    awaitable.__name__ = awaitable.__qualname__ = f"a{function.__name__}"
    awaitable.__doc__ = doc
    return awaitable


def _read_payloads(
    queue: Any, payloads: Iterable[Any], **options: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # An iterable of payloads is read in the async caller's thread.
    return (queue, _payload_list(payloads)), options


aenqueue = _awaitable(
    enqueue,
    """``enqueue`` for async code (async views, ASGI consumers); same arguments.

    Django runs database work of async code in a thread (``sync_to_async``
    with ``thread_sensitive=True``, as the ORM's async methods do), and a
    transaction cannot span ``await``: the message is written and committed
    in a transaction of its own, like ``Model.objects.acreate``. When it must
    commit together with other writes, put them and ``enqueue`` in one sync
    function under ``transaction.atomic()`` and await that function through
    ``sync_to_async``.
    """,
)

aenqueue_many = _awaitable(
    enqueue_many,
    """``enqueue_many`` for async code; one transaction of its own (see ``aenqueue``).""",
    _read_payloads,
)
