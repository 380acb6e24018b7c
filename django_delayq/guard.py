"""Calls into a project's code that must not take the caller down with them.

A worker calls code it does not own: handlers, signal receivers, retry
policies, the callbacks it was given. Any of them may raise what is not an
``Exception``: ``asyncio.CancelledError`` from library code, a
``SystemExit`` from a careless ``sys.exit()``, a ``KeyboardInterrupt``
raised by hand. Caught only as ``Exception``, one of them kills the thread
it runs on (an executor, the acknowledgement thread, the lease keeper), and
what that thread was doing for every other message stops with it. So every
such call goes through :func:`call`: what it raises is logged and returned,
never propagated, except a real Ctrl-C, which only the main thread receives
and which must still interrupt it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_delayq")

_MAIN_THREAD = threading.main_thread()


class Raised:
    """What a guarded call raised instead of returning (see :func:`call`)."""

    __slots__ = ("exception",)

    def __init__(self, exception: BaseException) -> None:
        self.exception = exception

    def __bool__(self) -> bool:
        return False


def interrupts(exc: BaseException) -> bool:
    """Whether ``exc`` must go on up: a Ctrl-C in the main thread (handlers and
    receivers run there only when called directly, as the testing helpers do)."""
    return isinstance(exc, KeyboardInterrupt) and threading.current_thread() is _MAIN_THREAD


def call(
    what: str,
    func: Callable[..., Any],
    *args: Any,
    log: logging.Logger | None = None,
    **kwargs: Any,
) -> Any:
    """``func(*args, **kwargs)``; if it raises anything, log it (as ``what``) and return
    a :class:`Raised` holding it.

    Nothing is re-raised but a Ctrl-C in the main thread (:func:`interrupts`).
    """
    try:
        return func(*args, **kwargs)
    except BaseException as exc:
        if interrupts(exc):
            raise
        (log or logger).error(
            "%s raised %s", what, type(exc).__name__, exc_info=(type(exc), exc, exc.__traceback__)
        )
        return Raised(exc)
