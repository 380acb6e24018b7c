"""Handlers, receivers and a retry policy of the adversary suite (tests/chaos/adversaries.py).

Every handler records its runs in the run's ledger, a JSON-lines file per
worker process in ``DELAYQ_TEST_ADVERSARY_LEDGER`` (message, attempt, worker pid,
start and end, the payload's ``adv``: the adversary that sent it). A file, not a
table: a run's start and end must be recorded whatever the database does (a
connection cut, SQLite's write lock held for seconds), or an end that could
not be written reads as a run that went on until its worker was killed.

Payload knobs: ``sleep`` (seconds, every attempt), ``sleep_first``
(seconds, first attempt only), ``raise`` (an exception class name, see
:data:`EXCEPTIONS`, raised once: by the first attempt that gets there),
``fail`` (raise on attempts <= fail), ``fail_until`` (raise on every run
until the callback it names has raised: a worker killed after the handler
failed but before the retry policy or the receiver ran spends a run that
did not reach the callback), ``v`` (a version number, recorded), ``mode`` of the
atomic handler.

The receivers and the policy raise only for messages of ``adv-cb`` whose
payload asks them to (``where``, ``exc``), and the receivers are connected
only in processes started with ``DELAYQ_TEST_ADVERSARY_CALLBACKS=1``: other
tests never meet them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, InterfaceError
from django.utils import timezone

from django_delayq import handler, signals
from django_delayq.retry import FixedDelay
from tests.testapp.models import Effect, Raised

EXCEPTIONS: dict[str, type[BaseException]] = {
    "Exception": Exception,
    "DatabaseError": DatabaseError,
    "InterfaceError": InterfaceError,
    "CancelledError": asyncio.CancelledError,
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
}
#: The callbacks the ``callbacks`` adversary makes raise (payload ``where``).
CALLBACKS = ("handler", "async-handler", "started", "succeeded", "retried", "failed", "policy")
#: The atomic handler's time limit (``mode="outlive"`` sleeps past it on its first attempt).
ATOMIC_TIME_LIMIT = 1.0
ATTEMPTS = 50  # workers are killed on purpose: a crash spends the attempt it interrupts
QUICK_RETRY = FixedDelay(delay=0.2)


class Planned(Exception):
    """What a handler raises on purpose."""


def _first_time(message_id: int, where: str, name: str) -> bool:
    """Record that ``where`` raises ``name`` for this message; False if it already did
    (each callback raises once, on the first attempt that reaches it)."""
    if Raised.objects.filter(message_id=message_id, where=where).exists():
        return False
    Raised.objects.create(message_id=message_id, where=where, exception=name, pid=os.getpid())
    return True


def _payload(message: Any) -> dict[str, Any]:
    return message.payload if isinstance(message.payload, dict) else {}


def _append(record: dict[str, Any]) -> None:
    directory = os.environ.get("DELAYQ_TEST_ADVERSARY_LEDGER")
    if not directory:
        return
    # One write of one line with O_APPEND: whole lines, whichever thread writes.
    fd = os.open(
        os.path.join(directory, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _stamp() -> str:
    return timezone.now().isoformat()


def _begin(message: Any) -> str:
    """Record the start of a run; returns its id, for :func:`_end`."""
    payload = _payload(message)
    run = uuid.uuid4().hex
    claimed = message.last_attempt_time
    _append(
        {
            "run": run,
            "message_id": message.pk,
            "queue": message.queue,
            "key": (message.key or "")[:255],
            "adversary": str(payload.get("adv", "")),
            "attempt": message.attempt_count,
            "pid": os.getpid(),
            "version": int(payload.get("v", 0)),
            "group": getattr(message, "group", "") or "",
            "started": _stamp(),
            "claimed": claimed.isoformat() if claimed else None,
        }
    )
    return run


def _end(run: str, outcome: str) -> None:
    _append({"run": run, "finished": _stamp(), "outcome": outcome})


def read_ledger(directory: str) -> list[dict[str, Any]]:
    """Every run recorded in ``directory``, by start; ``finished`` None where the
    run never ended (its worker was killed)."""
    from datetime import datetime
    from pathlib import Path

    runs: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if "message_id" in record:
                runs[record["run"]] = record
            else:
                ends[record["run"]] = record
    out = []
    for run, record in runs.items():
        end = ends.get(run, {})
        record["finished"] = end.get("finished", record.get("finished"))
        record["outcome"] = end.get("outcome", record.get("outcome", ""))
        for field in ("started", "finished", "claimed"):
            if record.get(field):
                record[field] = datetime.fromisoformat(record[field])
        out.append(record)
    out.sort(key=lambda r: r["started"])
    return out


def _body(message: Any) -> None:
    payload = _payload(message)
    first = message.attempt_count == 1
    sleep = float(payload.get("sleep", 0)) + (float(payload.get("sleep_first", 0)) if first else 0)
    if sleep:
        time.sleep(sleep)
    if payload.get("raise") and _first_time(message.pk, "handler", payload["raise"]):
        raise EXCEPTIONS[payload["raise"]](f"raised by the handler of message {message.pk}")
    failing = message.attempt_count <= int(payload.get("fail", 0)) or (
        payload.get("fail_until")
        and not Raised.objects.filter(message_id=message.pk, where=payload["fail_until"]).exists()
    )
    if failing:
        raise Planned(f"policy:{message.pk}" if payload.get("where") == "policy" else "planned")


def _recorded(message: Any) -> None:
    """Run the payload's knobs between a recorded start and a recorded end."""
    run = _begin(message)
    try:
        _body(message)
    except BaseException:
        _end(run, "raised")
        raise
    _end(run, "ok")


