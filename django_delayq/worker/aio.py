"""The worker's event loop: every ``async def`` handler runs on it, as a coroutine.

A worker runs one asyncio event loop on a thread of its own. An ``async def``
handler's coroutine is scheduled on it (:meth:`EventLoop.run`), so however
many of them run at once (up to their lane's concurrency) they share that
one thread and interleave at each ``await``: a hundred handlers waiting on
HTTP calls cost a hundred coroutines, not a hundred busy threads.

Everything around the handler stays where it is for a plain handler: the
executor thread that took the message waits for the coroutine's result
(blocked, not spinning), then records the outcome through the settler; its
lease, time limit, retries, signals and metrics are those of any message.
Past its time limit the coroutine is cancelled (``asyncio.CancelledError``
at its current ``await``), which a thread could never be.

A ``KeyboardInterrupt`` or ``SystemExit`` raised by a handler ends its own
attempt, as it does a plain handler's, and nothing else: asyncio would let it
out of ``run_forever`` and stop the loop under every other coroutine on it, so
it is carried to the handler's executor thread and raised there. The loop can
still die (a callback or a task of the handler's own raising one): it then
cancels and ends every task it had, and the supervisor starts it again.

Django's async ORM calls (``aget``, ``acreate``...) run as Django runs them
outside a request: on asgiref's single thread for sync code, with its own
connection, which the loop closes when it stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import close_old_connections, connections

from django_delayq.worker.background import Supervisor

logger = logging.getLogger("django_delayq.worker")

_local = threading.local()

# The futures of the coroutines handed to one loop, each with its wrapper and
# the handler's coroutine.
_Handed = dict[
    concurrent.futures.Future[Any],
    tuple[Coroutine[Any, Any, Any], Coroutine[Any, Any, Any]],
]


class EventLoop:
    """One asyncio loop on a daemon thread; coroutines are handed to it from other threads."""

    def __init__(self, supervisor: Supervisor | None = None) -> None:
        self.supervisor = supervisor
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()
        # The loop that takes coroutines, and the futures of those handed to it
        # (under _state): a loop that dies ends every one it did not finish.
        self._state = threading.Lock()
        self._live: tuple[asyncio.AbstractEventLoop, _Handed] | None = None

    def start(self) -> None:
        self._ready.clear()
        self.thread = threading.Thread(target=self._run, name="delayq-async", daemon=True)
        self.thread.start()
        self._ready.wait()

    def ensure_started(self) -> None:
        """Start the loop's thread the first time a coroutine comes (a worker whose
        queues may hold async tasks, but need not: no thread until one does), or
        again once it died (the supervisor's restart)."""
        if self._ready.is_set():
            return
        with self._lock:
            if not self._ready.is_set() and not self._stopping:
                self.start()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        futures: _Handed = {}
        with self._state:
            self.loop, self._live = loop, (loop, futures)
        asyncio.set_event_loop(loop)
        self._ready.set()
        died: BaseException | None = None
        try:
            loop.run_forever()
        except BaseException as exc:
            if self.supervisor is None or self._stopping:
                raise
            died = exc
        finally:
            with self._state:
                # No coroutine is handed to this loop from now on: one that came
                # while it shuts down would be left pending when it closes, and
                # its executor would wait for it for ever.
                if self._live is not None and self._live[0] is loop:
                    self._live = None
                    self._ready.clear()
            try:
                escaped = _end_tasks(loop)
                try:
                    loop.run_until_complete(_close_connections())
                except BaseException as exc:
                    escaped = escaped or exc
                escaped = _end_tasks(loop) or escaped
                if escaped is not None and died is None and not self._stopping:
                    died = escaped
            finally:
                loop.close()
                for future, coroutines in list(futures.items()):
                    future.cancel()  # its coroutine never ended: the attempt fails
                    # One handed over just as the loop stopped may never have
                    # been scheduled: close it, or it warns that it was never
                    # awaited (its attempt fails through the cancelled future).
                    for coroutine in coroutines:
                        coroutine.close()
        if died is not None and self.supervisor is not None:
            self.supervisor.died("event loop", died, self.ensure_started)

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Schedule ``coroutine`` on the loop (from any other thread); RuntimeError if
        the loop is not running (it died and was not restarted yet, or it stops)."""
        with self._state:
            if self._live is None:
                coroutine.close()
                raise RuntimeError("the worker's event loop is not running")
            loop, futures = self._live
            wrapped = _awaited(coroutine)
            future = asyncio.run_coroutine_threadsafe(wrapped, loop)
            futures[future] = (wrapped, coroutine)
        future.add_done_callback(lambda done: futures.pop(done, None))
        return future

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what still runs on the loop, close its ORM connection, and stop it."""
        self._stopping = True
        if self.loop is not None and self.thread is not None and self.thread.is_alive():
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:  # it closed meanwhile (it died)
                pass
            self.thread.join(timeout)


def _end_tasks(loop: asyncio.AbstractEventLoop) -> BaseException | None:
    """Cancel every task of the stopped ``loop`` and let each end, including those of
    coroutines handed over while it stopped (their tasks start only at the loop's
    next turns): a task left pending when the loop closes is never ended.

    A task may raise ``SystemExit`` or ``KeyboardInterrupt`` as it ends (one the
    handler started itself, outside :func:`_awaited`): asyncio lets it out of
    ``run_until_complete`` before the other tasks' turns, so the rounds go on
    until none is left, and the first such exception is returned."""
    escaped: BaseException | None = None
    for _ in range(100):
        try:
            loop.run_until_complete(asyncio.sleep(0))  # start what was handed over meanwhile
            pending = asyncio.all_tasks(loop)
            if not pending:
                return escaped
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except (KeyboardInterrupt, SystemExit) as exc:
            escaped = escaped or exc
    return escaped


class _Escaped(Exception):
    """Carries a handler's ``KeyboardInterrupt`` or ``SystemExit`` off the loop, to be
    raised again in its executor thread (:func:`run`)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


async def _awaited(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coroutine
    except (KeyboardInterrupt, SystemExit) as exc:
        raise _Escaped(exc) from None
    except Exception:
        # The handler's async ORM calls ran on asgiref's thread, whose
        # connection no outcome write uses (those run on the executor's
        # thread, which reconnects after a lost connection): one the database
        # dropped would fail every async handler after this one. Django closes
        # such a connection at the end of a request; a worker has no requests.
        await sync_to_async(close_old_connections)()
        raise


async def _close_connections() -> None:
    # The async ORM's calls ran on asgiref's thread for sync code: close the
    # connections it opened there.
    await sync_to_async(connections.close_all)()


def current() -> EventLoop | None:
    """The loop of the worker whose executor this thread is (while it runs a message)."""
    return getattr(_local, "loop", None)


class running_on:
    """Within this block, this thread's ``async def`` handlers run on ``loop``, for
    the attempt ``item`` (whose ``cancel`` is set to the coroutine's, for the keeper)."""

    def __init__(self, loop: EventLoop | None, item: Any = None) -> None:
        self.loop, self.item = loop, item

    def __enter__(self) -> None:
        self.previous = (current(), getattr(_local, "item", None))
        _local.loop, _local.item = self.loop, self.item

    def __exit__(self, *exc: object) -> None:
        _local.loop, _local.item = self.previous


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` to its end and return its result.

    On the worker's loop when this thread is one of its executors; elsewhere
    (the testing helpers, a plain call) through ``asgiref.sync.async_to_sync``,
    as Django runs async code from sync code. Past its attempt's time limit the keeper cancels it
    (``InFlight.cancel``).
    """
    loop = current()
    if loop is not None:
        loop.ensure_started()
    if loop is None or loop.loop is None or loop.thread is threading.current_thread():
        # asgiref's bridge, as Django calls async code from sync code: the
        # coroutine's sync calls (the async ORM's) come back to this thread, on
        # its connection, so a test's uncommitted rows are seen.
        try:
            return async_to_sync(_awaited)(coroutine)
        except _Escaped as carried:
            raise carried.error from None
    future = loop.submit(coroutine)
    item = getattr(_local, "item", None)
    if item is not None:
        item.cancel = future.cancel
    try:
        return future.result()
    except concurrent.futures.CancelledError:
        raise asyncio.CancelledError("cancelled on the worker's event loop") from None
    except _Escaped as carried:
        raise carried.error from None
    finally:
        if item is not None:
            item.cancel = None
