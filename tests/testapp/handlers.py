"""Handlers the suite drives through the payload.

Payload knobs: ``fail`` (raise on attempts <= fail), ``sleep`` (seconds),
``retry_in`` (raise Retry on the first attempt), ``discard`` (raise Discard),
``sleep_attempts`` (only sleep on attempts <= this), ``raise`` (raise that
``BaseException``: ``KeyboardInterrupt`` or ``CancelledError``, on attempts <=
``raise_attempts``), ``log`` (log that text at INFO on the ``tests.testapp``
logger, as a project's handler logs what it does).
"""

import asyncio
import json
import logging
import os
import threading
import time

from django.db import connection
from django.utils import timezone

from django_delayq import Discard, Retry, handler
from django_delayq.retry import FixedDelay
from tests.testapp.models import Effect, Execution, Shipment


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
    if payload.get("log"):
        logging.getLogger("tests.testapp").info("%s", payload["log"])
    if payload.get("sleep") and message.attempt_count <= int(payload.get("sleep_attempts", 99)):
        time.sleep(float(payload["sleep"]))
    if payload.get("retry_in") is not None and message.attempt_count == 1:
        raise Retry(delay=payload["retry_in"], reason="asked to")
    if payload.get("discard"):
        raise Discard(payload["discard"])
    if payload.get("raise") and message.attempt_count <= int(payload.get("raise_attempts", 99)):
        # Exceptions that are not Exceptions, as library code may raise them.
        raise {"KeyboardInterrupt": KeyboardInterrupt, "CancelledError": asyncio.CancelledError}[
            payload["raise"]
        ](f"raised by the handler of message {message.pk}")
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


