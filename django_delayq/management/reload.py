"""``run_delayq --reload``: a new worker process whenever the project's code changes.

Built on Django's own autoreloader (the one ``runserver`` uses), split the same
way: a parent process that only starts the worker and starts it again, and the
worker in a child process that watches the files it imported. What differs
from ``runserver`` is the way out of the old code: a change asks the worker to
stop as SIGTERM does (running handlers finish, their outcomes are written,
held messages go back) before the child exits with the status that tells the
parent to start a new one. A handler is never cut in the middle of its work
because a file was saved.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from types import FrameType

from django.utils import autoreload

logger = logging.getLogger("django_delayq.worker")

#: The status the child exits with to be started again (Django's own).
RELOAD = 3


def in_child() -> bool:
    """True in the process that runs the worker (started by :func:`supervise`)."""
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


def supervise() -> int:
    """Start the worker as a child and start it again each time it exits with
    :data:`RELOAD`; return the status of its last exit.

    A SIGTERM to this process is passed on to the worker. A Ctrl-C reaches the
    worker from the terminal on its own, so it is not passed on a second time
    (a second SIGINT makes the worker stop without waiting for its handlers).
    A worker that fails to start (a syntax error just saved) is started again
    once a file changes, as ``runserver`` does.
    """
    environ = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    arguments = autoreload.get_child_arguments()
    stopping = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        if signum == signal.SIGTERM and child is not None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            before = _snapshot()
            child = subprocess.Popen(arguments, env=environ, close_fds=False)
            status = child.wait()
            if stopping.is_set() or status == 0:
                return status
            if status != RELOAD:
                logger.error(
                    "the worker exited with status %s; starting it again once a file changes",
                    status,
                )
                if not _wait_for_a_change(before, stopping):
                    return status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def watch(on_change: Callable[[str], None]) -> None:
    """In the child: call ``on_change(path)`` once, when a file the process
    imported (or a watched template or locale file) changes. Django's reloader
    runs on a thread of its own; the worker keeps the main thread."""
    fired = threading.Event()

    def changed(sender: object, file_path: object, **kwargs: object) -> bool:
        if not fired.is_set():
            fired.set()
            on_change(str(file_path))
        return True  # handled: not Django's sys.exit from the watching thread

    def started(sender: object, **kwargs: object) -> None:
        logger.info("watching for file changes with %s", type(sender).__name__)

    autoreload.file_changed.connect(changed, weak=False)
    autoreload.autoreload_started.connect(started, weak=False)
    reloader = autoreload.get_reloader()
    thread = threading.Thread(
        target=reloader.run,
        args=(threading.main_thread(),),
        name="delayq-reload",
        daemon=True,
    )
    thread.start()


def _snapshot() -> dict[str, float]:
    return {str(path): mtime for path, mtime in autoreload.StatReloader().snapshot_files()}


def _wait_for_a_change(before: dict[str, float], stopping: threading.Event) -> bool:
    """Wait until a file this process imported changes; False if asked to stop."""
    while not stopping.wait(1.0):
        if _snapshot() != before:
            return True
    return False
