"""Tasks of Django's Tasks framework that the suite enqueues through DelayQBackend.

The framework's names come from ``django.tasks`` (Django 6) or the
``django-tasks`` backport (Django 5.2); the tests import them from here.
"""

import asyncio
import json
import time

from django_delayq import Discard
from tests.testapp.models import Effect

try:
    from django.tasks import TaskResultStatus, task, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    from django_tasks import TaskResultStatus, task, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

__all__ = [
    "InvalidTask",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


class TaskBoom(Exception):
    pass


@task
def add(a, b):
    return a + b


@task
async def add_async(a, b):
    await asyncio.sleep(0)
    return a + b


@task
async def where_async():
    """The thread its coroutine ran on: a worker's event loop is ``delayq-async``."""
    import threading

    await asyncio.sleep(0)
    return threading.current_thread().name


@task(takes_context=True)
def record(context, tag):
    """Leaves an Effect row (its pk gives the order tasks ran in)."""
    Effect.objects.create(message_id=int(context.task_result.id), value=tag)
    return tag


@task(queue_name="emails", takes_context=True)
def send_email(context, to, subject=""):
    Effect.objects.create(message_id=int(context.task_result.id), value=to)
    return {"to": to, "subject": subject, "attempt": context.attempt}


@task(takes_context=True)
def echo(context, value):
    """Returns its argument; records it as JSON text, so that its type shows too."""
    Effect.objects.create(
        message_id=int(context.task_result.id), value=json.dumps(value, sort_keys=True)
    )
    return value


@task
def explode(text):
    raise TaskBoom(text)


@task
def give_up(reason):
    raise Discard(reason)


@task
def returns_a_set():
    return {1, 2}


@task
def sleep_for(seconds):
    time.sleep(seconds)
    return seconds


@task(backend="retrying", queue_name="tasks-retry", takes_context=True)
def flaky(context):
    """Fails on its first attempt; the "retrying" backend allows two."""
    if context.attempt < 2:
        raise TaskBoom(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def account_step(context, account, step, fail=False):
    """Grouped by ``account`` (the suite's ``TASKS["default"]["OPTIONS"]["GROUP_BY"]``):
    leaves an Effect ``account:step`` (its pk gives the order steps ran in)."""
    Effect.objects.create(message_id=int(context.task_result.id), value=f"{account}:{step}")
    if fail:
        raise TaskBoom(f"step {step} of account {account} failed")
    return step


@task
def tenant_event(name, **fields):
    """Grouped by ``tenant``, which only its ``**fields`` can hold."""
    return name
