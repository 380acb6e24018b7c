"""A backend for Django's Tasks framework: ``task.enqueue()`` writes a delayq message.

::

    TASKS = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                         "QUEUES": ["default", "emails"]}}

A task call becomes one message of kind ``django.tasks`` in the queue named by
the task's ``queue_name``, written through the caller's connection, so it
commits or rolls back with the caller's transaction. ``run_delayq`` runs it:
the app config registers :func:`run_task` as the handler of that kind on each
of the backend's queues (a kind-specific handler, so a project's own
``@handler`` for the same queue keeps its other messages).

The message row is the task result, so no table of its own is needed: the
call (task path, args, kwargs) is the payload, and the worker adds to it what
the row's columns do not hold (the return value, each attempt's exception
class and traceback, the worker ids), in a compare-and-set write on the lock
token, as every write of a worker is. The ``TaskResult`` id is the message id.

Priorities keep their value: Django's range (-100..100, higher runs first) is
inside delayq's (-32768..32767, higher runs first), so task messages and
plain messages of one queue are ordered on one scale. A message reprioritised
outside Django's range (from the admin) reads back clamped to it.

Ordered groups: ``OPTIONS["GROUP_BY"] = {"shop.tasks.charge": "customer_id"}``
puts each call of that task in the group named by that argument's value
(``str(value)``; ``None`` or "" is no group), so the calls for one customer
run one at a time, in the order they were enqueued; tasks not listed are
ungrouped. The argument is read from the call as the function would bind
it: passed by keyword or by position, or its default.

Works with ``django.tasks`` (Django 6) and with the ``django-tasks`` backport
(Django 5.2), whichever is importable, ``django.tasks`` first.

This module imports nothing that needs ``django_delayq`` in ``INSTALLED_APPS``
(the models, the registry, the store) until it is used, so that a project
that names the backend without installing the app gets the check
``django_delayq.E040`` from ``manage.py check`` instead of a crash at import.
"""

from __future__ import annotations

import inspect
import logging
from contextvars import ContextVar
from datetime import datetime
from importlib.util import find_spec
from traceback import format_exception
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction
from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils.module_loading import import_string

from django_delayq.exceptions import DelayQError, Retry
from django_delayq.flow import check_group
from django_delayq.payload import encode_payload
from django_delayq.routers import queue_alias
from django_delayq.values import escape_surrogates

# Django 6 ships the framework as django.tasks (the type checker reads it);
# on Django 5.2 the django-tasks backport has the same modules.
if TYPE_CHECKING or find_spec("django.tasks") is not None:
    from django.tasks import base as tasks
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        import django_tasks.checks  # noqa: F401  (registers the backends' checks)
        from django_tasks import base as tasks
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImproperlyConfigured(
            "django_delayq.backends.DelayQBackend needs Django's Tasks framework: "
            "Django 6 (django.tasks), or on Django 5.2 the backport: "
            "pip install 'django-delayq[tasks]'"
        ) from exc

if TYPE_CHECKING:
    from django_delayq.models import Message

__all__ = ["TASK_KIND", "DelayQBackend", "TaskCancelled", "TaskLost", "run_task"]

logger = logging.getLogger("django_delayq.tasks")

# The framework logs every finished task from its own receiver of
# ``task_finished`` (an error for a failed one, with the traceback at hand).
# The worker has logged a failed message already, with the traceback and
# delayq's fields: while ``task_finished`` is sent for one, the framework's
# error line is dropped, so a failed task is one line in the log.
_worker_logged_failure: ContextVar[bool] = ContextVar("worker_logged_failure", default=False)
FRAMEWORK_LOGGERS = ("django.tasks", "django_tasks")  # Django 6, the backport