@handler("adv-lane", concurrency=2, max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def lane_handler(message: Any) -> None:
    """At most two at once per worker (the lane's cap)."""
    _recorded(message)


@handler("adv-global", global_concurrency=2, max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def global_handler(message: Any) -> None:
    """At most two at once across every worker."""
    _recorded(message)


@handler("adv-held", max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def held_handler(message: Any) -> None:
    """Runs longer than a lease, while producers hold its row's lock."""
    _recorded(message)


@handler("adv-op", max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def operated_handler(message: Any) -> None:
    """The messages the skewed operators retry, cancel, reschedule and reprioritise."""
    _recorded(message)


@handler(
    "adv-atomic",
    atomic=True,
    time_limit=ATOMIC_TIME_LIMIT,
    max_attempts=ATTEMPTS,
    retry=QUICK_RETRY,
)
def atomic_handler(message: Any) -> None:
    """Writes one Effect per attempt; its first attempt swallows a database error
    (``mode="swallow"``: its writes cannot commit) or outlives its time limit
    (``mode="outlive"``)."""
    mode = _payload(message).get("mode")
    run = _begin(message)
    try:
        effect = Effect.objects.create(message_id=message.pk, value=str(message.attempt_count))
        if message.attempt_count == 1 and mode == "swallow":
            try:
                Effect.objects.create(pk=effect.pk, message_id=message.pk, value="again")
            except DatabaseError:
                pass
        if message.attempt_count == 1 and mode == "outlive":
            time.sleep(ATOMIC_TIME_LIMIT * 2)
        _body(message)
    except BaseException:
        _end(run, "raised")
        raise
    _end(run, "ok")


@handler("adv-long-atomic", atomic=True, max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def long_atomic_handler(message: Any) -> None:
    """Holds its transaction (on SQLite: the database's write lock) for ``sleep`` seconds."""
    run = _begin(message)
    try:
        Effect.objects.create(message_id=message.pk, value=str(message.attempt_count))
        _body(message)
    except BaseException:
        _end(run, "raised")
        raise
    _end(run, "ok")


@handler("adv-async", concurrency=4, max_attempts=ATTEMPTS, retry=QUICK_RETRY)
async def async_handler(message: Any) -> None:
    """Awaits ``sleep`` seconds; raises ``raise`` on its first attempt."""
    payload = _payload(message)
    run = _begin(message)
    try:
        await asyncio.sleep(float(payload.get("sleep", 0)))
        if payload.get("raise") and await sync_to_async(_first_time)(
            message.pk, "async-handler", payload["raise"]
        ):
            raise EXCEPTIONS[payload["raise"]](f"raised by the handler of message {message.pk}")
    except BaseException:
        # Also when the coroutine is cancelled (its time limit, a dying loop).
        _end(run, "raised")
        raise
    _end(run, "ok")


@handler("adv-groups", max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def group_handler(message: Any) -> None:
    """The ordered groups' messages: start and end in one line."""
    run = _begin(message)
    _end(run, "ok")


@handler("adv-flow", max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def flow_handler(message: Any) -> None:
    """A workflow's step (a fan-in's parent or child, a chain's link)."""
    _recorded(message)


@handler("adv-ticks", global_concurrency=1, max_attempts=ATTEMPTS, retry=QUICK_RETRY)
def tick_handler(message: Any) -> None:
    """The cron adversary's ticks: slower than they come, so many are claimed late."""
    _recorded(message)


class RaisingPolicy:
    """Retries after 0.2 s, but raises (once) for an ``adv-cb`` message whose handler
    asked it to (``where="policy"``: the handler's error says ``policy:<pk>``)."""

    def next_delay(self, attempt: int, exc: BaseException) -> timedelta:
        text = str(exc)
        if text.startswith("policy:"):
            from django_delayq.models import Message

            pk = int(text.split(":")[1])
            name = Message.objects.get(pk=pk).payload["exc"]
            if _first_time(pk, "policy", name):
                raise EXCEPTIONS[name](f"raised by the retry policy for message {pk}")
        return timedelta(seconds=0.2)


@handler("adv-cb", max_attempts=ATTEMPTS, retry=RaisingPolicy())
def callback_handler(message: Any) -> None:
    """Each message makes one callback raise one exception class, once (``where``, ``exc``)."""
    _recorded(message)


def _raise_once(where: str, message: Any, attempt: int, **kwargs: Any) -> None:
    if getattr(message, "queue", None) != "adv-cb":
        return
    payload = _payload(message)
    if payload.get("where") != where or not _first_time(message.pk, where, payload["exc"]):
        return
    raise EXCEPTIONS[payload["exc"]](f"raised by the {where} receiver for message {message.pk}")


def _started(sender: Any, message: Any, attempt: int, **kwargs: Any) -> None:
    _raise_once("started", message, attempt)


def _succeeded(sender: Any, message: Any, attempt: int, **kwargs: Any) -> None:
    _raise_once("succeeded", message, attempt)


def _retried(sender: Any, message: Any, attempt: int, **kwargs: Any) -> None:
    _raise_once("retried", message, attempt)


def _failed(sender: Any, message: Any, attempt: int, **kwargs: Any) -> None:
    _raise_once("failed", message, attempt)


if os.environ.get("DELAYQ_TEST_ADVERSARY_CALLBACKS"):
    signals.message_started.connect(_started, dispatch_uid="adv-started")
    signals.message_succeeded.connect(_succeeded, dispatch_uid="adv-succeeded")
    signals.message_retried.connect(_retried, dispatch_uid="adv-retried")
    signals.message_failed.connect(_failed, dispatch_uid="adv-failed")
