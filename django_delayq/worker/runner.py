"""The runner: executor threads that run claimed messages, alone or in groups.

Each executor takes the next attempt a free slot may run (``Book.take``) and
runs it through :func:`~django_delayq.worker.execute.execute`, which calls
the handler and records the outcome. Atomic handlers on PostgreSQL run in
groups (``ACK_DELAY``): one transaction, one write-ahead-log flush, for up
to a few milliseconds' worth of messages (see :meth:`Runner._run_group`).

Whatever a handler or a receiver raises, an executor survives it: the
attempt ends as "unrecorded" at worst (its lease runs out and it is
redelivered), and the slot is never lost.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections, reset_queries, transaction
from django.db.models import Model

from django_delayq.exceptions import DelayQError, HandlerNotFound
from django_delayq.logs import message_fields
from django_delayq.models import Message
from django_delayq.registry import registry
from django_delayq.store import changes
from django_delayq.worker.acks import AckBuffer, by_token
from django_delayq.worker.execute import Result, execute, lease_lost, unrecorded
from django_delayq.worker.inflight import Book, InFlight

logger = logging.getLogger("django_delayq.worker")

# Most atomic messages committed in one group transaction.
GROUP_MAX = 100

# An executor whose connection sat unused this long, or that missed a
# connection failure seen by another thread, checks it before the next
# handler runs, so a handler is not blamed (and retried) for a connection
# that died while idle (server restart, terminated backend, idle timeout).
IDLE_RECHECK = 5.0

Done = list[tuple[InFlight, str, float]]


def is_atomic(row: Any) -> bool:
    try:
        return registry.lookup_for(row).atomic
    except HandlerNotFound:
        return False


class _GroupLost(DelayQError):
    """An attempt of a group of atomic handlers is no longer this worker's."""

    def __init__(self, lost: set[InFlight]) -> None:
        super().__init__(len(lost))
        self.lost = lost


