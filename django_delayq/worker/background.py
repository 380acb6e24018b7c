"""A worker's background thread: one step after another until the worker stops.

The lease keeper and maintenance run beside the claim loop on threads of
their own, each with its own database connection (Django's connections are
per thread), so that neither ever holds up a claim. What they share is
here: a stop event that also paces the loop, DEBUG's query log emptied on
every turn (it is per thread and per connection), and the thread's
connections closed when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.conf import settings
from django.db import connections, reset_queries


class Background:
    """Runs ``step`` after each wait of ``pause()`` seconds, on a daemon thread ``name``."""

    def __init__(self, name: str, step: Callable[[], None], pause: Callable[[], float]) -> None:
        self._step = step
        self._pause = pause
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current step; wait up to ``timeout`` for it to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._pause()):
                if settings.DEBUG:
                    reset_queries()
                self._step()
        finally:
            connections.close_all()
