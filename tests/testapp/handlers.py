"""Handlers the suite drives through the payload.

Payload knobs: ``fail`` (raise on attempts <= fail), ``sleep`` (seconds),
``retry_in`` (raise Retry on the first attempt), ``discard`` (raise Discard),
``sleep_attempts`` (only sleep on attempts <= this).
"""

import os
import time

from django.utils import timezone

from django_delayq import Discard, Retry, handler
from tests.testapp.models import Effect, Execution


class Boom(Exception):
    pass


def _run(message, record=True):
    payload = message.payload if isinstance(message.payload, dict) else {}
    execution = None
    if record:
        execution = Execution.objects.create(
            message_id=message.pk,
            attempt=message.attempt_count,
            worker=str(os.getpid()),
            queue=message.queue,
            started=timezone.now(),
        )
    if payload.get("sleep") and message.attempt_count <= int(payload.get("sleep_attempts", 99)):
        time.sleep(float(payload["sleep"]))
    if payload.get("retry_in") is not None and message.attempt_count == 1:
        raise Retry(delay=payload["retry_in"], reason="asked to")
    if payload.get("discard"):
        raise Discard(payload["discard"])
    if message.attempt_count <= int(payload.get("fail", 0)):
        raise Boom(f"attempt {message.attempt_count} of message {message.pk} failed")
    if execution is not None:
        Execution.objects.filter(pk=execution.pk).update(finished=timezone.now())


@handler("default")
def default_handler(message):
    _run(message)


@handler("default", kind="typed")
def typed_handler(message):
    _run(message)


@handler("other", max_attempts=2)
def other_handler(message):
    _run(message)


@handler("atomic", atomic=True)
def atomic_handler(message):
    Effect.objects.create(message_id=message.pk, value=str(message.payload.get("value", "")))
    _run(message, record=False)


@handler("slow", lease=2)
def slow_handler(message):
    _run(message)


@handler("ticks")
def tick_handler(message):
    """Consumer of the cron tests' schedules (tests/*/test_cron*.py)."""
    _run(message)
