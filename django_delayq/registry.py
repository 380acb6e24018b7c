"""Handler registration: ``@handler(queue, ...)`` and lookup by queue and kind.

Handlers are found the way the admin finds ``admin.py``: the app config
imports each installed app's ``handlers`` module at start-up, so the worker
knows every handler before it claims anything.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured

from django_delayq.conf import check_count, check_max_delay, get_config, to_timedelta
from django_delayq.exceptions import HandlerNotFound
from django_delayq.flow import Rate, parse_cap, parse_rate
from django_delayq.models import (
    KIND_MAX_LENGTH,
    MAX_ATTEMPTS_LIMIT,
    QUEUE_MAX_LENGTH,
    STAND_IN_PREFIX,
)
from django_delayq.retry import RetryPolicy, get_default_policy, resolve_policy
from django_delayq.values import check_text, is_int_between

if TYPE_CHECKING:
    from django.db.models import Model


def is_async_callable(func: object) -> bool:
    """``async def`` (or marked as such, ``asgiref.sync.markcoroutinefunction``), or a
    callable object whose ``__call__`` is."""
    if iscoroutinefunction(func):
        return True
    if isinstance(func, type):
        return False
    call = next(
        (k.__dict__["__call__"] for k in type(func).__mro__ if "__call__" in k.__dict__), None
    )
    return call is not None and iscoroutinefunction(call)


# Called with the claimed ``Message``, or with the row of a ``QueueFields`` model.
HandlerFunc = Callable[[Any], Any]
F = TypeVar("F", bound=HandlerFunc)

# Matched whole (``fullmatch``): ``$`` would also match before a final newline.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")


def validate_queue_name(queue: object) -> str:
    queue = check_text(queue, "queue name", QUEUE_MAX_LENGTH)
    if not queue:
        raise ValueError("queue name must not be empty")
    if not QUEUE_NAME_RE.fullmatch(queue):
        raise ValueError(
            f"queue name {queue!r} may only hold letters, digits and _ . : - "
            "(and must start with a letter or digit)"
        )
    if queue.startswith(STAND_IN_PREFIX):
        raise ValueError(
            f"queue name {queue!r}: names starting with {STAND_IN_PREFIX!r} are the "
            "queues of rows in workflows (their stand-ins), no handler's"
        )
    return queue


def validate_kind(kind: object) -> str:
    return check_text(kind, "kind", KIND_MAX_LENGTH, nul=True)


def validate_max_attempts(max_attempts: object) -> int | None:
    """None (the handler's or the setting's value), or an int from 1 to ``MAX_ATTEMPTS_LIMIT``."""
    if max_attempts is None:
        return None
    if not is_int_between(max_attempts, 1, MAX_ATTEMPTS_LIMIT):
        raise ValueError(
            f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT} or None, "
            f"got {max_attempts!r}"
        )
    return max_attempts


@dataclass(frozen=True)
class HandlerSpec:
    """A registered handler and the options that override the settings."""

    func: HandlerFunc
    queue: str
    kind: str | None = None
    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    lease: timedelta | None = None
    atomic: bool = False
    concurrency: int | None = None
    time_limit: timedelta | None = None
    # Limits across every worker (flow.py): starts per period, running at once.
    rate_limit: Rate | None = None
    global_concurrency: int | None = None
    # Set for a model with ``QueueFields``: the rows of that model are this
    # queue's messages (``entity.py``), and the queue has no other handler.
    model: type[Model] | None = None

    @property
    def name(self) -> str:
        return f"{self.func.__module__}.{self.func.__qualname__}"

    @property
    def is_async(self) -> bool:
        """An ``async def`` handler: the worker awaits it on its event loop."""
        return is_async_callable(self.func)

    def _queue_setting(self, name: str) -> Any:
        config = get_config()
        return config["QUEUES"].get(self.queue, {}).get(name, config[name])

    def effective_max_attempts(self) -> int:
        return self.max_attempts or int(self._queue_setting("MAX_ATTEMPTS"))

    def effective_lease(self) -> timedelta:
        return self.lease or to_timedelta(self._queue_setting("LEASE"))

    def effective_time_limit(self) -> timedelta | None:
        """The handler's time limit, else its queue's, else ``TIME_LIMIT``; None: no limit."""
        if self.time_limit is not None:
            return self.time_limit
        value = self._queue_setting("TIME_LIMIT")
        return None if value is None else to_timedelta(value)

    def effective_retry(self) -> RetryPolicy:
        if self.retry is not None:
            return self.retry
        queue_policy = get_config()["QUEUES"].get(self.queue, {}).get("RETRY_POLICY")
        return resolve_policy(queue_policy) if queue_policy else get_default_policy()


def max_attempts_of(row: Any, spec: HandlerSpec | None) -> int:
    """How many attempts ``row`` gets: its own cap, else its handler's, else its queue's."""
    if row.max_attempts:
        return int(row.max_attempts)
    if spec is not None:
        return spec.effective_max_attempts()
    config = get_config()
    return int(config["QUEUES"].get(row.queue, {}).get("MAX_ATTEMPTS", config["MAX_ATTEMPTS"]))


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handlers: dict[tuple[str, str | None], HandlerSpec] = {}
        self._models: dict[type[Model], HandlerSpec] = {}

    def register(self, spec: HandlerSpec) -> None:
        key = (spec.queue, spec.kind)
        with self._lock:
            self._check_model_queue(spec)
            existing = self._handlers.get(key)
            # Re-registering the same function (a module imported twice, the
            # autoreloader) is harmless; two different functions are a bug.
            if existing is not None and existing.name != spec.name:
                what = f"queue {spec.queue!r}" + (f", kind {spec.kind!r}" if spec.kind else "")
                raise ImproperlyConfigured(
                    f"two handlers for {what}: {existing.name} and {spec.name}"
                )
            self._handlers[key] = spec
            if spec.model is not None:
                self._models[spec.model] = spec

    def _check_model_queue(self, spec: HandlerSpec) -> None:
        """A model's queue is the model's alone; a model has one queue."""
        others = [s for (q, _), s in self._handlers.items() if q == spec.queue]
        for other in others:
            if other.name != spec.name and (spec.model is not None or other.model is not None):
                owner = spec.model or other.model
                assert owner is not None
                raise ImproperlyConfigured(
                    f"queue {spec.queue!r} holds the rows of {owner._meta.label}; it cannot "
                    f"have another handler ({other.name} and {spec.name})"
                )
        if spec.model is not None:
            existing = self._models.get(spec.model)
            if existing is not None and (existing.queue, existing.name) != (
                spec.queue,
                spec.name,
            ):
                raise ImproperlyConfigured(
                    f"two handlers for {spec.model._meta.label}: {existing.name} "
                    f"(queue {existing.queue!r}) and {spec.name} (queue {spec.queue!r})"
                )

    def unregister(self, queue: str, kind: str | None = None) -> None:
        with self._lock:
            spec = self._handlers.pop((queue, kind), None)
            if spec is not None and spec.model is not None:
                self._models.pop(spec.model, None)

    def models(self) -> list[type[Model]]:
        """The ``QueueFields`` models a handler consumes."""
        return list(self._models)

    def for_model(self, model: type[Model]) -> HandlerSpec | None:
        """The handler registered for a ``QueueFields`` model, or None."""
        return self._models.get(model)

    def lookup_for(self, row: Model) -> HandlerSpec:
        """The handler of a claimed row: a message's by queue and kind, an entity's by model."""
        model = type(row)
        if model._meta.proxy:
            model = model._meta.concrete_model  # type: ignore[assignment]
        if model._meta.label_lower == "django_delayq.message":
            return self.lookup(row.queue, row.kind)  # type: ignore[attr-defined]
        spec = self._models.get(type(row)) or self._models.get(model)
        if spec is None:
            raise HandlerNotFound(f"no handler for {model._meta.label}")
        return spec

    def lookup(self, queue: str, kind: str) -> HandlerSpec:
        """The handler for this kind in this queue, else the queue's catch-all."""
        spec = self._handlers.get((queue, kind or None)) or self._handlers.get((queue, None))
        if spec is None:
            raise HandlerNotFound(
                f"no handler for queue {queue!r}" + (f" and kind {kind!r}" if kind else "")
            )
        return spec

    def for_queue(self, queue: str) -> list[HandlerSpec]:
        return [s for (q, _), s in self._handlers.items() if q == queue]

    def queues(self) -> list[str]:
        return sorted({q for q, _ in self._handlers})

    def all(self) -> list[HandlerSpec]:
        return list(self._handlers.values())


