"""Helpers for a project's own tests: run due messages in-process, assert, move time.

With pytest (the ``delayq`` fixture is registered by the package's
``pytest11`` entry point, or by ``pytest_plugins = ["django_delayq.pytest_plugin"]``)::

    def test_order_is_confirmed(delayq):
        order = place_order("a@example.com", 10)
        delayq.assert_enqueued("orders", key=f"confirm-{order.pk}")
        [attempt] = delayq.run_pending("orders")
        assert attempt.result == "succeeded"

        delayq.advance(hours=1)              # the delayed follow-up is due now
        delayq.run_pending("emails")

With ``unittest`` / Django's ``TestCase``::

    def setUp(self):
        self.delayq = self.enterContext(DelayQ())

Everything runs in the test's thread, through the test's connection, so it
works inside the transaction of ``TestCase`` or pytest-django's ``db``: the
handlers see the test's uncommitted data and their writes are rolled back
with it. The messages go through the worker's own claim and outcome code
(retries, ``Retry``, ``Discard``, ``max_attempts``, signals); handler time
limits and lease extension, which need a worker's threads, do not apply.

The queue's clock (:mod:`django_delayq.clock`) is replaced while a
:class:`DelayQ` is active: it runs with real time plus an offset that
:meth:`DelayQ.advance` increases. Due times, leases and retry times are then
compared with that clock instead of the database's, so a message delayed by
an hour, or a retry scheduled by the retry policy, is due after
``advance(hours=1)`` without sleeping. Code under test that computes
``run_at`` from ``timezone.now()`` stays consistent with it, since the
offset clock only ever runs ahead of real time. A clock patched by a library
such as time-machine would not reach the database's clock, which the worker
uses; move time with ``advance`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar, cast

from django.db.models import Min
from django.utils import timezone

from django_delayq import clock, signals
from django_delayq.conf import get_config, to_timedelta
from django_delayq.exceptions import Discard
from django_delayq.models import Message
from django_delayq.routers import model_alias, queue_alias

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "Attempt",
    "DelayQ",
    "OffsetClock",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued",
    "run_pending",
]

#: ``locked_by`` of the messages the helpers run.
WORKER_NAME = "django_delayq.testing"

_ANY: Any = object()


@dataclass(frozen=True)
class Attempt:
    """One message run by :func:`run_pending`, and how the attempt ended.

    ``result`` is one of ``"succeeded"``, ``"retrying"`` (failed, will run
    again), ``"snoozed"`` (the handler raised ``Retry``), ``"failed"`` (gave
    up) or ``"discarded"`` (the handler raised ``Discard``); ``exception`` is
    what the handler raised (``None`` on success). ``message`` is the row as
    the attempt left it (status, ``attempt_count``, ``last_error``, due time).
    """

    message: Message
    result: str
    exception: BaseException | None = None

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def key(self) -> str:
        return self.message.key

    @property
    def payload(self) -> Any:
        return self.message.payload

    def __repr__(self) -> str:
        error = f", {self.exception!r}" if self.exception is not None else ""
        return (
            f"<Attempt {self.queue}/{self.key} #{self.message.attempt_count}: {self.result}{error}>"
        )


def _queues(queue: str | Iterable[str] | None) -> list[str] | None:
    if queue is None:
        return None
    return [queue] if isinstance(queue, str) else list(queue)


def run_pending(
    queue: str | Iterable[str] | None = None,
    *,
    using: str | None = None,
    limit: int = 1000,
) -> list[Attempt]:
    """Run every message that is due now, one at a time, in this thread.

    ``queue`` is a queue name, several, or None for every queue with a
    handler (as ``run_delayq`` would). Messages that the handlers enqueue and
    that are due at once run too; a failed attempt whose retry is scheduled
    later does not (move the clock, then call again). Paused queues are
    skipped, as a worker skips them. Returns the attempts in the order they
    ran. More than ``limit`` attempts raises ``RuntimeError`` (a handler
    that keeps re-enqueueing due work would otherwise never end). The due
    rows of a ``QueueFields`` model run too (after the due messages), for
    its queue: ``Attempt.message`` is then the row.
    """
    from django_delayq.queues import paused_queues
    from django_delayq.registry import registry
    from django_delayq.store import claim
    from django_delayq.worker import resolve_queues
    from django_delayq.worker.execute import Result, execute

    queues = resolve_queues(_queues(queue))
    alias = queue_alias(using)
    lease = to_timedelta(get_config()["LEASE"])
    paused = paused_queues(queues, using=alias)
    active = [q for q in queues if q not in paused]
    # Queues whose messages are the rows of a QueueFields model.
    row_specs = [s for q in active for s in registry.for_queue(q) if s.model is not None]
    message_queues = [q for q in active if q not in {s.queue for s in row_specs}]
    attempts: list[Attempt] = []
    raised: dict[tuple[type, Any], BaseException] = {}

    def capture(
        sender: Any,
        message: Message,
        exception: BaseException | None = None,
        reason: str = "",
        **kwargs: Any,
    ) -> None:
        raised[(type(message), message.pk)] = (
            exception if exception is not None else Discard(reason)
        )

    outcome_signals = (signals.message_retried, signals.message_failed, signals.message_discarded)
    for signal in outcome_signals:
        signal.connect(capture, weak=False)
    try:
        while active:
            if len(attempts) >= limit:
                if Message.objects.using(alias).due().filter(queue__in=active).exists():
                    raise RuntimeError(
                        f"run_pending ran {limit} messages and more are still due; "
                        "do handlers keep enqueueing due messages? (raise limit= if not)"
                    )
                break
            batch = claim.claim(message_queues, 1, worker=WORKER_NAME, lease=lease, using=alias)
            for spec in row_specs:
                if batch.messages:
                    break
                batch = claim.claim(
                    [spec.queue],
                    1,
                    worker=WORKER_NAME,
                    lease=spec.effective_lease(),
                    using=alias,
                    model=spec.model or Message,
                )
            if not batch.messages:
                break
            message = batch.messages[0]
            result = execute(message, batch.token, using=alias)
            assert isinstance(result, Result)  # with no settler, every outcome is written here
            message.refresh_from_db(using=alias)
            exception = raised.pop((type(message), message.pk), None)
            attempts.append(Attempt(message, str(Result(result)), exception))
    finally:
        for signal in outcome_signals:
            signal.disconnect(capture)
    return attempts


def enqueued(
    queue: str | Iterable[str] | None = None,
    *,
    key: str | None = None,
    kind: str | None = None,
    payload: Any = _ANY,
    using: str | None = None,
) -> list[Message]:
    """Pending messages (due now, later, or waiting for a retry), oldest first.

    Filters are exact: ``payload`` compares the decoded JSON as a whole.
    """
    qs = Message.objects.using(queue_alias(using, read=True)).filter(status=Message.Status.PENDING)
    queues = _queues(queue)
    if queues is not None:
        qs = qs.filter(queue__in=queues)
    if key is not None:
        qs = qs.filter(key=key)
    if kind is not None:
        qs = qs.filter(kind=kind)
    messages = list(qs.order_by("id"))
    if payload is not _ANY:
        messages = [m for m in messages if m.payload == payload]
    return messages


def _describe(queue: str | Iterable[str] | None, filters: dict[str, Any]) -> str:
    where = "any queue" if queue is None else f"queue {queue!r}"
    shown = ", ".join(f"{k}={v!r}" for k, v in filters.items() if v is not _ANY and v is not None)
    return f"{where}" + (f" with {shown}" if shown else "")


def assert_enqueued(
    queue: str | Iterable[str] | None = None,
    *,
    payload: Any = _ANY,
    key: str | None = None,
    kind: str | None = None,
    count: int | None = None,
    using: str | None = None,
) -> list[Message]:
    """Fail unless pending messages match (exactly ``count`` of them if given).

    Returns the matching messages; the failure lists what is pending instead.
    """
    found = enqueued(queue, key=key, kind=kind, payload=payload, using=using)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    pending = enqueued(queue, using=using)
    listing = "".join(
        f"\n  {m.queue}/{m.key} kind={m.kind!r} payload={m.payload!r}" for m in pending[:20]
    )
    expected = "a pending message" if count is None else f"{count} pending message(s)"
    raise AssertionError(
        f"expected {expected} in {_describe(queue, {'key': key, 'kind': kind, 'payload': payload})}"
        f", found {len(found)}; pending there: {len(pending)}{listing}"
    )


def assert_not_enqueued(
    queue: str | Iterable[str] | None = None,
    *,
    kind: str | None = None,
    payload: Any = _ANY,
    key: str | None = None,
    using: str | None = None,
) -> None:
    """Fail if any pending message matches."""
    assert_enqueued(queue, key=key, kind=kind, payload=payload, count=0, using=using)


class _OnItsDatabase(Generic[P, R]):
    """One of this module's functions as a method of :class:`DelayQ`: called on the
    helper's database (its ``using``), with the same arguments otherwise."""

    def __init__(self, function: Callable[P, R]) -> None:
        self.function = function
        self.__doc__ = f":func:`{function.__name__}` on this helper's database."

    def __get__(self, helper: DelayQ | None, owner: type | None = None) -> Callable[P, R]:
        if helper is None:
            return self.function
        bound: Callable[..., R] = self.function
        return cast("Callable[P, R]", partial(bound, using=helper.using))


