"""The runner: executor threads that run claimed messages, alone or in groups.

Each executor takes the next attempt a free slot may run (``Book.take``) and
runs it through :func:`~django_delayq.worker.execute.execute`, which calls
the handler and records the outcome. Atomic handlers on PostgreSQL run in
groups (``ACK_DELAY``): one transaction, one write-ahead-log flush, for up
to a few milliseconds' worth of messages (see :meth:`Runner._run_group`).

Whatever a handler or a receiver raises, an executor survives it: every call
into the project's code is guarded (``guard.py``), and an attempt whose
outcome cannot be written here is handed to the settler (``acks.py``),
which writes it, or lets the message go again, once the database lets it.
Should an executor die all the same (a bug of ours), the worker's
supervisor logs it and starts another in its place (``worker/__init__.py``);
the attempt it held is handed back.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections, reset_queries, transaction
from django.db.models import Model

from django_delayq import guard
from django_delayq.exceptions import DelayQError, HandlerNotFound
from django_delayq.logs import message_fields, who
from django_delayq.models import Message
from django_delayq.registry import registry
from django_delayq.store import leases, settle
from django_delayq.worker import aio
from django_delayq.worker.acks import Done, Settler, Unwritten, by_token
from django_delayq.worker.aio import EventLoop
from django_delayq.worker.execute import DEFERRED, Result, execute, lease_lost
from django_delayq.worker.inflight import Book, InFlight

logger = logging.getLogger("django_delayq.worker")

# Most atomic messages committed in one group transaction.
GROUP_MAX = 100

# An executor whose connection sat unused this long, or that missed a
# connection failure seen by another thread, checks it before the next
# handler runs, so a handler is not blamed (and retried) for a connection
# that died while idle (server restart, terminated backend, idle timeout).
IDLE_RECHECK = 5.0


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


@dataclass
class _Held:
    """What :func:`execute` is told of the attempt it runs (``execute.Held``)."""

    item: InFlight
    settler: Settler | None
    book: Book

    @property
    def defer_all(self) -> bool:
        # An async lane's executors only wait for coroutines: its outcomes are
        # written by the settler, so a lane of a hundred coroutines does not
        # hold a hundred database connections.
        return self.item.lane.is_async

    def returned(self) -> bool:
        return self.book.returned(self.item)


class Runner:
    def __init__(
        self,
        book: Book,
        *,
        using: str,
        settler: Settler,
        group_window: float | None,
        settled: Callable[[Done], None],
        database_failures: Callable[[], int],
        died: Callable[[threading.Thread, BaseException], None] = lambda thread, exc: None,
        loop: EventLoop | None = None,
    ) -> None:
        self.book = book
        self.using = using
        self.settler = settler
        # Atomic handlers' transactions are grouped for up to this long;
        # None: one transaction per message.
        self.group_window = group_window
        self._settled = settled
        self._database_failures = database_failures
        # Told when an executor dies of an error of ours (the supervisor).
        self._died = died
        # Where async def handlers run (aio.py); None: none is registered.
        self.loop = loop
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
        """A new executor takes the slot of ``thread`` (stuck past a time limit, or dead)."""
        with self._lock:
            if thread in self.threads:
                self.threads.remove(thread)
        if not self.book.stopping:
            self._spawn(f"delayq-executor-{uuid.uuid4().hex[:6]}")

    def alive(self) -> int:
        with self._lock:
            return sum(t.is_alive() for t in self.threads)

    def join(self, deadline: float, force: Callable[[], bool]) -> None:
        """Wait for the executors until ``deadline`` (monotonic) or until ``force()``."""
        with self._lock:
            threads = list(self.threads)
        for thread in threads:
            while thread.is_alive() and not force() and time.monotonic() < deadline:
                thread.join(timeout=min(0.1, max(0.0, deadline - time.monotonic())))

    def _loop(self) -> None:
        item: InFlight | None = None
        try:
            while (item := self.book.take()) is not None:
                grouped = self.group_window is not None and is_atomic(item.row)
                with aio.running_on(self.loop, item):
                    done = self._run_group(item) if grouped else self._run_single(item)
                item = None
                if not done:
                    return  # replaced meanwhile (time limit)
        except BaseException as exc:
            # Every call into the project's code is guarded: this is an error
            # of ours. The attempt in hand goes back; the supervisor replaces
            # this thread.
            if item is not None:
                self._hand_back([item], "its executor failed")
            self._died(threading.current_thread(), exc)
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
        if result is not None:
            self._settled([(item, result, elapsed)])
        return True

    def _run_one(self, item: InFlight) -> str | None:
        """Run ``item``; its result, or None when the settler took its outcome over."""
        # Batched acknowledgements are for messages; a model's rows are
        # acknowledged one statement each.
        settler = self.settler if isinstance(item.row, Message) else _single(self.settler)
        try:
            result = execute(
                item.row, item.token, using=self.using, held=_Held(item, settler, self.book)
            )
        except BaseException:
            # BaseException: nothing may kill the executor thread.
            self._unrecorded([item])
            return None
        return None if result is DEFERRED else str(result)

    def _unrecorded(self, items: list[InFlight]) -> None:
        """The outcomes of ``items`` could not be written (the database failed): the
        messages are handed back, to run again, as soon as the database lets us."""
        logger.exception(
            "could not record the outcome of %d message(s); they will run again",
            len(items),
            extra=message_fields(items[0].row, outcome=Result.UNRECORDED) if items else {},
        )
        connections[self.using].close()
        self._hand_back(items, "its outcome could not be recorded")

    def _hand_back(self, items: list[InFlight], why: str) -> None:
        """Release ``items`` to run again elsewhere, their attempts spent.

        Each gets a line of its own: a message that runs again must say why
        in the log (an operator reading two runs of one message, or the
        adversary suite, finds the cause next to its id).
        """
        for item in items:
            logger.warning(
                "%s attempt %d handed back, to run again: %s",
                who(item.row),
                item.row.attempt_count,
                why,
                extra=message_fields(item.row, outcome=Result.UNRECORDED),
            )
            self.book.returned(item)
            self.settler.defer(
                Unwritten(
                    item,
                    Result.UNRECORDED,
                    0.0,
                    _release(item, self.using),
                    lambda: None,
                    maybe_written=True,
                )
            )

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
        Outcomes are logged and signalled after the commit. If an attempt of
        the group was taken from it meanwhile (its time limit passed), its
        acknowledgement finds the row claimed again (its lease was lost), or
        the commit fails (a deferred constraint, a lost connection), the group
        rolls back and the others run again, one transaction each, so no
        attempt's writes commit but with its own outcome. False if this
        thread was replaced meanwhile.
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
                    result: Any = Result.UNRECORDED
                    try:
                        # If its outcome cannot be written, the exception rolls
                        # back the whole group, this message with the others.
                        result = execute(
                            item.row,
                            item.token,
                            using=self.using,
                            held=_Held(item, self.settler, self.book),
                            later=later,
                            group_acks=pending,
                        )
                    finally:
                        elapsed = time.monotonic() - started
                        if self.book.handler_done(item, elapsed):
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
            done, rerun_replaced = self._rerun(done, lost.lost)
            replaced = replaced or rerun_replaced
            later = []
        except BaseException:
            # The commit failed (or whatever else escaped): nothing of the
            # group happened. Each runs again, alone.
            logger.warning(
                "a group of %d atomic handler(s) could not commit; running each again alone",
                len(done),
                exc_info=True,
            )
            connections[self.using].close()
            done, replaced = self._rerun(done, set())
            later = []
        for announce in later:
            guard.call("announcing an outcome", announce, log=logger)
        settled = [(i, r, e) for i, r, e in done if r is not DEFERRED and r is not None]
        if settled:
            self._settled(settled)
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
        mine = settle.ack_held(by_token(pending), using=self.using, model=model)
        lost = {
            members[(model, message.pk)]
            for message, token in pending
            if (message.pk, token) not in mine
        }
        if lost:
            raise _GroupLost(lost)

    def _rerun(self, done: Done, lost: set[InFlight]) -> tuple[Done, bool]:
        """After a group rolled back: run every attempt of it again, alone, but those
        ``lost``. Returns their results, and whether this thread was replaced
        meanwhile (a re-run went past its time limit)."""
        out: Done = []
        for position, (item, result, _) in enumerate(done):
            if result is DEFERRED:
                continue  # its outcome is the settler's already (written outside the group)
            if item in lost:
                out.append((item, lease_lost(item.row), 0.0))
                continue
            if not self.book.resume(item):  # running again: its slot and time limit apply
                continue
            started = time.monotonic()
            self._prepare_connection()
            again = self._run_one(item)
            elapsed = time.monotonic() - started
            if not self.book.handler_done(item, elapsed):
                # Taken past its time limit: a new executor has the slot. The
                # attempts not run again yet go back to run elsewhere.
                self._hand_back(
                    [i for i, _, _ in done[position + 1 :] if i not in lost],
                    "its atomic group rolled back, and the re-run before it "
                    "went past its time limit",
                )
                return out, True
            if again is not None:
                out.append((item, again, elapsed))
        return out, False

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


def _single(settler: Settler) -> Settler:
    """The settler, as seen by a row of a ``QueueFields`` model: it takes what must
    wait, but does not batch (its rows are acknowledged one statement each)."""
    return _Unbatched(settler)  # type: ignore[return-value]


class _Unbatched:
    def __init__(self, settler: Settler) -> None:
        self._settler = settler

    batching = False

    def defer(self, outcome: Unwritten) -> None:
        self._settler.defer(outcome)


def _release(item: InFlight, using: str) -> Callable[[], int]:
    """The statement that hands ``item``'s message back, due now, its attempt spent."""

    def release() -> int:
        return leases.release(
            [item.row.pk], item.token, started=True, using=using, model=item.lane.model
        )

    return release


def drop_broken_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or not conn.errors_occurred:
            continue
        if conn.in_atomic_block or not conn.is_usable():
            conn.close()
        else:
            conn.errors_occurred = False


__all__ = ["GROUP_MAX", "Runner", "drop_broken_connections", "is_atomic"]