class _FailureLoggedByWorker(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not _worker_logged_failure.get()


_failure_logged_by_worker = _FailureLoggedByWorker()

#: The ``kind`` of every task message: it selects :func:`run_task` in the registry.
TASK_KIND = "django.tasks"

OPTION_DEFAULTS: dict[str, Any] = {
    # Attempts per task. 1 is the framework's contract (a task that raises is
    # FAILED); more makes delayq retry it by the queue's RETRY_POLICY, and
    # None takes DELAYQ's MAX_ATTEMPTS for the queue.
    "MAX_ATTEMPTS": 1,
    # Ordered groups: {"<task's dotted path>": "<argument name>"}; each call of
    # a listed task goes in the group named by that argument's value.
    "GROUP_BY": {},
}

# By Message.Status value (the model is not imported here: see the module's docstring).
_STATUS = {
    "pending": tasks.TaskResultStatus.READY,
    "running": tasks.TaskResultStatus.RUNNING,
    "succeeded": tasks.TaskResultStatus.SUCCESSFUL,
    "failed": tasks.TaskResultStatus.FAILED,
    "cancelled": tasks.TaskResultStatus.FAILED,
}


class TaskCancelled(DelayQError):
    """The error of a task whose message an operator cancelled before it finished."""


class TaskLost(DelayQError):
    """The error of a task whose last attempt ended without returning or raising.

    Its worker died or lost the message's lease, and no attempt was left
    (``OPTIONS["MAX_ATTEMPTS"]``); the message's ``last_error`` says which.
    """


def _class_path(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def parse_group_by(value: object) -> dict[str, str]:
    """``OPTIONS["GROUP_BY"]``: a dict of task paths to argument names, checked."""
    if not isinstance(value, dict):
        raise ValueError(
            "must be a dict of task paths to argument names, e.g. "
            f"{{'shop.tasks.charge': 'customer_id'}}, not {type(value).__name__}"
        )
    for path, name in value.items():
        if not isinstance(path, str) or not path:
            raise ValueError(f"task paths must be str (a task's dotted path), got {path!r}")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"{path!r}: the argument name must be a str naming one of the task's "
                f"parameters, got {name!r}"
            )
    return dict(value)


def _parameters(task: tasks.Task[Any, Any]) -> inspect.Signature:
    """The task function's signature as callers see it (without ``context``)."""
    signature = inspect.signature(task.func)
    if task.takes_context:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature


def _accepts(signature: inspect.Signature, name: str) -> bool:
    """Whether a call can pass the argument ``name`` (a parameter, or into ``**kwargs``)."""
    parameter = signature.parameters.get(name)
    if parameter is not None:
        return parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    return any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())


