"""System checks for the ``DELAYQ`` setting (ids ``django_delayq.E0xx``; see docs/checks.md)."""

from __future__ import annotations

import difflib
from datetime import timedelta
from typing import Any

from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

from django_delayq.conf import (
    DEFAULTS,
    DURATION_SETTINGS,
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_DELAY,
    MAX_PRUNE_BATCH_SIZE,
    PAYLOAD_SIZE_LIMIT,
)
from django_delayq.models import MAX_ATTEMPTS_LIMIT

#: The integer settings, and the most each may be.
POSITIVE_INTS = {
    "BATCH_SIZE": MAX_BATCH_SIZE,
    "CONCURRENCY": MAX_CONCURRENCY,
    "MAX_ATTEMPTS": MAX_ATTEMPTS_LIMIT,
    "PRUNE_BATCH_SIZE": MAX_PRUNE_BATCH_SIZE,
}
QUEUE_KEYS = (
    "LEASE",
    "MAX_ATTEMPTS",
    "RETRY_POLICY",
    "CONCURRENCY",
    "TIME_LIMIT",
    # Flow control across every worker (flow.py): per queue only.
    "RATE_LIMIT",
    "GLOBAL_CONCURRENCY",
    "GROUP_AFTER_FAILURE",
)
FLOW_KEYS = ("RATE_LIMIT", "GLOBAL_CONCURRENCY", "GROUP_AFTER_FAILURE")
# Settings later features read; accepted here so that they are not flagged.
KNOWN_EXTRA: tuple[str, ...] = ()


def _duration(value: Any) -> timedelta | None:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return timedelta(seconds=value)
        except (OverflowError, ValueError):
            # More seconds than a timedelta holds (1e15, an infinity, NaN):
            # reported as too long, or as negative.
            return timedelta.min if value < 0 else timedelta.max
    return None


