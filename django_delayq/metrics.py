"""Prometheus metrics of a worker (optional: the ``prometheus`` extra).

``run_delayq --metrics-port 9108`` (or ``DELAYQ["METRICS_PORT"]``) serves
them at ``http://127.0.0.1:9108/metrics`` (``METRICS_ADDRESS`` chooses the
interface) with ``prometheus_client``'s WSGI application on the standard
library's server, bounded as ``httpserver`` says, from the default registry,
so the process's CPU/memory metrics and any metric a project's handlers
define are exposed beside them:

* ``delayq_messages_processed_total{queue, outcome}``: attempts by how they
  ended (``succeeded``, ``retrying``, ``snoozed``, ``failed``, ``discarded``,
  ``lease_lost``, ``unrecorded``); failures per queue are
  ``outcome=~"retrying|failed"``.
* ``delayq_processing_seconds{queue}``: histogram of the time from a
  handler's start to its recorded outcome.
* ``delayq_queue_depth{queue, state}``: active messages of this worker's
  queues: ``due`` (waiting to be claimed), ``scheduled`` (due later),
  ``running`` and ``waiting_for_parents`` (a workflow's steps, ``after=``);
  ``delayq_queue_lag_seconds{queue}``: how long the oldest due message has
  waited. Both are sampled every ``METRICS_INTERVAL`` by grouped queries
  over the active rows (the claim and due indexes), and are the same for
  every worker of a queue: aggregate them with ``max``.
* ``delayq_throttled{queue, kind}``: 1 while due messages wait because a
  global limit is reached (the rate's window is full or the cap's running
  messages are at the cap), for the queue's own limits (``kind=""``, 0 for a
  queue without) and for each limited kind; ``delayq_group_held_messages{queue}``:
  messages waiting behind an earlier message of their group;
  ``delayq_blocked_groups{queue}``: groups whose first message is failing
  (waiting for a retry, or failed where that blocks the group). Sampled with
  depth and lag (``flowstats.flow_stats``), the same for every worker of a
  queue.
* ``delayq_worker_up``: 1 while the worker runs;
  ``delayq_worker_last_loop_timestamp_seconds``: when its claim loop last
  turned (at least once per ``POLL_INTERVAL``), to alert on a stuck worker;
  ``delayq_worker_info{worker, queues}``.

Nothing here is imported unless metrics are enabled; the system check
``django_delayq.E030`` reports an enabled port without ``prometheus-client``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, reset_queries

from django_delayq import clock
from django_delayq.flowstats import QueueFlow, flow_stats
from django_delayq.httpserver import MAX_CONNECTIONS, REQUEST_TIMEOUT
from django_delayq.models import Message

logger = logging.getLogger("django_delayq.metrics")

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
DEPTH_STATES = ("due", "scheduled", "running", "waiting_for_parents")

_lock = threading.Lock()
_metrics: dict[str, Any] = {}


def available() -> bool:
    """Whether ``prometheus-client`` can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def _define() -> dict[str, Any]:
    """The metric objects, created once per process in the default registry."""
    with _lock:
        if _metrics:
            return _metrics
        from prometheus_client import Counter, Gauge, Histogram, Info

        _metrics.update(
            processed=Counter(
                "delayq_messages_processed",
                "Attempts by queue and how they ended.",
                ["queue", "outcome"],
            ),
            duration=Histogram(
                "delayq_processing_seconds",
                "Time from a handler's start to its recorded outcome.",
                ["queue"],
                buckets=BUCKETS,
            ),
            depth=Gauge(
                "delayq_queue_depth",
                "Active messages by queue and state (due, scheduled, running), sampled.",
                ["queue", "state"],
            ),
            lag=Gauge(
                "delayq_queue_lag_seconds",
                "Age of the oldest due message of the queue, sampled.",
                ["queue"],
            ),
            throttled=Gauge(
                "delayq_throttled",
                "1 while due messages wait for a rate limit or concurrency cap, by queue "
                "and limited kind (empty: the queue's own limits), sampled.",
                ["queue", "kind"],
            ),
            group_held=Gauge(
                "delayq_group_held_messages",
                "Messages waiting behind an earlier message of their group, sampled.",
                ["queue"],
            ),
            blocked_groups=Gauge(
                "delayq_blocked_groups",
                "Groups whose first message is failing (waiting for a retry, or failed), sampled.",
                ["queue"],
            ),
            up=Gauge("delayq_worker_up", "1 while this worker runs."),
            last_loop=Gauge(
                "delayq_worker_last_loop_timestamp_seconds",
                "Unix time of the worker's last claim loop turn.",
            ),
            info=Info("delayq_worker", "This worker's name and queues."),
        )
        return _metrics