registry = Registry()


def handler(
    queue: str,
    *,
    kind: str | None = None,
    max_attempts: int | None = None,
    retry: RetryPolicy | str | type | None = None,
    lease: timedelta | int | float | None = None,
    atomic: bool = False,
    concurrency: int | None = None,
    time_limit: timedelta | int | float | None = None,
    model: type[Model] | None = None,
    rate_limit: str | None = None,
    global_concurrency: int | None = None,
) -> Callable[[F], F]:
    """Register the decorated function as the consumer of ``queue``.

    ``kind`` narrows it to messages of that payload kind (a queue may have one
    handler per kind plus a catch-all). ``max_attempts``, ``retry`` and
    ``lease`` override the settings for these messages. ``atomic=True`` runs
    the handler inside the transaction that acknowledges the message, so its
    database writes commit if and only if the message is marked done.
    ``concurrency`` caps how many of this queue's messages one worker process
    runs at once. ``rate_limit`` (``"N/s"``, ``"N/m"``, ``"N/h"``) and
    ``global_concurrency`` limit them across every worker and host: how many
    start per period, how many run at once (``flow.py``); a kind's handler
    limits its kind, a catch-all its whole queue. ``time_limit`` bounds one
    attempt: past it the attempt is recorded as failed (and retried by the
    retry policy), the worker stops extending the lease and frees the slot.
    Python cannot kill a thread, so the handler runs on until it returns,
    but its outcome is discarded: the failure replaced the message's lock
    token, and every later write under the old token (the late
    acknowledgement included) matches nothing.

    ``model`` (a model that inherits ``django_delayq.entity.QueueFields``)
    makes the handler consume that model's due rows instead of messages: it
    is called with the row, and ``queue`` names them for ``run_delayq
    --queue``, pausing and the admin (see ``entity.py``).

    Options are validated here, at import time, so a typo fails start-up
    instead of the first message.
    """
    validate_queue_name(queue)
    if kind is not None:
        validate_kind(kind)
        if not kind:
            # Messages without a kind go to the queue's catch-all (kind=None):
            # a handler of kind "" would never be called.
            raise ValueError(
                "kind must not be empty: leave it out (None) for the queue's catch-all handler"
            )
    validate_max_attempts(max_attempts)
    if not isinstance(atomic, bool):
        raise TypeError(f"atomic must be True or False, got {atomic!r}")
    lease_td = to_timedelta(lease, "lease") if lease is not None else None
    if lease_td is not None and lease_td <= timedelta(0):
        raise ValueError(f"lease must be positive, got {lease!r}")
    if lease_td is not None:
        check_max_delay(lease_td, "lease", lease)
    if concurrency is not None:
        check_count(concurrency, "concurrency")
    time_limit_td = to_timedelta(time_limit, "time_limit") if time_limit is not None else None
    if time_limit_td is not None and time_limit_td <= timedelta(0):
        raise ValueError(f"time_limit must be positive, got {time_limit!r}")
    if time_limit_td is not None:
        check_max_delay(time_limit_td, "time_limit", time_limit)
    policy = resolve_policy(retry) if retry is not None else None
    rate = parse_rate(rate_limit) if rate_limit is not None else None
    cap = parse_cap(global_concurrency) if global_concurrency is not None else None
    if model is not None and (rate or cap):
        raise ValueError(
            "a model's handler takes no rate_limit or global_concurrency: the limits "
            "apply to queues of messages only"
        )
    if model is not None:
        from django_delayq.entity import QueueFields

        if not (isinstance(model, type) and issubclass(model, QueueFields)):
            raise TypeError(f"model must be a model class that inherits QueueFields, got {model!r}")
        if model._meta.abstract:
            raise TypeError(f"model {model.__name__} is abstract; pass a concrete model")
        if kind is not None:
            raise ValueError("a model's handler takes no kind: the model is the kind")

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError("@handler must decorate a callable")
        if atomic and is_async_callable(func):
            raise ImproperlyConfigured(
                f"{func.__module__}.{func.__qualname__}: an async def handler cannot be "
                "atomic=True (Django runs a transaction on one thread, and an async handler's "
                "database calls run on others); make it a plain def, or drop atomic=True and "
                "make its writes idempotent"
            )
        registry.register(
            HandlerSpec(
                func=func,
                queue=queue,
                kind=kind,
                max_attempts=max_attempts,
                retry=policy,
                lease=lease_td,
                atomic=atomic,
                concurrency=concurrency,
                time_limit=time_limit_td,
                model=model,
                rate_limit=rate,
                global_concurrency=cap,
            )
        )
        return func

    return decorate
