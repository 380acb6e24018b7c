"""What handlers raise to steer their message, and the library's own errors."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class DelayQError(Exception):
    """Base class of every exception the library raises (or that handlers raise to steer it)."""


class HandlerOutcome(DelayQError):
    """Raised by a handler to decide its message's outcome; not an error of the handler."""


class Retry(HandlerOutcome):
    """Raised by a handler to run the message again later ("snooze").

    A snooze is not a failure: it records no error, and it does not use up one
    of the message's attempts, so a handler waiting on something slow can keep
    snoozing without being marked failed.
    """

    def __init__(self, delay: timedelta | int | float = 0, reason: str = "") -> None:
        from django_delayq.conf import check_delay

        # A delay no database could store (past ``conf.MAX_DELAY``) is refused
        # here, in the handler: the attempt fails with this error, as with any
        # other exception, instead of the worker failing to record a snooze.
        self.delay = check_delay(delay, "Retry delay")
        self.reason = reason
        super().__init__(reason or f"retry in {self.delay}")


class Discard(HandlerOutcome):
    """Raised by a handler to give up on a message at once, without retries.

    The message is marked ``failed`` with the reason as its error, so it stays
    visible (and retryable by an operator) instead of vanishing.
    """

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason)


class DuplicateMessage(DelayQError, ValueError):
    """``on_conflict="error"`` met a key that is already in the queue."""

    def __init__(self, queue: str, keys: list[str]) -> None:
        self.queue = queue
        self.keys = keys
        shown = ", ".join(repr(k) for k in keys[:5]) + (" ..." if len(keys) > 5 else "")
        super().__init__(f"queue {queue!r} already holds message(s) with key {shown}")


class HandlerNotFound(DelayQError, LookupError):
    """No handler is registered for a message's queue and kind."""


class TimeLimitExceeded(DelayQError):
    """Recorded as the error of an attempt that ran past its handler's ``time_limit``."""


class MessageAbandoned(DelayQError):
    """The error of a message given up after attempts that ended without an outcome.

    Such attempts leave no exception behind (the worker running them was
    killed, or the message outlived its lease); this one stands for them in
    ``message_failed`` receivers.
    """


class DatabaseUnreachable(DelayQError):
    """A worker stopped because its database stayed unreachable past ``DATABASE_OUTAGE_LIMIT``.

    Raised by ``Worker.run()`` once the worker has stopped; ``run_delayq``
    exits with its ``exit_code``, 75 (``EX_TEMPFAIL``: try again later), so a
    supervisor tells it from a crash (1) or a usage error (2) and restarts it.
    """

    #: The exit status of ``run_delayq`` when it gives up on its database.
    exit_code = 75


class WorkerCrashed(DelayQError):
    """A worker stopped because one of its threads kept dying (an error of django-delayq's).

    Raised by ``Worker.run()`` once the worker has stopped; ``run_delayq``
    exits with its ``exit_code``, 70 (``EX_SOFTWARE``), so the process manager
    restarts it and the failure shows, instead of a worker that runs on with
    a part missing (a lease keeper that stopped would let every lease lapse).
    """

    #: The exit status of ``run_delayq`` when a part of the worker kept dying.
    exit_code = 70


class WorkerNameTaken(DelayQError):
    """A worker did not start, or stopped, because a live worker holds its name.

    Workers hand back what runs under their name without being held by them
    (an earlier run's messages, killed): two live workers under one name
    would each hand back the other's running messages, to run again beside
    it. A worker whose name's holder has stopped, or not kept its heartbeat's
    promise, takes the name over. ``run_delayq`` exits with ``exit_code``, 78
    (``EX_CONFIG``): give each worker a name of its own (``--name``; the
    default, ``host:pid``, is one unless containers share a host name).
    """

    #: The exit status of ``run_delayq`` when its name is taken.
    exit_code = 78

    def __init__(self, name: str, host: str, pid: int) -> None:
        self.name, self.host, self.pid = name, host, pid
        super().__init__(
            f"another worker named {name!r} is alive (host {host}, pid {pid}): "
            "give each worker a name of its own (--name)"
        )


class MessageFailed(DelayQError):
    """``wait`` / ``await_result``: the message ended without succeeding.

    ``status`` is how it ended (``failed`` or ``cancelled``), ``error`` its
    last error (for a workflow's step cancelled by its parent, which parent).
    """

    def __init__(self, message: Any) -> None:
        self.message = message
        self.status = str(message.status)
        self.error = str(message.last_error)
        super().__init__(
            f"{message.queue}/{message.key} (#{message.pk}) ended {self.status}"
            + (f": {message.error_summary()}" if self.error else "")
        )
