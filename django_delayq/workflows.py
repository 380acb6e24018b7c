"""Workflows from the caller's side: naming parents for ``after=``, and waiting for a result.

A message's parents (``enqueue(..., after=[...])``) are resolved and checked
here, before anything is written; the edges and their release are
``store/dependencies.py``'s. :func:`wait` and :func:`await_result` read a
message until it has finished: on PostgreSQL (psycopg 3) they sleep until
the message's end is notified (``store/ended.py``), elsewhere until the next
look, at a growing interval (10 ms to ``WAIT_POLL_MAX``). The looks go on
under a notification too, as a safety net: one indexed read each.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

from django_delayq.exceptions import MessageFailed
from django_delayq.models import PARENT_FAILURE_POLICIES, Message, QueueColumns
from django_delayq.status import Status
from django_delayq.store import ended
from django_delayq.store.columns import batches

logger = logging.getLogger("django_delayq.wait")

#: The polling interval of :func:`wait` grows to this (seconds).
WAIT_POLL_MAX = 0.5


def check_policy(policy: object) -> str:
    if policy not in PARENT_FAILURE_POLICIES:
        raise ValueError(
            f"on_parent_failure must be one of {', '.join(PARENT_FAILURE_POLICIES)}; got {policy!r}"
        )
    return str(policy)


def ids_by_key(queue: str, keys: list[str], using: str) -> dict[str, int]:
    """The ids of the messages of ``queue`` with these keys (those that exist), a batch
    of keys per query."""
    rows = Message._base_manager.using(using)
    found: dict[str, int] = {}
    for chunk in batches(keys):
        found.update(rows.filter(queue=queue, key__in=chunk).values_list("key", "pk"))
    return found


def parent_ids(after: Iterable[Any] | None, using: str) -> list[int]:
    """The ids of ``after=``'s parents, in order, each checked to exist on ``using``.

    A parent is what ``enqueue`` returned, a ``Message``, a ``(queue, key)``
    pair, or a row of a ``QueueFields`` model (its stand-in, created as
    needed). It must exist already (written before, or earlier in the same
    transaction), so a cycle cannot be written.
    """
    if after is None:
        return []
    if isinstance(after, str | bytes | tuple) or not isinstance(after, Iterable):
        raise TypeError(
            "after must be a list of parents (what enqueue returned, Messages or "
            f"(queue, key) pairs), got {type(after).__name__}"
        )
    from django_delayq.enqueuing import EnqueueResult

    ids: list[int | None] = []
    pairs: dict[tuple[str, str], list[int]] = {}
    rows: dict[int, Any] = {}  # place: a QueueFields row
    for i, parent in enumerate(after):
        if isinstance(parent, EnqueueResult):
            parent = parent.message
        if isinstance(parent, Message):
            if parent.pk is None:
                raise ValueError(f"after[{i}]: the message was never saved")
            ids.append(int(parent.pk))
        elif isinstance(parent, QueueColumns):
            rows[i] = parent
            ids.append(None)
        elif (
            isinstance(parent, tuple)
            and len(parent) == 2
            and all(isinstance(part, str) for part in parent)
        ):
            pairs.setdefault((parent[0], parent[1]), []).append(i)
            ids.append(None)
        else:
            raise TypeError(
                f"after[{i}]: a parent is what enqueue returned, a Message, a (queue, key) "
                f"pair of str or a row of a QueueFields model, got {type(parent).__name__}"
            )
    if rows:
        # A row is a parent through its stand-in (store/row_steps.py).
        from django_delayq.store import row_steps

        for place, pk in zip(rows, row_steps.stand_in_ids(list(rows.values()), using), strict=True):
            ids[place] = pk
    messages = Message._base_manager.using(using)
    if pairs:
        found: dict[tuple[str, str], int] = {}
        by_queue: dict[str, list[str]] = {}
        for queue, key in pairs:
            by_queue.setdefault(queue, []).append(key)
        for queue, keys in by_queue.items():
            found.update(((queue, key), pk) for key, pk in ids_by_key(queue, keys, using).items())
        for pair, places in pairs.items():
            if pair not in found:
                raise ValueError(f"after[{places[0]}]: no message {pair[0]}/{pair[1]}")
            for place in places:
                ids[place] = found[pair]
    resolved = [pk for pk in ids if pk is not None]
    seen: set[int] = set()
    for i, pk in enumerate(resolved):
        if pk in seen:
            raise ValueError(f"after[{i}]: message #{pk} is named twice")
        seen.add(pk)
    existing: set[int] = set()
    for chunk in batches(resolved):
        existing.update(messages.filter(pk__in=chunk).values_list("pk", flat=True))
    missing = [pk for pk in resolved if pk not in existing]
    if missing:
        raise ValueError(f"after: message #{missing[0]} does not exist")
    return resolved


def _row(message: Any) -> Message:
    from django_delayq.enqueuing import EnqueueResult

    if isinstance(message, EnqueueResult):
        message = message.message
    if not isinstance(message, Message) or message.pk is None:
        raise TypeError(
            f"wait for what enqueue returned or a saved Message, got {type(message).__name__}"
        )
    return message


def _seconds(timeout: float | timedelta | None) -> float | None:
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
        raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
    return timeout


def _ended(message: Message) -> tuple[bool, Any]:
    row = Message._base_manager.using(message._state.db).filter(pk=message.pk).first()
    if row is None:
        raise MessageFailed(_gone(message))
    if row.status == Status.SUCCEEDED:
        return True, row.result
    if row.status in (Status.FAILED, Status.CANCELLED):
        raise MessageFailed(row)
    return False, None


def _gone(message: Message) -> Message:
    """A copy of ``message`` that says it was deleted (for :class:`MessageFailed`)."""
    gone = copy.copy(message)
    gone.status = "deleted"  # type: ignore[assignment]
    gone.last_error = "the message was deleted"
    return gone


class _Looks:
    """When :func:`wait` and :func:`await_result` read the message next: at a growing
    interval (10 ms to :data:`WAIT_POLL_MAX`), never past the deadline."""

    def __init__(self, row: Message, timeout: float | timedelta | None) -> None:
        self.row = row
        self.seconds = _seconds(timeout)
        self.deadline = None if self.seconds is None else time.monotonic() + self.seconds
        self.interval = 0.01

    def pause(self) -> float:
        """How long to wait before the next read; TimeoutError once there is none."""
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0:
            row = self.row
            raise TimeoutError(
                f"{row.queue}/{row.key} (#{row.pk}) did not finish in {self.seconds} s"
            )
        pause = self.interval if left is None else min(self.interval, left)
        self.interval = min(self.interval * 1.5, WAIT_POLL_MAX)
        return pause


def _bell_setup(using: str) -> tuple[str | None, dict[str, Any]]:
    """The statement that marks a waited row and the LISTEN connection's
    parameters, or ``(None, {})`` where waits poll."""
    from django_delayq.worker.listen import connection_params, listen_alias

    sql = ended.mark_sql(using)
    return sql, (connection_params(listen_alias(using)) if sql is not None else {})


@contextmanager
def _bell(row: Message) -> Iterator[ended.Bell | None]:
    """A LISTEN connection on ``row``'s channel (``store/ended.py``), or None."""
    sql, params = _bell_setup(row._state.db or "default")
    if sql is None:
        yield None
        return
    import psycopg

    try:
        conn = psycopg.connect(**params, autocommit=True)
    except psycopg.Error:
        logger.warning("wait: no LISTEN connection, polling instead", exc_info=True)
        yield None
        return
    with conn:
        conn.execute(f'LISTEN "{ended.channel(row.pk)}"')
        yield ended.Bell(conn, sql, row.pk)