@handler("atomic-txid", atomic=True)
def atomic_txid_handler(message):
    """Records the id of the transaction its write committed in (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current()")
        txid = cursor.fetchone()[0]
    Effect.objects.create(message_id=message.pk, value=str(txid))
    if message.payload.get("steal"):
        _steal(message)
    if message.payload.get("deferred") is not None:
        with connection.cursor() as cursor:
            # A deferred unique constraint: a clash fails the commit, not the insert.
            cursor.execute(
                "INSERT INTO delayq_test_deferred (v) VALUES (%s)", [message.payload["deferred"]]
            )
    _run(message, record=False)


# In-process tests steer handlers through gates: a handler whose payload has
# {"gate": name} sets ARRIVED[name] and waits for GATES[name] (see gate()).
GATES: dict[str, threading.Event] = {}
ARRIVED: dict[str, threading.Event] = {}


def gate(name):
    """(arrived, release): set when the handler reached the gate; set to let it through."""
    ARRIVED[name], GATES[name] = threading.Event(), threading.Event()
    return ARRIVED[name], GATES[name]


def _wait_at_gate(message):
    name = message.payload.get("gate") if isinstance(message.payload, dict) else None
    if name:
        ARRIVED[name].set()
        if not GATES[name].wait(60):
            raise TimeoutError(f"gate {name!r} was never opened")


@handler("gated", lease=1)
def gated_handler(message):
    """Records its run (Execution) and waits at its gate, if any, in between."""
    execution = Execution.objects.create(
        message_id=message.pk,
        attempt=message.attempt_count,
        worker=str(message.payload.get("v", "")),
        queue=message.queue,
        started=timezone.now(),
    )
    _wait_at_gate(message)
    Execution.objects.filter(pk=execution.pk).update(finished=timezone.now())


@handler("atomic-gated", atomic=True, lease=1)
def atomic_gated_handler(message):
    """Writes an Effect (its attempt's lock token), then waits at its gate, if any."""
    Effect.objects.create(message_id=message.pk, value=str(message.lock_token))
    _wait_at_gate(message)


@handler("payloads")
def payload_handler(message):
    """Records the payload it was given as JSON text, so that its type shows too."""
    Effect.objects.create(message_id=message.pk, value=json.dumps(message.payload, sort_keys=True))


@handler("slow", lease=2)
def slow_handler(message):
    _run(message)


@handler("ticks")
def tick_handler(message):
    """Consumer of the cron tests' schedules (tests/*/test_cron*.py)."""
    _run(message)


# The chaos suite's queues (tests/chaos/): attempts are plentiful because
# workers are killed on purpose, and a crash spends the attempt it interrupts.
CHAOS_TIME_LIMIT = 1.5


@handler("chaos", max_attempts=50, retry=FixedDelay(delay=0.2))
def chaos_handler(message):
    _run(message)


@handler("chaos-atomic", atomic=True, max_attempts=50, retry=FixedDelay(delay=0.2))
def chaos_atomic_handler(message):
    Effect.objects.create(message_id=message.pk, value=message.key[:100])
    _run(message)


@handler(
    "chaos-slow",
    max_attempts=50,
    time_limit=CHAOS_TIME_LIMIT,
    retry=FixedDelay(delay=0.2),
)
def chaos_slow_handler(message):
    """Outlives its time limit (payload ``sleep``) until one attempt was failed for it.

    Once a ``TimeLimitExceeded`` is recorded it runs quickly, so each slow
    message hits its time limit exactly once, even if a worker running it is
    killed before the limit.
    """
    if "TimeLimitExceeded" in message.last_error and isinstance(message.payload, dict):
        message.payload = {k: v for k, v in message.payload.items() if k != "sleep"}
    _run(message)


@handler("poison", max_attempts=3)
def poison_handler(message):
    """Kills its own worker process, like a segfault or the OOM killer would."""
    _run(message)
    os._exit(3)


@handler("shipments", model=Shipment, max_attempts=3, lease=5)
def ship(shipment: Shipment) -> None:
    """Consumer of the entity tests' rows (tests/*/test_entity*.py)."""
    Execution.objects.create(
        message_id=shipment.pk,
        attempt=shipment.attempt_count,
        worker=str(os.getpid()),
        queue="shipments",
        started=timezone.now(),
    )
    if shipment.sleep:
        time.sleep(shipment.sleep)
    if shipment.attempt_count <= shipment.fail:
        raise Boom(f"attempt {shipment.attempt_count} of shipment {shipment.pk} failed")
    Shipment.objects.filter(pk=shipment.pk).update(shipped_at=timezone.now())


# Global limits (tests/integration/test_limits.py, tests/process/test_flow_control.py):
# the queue runs at most 2 at once across workers, its webhooks start at most 5 a second.
@handler("limited", global_concurrency=2)
def limited_handler(message):
    _run(message)


@handler("limited", kind="webhook", rate_limit="5/s")
def limited_webhook_handler(message):
    _run(message)


@handler("atomic-swallow", atomic=True, max_attempts=2)
def atomic_swallowing_handler(message):
    """Writes an Effect, then runs a statement that fails and swallows the error.

    ``payload["how"]``: ``"orm"`` (a duplicate primary key through the ORM, which
    marks the transaction for rollback) or ``"raw"`` (a statement on a missing table
    through a cursor, which leaves a PostgreSQL transaction aborted without Django
    knowing).
    A handler like this must not be acknowledged: its writes cannot commit.
    """
    from django.db import DatabaseError

    effect = Effect.objects.create(message_id=message.pk, value="written")
    if message.attempt_count > int(message.payload.get("swallow_attempts", 99)):
        return
    try:
        if message.payload.get("how") == "raw":
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM delayq_no_such_table")
        else:
            Effect.objects.create(pk=effect.pk, message_id=message.pk, value="again")
    except DatabaseError:
        pass


# Runs of "atomic-limited" handlers by message id (in-process tests).
RUNS: dict[int, int] = {}


def _steal(message):
    """Another, live, worker claims ``message`` meanwhile (as after an expired lease): a
    new lock token and the thief's name, written and committed on a connection of its
    own (PostgreSQL), and the thief's heartbeat promising it lives for the day."""
    import psycopg

    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k not in ("cursor_factory", "context", "prepare_threshold", "server_side_binding")
    }
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute(
            "INSERT INTO django_delayq_workerstate "
            "(name, host, pid, queues, concurrency, started_at, last_seen, alive_until) "
            "VALUES ('a-thief', 'elsewhere', 1, '[]', 1, now(), now(), now() + interval '1 day') "
            "ON CONFLICT (name) DO UPDATE SET alive_until = EXCLUDED.alive_until"
        )
        other.execute(
            "UPDATE django_delayq_message SET lock_token = gen_random_uuid(), "
            "locked_by = 'a-thief' WHERE id = %s",
            [message.pk],
        )


@handler("atomic-limited", atomic=True, time_limit=0.5)
def atomic_limited_handler(message):
    """Atomic, with a time limit: ``steal`` is claimed away while it runs; ``gate``
    waits at its gate when it runs again (a group's re-run, RUNS); ``sleep``
    sleeps (past the limit) on every run."""
    RUNS[message.pk] = RUNS.get(message.pk, 0) + 1
    Effect.objects.create(message_id=message.pk, value=str(RUNS[message.pk]))
    if message.payload.get("sleep"):
        time.sleep(message.payload["sleep"])
    if message.payload.get("steal"):
        _steal(message)
    if RUNS[message.pk] > 1:
        _wait_at_gate(message)


