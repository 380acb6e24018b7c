"""Outcomes committed off the executors: batched successes, and the ones that must wait.

A worker whose handlers are fast spends nearly all its time committing one
acknowledgement per message (the commit waits for the write-ahead log to
reach the disk). Instead, executor threads hand each success of a non-atomic
handler to the :class:`Settler` and move on to the next message; its thread
commits everything handed to it in one compare-and-set statement
(``settle.ack_held``) at most ``DELAYQ["ACK_DELAY"]`` after the first of
them, or as soon as ``max_size`` are waiting, then logs and signals each
success (after the commit, as for a single acknowledgement).

It also takes every outcome an executor could not write itself
(:class:`Unwritten`): the message's row was locked by another transaction
(a producer's upsert of its key, an operator's bulk change, the Spark
loader), or the connection was lost. It tries each again, without ever
waiting for a lock, until it lands or the row turns out to be someone
else's; one locked row never holds up the others.

Until its outcome commits, a message stays in the worker's book (settling):
its lease keeps being extended, so no other worker takes it meanwhile. Only
then is it forgotten (``settled``). A connection lost with a commit's reply
is told from a lost lease by reading the row (``leases.states``).

What batching does not change: an acknowledgement is still a compare-and-set
on ``(id, lock_token)``; atomic handlers still commit their writes and their
acknowledgement together; a shutdown commits what is waiting before the
worker exits. What it widens: if the process is killed (SIGKILL, power loss)
after a handler returned and before the batch commits, that message is
redelivered when its lease expires and its handler runs again, as it would
if the process died just before a single acknowledgement. The window is
``ACK_DELAY`` plus one commit; ``ACK_DELAY = None`` turns batching off.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connections, reset_queries
from django.db.models import Model

from django_delayq import guard
from django_delayq.logs import who
from django_delayq.models import Message
from django_delayq.store import dependencies, leases, settle
from django_delayq.worker.background import Supervisor
from django_delayq.worker.execute import Result, lease_lost, record_success
from django_delayq.worker.inflight import InFlight
from django_delayq.worker.spacing import Spacing

logger = logging.getLogger("django_delayq.worker")

Done = list[tuple[InFlight, str, float]]

# Where successes come densely (at least DENSE_COMPANY more expected within
# the longer window), a batch that has fewer than DENSE_FILL successes when
# ACK_DELAY is up waits for more, up to DENSE_STRETCH times ACK_DELAY: one
# statement then serves several messages, where at ACK_DELAY alone a steady
# stream of 200 a second was acknowledged nearly one by one (a statement, a
# wake-up and a commit each, a third of the worker's CPU per message). A
# batch that has filled by then closes at ACK_DELAY as before: a faster
# stream gains nothing from a longer wait, and its finished messages, which
# count in what a lane may hold, would hold up its claims. Nor does a batch
# wait longer when no new message has been heard of since it began (the
# worker's ``activity``): successes that came densely from a producer that
# waits for each result before it sends the next (``wait()``, a Tasks
# result) would wait the longer time for company that cannot come. A
# success that something waits for closes its batch at ACK_DELAY still
# (``_waited_for``), as does every batch of a sparse stream.
DENSE_STRETCH = 10
DENSE_COMPANY = 4
DENSE_FILL = 10

# An outcome whose row was locked (or whose write failed) is tried again after
# this, doubling up to RETRY_MAX while it keeps failing.
RETRY_FIRST = 0.05
RETRY_MAX = 2.0


@dataclass(eq=False)
class Unwritten:
    """An attempt's outcome its executor could not write (a locked row, a lost
    connection): the settler writes it later.

    ``write`` is the compare-and-set statement (1 when it took); ``announce``
    logs and signals the outcome once written. ``maybe_written``: a connection
    was lost while it was being sent, so it may have committed already.
    """

    item: InFlight
    result: str
    elapsed: float
    write: Callable[[], int]
    announce: Callable[[], None]
    maybe_written: bool = False
    tries: int = 0
    due: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Success:
    item: InFlight
    duration: float
    maybe_written: bool = False
    tries: int = 0
    due: float = 0.0


class Settler:
    """Commits batched successes and the outcomes executors handed over, on its own thread."""

    def __init__(
        self,
        using: str,
        *,
        settled: Callable[[Done], None],
        max_delay: float | None,
        max_size: int = 500,
        on_committed: Callable[[bool], None] | None = None,
        activity: Callable[[], float] | None = None,
    ) -> None:
        self.using = using
        # Told of attempts whose outcome is committed (or known lost): the
        # worker forgets them. And of each batch committed (whether it
        # finished grouped messages, whose groups' next messages are due now).
        self._settled = settled
        self.on_committed = on_committed
        # None: no batching (successes are written by their executor).
        self.max_delay = max_delay
        self.max_size = max_size
        self._successes: list[_Success] = []
        self._retries: list[_Success | Unwritten] = []
        # When the batch waiting closes (monotonic; see add): at _close_at, or
        # max_delay after its first success once it holds _fill of them.
        self._close_at = 0.0
        self._first_at = 0.0
        self._fill = max_size
        # How densely successes come (see add), and when the worker last heard
        # of a new message (monotonic; None: take it that they keep coming).
        self._spacing = Spacing()
        self._activity = activity
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = float("inf")
        self._flushing = False
        self._thread: threading.Thread | None = None
        self._supervisor: Supervisor | None = None

    # -- the executors' side ------------------------------------------------------

    @property
    def batching(self) -> bool:
        return self.max_delay is not None

    def add(self, item: InFlight, duration: float) -> None:
        """A success to acknowledge in the next batch.

        The batch closes ``max_delay`` after its first success; where
        successes come densely and new messages keep coming (``activity``),
        only once it holds ``DENSE_FILL`` of them, or ``DENSE_STRETCH`` times
        ``max_delay`` after the first. A success someone waits for
        (``_waited_for``) closes it at ``max_delay`` after itself at the
        latest.
        """
        delay = self.max_delay or 0.0
        with self._cond:
            now = time.monotonic()
            close_at = now + delay
            if not self._successes:
                window = self.window(now)
                self._first_at = now
                self._close_at = now + window
                self._fill = DENSE_FILL if window > delay else 1
            self._spacing.heard(now)
            earlier = close_at < self._close_at and _waited_for(item)
            if earlier:
                self._close_at = close_at
            self._successes.append(_Success(item, duration))
            count = len(self._successes)
            if count in (1, self._fill) or earlier or count >= self.max_size:
                self._cond.notify_all()

    @property
    def closes_at(self) -> float | None:
        """When the batch waiting is committed (monotonic), or None when none waits."""
        with self._cond:
            return self._closes_at() if self._successes else None

    def _closes_at(self) -> float:
        if len(self._successes) >= self._fill or not self._more_coming():
            return min(self._close_at, self._first_at + (self.max_delay or 0.0))
        return self._close_at

    def _more_coming(self) -> bool:
        """Whether a new message was heard of since the batch began (an open stream)."""
        return self._activity is None or self._activity() > self._first_at

    def window(self, now: float) -> float:
        """How long a batch begun at ``now`` may stay open: ``max_delay``, or
        ``DENSE_STRETCH`` times that where at least ``DENSE_COMPANY`` more successes
        are expected within the longer wait (for a batch still short of
        ``DENSE_FILL``)."""
        delay = self.max_delay or 0.0
        stretched = delay * DENSE_STRETCH
        return stretched if self._spacing.expects(DENSE_COMPANY, stretched, now) else delay

    def defer(self, outcome: Unwritten) -> None:
        """An outcome to write as soon as its row lets it."""
        with self._cond:
            self._retries.append(outcome)
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._successes) + len(self._retries)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until every success handed over is committed and announced (``--burst``:
        a success may let the next message of its group go, which the last claim
        must see). Outcomes waiting for a locked row are not waited for."""
        with self._cond:
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._successes and not self._flushing, timeout)

    # -- the thread ------------------------------------------------------------------

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Run on a thread of its own; should it die, ``supervisor`` starts another
        (what was handed over is this object's, not the thread's)."""
        self._supervisor = supervisor
        self._thread = threading.Thread(target=self._supervised, name="delayq-acks", daemon=True)
        self._thread.start()

    def _supervised(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            if self._supervisor is None:
                raise
            self._supervisor.died("acknowledgement", exc, self.start_again)

    def start_again(self) -> None:
        with self._cond:
            self._flushing = False
        self.start(self._supervisor)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def close(self, timeout: float = 30.0) -> None:
        """Commit what is waiting (trying locked rows again until ``timeout``), then stop."""
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout + 5)

    def run(self) -> None:
        """The thread's loop: until closed and nothing is left (or its time is up)."""
        try:
            while (taken := self._take()) is not None:
                try:
                    self._flush(*taken)
                except BaseException:
                    # An error of ours: nothing handed over may be lost, or
                    # its message would stay held, its lease extended for
                    # ever. Everything of the batch is tried again.
                    with self._cond:
                        for outcome in [*taken[0], *taken[1]]:
                            outcome.maybe_written = True
                            outcome.due = time.monotonic() + RETRY_MAX
                            self._retries.append(outcome)
                    raise
                finally:
                    with self._cond:
                        self._flushing = False
                        self._cond.notify_all()
        finally:
            connections.close_all()

    def _take(self) -> tuple[list[_Success], list[_Success | Unwritten]] | None:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._closing and (
                    (not self._successes and not self._retries) or now >= self._deadline
                ):
                    return None
                due = [r for r in self._retries if r.due <= now]
                batch_ready = self._successes and (
                    self._closing
                    or len(self._successes) >= self.max_size
                    or now >= self._closes_at()
                )
                if batch_ready or due:
                    batch = self._successes if batch_ready else []
                    if batch_ready:
                        self._successes = []
                    self._retries = [r for r in self._retries if r.due > now]
                    self._flushing = True
                    return batch, due
                waits = [r.due - now for r in self._retries]
                if self._successes:
                    waits.append(self._closes_at() - now)
                if self._closing:
                    waits.append(self._deadline - now)
                self._cond.wait(max(0.0, min(waits)) if waits else None)

    def _flush(self, successes: list[_Success], retries: list[_Success | Unwritten]) -> None:
        if settings.DEBUG:
            reset_queries()  # DEBUG's query log of this thread's connection
        done: Done = []
        again: list[_Success | Unwritten] = []
        grouped = False
        acks = successes + [r for r in retries if isinstance(r, _Success)]
        if acks:
            grouped = self._acknowledge(acks, done, again)
        for outcome in retries:
            if isinstance(outcome, Unwritten):
                self._write(outcome, done, again)
        if again:
            with self._cond:
                for outcome in again:
                    outcome.tries += 1
                    outcome.due = time.monotonic() + min(
                        RETRY_MAX, RETRY_FIRST * 2 ** (outcome.tries - 1)
                    )
                self._retries.extend(again)
        if done:
            guard.call("recording settled outcomes", self._settled, done, log=logger)
        if acks and self.on_committed is not None and len(again) < len(acks):
            # After the successes are recorded: each let its group's next go.
            guard.call("the acknowledgement callback", self.on_committed, grouped, log=logger)

    def _acknowledge(
        self, acks: list[_Success], done: Done, again: list[_Success | Unwritten]
    ) -> bool:
        held = by_token((a.item.row, a.item.token) for a in acks)
        try:
            mine = settle.ack_held(held, using=self.using, skip_locked=True)
        except (DatabaseError, InterfaceError):
            logger.warning(
                "could not record the success of %d message(s); trying again",
                len(acks),
                exc_info=True,
            )
            connections[self.using].close()
            for ack in acks:
                ack.maybe_written = True
            again.extend(acks)
            return False
        missing = [a for a in acks if (a.item.row.pk, a.item.token) not in mine]
        found = self._states([a.item for a in missing]) if missing else {}
        # A workflow's parents acknowledged together end their edges together:
        # a fan-in's child changes once per batch, not once per parent.
        # A QueueFields row may be a parent too (through its stand-in).
        parents: dict[type[Model], list[Any]] = {}
        for a in acks:
            row = a.item.row
            if (row.pk, a.item.token) in mine and (
                type(row) is not Message or getattr(row, "has_children", False)
            ):
                parents.setdefault(type(row), []).append(row.pk)
        grouped = False
        for model, pks in parents.items():
            grouped = self._children_go_on(pks, model) or grouped
        for ack in acks:
            item = ack.item
            message = item.row
            if (message.pk, item.token) not in mine:
                state = found.get(message.pk)
                if state is not None and state.holds(item.token):
                    again.append(ack)  # locked by another transaction: later
                    continue
                if not (ack.maybe_written and _ended(state, item)):
                    lease_lost(message)
                    done.append((item, Result.LEASE_LOST, ack.duration))
                    continue
            guard.call(
                f"announcing the success of message {message.pk}",
                record_success,
                message,
                ack.duration,
                using=self.using,
                children=False,
                log=logger,
            )
            grouped = grouped or bool(getattr(message, "group", ""))
            done.append((item, Result.SUCCEEDED, ack.duration))
        return grouped

    def _children_go_on(self, parents: list[Any], model: type[Model]) -> bool:
        """Release the children of ``parents`` (acknowledged rows of ``model``); True if
        any was released. If this fails, the sweep of every worker's maintenance does
        it a little later."""
        try:
            settled = dependencies.settle_without_waiting(parents, using=self.using, model=model)
            return bool(settled.released)
        except (DatabaseError, InterfaceError):
            logger.warning(
                "could not release the messages waiting for %d acknowledged message(s); "
                "the sweep will",
                len(parents),
                exc_info=True,
            )
            connections[self.using].close()
            return False

    def _write(self, outcome: Unwritten, done: Done, again: list[_Success | Unwritten]) -> None:
        item = outcome.item
        try:
            wrote = outcome.write()
            state = None if wrote else self._states([item]).get(item.row.pk)
        except (DatabaseError, InterfaceError):
            logger.warning(
                "could not record the outcome of %s; trying again",
                who(item.row),
                exc_info=True,
            )
            connections[self.using].close()
            outcome.maybe_written = True
            again.append(outcome)
            return
        if not wrote:
            if state is not None and state.holds(item.token):
                again.append(outcome)
                return
            if not (outcome.maybe_written and _ended(state, item)):
                lease_lost(item.row)
                done.append((item, Result.LEASE_LOST, outcome.elapsed))
                return
        guard.call(f"announcing the outcome of {who(item.row)}", outcome.announce, log=logger)
        done.append((item, outcome.result, outcome.elapsed))

    def _states(self, items: list[InFlight]) -> dict[Any, leases.RowState]:
        by_model: dict[type, list[Any]] = defaultdict(list)
        for item in items:
            by_model[item.lane.model].append(item.row.pk)
        found: dict[Any, leases.RowState] = {}
        for model, ids in by_model.items():
            found.update(leases.states(ids, using=self.using, model=model))
        return found


def _waited_for(item: InFlight) -> bool:
    """Whether something waits for ``item``'s acknowledgement to commit: the next
    message of its ordered group, a workflow's children, a place under its lane's
    global limits, or (a ``QueueFields`` row) a workflow through its stand-in."""
    row = item.row
    return bool(
        item.lane.limits
        or type(row) is not Message
        or getattr(row, "group", "")
        or getattr(row, "has_children", False)
    )


def _ended(state: leases.RowState | None, item: InFlight) -> bool:
    return state is not None and state.ended(item.token, item.row.last_attempt_time)


def by_token(items: Iterable[tuple[Any, uuid.UUID]]) -> dict[uuid.UUID, list[Any]]:
    """The ids of ``(row, token)`` pairs by lock token (``settle.ack_held``'s)."""
    held: defaultdict[uuid.UUID, list[Any]] = defaultdict(list)
    for row, token in items:
        held[token].append(row.pk)
    return held


__all__ = ["Done", "Settler", "Unwritten", "by_token"]