def _argument(task: tasks.Task[Any, Any], name: str, args: Any, kwargs: Any) -> Any:
    """The value the task function would get for the argument ``name`` (None if none)."""
    signature = _parameters(task)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(
            f"{task.module_path}: {exc} (its group is read from the call, so the call "
            "must fit the function)"
        ) from None
    parameter = signature.parameters.get(name)
    if parameter is not None and parameter.kind not in (
        parameter.VAR_POSITIONAL,
        parameter.VAR_KEYWORD,
    ):
        if name in bound.arguments:
            return bound.arguments[name]
        return None if parameter.default is parameter.empty else parameter.default
    extra = next((p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    return None if extra is None else bound.arguments.get(extra.name, {}).get(name)


class DelayQBackend(BaseTaskBackend):
    """Tasks become delayq messages; ``manage.py run_delayq`` runs them."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = {**OPTION_DEFAULTS, **self.options}
        self.max_attempts: int | None = options["MAX_ATTEMPTS"]
        # A malformed GROUP_BY is reported by check() (E043) and refuses every
        # enqueue: grouped tasks must never run as ungrouped ones.
        self.group_by: dict[str, str] = {}
        self.group_by_error = ""
        try:
            self.group_by = parse_group_by(options["GROUP_BY"])
        except ValueError as exc:
            self.group_by_error = str(exc)

    def group_of(self, task: tasks.Task[Any, Any], args: Any, kwargs: Any) -> str:
        """The ordered group of a call of ``task`` ("": none), from ``GROUP_BY``."""
        if self.group_by_error:
            raise ImproperlyConfigured(
                f"TASKS[{self.alias!r}]['OPTIONS']['GROUP_BY'] {self.group_by_error}"
            )
        name = self.group_by.get(task.module_path)
        if name is None:
            return ""
        value = _argument(task, name, args, kwargs)
        if value is None:
            return ""
        return check_group(str(value), f"{task.module_path}: argument {name!r}: ")

    # -- producing -----------------------------------------------------------

    def validate_task(self, task: tasks.Task[..., Any]) -> None:
        from django_delayq.registry import validate_queue_name

        super().validate_task(task)
        try:
            validate_queue_name(task.queue_name)
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from exc

    def enqueue(
        self, task: tasks.Task[Any, Any], args: Any, kwargs: Any
    ) -> tasks.TaskResult[Any, Any]:
        """Write the call as a message in the caller's transaction.

        ``task_enqueued`` is sent once that transaction commits (at once
        outside one): a rolled-back call was never enqueued.
        """
        from django_delayq.enqueuing import enqueue

        self.validate_task(task)
        group = self.group_of(task, args, kwargs)
        try:
            call: dict[str, Any] = normalize_json({"args": args, "kwargs": kwargs})  # type: ignore[assignment]
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{task.module_path}: arguments must be JSON-serialisable: {exc}"
            ) from exc
        payload = {
            "task": task.module_path,
            "args": call["args"],
            "kwargs": call["kwargs"],
            "backend": self.alias,
            "run_after": task.run_after.isoformat() if task.run_after else None,
        }
        message = enqueue(
            task.queue_name,
            payload,
            kind=TASK_KIND,
            run_at=task.run_after,
            priority=task.priority,
            max_attempts=self.max_attempts,
            group=group,
        ).message
        result = to_task_result(message, task)
        alias = queue_alias()
        transaction.on_commit(
            lambda: task_enqueued.send(type(self), task_result=result), using=alias
        )
        return result

    # -- results -------------------------------------------------------------

    def _messages(self, result_id: str) -> Any:
        try:
            pk = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        from django_delayq.models import Message

        return Message.objects.filter(pk=pk, kind=TASK_KIND)

    def get_result(self, result_id: str) -> tasks.TaskResult[Any, Any]:
        message = self._messages(result_id).first()
        if message is None:
            raise TaskResultDoesNotExist(result_id)
        return to_task_result(message)

    async def aget_result(self, result_id: str) -> tasks.TaskResult[Any, Any]:
        message = await self._messages(result_id).afirst()
        if message is None:
            raise TaskResultDoesNotExist(result_id)
        return to_task_result(message)

    # -- checks --------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[Any]:
        """Configuration errors, reported by ``manage.py check`` and at worker start."""
        where = f"TASKS[{self.alias!r}]"
        errors: list[Any] = list(super().check(**kwargs))
        if not apps.is_installed("django_delayq"):
            # The checks below need the app's modules, which need the app.
            errors.append(
                checks.Error(
                    f"{where} uses DelayQBackend but django_delayq is not installed",
                    hint="add 'django_delayq' to INSTALLED_APPS and run migrate",
                    id="django_delayq.E040",
                )
            )
            return errors
        from django_delayq.registry import validate_max_attempts, validate_queue_name

        if not self.queues:
            errors.append(
                checks.Error(
                    f"{where}['QUEUES'] is empty: run_delayq needs the queue names to consume",
                    hint='list them, e.g. "QUEUES": ["default", "emails"]',
                    id="django_delayq.E041",
                )
            )
        for queue in sorted(self.queues, key=str):
            try:
                validate_queue_name(queue)
            except (TypeError, ValueError) as exc:
                errors.append(checks.Error(f"{where}['QUEUES']: {exc}", id="django_delayq.E041"))
        unknown = sorted(set(self.options) - set(OPTION_DEFAULTS))
        if unknown:
            errors.append(
                checks.Error(
                    f"{where}['OPTIONS'] has unknown option(s) {', '.join(map(repr, unknown))}",
                    hint=f"known options: {', '.join(OPTION_DEFAULTS)}",
                    id="django_delayq.E042",
                )
            )
        try:
            validate_max_attempts(self.max_attempts)
        except ValueError as exc:
            errors.append(
                checks.Error(f"{where}['OPTIONS']['MAX_ATTEMPTS']: {exc}", id="django_delayq.E042")
            )
        errors.extend(
            checks.Error(
                f"{where}['OPTIONS']['GROUP_BY'] {problem}",
                hint="map a task's dotted path to the name of the argument whose value "
                'names its group, e.g. {"shop.tasks.charge": "customer_id"}',
                id="django_delayq.E043",
            )
            for problem in self._group_by_problems()
        )
        return errors

    def _group_by_problems(self) -> list[str]:
        if self.group_by_error:
            return [self.group_by_error]
        problems = []
        for path, name in sorted(self.group_by.items()):
            try:
                task = import_string(path)
            except ImportError as exc:
                problems.append(f"{path!r} cannot be imported: {exc}")
                continue
            if not isinstance(task, tasks.Task):
                problems.append(f"{path!r} is not a task (decorate it with @task)")
            elif task.module_path != path:
                # Calls are matched by the path of the function's definition.
                problems.append(
                    f"{path!r} is the task defined as {task.module_path!r}: list it by that path"
                )
            elif not _accepts(_parameters(task), name):
                problems.append(f"{path!r}: the task takes no argument {name!r}")
        return problems

    def install(self) -> None:
        """Register :func:`run_task` for this backend's valid queue names.

        Called at start-up (``apps.py``) so that ``run_delayq`` consumes the
        task queues; invalid names are left to :meth:`check` to report.
        """
        from django_delayq.registry import HandlerSpec, registry, validate_queue_name

        for queue in self.queues:
            try:
                validate_queue_name(queue)
            except (TypeError, ValueError):
                continue
            registry.register(HandlerSpec(func=run_task, queue=queue, kind=TASK_KIND))


def install_task_backends(settings_tasks: object) -> None:
    """Install every ``TASKS`` entry whose backend is a :class:`DelayQBackend`."""
    if not isinstance(settings_tasks, dict):
        return
    for alias, params in settings_tasks.items():
        if not isinstance(params, dict):
            continue
        try:
            backend_class = import_string(params.get("BACKEND", ""))
        except ImportError:
            continue  # the framework reports unknown backends
        if isinstance(backend_class, type) and issubclass(backend_class, DelayQBackend):
            backend_class(alias, params).install()
            _connect_outcome_signals()


# -- messages as task results ------------------------------------------------


def _task_of(message: Message) -> tasks.Task[Any, Any]:
    payload = message.payload
    task = import_string(payload["task"])
    if not isinstance(task, tasks.Task):
        raise ImproperlyConfigured(
            f"message {message.pk}: {payload['task']!r} is not a task (decorate it with @task)"
        )
    priority = max(tasks.TASK_MIN_PRIORITY, min(tasks.TASK_MAX_PRIORITY, message.priority))
    return task.using(
        priority=priority,
        queue_name=message.queue,
        run_after=_time(payload.get("run_after")),
        backend=payload["backend"],
    )


def _errors(message: Message) -> list[tasks.TaskError]:
    from django_delayq.models import Message

    recorded = message.payload.get("errors", [])
    errors = [
        tasks.TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in recorded
    ]
    if message.status == Message.Status.CANCELLED:
        errors.append(
            tasks.TaskError(
                exception_class_path=_class_path(TaskCancelled),
                traceback="the message was cancelled by an operator before the task finished",
            )
        )
    elif message.status == Message.Status.FAILED and (
        not recorded or recorded[-1].get("attempt") != message.attempt_count
    ):
        errors.append(
            tasks.TaskError(
                exception_class_path=_class_path(TaskLost),
                traceback="\n".join(filter(None, [message.last_error, message.last_traceback])),
            )
        )
    return errors


def to_task_result(
    message: Message, task: tasks.Task[Any, Any] | None = None
) -> tasks.TaskResult[Any, Any]:
    """The ``TaskResult`` a task message stands for."""
    payload = message.payload
    worker_ids = list(payload.get("worker_ids", []))
    if message.status == "running" and message.locked_by:
        worker_ids.append(message.locked_by)
    elif message.status == "succeeded" and "return_value" not in payload and message.locked_by:
        # Its successful attempt's worker: the acknowledgement wrote no payload.
        worker_ids.append(message.locked_by)
    result: tasks.TaskResult[Any, Any] = tasks.TaskResult(
        task=task or _task_of(message),
        id=str(message.pk),
        status=_STATUS[message.status],
        enqueued_at=message.created_at,
        started_at=_time(payload.get("started_at")) or message.last_attempt_time,
        last_attempted_at=message.last_attempt_time,
        finished_at=message.finished_at,
        args=payload["args"],
        kwargs=payload["kwargs"],
        backend=payload["backend"],
        errors=_errors(message),
        worker_ids=worker_ids,
    )
    # The return value: Message.result (a release before it kept it in the payload).
    returned = message.result if message.result is not None else payload.get("return_value")
    object.__setattr__(result, "_return_value", returned)
    return result


# -- running -----------------------------------------------------------------


def _record(message: Message, **outcome: Any) -> bool:
    """Add to the message's payload while this worker still holds it."""
    from django_delayq.store import leases

    assert message.lock_token is not None
    payload = dict(message.payload)
    payload["worker_ids"] = [*payload.get("worker_ids", []), message.locked_by]
    if not payload.get("started_at") and message.last_attempt_time:
        payload["started_at"] = message.last_attempt_time.isoformat()
    payload.update(outcome)
    encode_payload(payload)  # NaN, NUL or an oversized result fail the attempt, as its error
    written = leases.write_payload(message.pk, message.lock_token, payload)
    if written:
        message.payload = payload
    return bool(written)


def _error(message: Message, exc: BaseException) -> dict[str, Any]:
    return {
        "exception_class_path": _class_path(type(exc)),
        "traceback": escape_surrogates("".join(format_exception(exc)).replace("\x00", "\\x00")),
        "attempt": message.attempt_count,
    }


def run_task(message: Message) -> Any:
    """The handler of every task message: run the task, keep its outcome.

    Sends ``task_started`` before the call. Exceptions propagate, so delayq
    records the attempt (``last_error``) and applies the retry policy;
    ``Retry`` snoozes the task as it does any message. ``task_finished`` is
    sent by :func:`_send_task_finished` once delayq has committed the final
    outcome.
    """
    try:
        task = _task_of(message)
    except Exception as exc:
        _record(message, errors=[*message.payload.get("errors", []), _error(message, exc)])
        raise
    result = to_task_result(message, task)
    try:
        task_started.send(type(task.get_backend()), task_result=result)
        args, kwargs = message.payload["args"], message.payload["kwargs"]
        if task.takes_context:
            args = [tasks.TaskContext(task_result=result), *args]
        if iscoroutinefunction(task.func):
            from django_delayq.worker import aio

            # On the worker's event loop, as an async def handler runs (its
            # time limit cancels it); elsewhere on a loop of its own.
            value = aio.run(task.acall(*args, **kwargs))
        else:
            value = task.call(*args, **kwargs)
        returned = normalize_json(value)
        # NaN, NUL or an oversized result fail the attempt, as its error.
        encode_payload(returned, "the task's return value: ")
    except Retry:
        raise
    except (Exception, SystemExit) as exc:
        _record(message, errors=[*message.payload.get("errors", []), _error(message, exc)])
        raise
    # Stored as the message's result by its acknowledgement (Message.result), as
    # any handler's return value: no statement of its own.
    return returned


def _send_task_finished(sender: Any, message: Message, using: str, **kwargs: Any) -> None:
    """``task_finished`` for a task message whose final outcome was just committed.

    Connected to delayq's ``message_succeeded``, ``message_failed`` and
    ``message_discarded``, which are sent after the outcome's commit, so
    ``get_result()`` in a receiver reads the same finished result; an
    attempt that will be retried sends nothing.
    """
    if message.kind != TASK_KIND:
        return
    from django_delayq import signals
    from django_delayq.models import Message

    row = Message.objects.using(using).filter(pk=message.pk).first()
    if row is None:
        return
    result = to_task_result(row)
    backend = type(result.task.get_backend())
    # message_failed: the worker logged the failure (an error, with the
    # traceback). A discarded task is logged by the framework alone.
    logged = _worker_logged_failure.set(kwargs.get("signal") is signals.message_failed)
    try:
        responses = task_finished.send_robust(backend, task_result=result)
    finally:
        _worker_logged_failure.reset(logged)
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error(
                "task_finished receiver %r raised for task %s",
                receiver,
                result.id,
                exc_info=(type(response), response, response.__traceback__),
            )


def _connect_outcome_signals() -> None:
    from django_delayq import signals

    for signal in (signals.message_succeeded, signals.message_failed, signals.message_discarded):
        signal.connect(_send_task_finished, dispatch_uid="django_delayq.backends.task_finished")
    for name in FRAMEWORK_LOGGERS:
        logging.getLogger(name).addFilter(_failure_logged_by_worker)