def _check_value(name: str, value: Any, where: str) -> list[Error]:
    errors = []
    if name in DURATION_SETTINGS:
        if value is None and name in (
            "PRUNE_INTERVAL",
            "TIME_LIMIT",
            "ACK_DELAY",
            "CLAIM_DELAY",
            "DATABASE_OUTAGE_LIMIT",
        ):
            return []
        td = _duration(value)
        if td is None:
            errors.append(
                Error(
                    f"{where}{name} must be a datetime.timedelta or a number of seconds, "
                    f"got {value!r}",
                    id="django_delayq.E002",
                )
            )
        elif td < timedelta(0) or (td == timedelta(0) and name != "RETENTION"):
            errors.append(
                Error(f"{where}{name} must be positive, got {value!r}", id="django_delayq.E003")
            )
        elif td > MAX_DELAY:
            errors.append(
                Error(
                    f"{where}{name} must be at most {MAX_DELAY.days} days (about 1,000 years), "
                    f"got {value!r}",
                    id="django_delayq.E003",
                )
            )
    elif name in POSITIVE_INTS:
        if name == "BATCH_SIZE" and value is None:
            return []
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                Error(
                    f"{where}{name} must be a positive integer, got {value!r}",
                    id="django_delayq.E004",
                )
            )
        elif value > POSITIVE_INTS[name]:
            errors.append(
                Error(
                    f"{where}{name} must be at most {POSITIVE_INTS[name]:,}, got {value!r}",
                    id="django_delayq.E004",
                )
            )
    elif name == "MAX_PAYLOAD_SIZE":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            errors.append(
                Error(
                    f"{where}MAX_PAYLOAD_SIZE must be a positive integer or None, got {value!r}",
                    id="django_delayq.E004",
                )
            )
        elif value is not None and value > PAYLOAD_SIZE_LIMIT:
            errors.append(
                Error(
                    f"{where}MAX_PAYLOAD_SIZE must be at most {PAYLOAD_SIZE_LIMIT:,} bytes "
                    f"(255 MiB, what PostgreSQL's jsonb holds), got {value!r}",
                    id="django_delayq.E004",
                )
            )
    elif name == "RETRY_POLICY":
        from django_delayq.retry import resolve_policy

        try:
            resolve_policy(value)
        except (ImportError, TypeError, ValueError) as exc:
            errors.append(
                Error(f"{where}RETRY_POLICY is not usable: {exc}", id="django_delayq.E005")
            )
    elif name in FLOW_KEYS:
        errors.extend(_check_flow(name, value, where))
    elif name == "NOTIFY":
        if not isinstance(value, bool):
            errors.append(
                Error(
                    f"{where}NOTIFY must be True or False, got {value!r}", id="django_delayq.E004"
                )
            )
    return errors


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    from django.conf import settings

    user = getattr(settings, "DELAYQ", {})
    if not isinstance(user, dict):
        return [Error(f"DELAYQ must be a dict, got {type(user).__name__}", id="django_delayq.E001")]
    errors: list[Error | Warning] = []
    for name, value in user.items():
        if name not in DEFAULTS and name not in KNOWN_EXTRA:
            errors.append(
                Warning(
                    f"DELAYQ[{name!r}] is not a known setting",
                    hint=f"known settings: {', '.join(sorted(DEFAULTS))}",
                    id="django_delayq.W001",
                )
            )
            continue
        errors.extend(_check_value(name, value, "DELAYQ: "))
    beat = _duration(user.get("HEARTBEAT_INTERVAL", DEFAULTS["HEARTBEAT_INTERVAL"]))
    dead = _duration(user.get("WORKER_DEAD_AFTER", DEFAULTS["WORKER_DEAD_AFTER"]))
    if beat and dead and timedelta(0) < beat <= MAX_DELAY and dead < 2 * beat:
        # One late heartbeat (a slow query, a busy host) must not make a
        # live worker look dead and lose its messages to the others.
        errors.append(
            Error(
                f"DELAYQ: WORKER_DEAD_AFTER ({dead.total_seconds():g} s) must be at least "
                f"twice HEARTBEAT_INTERVAL ({beat.total_seconds():g} s)",
                id="django_delayq.E020",
            )
        )
    queues = user.get("QUEUES", {})
    if not isinstance(queues, dict):
        errors.append(
            Error(
                "DELAYQ['QUEUES'] must be a dict of queue name to overrides",
                id="django_delayq.E006",
            )
        )
        return errors
    for queue, overrides in queues.items():
        where = f"DELAYQ['QUEUES'][{queue!r}]: "
        from django_delayq.registry import validate_queue_name

        try:
            validate_queue_name(queue)
        except (TypeError, ValueError) as exc:
            errors.append(
                Error(
                    f"DELAYQ['QUEUES'] has a key that is not a queue: {exc}",
                    id="django_delayq.E006",
                )
            )
            continue
        if not isinstance(overrides, dict):
            errors.append(Error(f"{where}must be a dict", id="django_delayq.E006"))
            continue
        for name, value in overrides.items():
            if name not in QUEUE_KEYS:
                errors.append(
                    Error(
                        f"{where}{name!r} cannot be set per queue",
                        hint=f"per-queue settings: {', '.join(QUEUE_KEYS)}",
                        id="django_delayq.E006",
                    )
                )
                continue
            errors.extend(_check_value(name, value, where))
    return errors


