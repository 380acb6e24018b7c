"""Settings: one ``DELAYQ`` dict laid over documented defaults.

The merged view is cached because the worker reads it on every loop; a
``setting_changed`` receiver (wired in ``apps.py``) drops the cache so
``override_settings(DELAYQ=...)`` works in tests.

The comment above each key of ``DEFAULTS`` is that setting's entry in the
documentation's settings reference (generated from this file): every key
needs one.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # The DATABASES alias the queue's tables live on (Message, queue, flow
    # and worker state); None: where the database routers send Message
    # ("default" without routers). An explicit using= or --database wins.
    # Add "django_delayq.routers.DelayQRouter" to DATABASE_ROUTERS so that
    # the admin and migrate follow it; enqueue is then not part of a
    # transaction on another alias (see the deployment guide).
    "DATABASE": None,
    # How long a claimed message stays invisible to other workers. The
    # worker extends it while the handler runs, so this bounds how long a
    # crashed worker's message waits before it is redelivered.
    "LEASE": timedelta(seconds=60),
    # Longest idle sleep between two claims (LISTEN/NOTIFY wakes earlier).
    "POLL_INTERVAL": timedelta(seconds=5),
    # Messages claimed per round trip. None: adaptive, sized to about 0.1 s of
    # the queue's recent work (from one per handler slot for slow handlers
    # up to 100 for fast ones); a worker also claims the next batch while
    # the current one runs. At most 10,000.
    "BATCH_SIZE": None,
    # Handler threads per worker process, 1 to 1,000.
    "CONCURRENCY": 1,
    # Attempts before a message is marked failed (handler option overrides).
    "MAX_ATTEMPTS": 5,
    # The retry policy: an instance, a class or a dotted path to either
    # (see ``retry.py``).
    "RETRY_POLICY": "django_delayq.retry.ExponentialBackoff",
    # Finished messages are kept this long, then pruned.
    "RETENTION": timedelta(days=7),
    # Rows deleted per pruning statement (bounded so a prune never holds
    # long locks on a big table), 1 to 10,000.
    "PRUNE_BATCH_SIZE": 1000,
    # How often a running worker prunes; None disables worker pruning.
    "PRUNE_INTERVAL": timedelta(minutes=5),
    # Largest accepted payload, in bytes of its JSON encoding, at most 255 MiB
    # (what PostgreSQL's jsonb holds); None: no limit of this app's (the
    # database's own still applies).
    "MAX_PAYLOAD_SIZE": 1024 * 1024,
    # On SIGTERM/SIGINT, how long in-flight handlers may run before their
    # messages are released for redelivery.
    "SHUTDOWN_GRACE": timedelta(seconds=30),
    # Wake idle workers on the commit of an enqueue: NOTIFY and LISTEN on
    # PostgreSQL, local sockets on SQLite (store/localwake.py).
    "NOTIFY": True,
    # An alias of DATABASES that reaches the queue's database without a
    # connection pooler, for the idle workers' LISTEN. Behind PgBouncer in
    # transaction mode a LISTEN on the pooled connection hears nothing, and
    # workers would poll (pickup within POLL_INTERVAL instead of
    # milliseconds); everything else still goes through the pool.
    # None: LISTEN on the queue's own alias (run_delayq says if that fails).
    "LISTEN_DATABASE": None,
    # How often each worker records its heartbeat (DelayQ's worker table).
    "HEARTBEAT_INTERVAL": timedelta(seconds=5),
    # A worker whose heartbeat is older than this is dead: live workers hand
    # its messages back at once instead of waiting for their leases. Keep it
    # several heartbeats long, so a slow database is not taken for a death.
    "WORKER_DEAD_AFTER": timedelta(seconds=30),
    # Longest a handler may run (handler option time_limit= overrides); past
    # it the attempt is recorded as failed and retried by the retry policy.
    # None: no limit (the lease keeper keeps the message while it runs).
    "TIME_LIMIT": None,
    # Per-queue settings, by queue name (a queue no handler consumes is the
    # warning W002: a typo?): overrides of LEASE, MAX_ATTEMPTS,
    # RETRY_POLICY, CONCURRENCY and TIME_LIMIT, and the queue's flow control
    # across every worker: RATE_LIMIT ("100/m"), GLOBAL_CONCURRENCY (3) and
    # GROUP_AFTER_FAILURE ("block" or "continue"), which exist per queue only.
    "QUEUES": {},
    # Recurring messages, by name (see ``cron/spec.py``): {"cron": ...} or
    # {"every": ...} plus queue, payload, timezone, catch_up, ...
    "SCHEDULES": {},
    # How often each worker installs the next ticks of every schedule; it
    # installs two intervals ahead, so ticks never run out while one runs.
    "CRON_INSTALL_INTERVAL": timedelta(seconds=60),
    # Serve Prometheus metrics from run_delayq on this port (needs the
    # ``prometheus`` extra); None: no metrics. ``--metrics-port`` overrides.
    "METRICS_PORT": None,
    # Address the metrics server listens on: the loopback interface by
    # default, so only this host scrapes it; "0.0.0.0" (or ""): every IPv4
    # interface, "::": every IPv6 one, for a Prometheus on another host or
    # outside the container (see the security page).
    "METRICS_ADDRESS": "127.0.0.1",
    # How often a worker samples queue depth and lag for its metrics.
    "METRICS_INTERVAL": timedelta(seconds=15),
    # Serve /healthz (alive: the claim loop turns) and /readyz (ready: it
    # reaches the database and records its heartbeat; 503 while starting,
    # while the database is unreachable and once shutdown began) from
    # run_delayq on this port, for a supervisor's probes; None: no health
    # server. ``--health-port`` overrides.
    "HEALTH_PORT": None,
    # Address the health server listens on: the loopback interface by
    # default; "0.0.0.0" (or ""): every IPv4 interface, "::": every IPv6 one,
    # for probes from outside the host or container (Kubernetes' kubelet
    # probes the pod's IP: see the deployment guide).
    "HEALTH_ADDRESS": "127.0.0.1",
    # Whether /healthz and /readyz name the worker in their answers
    # ("worker": its name, host:pid by default). Off: whoever reaches the
    # port learns the worker's state, not the host's name and process id.
    "HEALTH_SHOW_WORKER": False,
    # How long a worker keeps reconnecting to an unreachable database before
    # it stops and exits with status 75, so that its supervisor restarts it
    # (or alerts); what it held comes back by lease expiry. None: reconnect
    # for ever. ``--database-outage-limit`` overrides.
    "DATABASE_OUTAGE_LIMIT": None,
    # Successes of non-atomic handlers are acknowledged together: one
    # compare-and-set statement per batch, committed at most this long after
    # the first of them finished (PostgreSQL); where successes come so
    # densely that at least four more are expected within ten times this
    # (80 a second and more at 5 ms), new messages keep coming, and fewer
    # than ten have come within it, up to ten times this long. A success
    # that something waits for (the next message of its group, a workflow's
    # children, a place under a global limit) still closes its batch within
    # this delay. A longer delay means fewer commits but a longer window in
    # which a killed worker's finished messages are redelivered and run
    # again. Atomic handlers that finish within it share one transaction,
    # each in a savepoint of its own. None: one commit per message.
    "ACK_DELAY": timedelta(milliseconds=5),
    # The longest a notification waits to be claimed together with the next
    # ones, and only where that pays: when messages come densely enough that
    # at least one more is expected within it (the time between two lately
    # is at most the delay: 170 a second and more at 6 ms), the worker waits
    # (up to this long, as long as the messages expected take to come)
    # without waking for each and claims them in one statement.
    # Sparser streams, and an idle worker, claim every notification at once.
    # Longer: denser streams share claims (25 ms: from 40 a second, five or
    # six messages a claim at 200 a second) for less CPU per message and
    # more pickup latency. None: claim for every notification at once.
    "CLAIM_DELAY": timedelta(milliseconds=6),
}

DURATION_SETTINGS = (
    "ACK_DELAY",
    "CLAIM_DELAY",
    "LEASE",
    "POLL_INTERVAL",
    "RETENTION",
    "SHUTDOWN_GRACE",
    "PRUNE_INTERVAL",
    "CRON_INSTALL_INTERVAL",
    "METRICS_INTERVAL",
    "DATABASE_OUTAGE_LIMIT",
    "HEARTBEAT_INTERVAL",
    "WORKER_DEAD_AFTER",
    "TIME_LIMIT",
)


#: The longest duration accepted: a delay (``enqueue(delay=)``, ``Retry(delay=)``,
#: the admin's reschedule; a retry policy's longer delay is cut to it), a
#: lease, a time limit, a schedule's period or grace, a retention. About 1,000
#: years: a due time computed from one stays far inside what every database
#: and Python's ``datetime`` hold (up to the year 9999).
MAX_DELAY = timedelta(days=365_000)


#: The most handler threads (``CONCURRENCY``, ``--concurrency``, a queue's or a
#: handler's ``concurrency``) a worker process runs: each is a thread with its own
#: database connection.
MAX_CONCURRENCY = 1_000
#: The most messages one claim takes (``BATCH_SIZE``, ``--batch-size``).
MAX_BATCH_SIZE = 10_000
#: The most rows one pruning statement deletes (``PRUNE_BATCH_SIZE``,
#: ``delayq_prune --batch-size``): their ids are the statement's parameters, and
#: SQLite takes at most 32,766.
MAX_PRUNE_BATCH_SIZE = 10_000
#: The largest ``MAX_PAYLOAD_SIZE``, in bytes: 255 MiB, what PostgreSQL's jsonb holds.
PAYLOAD_SIZE_LIMIT = 255 * 1024 * 1024


def check_count(value: object, name: str, high: int = MAX_CONCURRENCY) -> int:
    """``value`` if it is an int (not a bool) from 1 to ``high``, else a ``TypeError`` or
    ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer from 1 to {high:,}, got {value!r}")
    if not 1 <= value <= high:
        raise ValueError(f"{name} must be from 1 to {high:,}, got {value!r}")
    return value