class Runner:
    def __init__(
        self,
        book: Book,
        *,
        using: str,
        acks: AckBuffer | None,
        group_window: float | None,
        settled: Callable[[Done], None],
        database_failures: Callable[[], int],
    ) -> None:
        self.book = book
        self.using = using
        self.acks = acks
        # Atomic handlers' transactions are grouped for up to this long;
        # None: one transaction per message.
        self.group_window = group_window
        self._settled = settled
        self._database_failures = database_failures
        self._local = threading.local()
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    # -- threads --------------------------------------------------------------

    def start(self, count: int) -> None:
        for i in range(count):
            self._spawn(f"delayq-executor-{i}")

    def _spawn(self, name: str) -> None:
        thread = threading.Thread(target=self._loop, name=name, daemon=True)
        with self._lock:
            self.threads.append(thread)
        thread.start()

    def replace(self, thread: threading.Thread | None) -> None:
        """A new executor takes the slot of ``thread`` (stuck past a time limit)."""
        with self._lock:
            if thread in self.threads:
                self.threads.remove(thread)
        if not self.book.stopping:
            self._spawn(f"delayq-executor-{uuid.uuid4().hex[:6]}")

    def join(self, deadline: float, force: Callable[[], bool]) -> None:
        """Wait for the executors until ``deadline`` (monotonic) or until ``force()``."""
        with self._lock:
            threads = list(self.threads)
        for thread in threads:
            while thread.is_alive() and not force() and time.monotonic() < deadline:
                thread.join(timeout=min(0.1, max(0.0, deadline - time.monotonic())))

    def _loop(self) -> None:
        try:
            while (item := self.book.take()) is not None:
                grouped = self.group_window is not None and is_atomic(item.row)
                if not (self._run_group(item) if grouped else self._run_single(item)):
                    return  # replaced meanwhile (time limit)
        finally:
            connections.close_all()

    # -- one message ----------------------------------------------------------

    def _run_single(self, item: InFlight) -> bool:
        self._prepare_connection()
        started = time.monotonic()
        result = self._run_one(item)
        elapsed = time.monotonic() - started
        if not self.book.handler_done(item, elapsed):
            return False
        self._settled([(item, result, elapsed)])
        return True

    def _run_one(self, item: InFlight) -> str:
        try:
            # Batched acknowledgements are for messages; a model's rows are
            # acknowledged one statement each.
            acks = self.acks if isinstance(item.row, Message) else None
            return execute(item.row, item.token, using=self.using, acks=acks)
        except BaseException:
            # BaseException: nothing may kill the executor thread.
            unrecorded(
                self.using,
                "could not record the outcome of message %s; it will be redelivered "
                "when its lease expires",
                item.row.pk,
                extra=message_fields(item.row, outcome=Result.UNRECORDED),
            )
            return Result.UNRECORDED

    # -- groups of atomic handlers --------------------------------------------

    def _run_group(self, first: InFlight) -> bool:
        """Run atomic handlers one after another in one transaction, committed once.

        A commit waits for the write-ahead log to reach the disk; for fast
        atomic handlers it is most of their cost. Each handler still runs in
        a savepoint of its own, so a failing one rolls back its own writes
        only (its failure is recorded in the same transaction); the successes
        are acknowledged together by one compare-and-set statement just
        before the commit, so every handler's writes commit exactly when its
        acknowledgement does. The group closes ``ACK_DELAY`` after its first
        message finished, at ``GROUP_MAX`` messages, when the next queued
        message is not atomic, or when it is a row the group already holds.
        Outcomes are logged and signalled after the commit; if the commit
        fails, none of them happened (the messages keep their leases and are
        redelivered). If an attempt of the group was taken from it meanwhile
        (its time limit passed) or its acknowledgement finds the row claimed
        again (its lease was lost), the group rolls back and the others run
        again, one transaction each, so that attempt's writes never commit.
        False if this thread was replaced meanwhile.
        """
        assert self.group_window is not None
        self._prepare_connection()
        item = first
        done: Done = []
        later: list[Callable[[], None]] = []
        pending: list[tuple[Message, uuid.UUID]] = []
        members: dict[tuple[type[Model], Any], InFlight] = {}
        replaced = False
        try:
            with transaction.atomic(using=self.using):
                deadline = None
                while True:
                    members[item.row_key] = item
                    started = time.monotonic()
                    result: str = Result.UNRECORDED
                    try:
                        # If its outcome cannot be written, the exception rolls
                        # back the whole group, this message with the others.
                        result = execute(
                            item.row, item.token, using=self.using, later=later, group_acks=pending
                        )
                    finally:
                        elapsed = time.monotonic() - started
                        if self.book.handler_done(item, elapsed, settling=True):
                            done.append((item, result, elapsed))
                        else:
                            replaced = True
                    if replaced:
                        raise _GroupLost({item})
                    if deadline is None:
                        deadline = time.monotonic() + self.group_window
                    if len(done) >= GROUP_MAX or time.monotonic() >= deadline:
                        break
                    following = self.book.take_for_group(item.lane, set(members), is_atomic)
                    if following is None:
                        break
                    item = following
                self._ack_group(pending, members)
        except _GroupLost as lost:
            done = self._rerun(done, lost.lost)
            later = []
        except BaseException:
            # BaseException: whatever escapes (a receiver's KeyboardInterrupt
            # too) must not kill the executor thread.
            unrecorded(
                self.using,
                "could not commit the outcome of %d message(s); they will be redelivered "
                "when their leases expire",
                len(done),
            )
            done = [(member, Result.UNRECORDED, elapsed) for member, _, elapsed in done]
            later = []
        for announce in later:
            announce()
        self._settled(done)
        return not replaced

    def _ack_group(
        self,
        pending: list[tuple[Message, uuid.UUID]],
        members: dict[tuple[type[Model], Any], InFlight],
    ) -> None:
        """Acknowledge the group's successes; raise ``_GroupLost`` if one is no longer ours.

        Judged per attempt, (id, token): the same row held again by this
        worker under a newer token must not pass for this attempt.
        """
        if not pending:
            return
        model = next(iter(members.values())).lane.model
        mine = changes.ack_held(by_token(pending), using=self.using, model=model)
        lost = {
            members[(model, message.pk)]
            for message, token in pending
            if (message.pk, token) not in mine
        }
        if lost:
            raise _GroupLost(lost)

    def _rerun(self, done: Done, lost: set[InFlight]) -> Done:
        """After a group rolled back for ``lost``: run every other attempt again, alone."""
        out: Done = []
        for item, _, _ in done:
            if item in lost:
                out.append((item, lease_lost(item.row), 0.0))
                continue
            self.book.resume(item)  # running again: its lease and time limit apply
            started = time.monotonic()
            self._prepare_connection()
            result = self._run_one(item)
            out.append((item, result, time.monotonic() - started))
        return out

    # -- connections ----------------------------------------------------------

    def _prepare_connection(self) -> None:
        # Keep DEBUG's query log from growing for the life of the worker, and
        # drop a connection that broke on the previous message. Unlike around
        # a request, healthy connections are kept whatever CONN_MAX_AGE says:
        # reconnecting per message would cost more than the message.
        if settings.DEBUG:
            reset_queries()
        drop_broken_connections()
        self._recheck_connection()

    def _recheck_connection(self) -> None:
        local = self._local
        now = time.monotonic()
        failures = self._database_failures()
        stale = (
            getattr(local, "failures", 0) != failures
            or now - getattr(local, "used", now) > IDLE_RECHECK
        )
        local.failures, local.used = failures, now
        connection = connections[self.using]
        if stale and connection.connection is not None and not connection.is_usable():
            logger.warning("dropping a database connection that died while idle")
            connection.close()


def drop_broken_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or not conn.errors_occurred:
            continue
        if conn.in_atomic_block or not conn.is_usable():
            conn.close()
        else:
            conn.errors_occurred = False
