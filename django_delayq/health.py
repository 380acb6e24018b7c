"""Health of one worker for a supervisor: ``/healthz`` (alive) and ``/readyz`` (ready).

``run_delayq --health-port 8080`` (or ``DELAYQ["HEALTH_PORT"]``) serves them
from the standard library's ``ThreadingHTTPServer`` in a daemon thread, with
no extra to install (the metrics need ``prometheus-client``; a probe should
not), on the loopback interface unless ``HEALTH_ADDRESS`` says otherwise,
with the bounds of ``httpserver`` (slow connections closed, a cap on open
ones):

* ``/healthz`` is 200 while the claim loop keeps turning: it turns at least
  once per ``POLL_INTERVAL`` when idle, and announces each reconnection
  backoff and the shutdown grace before it waits them out. A loop that has
  not turned for three of its periods (``max(POLL_INTERVAL,
  HEARTBEAT_INTERVAL)``) past what it announced is stuck: 503, and a
  liveness probe restarts the process. A database outage alone never makes
  it fail: that is readiness's business (and ``DATABASE_OUTAGE_LIMIT``'s).
* ``/readyz`` is 200 once the worker has claimed from the database and
  recorded its heartbeat, while the last claim round reached the database
  and the heartbeat is fresh (three ``HEARTBEAT_INTERVAL``); 503 while it
  starts, while the database is unreachable, when the heartbeat stalls, and
  from the moment shutdown begins, so a readiness probe takes it out of
  rotation at once.

:class:`Health` is the state: a few monotonic timestamps written by the
claim loop and the lease keeper, read by the HTTP handler (single attribute
reads and writes, atomic under the GIL: no lock is needed).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_delayq.httpserver import (
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT,
    BoundedServerMixin,
    best_family,
)

logger = logging.getLogger("django_delayq.health")

#: A loop or heartbeat older than this many of its periods is stale.
STALE_PERIODS = 3
#: The probes' paths.
LIVE_PATH = "/healthz"
READY_PATH = "/readyz"


@dataclass(frozen=True)
class Verdict:
    """One probe's answer: its HTTP status and its JSON body."""

    ok: bool
    body: dict[str, Any]

    @property
    def status(self) -> int:
        return 200 if self.ok else 503