def to_timedelta(value: timedelta | int | float, name: str = "") -> timedelta:
    """Every duration accepts a ``timedelta`` or a number of seconds.

    A number no ``timedelta`` can hold (an infinity, NaN, or past 999,999,999
    days) is a ``ValueError``; ``name``, when given, starts the message.
    """
    if isinstance(value, timedelta):
        return value
    prefix = f"{name}: " if name else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{prefix}expected a datetime.timedelta or a number of seconds, "
            f"got {type(value).__name__}"
        )
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError):
        raise ValueError(f"{prefix}{value!r} seconds is out of range") from None


def check_max_delay(delta: timedelta, name: str, value: object = None) -> timedelta:
    """``delta``, or a ``ValueError`` naming ``name`` if it is longer than ``MAX_DELAY``."""
    if delta > MAX_DELAY:
        shown = delta if value is None else value
        raise ValueError(
            f"{name} must be at most {MAX_DELAY.days} days (about 1,000 years), got {shown!r}"
        )
    return delta


def check_delay(value: timedelta | int | float, name: str = "delay") -> timedelta:
    """A delay from now: a duration from zero to ``MAX_DELAY``; errors name ``name``."""
    delta = to_timedelta(value, name)
    if delta < timedelta(0):
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return check_max_delay(delta, name, value)


@functools.cache
def get_config() -> dict[str, Any]:
    """The user's ``DELAYQ`` laid over ``DEFAULTS``; durations normalised.

    Invalid values are reported by the system checks (``checks.py``); here
    they are left as given so that ``manage.py check`` can name them.
    """
    user = getattr(settings, "DELAYQ", {}) or {}
    config = {**DEFAULTS, **user}
    for name in DURATION_SETTINGS:
        value = config[name]
        if value is None:
            continue
        try:
            config[name] = to_timedelta(value)
        except (TypeError, ValueError):
            pass
    return config


def clear_cache(**kwargs: Any) -> None:
    """Forget the settings read so far (``setting_changed``, wired in ``apps.py``
    with the caches of the modules above this one)."""
    if kwargs.get("setting") in (None, "DELAYQ"):
        get_config.cache_clear()
