"""The notification that ends a :func:`~django_delayq.wait`, on PostgreSQL.

A waiter marks the message's row (``waited``) and LISTENs on a channel of
that message's own; a trigger notifies the channel when a marked row ends
(succeeded, failed, cancelled) or is deleted. The trigger's condition reads
the row's own column, so the acknowledgement of a message nobody waits for
queues no event and sends no NOTIFY: a NOTIFY takes a lock every committing
transaction shares, and acks are the queue's hottest statement.

Order makes it race-free: the waiter listens, marks, then reads. An end
that commits before the mark is seen by the read; one after it updates the
marked row version (PostgreSQL re-reads a concurrently updated row), so the
trigger fires. Where the row is held by another transaction the mark is
skipped and tried again at the next look, and the waiter polls meanwhile.

Elsewhere (SQLite, MariaDB/MySQL, psycopg 2) there is no bell: waits poll.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connections

from django_delayq.models import Message
from django_delayq.store.columns import quote_names
from django_delayq.store.features import features
from django_delayq.store.sql import statement

CHANNEL_PREFIX = "django_delayq_ended_"


def channel(pk: int) -> str:
    """The channel on which the end of message ``pk`` is announced."""
    return f"{CHANNEL_PREFIX}{int(pk)}"


def _names(connection: Any) -> dict[str, str]:
    return quote_names(Message, connection, "id", "status", "waited")


def install_triggers(connection: Any, *, remove: bool = False) -> None:
    """Create (or, ``remove``, drop) the trigger that notifies a waited row's end."""
    can = features(connection)
    if not can.notify:
        return
    names = _names(connection)
    # The drop is three statements, one per line; a function's body holds ";\n" too.
    sqls = statement("drop_ended_triggers", can).split(";\n")
    if not remove:
        sqls += [
            statement("create_ended_function", can),
            statement("create_ended_trigger", can),
            statement("create_deleted_trigger", can),
        ]
    with connection.cursor() as cursor:
        for sql in sqls:
            cursor.execute(sql.format(**names))


def mark_sql(using: str) -> str | None:
    """The statement that marks a waited row, or None where no trigger answers it."""
    connection = connections[using]
    can = features(connection)
    if not can.notify:
        return None
    try:
        import psycopg  # noqa: F401
    except ImportError:  # pragma: no cover - psycopg2 users poll
        return None
    return statement("mark_waited", can).format(**_names(connection))


class Bell:
    """A waiter's LISTEN connection for one message: marks the row and hears its end."""

    def __init__(self, conn: Any, sql: str, pk: int) -> None:
        self.conn = conn
        self.sql = sql
        self.pk = pk
        self.marked = False

    def mark(self) -> None:
        """Mark the row (once); a row held by another transaction stays unmarked for now."""
        if not self.marked:
            self.marked = self.conn.execute(self.sql, [self.pk]).fetchone() is not None

    def ring(self, timeout: float) -> None:
        """Return when the message's end is announced, or after ``timeout`` seconds."""
        if not self.marked:
            time.sleep(timeout)
            return
        for _ in self.conn.notifies(timeout=timeout, stop_after=1):
            pass


class AsyncBell(Bell):
    """:class:`Bell` on an asyncio psycopg connection."""

    async def amark(self) -> None:
        if not self.marked:
            cursor = await self.conn.execute(self.sql, [self.pk])
            self.marked = await cursor.fetchone() is not None

    async def aring(self, timeout: float) -> None:
        import asyncio

        if not self.marked:
            await asyncio.sleep(timeout)
            return
        async for _ in self.conn.notifies(timeout=timeout, stop_after=1):
            pass


__all__ = ["AsyncBell", "Bell", "channel", "install_triggers", "mark_sql"]
