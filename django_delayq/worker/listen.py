"""Where an idle worker LISTENs, and whether notifications really reach it there.

A LISTEN is session state. Through a pooler in transaction mode (PgBouncer's
``pool_mode = transaction``) the session that ran it goes back to the pool at
once: producers' NOTIFYs are then delivered to whichever client borrows that
server connection next, never to the worker, and the worker's pickup latency
silently becomes its poll interval. Nothing in the connection says so (a
pooler speaks the server's protocol, and ``SHOW pool_mode`` is a statement of
PgBouncer's admin console only), so the worker asks the one question that
matters: it LISTENs on a fresh channel, sends a NOTIFY on it from a separate
connection and transaction of the queue's database alias, as a producer
would, and waits a short, bounded time for it to arrive.

``DELAYQ["LISTEN_DATABASE"]`` names an alias of ``DATABASES`` that reaches the
same database without the pooler; the worker then LISTENs there while every
other statement still goes through the pool.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connections

from django_delayq.conf import get_config
from django_delayq.store import direct
from django_delayq.store.features import features
from django_delayq.store.wakeup import NOTIFY_CHANNEL

logger = logging.getLogger("django_delayq.worker")

#: How long the probe waits for its own notification. A direct connection
#: delivers it within milliseconds; a pooler in transaction mode never does.
PROBE_TIMEOUT = 2.0

# Connection parameters Django adds for its own cursors, not psycopg.connect's.
_DJANGO_ONLY_PARAMS = ("cursor_factory", "context", "server_side_binding")

#: Why a worker polls when notifications sent through its own alias do not reach it.
NO_NOTIFICATIONS = (
    "connection {alias!r} does not deliver notifications (a pooler in transaction mode?); "
    "set DELAYQ['LISTEN_DATABASE'] to a direct alias"
)


def listen_alias(using: str) -> str:
    """The alias to LISTEN on: ``DELAYQ["LISTEN_DATABASE"]``, else the queue's own."""
    return get_config()["LISTEN_DATABASE"] or using


def connect(alias: str) -> Any:
    """A new autocommit psycopg connection from the alias's settings (not Django's).

    Autocommit, so a LISTEN never sits in a transaction (a notification is
    delivered only between transactions). The alias's ``prepare_threshold``
    (None unless the user set it) is kept: no prepared statements otherwise.
    """
    import psycopg

    return psycopg.connect(**connection_params(alias), autocommit=True)


def connection_params(alias: str) -> dict[str, Any]:
    """The alias's psycopg connection parameters, without those only Django's wrapper takes."""
    params = dict(connections[alias].get_connection_params())
    for name in _DJANGO_ONLY_PARAMS:
        params.pop(name, None)
    return params


def hears_notify(listener: Any, using: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """True if a NOTIFY sent through ``using`` reaches ``listener`` within ``timeout``.

    The channel is new (so no producer's notification answers it) and is
    unlistened again on success; on failure the LISTEN went to a pooled
    server connection, where it stays harmless since nothing notifies it.
    """
    channel = f"django_delayq_probe_{uuid.uuid4().hex}"
    listener.execute(f'LISTEN "{channel}"')
    sender = connect(using)
    try:
        sender.execute("SELECT pg_notify(%s, '')", [channel])
    finally:
        sender.close()
    heard = any(n.channel == channel for n in listener.notifies(timeout=timeout, stop_after=1))
    if heard:
        listener.execute(f'UNLISTEN "{channel}"')
    return heard


@dataclass(frozen=True)
class Mode:
    """How the worker wakes up, and the start-up line that says so."""

    listening: bool
    line: str
    # Polling where a listener was wanted: worth a warning, not an info line.
    degraded: bool = False


def _seconds(value: float) -> str:
    return f"{value:g} s"


def polling(interval: float, why: str, *, degraded: bool = False) -> Mode:
    return Mode(False, f"wake-up: polling every {_seconds(interval)}: {why}", degraded)


def open_listener(using: str, interval: float) -> tuple[Any, Mode]:
    """The LISTEN connection for a worker of alias ``using`` (or None), and its mode.

    The connection comes from ``listen_alias(using)``; it listens on the
    queue's channel only once a probe proved that notifications sent through
    ``using`` reach it.
    """
    alias = listen_alias(using)
    if not features(connections[using]).notify or connections[alias].vendor != "postgresql":
        return None, polling(interval, f"{connections[using].vendor} has no LISTEN/NOTIFY")
    try:
        import psycopg  # noqa: F401
    except ImportError:  # pragma: no cover - psycopg2 users poll
        return None, polling(interval, "LISTEN needs psycopg 3")
    try:
        conn = connect(alias)
    except Exception as exc:
        logger.warning("LISTEN connection to alias %r failed", alias, exc_info=True)
        return None, polling(interval, f"cannot connect to alias {alias!r}: {exc}", degraded=True)
    try:
        heard = hears_notify(conn, using)
        if heard:
            conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
    except Exception as exc:
        conn.close()
        logger.warning("LISTEN on alias %r failed", alias, exc_info=True)
        return None, polling(interval, f"LISTEN on alias {alias!r} failed: {exc}", degraded=True)
    if not heard:
        conn.close()
        if alias == using:
            why = NO_NOTIFICATIONS.format(alias=alias)
        else:
            why = (
                f"a LISTEN on alias {alias!r} does not hear a NOTIFY sent through {using!r} "
                "(not the same database? a pooler in transaction mode?)"
            )
        return None, polling(interval, why, degraded=True)
    if alias == using:
        # A session that keeps its LISTEN keeps its prepared statements too.
        direct.sessions_proven(using)
    return conn, Mode(True, f"wake-up: LISTEN on alias {alias!r} (pickup within milliseconds)")


def relisten(using: str) -> Any:
    """A new LISTEN connection after the last one was lost (probed already at start)."""
    conn = connect(listen_alias(using))
    try:
        conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
    except BaseException:
        conn.close()
        raise
    return conn


def probe_mode(using: str, interval: float) -> Mode:
    """For the system check: the mode a worker of ``using`` would start in.

    Opens and closes its connections.
    """
    conn, mode = open_listener(using, interval)
    if conn is not None:
        conn.close()
    return mode