def serve(
    port: int,
    address: str,
    *,
    request_timeout: float = REQUEST_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> Any:
    """Serve the default registry (``prometheus_client.make_wsgi_app``) from a daemon
    thread, with the bounds of ``httpserver``; the server (``shutdown()``, ``server_close()``)."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from prometheus_client import make_wsgi_app

    from django_delayq.httpserver import BoundedServerMixin, best_family

    class Handler(WSGIRequestHandler):
        server_version = "delayq"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s %s", self.address_string(), format % args)

    family, host = best_family(address, port)
    server_class = type(
        "MetricsHTTPServer",
        (BoundedServerMixin, ThreadingMixIn, WSGIServer),
        {
            "address_family": family,
            "request_timeout": request_timeout,
            "max_connections": max_connections,
        },
    )
    server = server_class((host, port), Handler)
    server.set_app(make_wsgi_app())
    threading.Thread(target=server.serve_forever, name="delayq-metrics-http", daemon=True).start()
    return server


class WorkerMetrics:
    """The metrics of one worker: its HTTP server, counters and depth sampler."""

    def __init__(
        self,
        *,
        port: int,
        address: str,
        interval: timedelta,
        queues: Sequence[str],
        using: str,
    ) -> None:
        if not available():
            raise ImproperlyConfigured(
                "metrics need prometheus-client: pip install 'django-delayq[prometheus]'"
            )
        self.port = port
        self.address = address
        self.interval = interval.total_seconds()
        self.queues = list(queues)
        self.using = using
        self._m = _define()
        self._server: Any = None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self, worker_name: str) -> None:
        """Serve ``/metrics`` and start sampling queue depth and lag."""
        try:
            self._server = serve(self.port, self.address)
        except OSError as exc:
            raise ImproperlyConfigured(
                f"cannot serve metrics on {self.address or '0.0.0.0'}:{self.port}: {exc}"
            ) from exc
        self._m["info"].info({"worker": worker_name, "queues": ",".join(self.queues)})
        self._m["up"].set(1)
        self.loop()
        logger.info("metrics at http://%s:%s/metrics", self.address or "0.0.0.0", self.port)
        self._sampler = threading.Thread(
            target=self._sample_loop, name="delayq-metrics", daemon=True
        )
        self._sampler.start()

    def stop(self) -> None:
        self._m["up"].set(0)
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def loop(self) -> None:
        """The claim loop turned: the worker is alive."""
        self._m["last_loop"].set(time.time())

    def processed(self, queue: str, outcome: str, seconds: float) -> None:
        self._m["processed"].labels(queue, outcome).inc()
        self._m["duration"].labels(queue).observe(seconds)

    # -- depth and lag ------------------------------------------------------------

    def sample(self) -> None:
        """Read depth and lag of this worker's queues (one grouped query on active
        rows), then their flow control."""
        now = clock.now()
        messages = Message.objects.using(self.using).in_queues(self.queues)
        waiting = messages.waiting_by_queue()
        rows = {
            queue: {
                "due": row["due"],
                "scheduled": row["scheduled"] + row["retrying"],
                "running": row["leased"],
                "oldest_due": row["oldest_due"],
                "waiting_for_parents": waiting.get(queue, 0),
            }
            for queue, row in messages.depth_by_queue(now).items()
        }
        for queue in self.queues:
            row = rows.get(queue, {})
            for state in DEPTH_STATES:
                self._m["depth"].labels(queue, state).set(row.get(state, 0))
            oldest = row.get("oldest_due")
            lag = (now - oldest).total_seconds() if oldest is not None else 0.0
            self._m["lag"].labels(queue).set(max(0.0, lag))
        self.sample_flow()

    def sample_flow(self) -> None:
        """Throttled limits, held messages and blocked groups of this worker's queues."""
        flows = {flow.queue: flow for flow in flow_stats(self.queues, using=self.using)}
        for queue in self.queues:
            flow = flows.get(queue) or QueueFlow(queue)
            throttled = {s.kind: s.throttled for s in flow.scopes}
            throttled.setdefault("", False)
            for kind, value in throttled.items():
                self._m["throttled"].labels(queue, kind).set(1 if value else 0)
            self._m["group_held"].labels(queue).set(flow.held)
            self._m["blocked_groups"].labels(queue).set(flow.blocked)

    def _sample_loop(self) -> None:
        try:
            while not self._stop.is_set():
                reset_queries()  # DEBUG's query log of this thread's connection
                try:
                    self.sample()
                except DatabaseError:
                    logger.warning("could not sample queue depth for metrics", exc_info=True)
                    connections[self.using].close()
                self._stop.wait(self.interval)
        finally:
            connections.close_all()
