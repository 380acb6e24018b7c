"""The worker's two small HTTP servers (health probes, metrics), bounded against their clients.

``run_delayq`` serves ``/healthz`` and ``/readyz`` (``health.py``) and
``/metrics`` (``metrics.py``) from daemon threads, with the standard
library's ``socketserver``: a thread per connection. Left as they come,
such servers let any client that can reach the port take the worker's
memory and file descriptors: a connection that sends half a request and
waits holds a thread for ever. :class:`BoundedServerMixin` bounds them:

* every connection is closed at most ``REQUEST_TIMEOUT`` seconds after it
  was accepted, whether it is idle, sends its request a byte at a time or
  does not read the answer (the accept loop checks every half second);
  a socket that stays silent for that long times out on its own;
* at most ``MAX_CONNECTIONS`` connections are served at once; one more is
  closed as soon as it is accepted, without a thread (a warning says so,
  at most once a minute);
* an error of a connection (a timeout, a reset) is logged at DEBUG, not
  printed with its traceback.

Both servers listen on the loopback interface unless ``HEALTH_ADDRESS`` /
``METRICS_ADDRESS`` (or ``--health-address`` / ``--metrics-address``) say
otherwise.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

logger = logging.getLogger("django_delayq.http")

#: Seconds a connection may stay open, from its accept to the last byte of the answer.
REQUEST_TIMEOUT = 10.0
#: Connections served at once by one server; more are closed when accepted.
MAX_CONNECTIONS = 16
#: How often the accept loop closes the connections past their deadline (seconds).
REAP_INTERVAL = 0.5
#: At most one warning about refused connections per this many seconds.
REFUSED_WARNING_INTERVAL = 60.0


def best_family(address: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and address to bind ``address`` with (IPv4 or IPv6, a name
    resolved); ``""`` is every IPv4 interface."""
    if not address:
        return socket.AF_INET, ""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise OSError(f"cannot resolve {address!r}: {exc}") from exc
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


class BoundedServerMixin:
    """Mixed in before ``ThreadingMixIn`` and a TCP server class (see the module docstring)."""

    daemon_threads = True
    # server_close() must not wait for a client's thread: it ends the connections instead.
    block_on_close = False
    request_timeout = REQUEST_TIMEOUT
    max_connections = MAX_CONNECTIONS
    # Connections the kernel queues before they are accepted (socketserver's 5
    # would make a burst of clients wait for SYN retries before they are refused).
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: dict[socket.socket, float] = {}
        self._open_lock = threading.Lock()
        self._refused = 0
        self._refused_warned = float("-inf")
        super().__init__(*args, **kwargs)

    # -- socketserver's hooks ------------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = time.monotonic() + self.request_timeout
        if full:
            self._refuse(request, client_address)
            return
        try:
            request.settimeout(self.request_timeout)
            super().process_request(request, client_address)  # type: ignore[misc]
        except Exception:
            # No thread for it (the process is out of them): close it, serve on.
            logger.warning("could not serve a connection from %s", client_address, exc_info=True)
            self.shutdown_request(request)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)  # type: ignore[misc]

    def service_actions(self) -> None:
        """Called by the accept loop at least every ``REAP_INTERVAL``: end the late ones."""
        super().service_actions()  # type: ignore[misc]
        now = time.monotonic()
        with self._open_lock:
            late = [request for request, deadline in self._open.items() if deadline <= now]
        for request in late:
            try:
                # Wakes the thread blocked reading or writing it; the thread closes it.
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)

    def serve_forever(self, poll_interval: float = REAP_INTERVAL) -> None:
        super().serve_forever(poll_interval)  # type: ignore[misc]

    def server_close(self) -> None:
        """Stop listening, and end the connections still open."""
        super().server_close()  # type: ignore[misc]
        with self._open_lock:
            still = list(self._open)
        for request in still:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- refusals ------------------------------------------------------------------------

    def _refuse(self, request: Any, client_address: Any) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_warned >= REFUSED_WARNING_INTERVAL:
            self._refused_warned = now
            logger.warning(
                "%s: %d connection(s) refused so far, %d already open (the most it serves "
                "at once); the last from %s",
                self.__class__.__name__,
                self._refused,
                self.max_connections,
                client_address[0] if client_address else "?",
            )
        try:
            request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        request.close()

    @property
    def open_connections(self) -> int:
        """Connections being served now."""
        with self._open_lock:
            return len(self._open)