class Health:
    """What the probes read: when the loop turned, the heartbeat, the database, the stop.

    ``loop_period``: the longest the claim loop rests between turns when
    nothing is wrong; ``heartbeat_interval``: how often the keeper records
    the heartbeat. ``clock`` is ``time.monotonic`` (tests pass their own).
    """

    def __init__(
        self,
        *,
        loop_period: float,
        heartbeat_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.loop_stale_after = STALE_PERIODS * max(loop_period, heartbeat_interval)
        self.beat_stale_after = STALE_PERIODS * heartbeat_interval
        now = clock()
        self.started = now
        self.last_turn = now
        # How long the loop said it would be away after its last turn (a
        # reconnection backoff, the shutdown grace); 0 for an ordinary turn.
        self.pause = 0.0
        self.last_claim: float | None = None  # last claim round that reached the database
        self.last_beat: float | None = None  # last heartbeat recorded
        self.unreachable_since: float | None = None
        self.stopping_since: float | None = None

    # -- written by the worker ----------------------------------------------------

    def turned(self, pause: float = 0.0) -> None:
        """The claim loop turned; it may now be away for up to ``pause`` more.

        Once shutdown began, the shutdown grace is the pause that counts.
        """
        if self.stopping_since is None:
            self.last_turn = self.clock()
            self.pause = pause

    def reached_database(self) -> None:
        """A claim round went through: the database is reachable."""
        self.last_claim = self.clock()
        self.unreachable_since = None

    def database_failed(self) -> None:
        """A claim round failed on the database; the outage starts at the first failure."""
        if self.unreachable_since is None:
            self.unreachable_since = self.clock()

    def beat(self) -> None:
        """The heartbeat was recorded."""
        self.last_beat = self.clock()

    def stopping(self, grace: float) -> None:
        """Shutdown began; running handlers get up to ``grace`` seconds."""
        if self.stopping_since is None:
            self.last_turn = self.stopping_since = self.clock()
            self.pause = grace

    # -- read by the probes -------------------------------------------------------

    def outage(self) -> float:
        """Seconds since the database became unreachable (0 while it is reachable)."""
        since = self.unreachable_since
        return 0.0 if since is None else self.clock() - since

    def alive(self) -> Verdict:
        now = self.clock()
        ago = now - self.last_turn
        limit = self.loop_stale_after + self.pause
        ok = ago <= limit
        return Verdict(
            ok,
            {
                "status": "ok" if ok else "stale",
                "last_loop_seconds_ago": round(ago, 3),
                "stale_after_seconds": round(limit, 3),
            },
        )

    def ready(self) -> Verdict:
        now = self.clock()
        beat_ago = None if self.last_beat is None else now - self.last_beat
        unreachable = self.unreachable_since
        if self.stopping_since is not None:
            status = "stopping"
        elif unreachable is not None:
            status = "database unreachable"
        elif self.last_claim is None or beat_ago is None:
            status = "starting"
        elif beat_ago > self.beat_stale_after:
            status = "heartbeat stale"
        else:
            status = "ready"
        body: dict[str, Any] = {
            "status": status,
            "last_heartbeat_seconds_ago": None if beat_ago is None else round(beat_ago, 3),
        }
        if unreachable is not None:
            body["database_unreachable_seconds"] = round(now - unreachable, 3)
        return Verdict(status == "ready", body)


class _Server(BoundedServerMixin, ThreadingHTTPServer):
    """The probes' server: closes slow connections, caps them (``httpserver``)."""


class HealthServer:
    """``/healthz`` and ``/readyz`` over HTTP, from a daemon thread.

    The answers name the worker (``worker``: its name, ``host:pid`` by
    default) only with ``show_worker`` (``DELAYQ["HEALTH_SHOW_WORKER"]``):
    a probe needs the status, and whoever reaches the port need not learn the
    host's name and the process id.
    """

    def __init__(
        self,
        health: Health,
        *,
        port: int,
        address: str,
        worker: str,
        show_worker: bool | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.health = health
        self.port = port
        self.address = address
        self.worker = worker
        if show_worker is None:
            from django_delayq.conf import get_config

            show_worker = get_config()["HEALTH_SHOW_WORKER"] is True
        self.show_worker = show_worker
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen now (a taken port is an ``ImproperlyConfigured``) and serve in a thread."""
        shown = self.address or "0.0.0.0"
        try:
            family, address = best_family(self.address, self.port)
            server_class = type(
                "HealthHTTPServer",
                (_Server,),
                {
                    "address_family": family,
                    "request_timeout": self.request_timeout,
                    "max_connections": self.max_connections,
                },
            )
            server = server_class((address, self.port), self._handler())
        except OSError as exc:
            raise ImproperlyConfigured(
                f"cannot serve health checks on {shown}:{self.port}: {exc}"
            ) from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="delayq-health", daemon=True
        )
        self._thread.start()
        logger.info("health checks at http://%s:%s/healthz and /readyz", shown, self.port)

    @property
    def server_address(self) -> tuple[str, int] | None:
        """Where it listens (the bound socket's address), once started."""
        if self._server is None:
            return None
        return tuple(self._server.socket.getsockname()[:2])  # type: ignore[return-value]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        probes: dict[str, Callable[[], Verdict]] = {
            LIVE_PATH: self.health.alive,
            READY_PATH: self.health.ready,
        }
        named = {"worker": self.worker} if self.show_worker else {}

        class Handler(BaseHTTPRequestHandler):
            # No version of Python in the Server header.
            server_version = "delayq"
            sys_version = ""

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                probe = probes.get(self.path.split("?", 1)[0])
                if probe is None:
                    self._send(404, {"status": "not found", "paths": sorted(probes)})
                    return
                verdict = probe()
                self._send(verdict.status, {**verdict.body, **named})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                # A probe every few seconds: not worth a line each at INFO.
                logger.debug("%s %s", self.address_string(), format % args)

        return Handler