@handler("atomic-limited-5s", atomic=True, time_limit=5)
def atomic_limited_5s_handler(message):
    """``atomic-limited`` with a time limit a slow first run stays well within (a
    database reached through a pool of two connections), for tests that need the
    limit to pass on a re-run only."""
    atomic_limited_handler(message)


# Async handlers (tests/integration/test_async.py). ASYNC is reset by each test:
# "active"/"peak" count the coroutines running at once, "threads" the threads
# they ran on, "cancelled" the messages whose coroutine was cancelled.
ASYNC: dict = {}


@handler("async", concurrency=20, max_attempts=2)
async def async_handler(message):
    """Writes an Effect through the async ORM. Payload: ``meet`` (wait until that
    many run at once), ``fail`` (raise on attempts <= fail), ``retry_in``,
    ``discard``, ``escape`` (raise that BaseException on the first attempt, once
    the meeting is over)."""
    payload = message.payload
    ASYNC.setdefault("threads", set()).add(threading.get_ident())
    ASYNC["active"] = ASYNC.get("active", 0) + 1
    ASYNC["peak"] = max(ASYNC.get("peak", 0), ASYNC["active"])
    try:
        if payload.get("meet"):
            met = ASYNC.setdefault("met", asyncio.Event())
            if ASYNC["active"] >= payload["meet"]:
                met.set()
            await asyncio.wait_for(met.wait(), 30)
        if payload.get("escape") and message.attempt_count == 1:
            raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[
                payload["escape"]
            ]("raised by an async handler")
        await Effect.objects.acreate(message_id=message.pk, value="async")
        if payload.get("retry_in") is not None and message.attempt_count == 1:
            raise Retry(delay=payload["retry_in"], reason="asked to")
        if payload.get("discard"):
            raise Discard(payload["discard"])
        if message.attempt_count <= int(payload.get("fail", 0)):
            raise Boom(f"attempt {message.attempt_count} of message {message.pk} failed")
    finally:
        ASYNC["active"] -= 1


@handler("async-limited", time_limit=0.5, max_attempts=1)
async def async_limited_handler(message):
    """Awaits far past its time limit: its coroutine is cancelled."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        ASYNC.setdefault("cancelled", []).append(message.pk)
        raise


# The fault-injection runs' workload (tests/chaos/faults.py).
@handler("outlives", time_limit=0.3, max_attempts=5, retry=FixedDelay(delay=0.1))
def outliving_handler(message):
    """Outlives its time limit on its first attempt only."""
    _run(message)
    if message.attempt_count == 1:
        time.sleep(0.6)


@handler("stolen", max_attempts=5, retry=FixedDelay(delay=0.1))
def stolen_handler(message):
    """Claimed away by an unknown worker on its first attempt, as after a lease that
    ran out: its outcome is no longer this attempt's to write."""
    import uuid

    from django_delayq.models import Message

    if message.attempt_count == 1:

        def steal():
            try:
                Message.objects.filter(pk=message.pk).update(
                    lock_token=uuid.uuid4(), locked_by="a-thief"
                )
            finally:
                connection.close()

        thread = threading.Thread(target=steal)
        thread.start()
        thread.join()
    _run(message)


@handler("surrogates", max_attempts=1)
def surrogate_handler(message):
    """Fails with a message holding a lone surrogate (a file name decoded with
    surrogateescape): its outcome is still recorded."""
    name = bytes.fromhex(message.payload["name"]).decode("utf-8", "surrogateescape")
    raise Boom(f"cannot open {name}")


# The adversary suite's handlers (tests/chaos/adversaries.py).
from tests.testapp import adversary_handlers  # noqa: E402, F401


def _step(message):
    # A workflow step: runs like any test message (the payload's knobs), then
    # returns the payload's "returns", or its key and what its parents returned.
    _run(message)
    payload = message.payload if isinstance(message.payload, dict) else {}
    if "echo" in payload:
        return {"i": payload["echo"], "parents": message.parent_results}
    if payload.get("returns_a_set"):
        return {1, 2}  # no JSON value
    if "returns" in payload:
        return payload["returns"]
    return {"key": message.key, "parents": message.parent_results}


@handler("steps", max_attempts=2, retry=FixedDelay(delay=0))
def step_handler(message):
    return _step(message)


@handler("steps-atomic", atomic=True, max_attempts=2, retry=FixedDelay(delay=0))
def atomic_step_handler(message):
    Effect.objects.create(message_id=message.pk, value=message.key)
    return _step(message)


@handler("steps-async", max_attempts=2, retry=FixedDelay(delay=0))
async def async_step_handler(message):
    await asyncio.sleep(0)
    return {"key": message.key, "async": True}