@register(Tags.models)
def check_queue_names(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """Queues of ``DELAYQ["QUEUES"]`` that no handler of the project consumes (W002).

    Their settings apply to nothing here: most often a typo of a queue's
    name, which would otherwise leave the real queue with the defaults.
    (Handlers are registered once the apps are ready: a models check.)
    """
    from django_delayq.conf import get_config
    from django_delayq.registry import registry

    queues = get_config()["QUEUES"]
    if not isinstance(queues, dict):
        return []  # E006 says so
    known = set(registry.queues())
    problems: list[Error | Warning] = []
    for queue in queues:
        if isinstance(queue, str) and queue not in known:
            close = difflib.get_close_matches(queue, sorted(known), n=1)
            problems.append(
                Warning(
                    f"DELAYQ['QUEUES'] sets {queue!r}, which no handler of this project "
                    "consumes: its settings apply to nothing here",
                    hint=(f"did you mean {close[0]!r}? " if close else "")
                    + f"queues with a handler: {', '.join(sorted(known)) or 'none'}",
                    id="django_delayq.W002",
                )
            )
    return problems


@register(Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """``DELAYQ["SCHEDULES"]`` and ``@schedule`` declarations (E010-E015).

    Every problem names its schedule, so a typo stops ``manage.py check``
    and ``run_delayq`` at start-up instead of a worker meeting it later.
    """
    from django.conf import settings

    from django_delayq.cron.declared import get_schedules, schedule_problems
    from django_delayq.exceptions import HandlerNotFound
    from django_delayq.registry import registry

    if not isinstance(getattr(settings, "DELAYQ", {}), dict):
        return []  # E001 already says so
    errors: list[Error | Warning] = []
    for name, problem in schedule_problems():
        where = f"DELAYQ['SCHEDULES'][{name!r}]: " if name else ""
        errors.append(Error(f"{where}{problem}", id=problem.check_id))
    schedules = get_schedules(log=False)
    if schedules and not settings.USE_TZ:
        errors.append(
            Error(
                f"schedules ({', '.join(map(repr, schedules))}) need USE_TZ = True: "
                "tick times are aware datetimes",
                id="django_delayq.E010",
            )
        )
    for sched in schedules.values():
        try:
            registry.lookup(sched.queue, sched.kind)
        except HandlerNotFound:
            what = f"queue {sched.queue!r}" + (f" and kind {sched.kind!r}" if sched.kind else "")
            errors.append(
                Error(
                    f"schedule {sched.name!r}: no handler for {what}; its ticks would never run",
                    hint="define one with @handler in an installed app's handlers.py",
                    id="django_delayq.E015",
                )
            )
    return errors


@register(Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Error | Warning]:
    """Servers the queue cannot use, and keys that would merge (E050, E051, W050).

    A database check: it connects, so it runs in ``migrate``, ``check
    --database ALIAS`` and at the start of ``run_delayq``.
    """
    from django.db import connections, router

    from django_delayq.models import Message
    from django_delayq.store import server

    errors: list[Error | Warning] = []
    for alias in databases or ():
        if not router.allow_migrate_model(alias, Message):
            continue  # the queue does not live there (DelayQRouter, E091)
        connection = connections[alias]
        problem = server.version_problem(connection)
        if problem:
            errors.append(
                Error(f"database {alias!r}: {problem}", hint=problem.hint, id=problem.check_id)
            )
        columns = server.collation_problems(connection)
        if columns:
            errors.append(
                Warning(
                    f"database {alias!r}: the queue table's {' and '.join(columns)} ignore "
                    "case or trailing spaces, so keys 'a', 'A' and 'a ' would be one message",
                    hint=f"run once: {server.binary_columns_sql(connection)}",
                    id="django_delayq.W050",
                )
            )
    return errors


@register(Tags.compatibility)
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """``METRICS_PORT`` / ``METRICS_ADDRESS`` (E030, E031).

    An enabled port without ``prometheus-client`` would only fail when the
    worker starts; ``manage.py check`` says so first.
    """
    from django.conf import settings

    user = getattr(settings, "DELAYQ", {})
    if not isinstance(user, dict):
        return []  # E001 already says so
    errors = _server_errors(user, "METRICS", "django_delayq.E031")
    if user.get("METRICS_PORT"):
        from django_delayq.metrics import available

        if not available():
            errors.append(
                Error(
                    "DELAYQ: METRICS_PORT is set but prometheus-client is not installed",
                    hint="pip install 'django-delayq[prometheus]'",
                    id="django_delayq.E030",
                )
            )
    return errors


@register(Tags.compatibility)
def check_health(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """``HEALTH_PORT`` / ``HEALTH_ADDRESS`` / ``HEALTH_SHOW_WORKER`` (E032): caught before
    a worker tries to listen."""
    from django.conf import settings

    user = getattr(settings, "DELAYQ", {})
    if not isinstance(user, dict):
        return []  # E001 already says so
    errors = _server_errors(user, "HEALTH", "django_delayq.E032")
    show = user.get("HEALTH_SHOW_WORKER", False)
    if not isinstance(show, bool):
        errors.append(
            Error(
                f"DELAYQ: HEALTH_SHOW_WORKER must be True or False, got {show!r}",
                id="django_delayq.E032",
            )
        )
    return errors


def _server_errors(user: dict[str, Any], prefix: str, check_id: str) -> list[Error | Warning]:
    """``<prefix>_PORT`` is a TCP port or None and ``<prefix>_ADDRESS`` a str: the
    metrics and the health servers are configured alike."""
    from django_delayq.values import is_int_between

    errors: list[Error | Warning] = []
    port = user.get(f"{prefix}_PORT")
    if port is not None and not is_int_between(port, 1, 65535):
        errors.append(
            Error(
                f"DELAYQ: {prefix}_PORT must be a TCP port (1-65535) or None, got {port!r}",
                id=check_id,
            )
        )
    address = user.get(f"{prefix}_ADDRESS", "")
    if not isinstance(address, str):
        errors.append(
            Error(f"DELAYQ: {prefix}_ADDRESS must be a str, got {address!r}", id=check_id)
        )
    return errors


def _check_flow(name: str, value: Any, where: str) -> list[Error]:
    """A queue's rate limit, global cap or GROUP_AFTER_FAILURE (E007)."""
    from django_delayq.flow import GROUP_AFTER_FAILURE, FlowError, parse_cap, parse_rate

    if value is None and name != "GROUP_AFTER_FAILURE":
        return []  # no limit, as flow.limits_of reads it
    try:
        if name == "RATE_LIMIT":
            parse_rate(value, name)
        elif name == "GLOBAL_CONCURRENCY":
            parse_cap(value, name)
        elif value not in GROUP_AFTER_FAILURE:
            raise FlowError(
                f"GROUP_AFTER_FAILURE must be one of {', '.join(map(repr, GROUP_AFTER_FAILURE))}, "
                f"got {value!r}"
            )
    except FlowError as exc:
        return [Error(f"{where}{exc}", id="django_delayq.E007")]
    return []


@register(Tags.models)
def check_flow_limits(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """Global limits on a queue whose handler consumes a model's rows (E008): they
    apply to queues of messages only."""
    from django_delayq.conf import get_config
    from django_delayq.registry import registry

    queues = get_config()["QUEUES"]
    if not isinstance(queues, dict):
        return []  # E006 says so
    problems: list[Error | Warning] = []
    for spec in registry.all():
        own = queues.get(spec.queue)
        if spec.model is None or not isinstance(own, dict):
            continue
        named = [k for k in ("RATE_LIMIT", "GLOBAL_CONCURRENCY") if own.get(k) is not None]
        if named:
            problems.append(
                Error(
                    f"DELAYQ['QUEUES'][{spec.queue!r}] sets {' and '.join(named)}, but the "
                    f"queue holds the rows of {spec.model._meta.label}: global limits apply "
                    "to queues of messages only",
                    hint="limit a queue of messages, or use CONCURRENCY (per worker)",
                    obj=spec.model,
                    id="django_delayq.E008",
                )
            )
    return problems


@register(Tags.models)
def check_queue_models(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """Models registered with ``@handler(..., model=...)`` keep their claim index.

    A model that declares its own ``Meta`` without inheriting
    ``QueueFields.Meta`` loses the index, and every claim scans the table.
    """
    from django_delayq.operations import has_priority
    from django_delayq.registry import registry

    problems: list[Error | Warning] = []
    for spec in registry.all():
        model = spec.model
        if model is None:
            continue
        indexed = any(
            index.fields and index.fields[-1].lstrip("-") == "next_attempt_time"
            for index in model._meta.indexes
        )
        by_priority = any(
            list(index.fields) == ["-priority", "next_attempt_time"]
            for index in model._meta.indexes
        )
        if indexed and not by_priority and has_priority(model):
            problems.append(
                Warning(
                    f"{model._meta.label} (queue {spec.queue!r}) has a priority column but no "
                    "index on (-priority, next_attempt_time): every claim sorts the due rows",
                    hint="list django_delayq.entity.claim_index('<name>', priority=True) "
                    "in Meta.indexes",
                    obj=model,
                    id="django_delayq.W061",
                )
            )
        if not indexed:
            problems.append(
                Warning(
                    f"{model._meta.label} (queue {spec.queue!r}) has no index ending with "
                    "next_attempt_time: every claim would scan its table",
                    hint="declare Meta as `class Meta(QueueFields.Meta):`, or add "
                    "django_delayq.entity.claim_index('<name>') to Meta.indexes",
                    obj=model,
                    id="django_delayq.W060",
                )
            )
    return problems


@register(Tags.compatibility)
def check_listen_database(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """``LISTEN_DATABASE`` names a PostgreSQL alias of the queue's database (E080, E081, W081)."""
    from django.conf import settings
    from django.db import connections

    from django_delayq.routers import queue_alias

    user = getattr(settings, "DELAYQ", {})
    alias = user.get("LISTEN_DATABASE") if isinstance(user, dict) else None
    if alias is None:
        return []
    databases = connections.settings
    if not isinstance(alias, str) or alias not in databases:
        return [
            Error(
                f"DELAYQ['LISTEN_DATABASE'] must be an alias of DATABASES, got {alias!r}",
                hint=f"aliases: {', '.join(map(repr, databases))}",
                id="django_delayq.E080",
            )
        ]
    engine = str(databases[alias].get("ENGINE", ""))
    if not engine.startswith("django.db.backends.postgresql"):
        return [
            Error(
                f"DELAYQ['LISTEN_DATABASE'] names {alias!r}, which is not PostgreSQL "
                f"({engine}): LISTEN/NOTIFY is PostgreSQL's",
                id="django_delayq.E081",
            )
        ]
    try:
        using = queue_alias()
    except ImproperlyConfigured:
        return []  # E090 says why
    listen_name = databases[alias].get("NAME")
    queue_name = databases.get(using, {}).get("NAME")
    if listen_name != queue_name:
        return [
            Warning(
                f"DELAYQ['LISTEN_DATABASE'] names {alias!r} (database {listen_name!r}), but "
                f"the queue is in {using!r} (database {queue_name!r}): notifications are "
                "per database, so workers would hear none",
                hint="point the alias at the queue's database, without the pooler",
                id="django_delayq.W081",
            )
        ]
    return []


@register(Tags.database)
def check_notifications(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Error | Warning]:
    """Idle workers would poll because notifications do not reach them (W080).

    A database check (``migrate``, ``check --database``, ``run_delayq``): a
    pooler in transaction mode is not visible in the settings, so this one
    LISTENs and NOTIFYs for real (``worker.listen``), in at most two seconds.
    """
    from django_delayq.conf import get_config, to_timedelta
    from django_delayq.routers import queue_alias
    from django_delayq.worker.listen import probe_mode

    config = get_config()
    try:
        using = queue_alias()
    except ImproperlyConfigured:
        return []  # E090 says why
    if using not in (databases or ()) or config["NOTIFY"] is not True:
        return []
    try:
        interval = to_timedelta(config["POLL_INTERVAL"]).total_seconds()
    except (TypeError, ValueError):
        return []  # E002 says so
    mode = probe_mode(using, interval)
    if not mode.degraded:
        return []
    return [
        Warning(
            f"idle workers would be {mode.line.removeprefix('wake-up: ')}",
            hint="see the PgBouncer section of the deployment guide",
            id="django_delayq.W080",
        )
    ]


@register(Tags.compatibility)
def check_queue_database(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """``DELAYQ["DATABASE"]`` and the database routers agree (E090, E091, W090)."""
    from django_delayq.routers import model_queue_problems, routing_problems

    return routing_problems() or model_queue_problems()