@asynccontextmanager
async def _async_bell(row: Message) -> AsyncIterator[ended.AsyncBell | None]:
    """:func:`_bell` on an asyncio connection."""
    from asgiref.sync import sync_to_async

    setup = sync_to_async(_bell_setup, thread_sensitive=True)
    sql, params = await setup(row._state.db or "default")
    if sql is None:
        yield None
        return
    import psycopg

    try:
        conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
    except psycopg.Error:
        logger.warning("await_result: no LISTEN connection, polling instead", exc_info=True)
        yield None
        return
    async with conn:
        await conn.execute(f'LISTEN "{ended.channel(row.pk)}"')
        yield ended.AsyncBell(conn, sql, row.pk)


def wait(message: Any, timeout: float | timedelta | None = None) -> Any:
    """Block until ``message`` has finished; return its result (``Message.result``).

    Raises :class:`MessageFailed` if it ends failed or cancelled (or is
    deleted), ``TimeoutError`` if it has not finished after ``timeout``
    seconds (None: no limit).

    Inside ``transaction.atomic()`` it sees what other transactions commit
    on PostgreSQL and MariaDB/MySQL (each read is a statement of its own),
    not on SQLite (a transaction reads one snapshot); and a message enqueued
    in the same, still open, transaction cannot run before it commits: such
    a wait can only time out.

    Waiting holds a thread and a database connection: in a web request it
    is a way to make the request as slow as the queue. Use it in scripts,
    management commands and tests, or return at once and let the page poll.
    """
    looks = _Looks(_row(message), timeout)
    with _bell(looks.row) as ringer:
        while True:
            if ringer is not None:
                ringer.mark()
            done, result = _ended(looks.row)
            if done:
                return result
            if ringer is None:
                time.sleep(looks.pause())
            else:
                ringer.ring(looks.pause())


async def await_result(message: Any, timeout: float | timedelta | None = None) -> Any:
    """:func:`wait` for async code: awaits (without holding a thread) between reads."""
    from asgiref.sync import sync_to_async

    looks = _Looks(_row(message), timeout)
    read = sync_to_async(_ended, thread_sensitive=True)
    async with _async_bell(looks.row) as ringer:
        while True:
            if ringer is not None:
                await ringer.amark()
            done, result = await read(looks.row)
            if done:
                return result
            if ringer is None:
                await asyncio.sleep(looks.pause())
            else:
                await ringer.aring(looks.pause())