def _on_its_database(function: Callable[P, R]) -> _OnItsDatabase[P, R]:
    return _OnItsDatabase(function)


class OffsetClock:
    """Real time plus an offset that only grows: the queue's clock under test."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return timezone.now() + self.offset

    def advance(self, delta: timedelta) -> datetime:
        if delta < timedelta(0):
            raise ValueError(f"the clock only moves forward; got {delta}")
        self.offset += delta
        return self()


class DelayQ:
    """The test helpers bound to one database, with the queue's clock under control.

    Use as a context manager (the ``delayq`` pytest fixture does): entering
    replaces the queue's clock, leaving restores it.
    """

    def __init__(self, *, using: str | None = None) -> None:
        self.using = using
        self.clock = OffsetClock()
        self._saved: list[Any] = []

    def __enter__(self) -> DelayQ:
        self._saved.append(clock.now)
        setattr(clock, "now", self.clock)  # noqa: B010  (the seam clock.py documents)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        setattr(clock, "now", self._saved.pop())  # noqa: B010

    def now(self) -> datetime:
        """The queue's current time."""
        return clock.now()

    def advance(self, delta: timedelta | int | float = 0, **parts: float) -> datetime:
        """Move the queue's clock forward: ``advance(30)``, ``advance(hours=1)``.

        Returns the new time. Messages due by then run at the next
        :meth:`run_pending`.
        """
        if clock.now is not self.clock:
            raise RuntimeError(
                "this DelayQ does not drive the queue's clock: use it as a context manager "
                "(with DelayQ() as delayq: ...) or through the delayq fixture"
            )
        return self.clock.advance(to_timedelta(delta) + timedelta(**parts))

    def run_pending(
        self, queue: str | Iterable[str] | None = None, *, limit: int = 1000
    ) -> list[Attempt]:
        """:func:`run_pending` on this helper's database."""
        return run_pending(queue, using=self.using, limit=limit)

    def run_all(
        self, queue: str | Iterable[str] | None = None, *, limit: int = 1000
    ) -> list[Attempt]:
        """Run until nothing is pending, moving the clock to each next due time.

        Delayed messages and every retry run, as if the test waited for
        them: a message that keeps failing ends ``failed`` after its
        ``max_attempts``. The rows of ``QueueFields`` models those queues
        consume run so too. Returns every attempt, in order.
        """
        from django_delayq.registry import registry
        from django_delayq.worker import resolve_queues

        queues = resolve_queues(_queues(queue))
        alias = queue_alias(self.using, read=True)
        attempts: list[Attempt] = []
        while True:
            attempts += self.run_pending(queues, limit=limit - len(attempts))
            upcoming = (
                Message.objects.using(alias)
                .filter(status=Message.Status.PENDING, queue__in=queues)
                .aggregate(t=Min("next_attempt_time"))["t"]
            )
            # The rows of the QueueFields models those queues consume, too.
            for model in {s.model for q in queues for s in registry.for_queue(q) if s.model}:
                due = (
                    model._base_manager.using(model_alias(model, self.using, read=True))
                    .filter(status=Message.Status.PENDING)
                    .aggregate(t=Min("next_attempt_time"))["t"]
                )
                if due is not None and (upcoming is None or due < upcoming):
                    upcoming = due
            if upcoming is None:
                return attempts
            if len(attempts) >= limit:
                raise RuntimeError(
                    f"run_all ran {limit} attempts and messages are still pending; "
                    "does a handler keep snoozing or re-enqueueing? (raise limit= if not)"
                )
            now = self.now()
            if upcoming > now:
                self.clock.advance(upcoming - now)

    #: :func:`enqueued` on this helper's database.
    enqueued = _on_its_database(enqueued)
    #: :func:`assert_enqueued` on this helper's database.
    assert_enqueued = _on_its_database(assert_enqueued)
    #: :func:`assert_not_enqueued` on this helper's database.
    assert_not_enqueued = _on_its_database(assert_not_enqueued)
