"""The adversary run: real workers against what users and operators really do to them.

Beside the chaos run's faults (SIGKILL, SIGTERM and restart, every connection
cut), it lets loose, at random moments of the work, the adversaries the
worker must survive (each a small class below, :data:`ADVERSARIES`):

- producer transactions that hold an upsert or a ``reprioritise`` of a
  running message's row for more than two leases (PostgreSQL, MariaDB);
- every user callback (the handler, an async handler, the ``message_started``,
  ``message_succeeded``, ``message_retried`` and ``message_failed`` receivers,
  the retry policy) raising each of ``Exception``, ``DatabaseError``,
  ``InterfaceError``, ``asyncio.CancelledError``, ``KeyboardInterrupt`` and
  ``SystemExit`` once;
- atomic handlers that swallow a database error, or outlive their time limit
  inside a group of atomic attempts; async handlers;
- operators on "another host" whose clock is 30 s ahead or behind (a process
  whose ``timezone.now`` is shifted) retrying, cancelling, rescheduling and
  reprioritising messages through ``django_delayq.operations``;
- a SQLite worker whose atomic handler holds the write lock longer than the
  workers' liveness (SQLite only);
- many ordered groups (100,000 in the full run), lanes with a per-worker and
  a global concurrency cap, and a cron schedule whose ticks come faster than
  they are handled, so that many are claimed past their grace;
- impostors: a worker started under the name of a live one (``--name``, or
  containers sharing a host name): it must refuse the name (exit status 78)
  rather than hand back the live worker's running messages and run them
  beside it;
- workflows: fan-ins (a child enqueued ``after=`` many parents, which finish
  at the same moments on every worker; one parent in four fails, and its
  child must be cancelled) and chains, through the kills and cuts: no step
  may start before its parents succeeded, none may stay waiting, none run
  twice.

The handlers (``tests/testapp/adversary_handlers.py``) record every run in a
ledger table (message, attempt, worker pid, start, end). When everything has
drained, the invariants are checked from the database and the workers' logs,
and printed as a table of adversary x invariant (violations, with how often
each adversary fired); any violation fails.

Used by ``make chaos`` (``python -m tests.chaos.adversaries``, full size) and by
``tests/chaos/test_adversaries.py`` (short form, in the suite, on every database).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.chaos.common import (
    ROOT,
    Consumer,
    Event,
    cut_connections,
    empty,
    kill,
    kill_leftovers,
    now,
    prepare_database,
    released,
    setup_django,
    spawn_worker,
    time_limits_hit,
    wait_until_consuming,
)

EXCEPTIONS = (
    "Exception",
    "DatabaseError",
    "InterfaceError",
    "CancelledError",
    "KeyboardInterrupt",
    "SystemExit",
)
QUEUES = (
    "adv-lane",
    "adv-global",
    "adv-held",
    "adv-op",
    "adv-atomic",
    "adv-async",
    "adv-groups",
    "adv-ticks",
    "adv-cb",
    "adv-flow",
)
SQLITE_QUEUES = ("adv-long-atomic",)
#: The lock holder's ways of holding a row (``hold``), in turn.
HOLDS = ("lock-upsert", "lock-reprioritise", "lock-step", "lock-row-step")
#: The queue of the rows (``Shipment``) that lock-row-step schedules after a message,
#: and that of their stand-ins, which end with them.
ROWS = "shipments"
ROWS_STAND_INS = "delayq.row:testapp.shipment"
#: A message running longer than this (seconds since its attempt began) has no live
#: executor: no handler of the run takes a quarter of it, even held back by a lock.
STUCK_AFTER = 40.0
#: Host clock (handlers) against database clock (due times): the same machine; this
#: is the resolution of the coarsest (SQLite's milliseconds).
CLOCK_SLACK = timedelta(milliseconds=5)
SKEW = 30.0  # seconds: the operators' clock offsets are +SKEW and -SKEW
TICK_GRACE = 1.0


@dataclass
class Config:
    workers: int = 4
    concurrency: int = 4
    lane: int = 3_000  # adv-lane messages (per-worker cap 2), a tenth delayed
    global_: int = 600  # adv-global messages (cap 2 across workers)
    atomic: int = 1_000  # adv-atomic messages, a tenth swallow, a twentieth outlive
    async_: int = 1_000  # adv-async messages
    groups: int = 100_000  # ordered groups of one message ...
    long_groups: int = 2_000  # ... of which these have three
    holds: int = 20  # lock-holding producer transactions (half upserts)
    operations: int = 10  # per operator and action
    long_atomic: int = 4  # SQLite: atomic handlers holding the write lock
    fan_ins: int = 40  # workflows: children after ``fan`` parents each ...
    fan: int = 50
    chains: int = 20  # ... and chains of ``chain`` steps
    chain: int = 8
    kills: int = 8
    terms: int = 2
    cuts: int = 2
    impostors: int = 2
    lease: float = 2.0
    heartbeat: float = 0.5
    dead_after: float = 3.0
    # Whether a worker that says its heartbeat came after its promise ran out
    # (starved of CPU or of the database) is a cause for what others ran again
    # of its messages meanwhile. The short form runs beside the rest of the
    # suite on a loaded machine, where a worker's threads can go unscheduled
    # for seconds; the full run (make chaos) has the machine to itself and
    # counts those reruns as violations.
    starved_is_cause: bool = False
    seed: int = 11
    timeout: float = 2_400.0  # the full size drains in about 20 minutes on 2 cores

    @classmethod
    def short(cls) -> Config:
        """The suite's form: every adversary fires, in about a minute."""
        return cls(
            workers=3,
            lane=150,
            global_=40,
            atomic=60,
            async_=60,
            groups=600,
            long_groups=60,
            holds=4,
            operations=2,
            long_atomic=2,
            fan_ins=6,
            fan=12,
            chains=4,
            chain=5,
            kills=2,
            terms=1,
            cuts=1,
            impostors=1,
            timeout=420.0,
            starved_is_cause=True,
        )


# -- the adversaries -------------------------------------------------------------


@dataclass
class Adversary:
    """One kind of trouble: its name (the messages' payload ``adv``) and where it applies."""

    name: str
    vendors: tuple[str, ...] = ("postgresql", "sqlite", "mysql")
    why_not: str = ""

    def applies(self, vendor: str) -> bool:
        return vendor in self.vendors


ADVERSARIES = [
    Adversary("SIGKILL"),
    Adversary("SIGTERM + restart"),
    Adversary(
        "connections cut",
        ("postgresql", "mysql"),
        "SQLite has no server connections to cut",
    ),
    Adversary(
        "lock-upsert",
        ("postgresql", "mysql"),
        "SQLite has no row locks: a transaction held open blocks every writer",
    ),
    Adversary(
        "lock-reprioritise",
        ("postgresql", "mysql"),
        "SQLite has no row locks: a transaction held open blocks every writer",
    ),
    Adversary(
        "lock-step",
        ("postgresql", "mysql"),
        "SQLite has no row locks: a transaction held open blocks every writer",
    ),
    Adversary(
        "lock-row-step",
        ("postgresql", "mysql"),
        "SQLite has no row locks: a transaction held open blocks every writer",
    ),
    *(Adversary(f"raise {name}") for name in EXCEPTIONS),
    Adversary("atomic-swallow"),
    Adversary("atomic-time-limit"),
    Adversary("async"),
    Adversary("operator +30s"),
    Adversary("operator -30s"),
    Adversary(
        "sqlite-long-atomic",
        ("sqlite",),
        "only SQLite has one write lock for the whole database",
    ),
    Adversary("ordered groups"),
    Adversary("lanes"),
    Adversary("cron ticks"),
    Adversary("workflows"),
    Adversary("impostor"),
]
INVARIANTS = (
    "lost or wrong end",
    "twice at once",
    "rerun w/o cause",
    "lane over cap",
    "group order",
    "atomic effect",
    "ran early",
    "missed tick ran",
    "stuck running",
    "step before parent",
)


# -- the producer, the lock holders, the operators (processes of their own) ------


def _in_chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _retrying(what: str, call: Any) -> Any:
    """``call()``, again after a cut connection (the run cuts them on purpose)."""
    from django.db import InterfaceError, OperationalError, connection

    for attempt in range(60):
        try:
            return call()
        except (OperationalError, InterfaceError):
            connection.close()
            time.sleep(min(2.0, 0.05 * 2**attempt))  # back-off before reconnecting
    raise SystemExit(f"{what}: the database never came back")


def _poll(predicate: Any, what: str, timeout: float) -> None:
    """Poll ``predicate`` until it is true, or fail the process after ``timeout``
    (the run's: a message of this process waits its turn behind the whole
    backlog, 100,000 ordered groups due at once at full size)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.1)


def workload(config: Config, vendor: str) -> list[dict[str, Any]]:
    """Every message the producer sends: queue, key, payload, options."""
    rng = random.Random(config.seed)
    items: list[dict[str, Any]] = []

    def add(queue: str, key: str, adv: str, **options: Any) -> None:
        payload = {"adv": adv, "expect": "succeeded", **options.pop("payload", {})}
        items.append({"queue": queue, "key": key, "payload": payload, **options})

    for i in range(config.lane):
        delay = round(rng.uniform(0.5, 3.0), 3) if rng.random() < 0.1 else 0
        add("adv-lane", f"lane-{i}", "lanes", payload={"sleep": 0.05}, delay=delay)
    for i in range(config.global_):
        add("adv-global", f"global-{i}", "lanes", payload={"sleep": 0.05})
    for i in range(config.atomic):
        mode, adv = "", "atomic-time-limit"
        if i % 10 == 0:
            mode, adv = "swallow", "atomic-swallow"
        elif i % 20 == 1:
            mode = "outlive"
        add("adv-atomic", f"atomic-{i}", adv, payload={"mode": mode})
    for i in range(config.async_):
        add("adv-async", f"async-{i}", "async", payload={"sleep": 0.05})
    for where in (
        "handler",
        "async-handler",
        "started",
        "succeeded",
        "retried",
        "failed",
        "policy",
    ):
        for name in EXCEPTIONS:
            payload: dict[str, Any] = {"where": where, "exc": name}
            queue, options = "adv-cb", {}
            if where == "handler":
                payload["raise"] = name
            elif where == "async-handler":
                queue, payload["raise"] = "adv-async", name
            elif where in ("retried", "policy"):
                # Its runs fail until the callback has raised, whichever attempts
                # those are: a worker killed after the handler failed but before
                # the callback ran must not leave the callback untried.
                payload["fail_until"] = where
            elif where == "failed":
                payload.update(fail=1, expect="failed")
                options["max_attempts"] = 1
            add(queue, f"cb-{where}-{name}", f"raise {name}", payload=payload, **options)
    if vendor == "sqlite":
        for i in range(config.long_atomic):
            add("adv-long-atomic", f"long-{i}", "sqlite-long-atomic", payload={"sleep": 7.0})
    for offset in (SKEW, -SKEW):
        adv = f"operator {offset:+.0f}s"
        for i in range(config.operations):
            tag = f"{offset:+.0f}-{i}"
            add("adv-op", f"op-cancel{tag}", adv, payload={"expect": "cancelled"}, delay=3600)
            add("adv-op", f"op-reschedule{tag}", adv, delay=3600)
            add("adv-op", f"op-reprioritise{tag}", adv, delay=3600)
            add("adv-op", f"op-backdate{tag}", adv, delay=3600)
            add("adv-op", f"op-retry{tag}", adv, payload={"fail": 1}, max_attempts=1)
    for g in range(config.groups):
        for v in range(3 if g < config.long_groups else 1):
            add("adv-groups", f"g{g}-{v}", "ordered groups", payload={"v": v}, group=f"g{g}")
    for f in range(config.fan_ins):
        failing = f % 4 == 3  # one parent fails for good: its child is cancelled
        parents = [f"fan{f}-p{p}" for p in range(config.fan)]
        for p, key in enumerate(parents):
            if failing and p == 0:
                add("adv-flow", key, "workflows", payload={"fail": 1, "expect": "failed"},
                    max_attempts=1, flow=f"fan{f}")  # fmt: skip
            else:
                add("adv-flow", key, "workflows", flow=f"fan{f}")
        expect = "cancelled" if failing else "succeeded"
        add("adv-flow", f"fan{f}-child", "workflows", payload={"expect": expect},
            after=parents, flow=f"fan{f}")  # fmt: skip
    for c in range(config.chains):
        for s in range(config.chain):
            after = [f"chain{c}-{s - 1}"] if s else None
            add("adv-flow", f"chain{c}-{s}", "workflows", after=after, flow=f"chain{c}")
    return items


def produce(config: Config) -> None:
    """Enqueue the workload, in transactions that also write the ledger (``Sent``)."""
    from django.db import connection, transaction

    from django_delayq import enqueue, enqueue_many
    from tests.testapp.models import Sent

    items = workload(config, connection.vendor)
    # Interleave the kinds of work, so every adversary meets the others.
    random.Random(config.seed).shuffle(items)
    rest = [i for i in items if i["queue"] not in ("adv-groups", "adv-flow")]
    batches = _in_chunks(rest, 50)
    # A workflow in one transaction, its parents before their children.
    flows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i in workload(config, connection.vendor):
        if i["queue"] == "adv-flow":
            flows[i["flow"]].append(i)
    batches += list(flows.values())
    for v in range(3):
        # A group's messages in their order: every group's first before any second.
        nth = [i for i in items if i["queue"] == "adv-groups" and i["payload"]["v"] == v]
        later = _in_chunks(nth, 500)
        if v == 0:
            batches += later
            random.Random(config.seed + 1).shuffle(batches)
        else:
            batches += later

    def send(batch: list[dict[str, Any]]) -> None:
        with transaction.atomic():
            if batch[0]["queue"] == "adv-groups":
                enqueue_many(
                    "adv-groups",
                    [i["payload"] for i in batch],
                    keys=[i["key"] for i in batch],
                    groups=[i["group"] for i in batch],
                )
            else:
                for i in batch:
                    enqueue(
                        i["queue"],
                        i["payload"],
                        key=i["key"],
                        delay=i.get("delay") or None,
                        max_attempts=i.get("max_attempts"),
                        after=[(i["queue"], k) for k in i.get("after") or ()] or None,
                    )
            Sent.objects.bulk_create(
                Sent(producer=0, queue=i["queue"], key=i["key"], outcome="sent") for i in batch
            )

    for batch in batches:
        _retrying("the producer", lambda batch=batch: send(batch))
    print(f"producer: committed {len(items)} messages in {len(batches)} batches", flush=True)


def hold(config: Config) -> None:
    """Hold a running message's row lock for more than two leases, ``holds`` times:
    an upsert (``on_conflict="update"``, due later) or an operator's ``reprioritise``;
    or (``lock-step``) hold, by an upsert of its key, the row of a workflow step
    waiting for a running parent, while that parent ends; or (``lock-row-step``)
    hold, as an application editing it, a row of its own model (``Shipment``)
    scheduled after a running parent, while that parent ends."""
    from django.db import transaction

    from django_delayq import enqueue, operations
    from django_delayq.models import Message
    from tests.testapp.models import Operation, Sent, Shipment

    held = config.lease * 2.5
    for i in range(config.holds):
        adv = HOLDS[i % len(HOLDS)]
        # A message may run and end between two looks (a loaded machine, a
        # cut connection): then another one is sent, until one is caught.
        for attempt in range(20):
            key = f"held-{i}-{attempt}"

            def send(key: str = key, adv: str = adv) -> None:
                if Sent.objects.filter(queue="adv-held", key=key).exists():
                    return  # committed, its reply lost to a cut: once is enough
                with transaction.atomic():
                    parent = enqueue(
                        "adv-held",
                        {"adv": adv, "expect": "succeeded", "sleep": 3.0, "v": 1},
                        key=key,
                    )
                    Sent.objects.create(producer=1, queue="adv-held", key=key, outcome="sent")
                    if adv == "lock-step":
                        enqueue(
                            "adv-held",
                            {"adv": adv, "expect": "succeeded", "v": 1},
                            key=f"{key}-step",
                            after=[parent],
                        )
                        Sent.objects.create(
                            producer=1, queue="adv-held", key=f"{key}-step", outcome="sent"
                        )
                    elif adv == "lock-row-step":
                        Shipment.objects.create(reference=f"{key}-row").schedule(after=[parent])

            _retrying("a lock holder", send)

            def once(key: str = key, adv: str = adv) -> str:
                with transaction.atomic():
                    rows = Message.objects.select_for_update().filter(queue="adv-held", key=key)
                    message = rows.first()
                    if message is None or message.status == "pending":
                        return ""  # not claimed yet
                    if message.status != "running":
                        return "missed"
                    at = now()
                    if adv == "lock-upsert":
                        enqueue(
                            "adv-held",
                            {"adv": adv, "expect": "succeeded", "v": 2, "sleep": 0.1},
                            key=key,
                            on_conflict="update",
                            delay=config.lease * 2,
                        )
                        changed = 1
                    elif adv == "lock-step":
                        # The step's row, not the running parent's: the parent
                        # ends meanwhile, and its worker must not wait for it.
                        changed = int(
                            enqueue(
                                "adv-held",
                                {"adv": adv, "expect": "succeeded", "v": 2},
                                key=f"{key}-step",
                                on_conflict="update",
                            ).outcome.name
                            == "UPDATED"
                        )
                    elif adv == "lock-row-step":
                        # The application edits the waiting row as its parent ends.
                        Shipment.objects.select_for_update().get(reference=f"{key}-row")
                        changed = 1
                    else:
                        changed = operations.reprioritise(
                            Message.objects.filter(pk=message.pk), 9
                        ).changed
                    time.sleep(held)  # the adversary: the row lock held for 2.5 leases
                    Operation.objects.create(
                        message_id=message.pk, action=adv, at=at, changed=changed
                    )
                    return "held"

            outcome: list[str] = []

            def caught(once: Any = once, outcome: list[str] = outcome) -> bool:
                outcome[:] = [_retrying("a lock holder", once)]
                return bool(outcome[0])

            _poll(caught, f"{key} to run", config.timeout)
            if outcome[0] == "held":
                break
        else:
            raise SystemExit(f"never caught a message of adv-held running ({adv})")
    print(f"lock holder: held {config.holds} running rows for {held:g} s each", flush=True)


def operate(config: Config, offset: float) -> None:
    """An operator on a host whose clock is ``offset`` seconds off: every clock read
    of this process (``timezone.now``, ``django_delayq.clock.now``) is shifted."""
    from django.db import transaction
    from django.utils import timezone

    from django_delayq import clock, operations
    from django_delayq.models import Message
    from tests.testapp.models import Operation

    real_now = timezone.now

    def skewed() -> datetime:
        return real_now() + timedelta(seconds=offset)

    timezone.now = skewed  # type: ignore[assignment]
    clock.now = skewed  # type: ignore[assignment]

    def act(action: str, key: str, apply: Any, due: datetime | None = None) -> None:
        rows = Message.objects.filter(queue="adv-op", key=key)
        _poll(
            lambda: _retrying("an operator", rows.exists), f"{key} to be enqueued", config.timeout
        )

        def once() -> None:
            # The operation and its record in one transaction: a connection cut
            # after the operation's commit but before the record's made the
            # retry operate again on a message the first call had changed
            # (a reschedule to "now" it had already run: "lost or wrong end").
            with transaction.atomic():
                record()

        def record() -> None:
            message_id = rows.values_list("pk", flat=True).get()
            at = real_now()
            result = apply(rows)
            Operation.objects.create(
                message_id=message_id,
                action=action,
                offset=offset,
                at=at,
                due=due,
                changed=result.changed,
            )

        _retrying("an operator", once)

    def failed(key: str) -> bool:
        return _retrying(
            "an operator",
            lambda: Message.objects.filter(queue="adv-op", key=key, status="failed").exists(),
        )

    tag = f"{offset:+.0f}"
    for i in range(config.operations):
        act("cancel", f"op-cancel{tag}-{i}", operations.cancel)
        due = clock.now() + timedelta(seconds=1)
        act(
            "reschedule",
            f"op-reschedule{tag}-{i}",
            lambda r, due=due: operations.reschedule(r, run_at=due),
            due,
        )
        act("reprioritise", f"op-reprioritise{tag}-{i}", lambda r: operations.reprioritise(r, 5))
        act("run_now", f"op-reprioritise{tag}-{i}", operations.run_now)
        # The project's own UPDATE, with no NOTIFY: due a minute ago, below where
        # listening workers' claims begin (worker/floors.py).
        act(
            "backdate",
            f"op-backdate{tag}-{i}",
            lambda r: SimpleNamespace(
                changed=r.update(next_attempt_time=real_now() - timedelta(minutes=1))
            ),
        )
        _poll(
            lambda i=i: failed(f"op-retry{tag}-{i}"), f"op-retry{tag}-{i} to fail", config.timeout
        )
        act("retry", f"op-retry{tag}-{i}", operations.retry_failed)
    print(f"operator {tag}: {config.operations * 6} actions", flush=True)


# -- the run ---------------------------------------------------------------------


class Run:
    def __init__(self, config: Config, env: dict[str, str], workdir: Path) -> None:
        from django.db import connection

        self.config = config
        self.vendor = connection.vendor
        schedule = {
            "adv-tick": {
                "every": 1,
                "queue": "adv-ticks",
                "grace": TICK_GRACE,
                "payload": {"adv": "cron ticks", "sleep": 1.5},
            }
        }
        self.env = {
            **env,
            "DELAYQ_TEST_LEASE": str(config.lease),
            "DELAYQ_TEST_HEARTBEAT": str(config.heartbeat),
            "DELAYQ_TEST_DEAD_AFTER": str(config.dead_after),
            "DELAYQ_TEST_POLL": "0.5",
            "DELAYQ_TEST_GRACE": "30",
            "DELAYQ_TEST_SCHEDULES": json.dumps(schedule),
            "DELAYQ_TEST_ADVERSARY_CALLBACKS": "1",
            "DELAYQ_LOG_LEVEL": "INFO",
            "DELAYQ_LOG_TIMES": "1",
        }
        self.workdir = workdir
        self.ledger = workdir / "ledger"
        self.ledger.mkdir(exist_ok=True)
        self.env["DELAYQ_TEST_ADVERSARY_LEDGER"] = str(self.ledger)
        self._read: dict[Path, int] = {}
        self._started = 0
        self.rng = random.Random(config.seed)
        self.consumers: list[Consumer] = []
        self.retired: list[Consumer] = []
        # Every other process of the run (producer, operators, holder): none may
        # outlive a failed run and act on the next one's messages, whose keys
        # are the same.
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.events: list[Event] = []
        self.crashes = 0
        self.exit_codes: list[int] = []
        self.stuck: set[int] = set()
        # Workers started under a live worker's name, with that worker's pid.
        self.impostors: list[tuple[Consumer, int]] = []
        self.impostor_exits: list[tuple[int | None, bool]] = []
        self.expected_runs = len(workload(config, self.vendor))
        self._spawned = 0

    def applies(self, name: str) -> bool:
        return next(a for a in ADVERSARIES if a.name == name).applies(self.vendor)

    def spawn_consumer(self) -> Consumer:
        self._spawned += 1
        queues = QUEUES + (SQLITE_QUEUES if self.vendor == "sqlite" else ()) + (ROWS,)
        consumer = spawn_worker(
            [*(a for q in queues for a in ("--queue", q))]
            + ["--concurrency", str(self.config.concurrency), "--batch-size", "8"],
            self.env,
            self.workdir / f"worker-{self._spawned}.log",
        )
        self.consumers.append(consumer)
        return consumer

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.adversaries", *args]
                + ["--config", json.dumps(asdict(self.config))],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.helpers.append(proc)
        return proc

    def retire(self, consumer: Consumer) -> None:
        consumer.ended = now()
        self.consumers.remove(consumer)
        self.retired.append(consumer)

    def _killable(self) -> list[Consumer]:
        """The consumers but those an impostor still running took the name of: its
        refusal is what the run checks (a killed holder's name is free to take)."""
        taken = {pid for impostor, pid in self.impostors if impostor.proc.poll() is None}
        return [c for c in self.consumers if c.proc.pid not in taken] or self.consumers

    def kill_one(self) -> None:
        victim = self.rng.choice(self._killable())
        self.events.append(kill(victim))
        self.retire(victim)
        self.spawn_consumer()

    def term_one(self) -> None:
        victim = self.rng.choice(self._killable())
        wait_until_consuming(victim)
        victim.expected_exit = True
        self.events.append(Event(now(), "term", victim.proc.pid))
        victim.proc.send_signal(signal.SIGTERM)
        self.retire(victim)
        self.spawn_consumer()

    def cut(self) -> None:
        self.events.append(cut_connections())

    def impostor(self) -> None:
        """Start a worker under the (default) name of a live one."""
        victim = self.rng.choice(self.consumers)
        name = f"{socket.gethostname()}:{victim.proc.pid}"
        if not wait_until_consuming(victim) or not self.holds_its_name(victim, name):
            return
        queues = QUEUES + (SQLITE_QUEUES if self.vendor == "sqlite" else ())
        impostor = spawn_worker(
            [*(a for q in queues for a in ("--queue", q)), "--name", name],
            self.env,
            self.workdir / f"impostor-{len(self.impostors) + 1}.log",
        )
        self.events.append(Event(now(), "impostor", impostor.proc.pid, victim.proc.pid))
        self.impostors.append((impostor, victim.proc.pid))

    def holds_its_name(self, consumer: Consumer, name: str, timeout: float = 60.0) -> bool:
        """Poll (with a deadline) until ``consumer`` holds ``name``: it logs that it
        consumes before it takes its name, and a worker that could not take it yet
        (SQLite's write lock held) is no live holder an impostor could wrong."""
        from django_delayq.models import WorkerState

        deadline = time.monotonic() + timeout
        held = WorkerState.objects.filter(name=name, pid=consumer.proc.pid, stopped_at=None)
        while time.monotonic() < deadline and consumer.proc.poll() is None:
            if held.exists():
                return True
            time.sleep(0.05)
        return False

    def end_impostors(self) -> None:
        """How each impostor ended: its exit status, and whether its victim had died
        first (then taking the name over was right; it is stopped here)."""
        gone = {e.pid for e in self.events if e.kind in ("kill", "term")}
        for impostor, victim in self.impostors:
            if impostor.proc.poll() is None and wait_until_consuming(impostor, 5):
                impostor.proc.send_signal(signal.SIGTERM)
            code = impostor.proc.wait(timeout=120)
            self.impostor_exits.append((code, victim in gone))

    def progress(self) -> float:
        """Runs started so far (the ledger's new lines), over the runs expected."""
        for path in self.ledger.glob("*.jsonl"):
            with path.open("rb") as file:
                file.seek(self._read.get(path, 0))
                chunk = file.read()
            whole = chunk[: chunk.rfind(b"\n") + 1]
            self._read[path] = self._read.get(path, 0) + len(whole)
            self._started += sum(
                1
                for line in whole.splitlines()
                if b'"message_id"' in line and b'"adv-ticks"' not in line
            )
        return self._started / max(1, self.expected_runs)

    def active(self) -> int:
        from django_delayq.models import Message

        queues = [q for q in QUEUES if q != "adv-ticks"] + [*SQLITE_QUEUES, ROWS_STAND_INS]
        return Message.objects.active().filter(queue__in=queues).count()

    def undrained(self) -> str:
        """What a run that does not drain still waits for: its active messages and the
        workers that hold them, as the database sees them."""
        from django_delayq import clock
        from django_delayq.models import Message, WorkerState

        queues = [q for q in QUEUES if q != "adv-ticks"] + list(SQLITE_QUEUES)
        fields = ("pk", "queue", "kind", "status", "locked_by", "next_attempt_time", "group")
        rows = Message.objects.active().filter(queue__in=queues).values_list(*fields)[:40]
        workers = WorkerState.objects.values_list("name", "last_seen", "alive_until", "stopped_at")
        return "\n".join(
            [f"this host's time {clock.now()}", "active messages:"]
            + [f"  {row}" for row in rows]
            + ["workers:"]
            + [f"  {w}" for w in workers]
        )

    def look_for_stuck(self) -> None:
        """Messages running for longer than any handler here takes: no live executor."""
        from django_delayq import clock
        from django_delayq.models import Message

        since = clock.sql_now_plus(-timedelta(seconds=STUCK_AFTER))
        self.stuck.update(
            Message.objects.filter(
                queue__in=QUEUES + SQLITE_QUEUES, status="running", last_attempt_time__lt=since
            ).values_list("pk", flat=True)
        )

    def execute(self) -> float:
        c = self.config
        started = time.monotonic()
        deadline = started + c.timeout
        for _ in range(c.workers):
            self.spawn_consumer()
        helpers = {"producer": self.spawn("producer", "produce")}
        for offset in (SKEW, -SKEW):
            helpers[f"operator{offset:+.0f}"] = self.spawn(
                f"operator{offset:+.0f}", "operate", str(offset)
            )
        if self.applies("lock-upsert"):
            helpers["holder"] = self.spawn("holder", "hold")
        # Faults are spread over the run by progress, with jitter.
        plan: list[tuple[float, str]] = []
        for i in range(c.kills):
            plan.append(((i + self.rng.uniform(0.3, 0.9)) / (c.kills + 0.5) * 0.9, "kill_one"))
        for i in range(c.terms):
            plan.append(((i + self.rng.uniform(0.2, 0.8)) / c.terms * 0.8, "term_one"))
        if self.applies("connections cut"):
            for i in range(c.cuts):
                plan.append(((i + self.rng.uniform(0.3, 0.7)) / c.cuts * 0.7, "cut"))
        for i in range(c.impostors):
            plan.append(((i + self.rng.uniform(0.2, 0.8)) / c.impostors * 0.8, "impostor"))
        plan.sort()
        looked = 0.0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"adversary run did not drain within {c.timeout:.0f} s; "
                    f"plan left: {plan}, progress {self.progress():.2f}\n{self.undrained()}"
                )
            for consumer in list(self.consumers):
                if consumer.proc.poll() is not None and not consumer.expected_exit:
                    self.crashes += 1
                    self.retire(consumer)
                    self.spawn_consumer()
            for name, proc in helpers.items():
                if proc.poll() not in (None, 0):
                    raise RuntimeError(f"the {name} failed (see {self.workdir}/{name}.log)")
            if time.monotonic() - looked > 1.0:
                looked = time.monotonic()
                self.look_for_stuck()
            if plan and self.progress() >= plan[0][0]:
                getattr(self, plan.pop(0)[1])()
                continue
            if not plan and all(p.poll() == 0 for p in helpers.values()) and not self.active():
                break
            time.sleep(0.2)  # pacing of the run's own polling, not synchronisation
        elapsed = time.monotonic() - started
        self.look_for_stuck()
        with (self.workdir / "events.txt").open("w") as out:
            for event in self.events:
                out.write(f"{event.at.isoformat()} {event.kind} pid={event.pid} {event.detail}\n")
        for consumer in self.consumers:
            wait_until_consuming(consumer)
            consumer.expected_exit = True
            consumer.proc.send_signal(signal.SIGTERM)
        self.exit_codes = [consumer.proc.wait(timeout=120) for consumer in self.consumers]
        self.end_impostors()
        terminated = {e.pid for e in self.events if e.kind == "term"}
        for consumer in self.retired:
            code = consumer.proc.wait(timeout=120)
            if consumer.proc.pid in terminated:
                self.exit_codes.append(code)
        return elapsed


def reset() -> None:
    from django_delayq.models import Dependency, Message, WorkerState
    from tests.testapp.models import Effect, Execution, Operation, Raised, Sent, Shipment

    empty((Dependency, Message, WorkerState, Execution, Effect, Sent, Operation, Raised, Shipment))


# -- the invariants --------------------------------------------------------------


@dataclass
class Table:
    """Adversary x invariant: violations (message ids as examples), and how often each fired."""

    vendor: str
    fired: Counter[str] = field(default_factory=Counter)
    violations: dict[tuple[str, str], list[Any]] = field(default_factory=lambda: defaultdict(list))
    figures: list[tuple[str, object]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    general: dict[str, int] = field(default_factory=dict)

    def violate(self, adversary: str, invariant: str, example: Any) -> None:
        self.violations[adversary, invariant].append(example)

    @property
    def failures(self) -> list[str]:
        out = [
            f"{adv} / {inv}: {len(ex)} (e.g. {ex[:5]})"
            for (adv, inv), ex in self.violations.items()
            if ex
        ]
        out += [f"{name}: {value}" for name, value in self.general.items() if value]
        return out

    def count(self, adversary: str, invariant: str) -> int:
        return len(self.violations.get((adversary, invariant), []))

    def render(self) -> str:
        width = max(len(a.name) for a in ADVERSARIES) + 2
        cols = ["fired", *INVARIANTS]
        head = "adversary".ljust(width) + "".join(c.rjust(max(len(c), 6) + 2) for c in cols)
        lines = [f"adversary suite on {self.vendor}", head, "-" * len(head)]
        for adversary in ADVERSARIES:
            name = adversary.name
            if name in self.skipped:
                lines.append(f"{name.ljust(width)}  skipped: {self.skipped[name]}")
                continue
            cells = [str(self.fired[name])] + [str(self.count(name, i)) for i in INVARIANTS]
            lines.append(
                name.ljust(width)
                + "".join(v.rjust(max(len(c), 6) + 2) for v, c in zip(cells, cols, strict=True))
            )
        lines.append("")
        for name, value in self.general.items():
            lines.append(f"{name.ljust(width + 20)}  {value:>8}  (must be 0)")
        for name, figure in self.figures:
            lines.append(f"{name.ljust(width + 20)}  {figure!s:>8}")
        lines.append("")
        failures = self.failures
        lines.append("PASS" if not failures else "FAIL: " + "; ".join(failures))
        return "\n".join(lines)


def _intervals_over(intervals: list[tuple[datetime, datetime, Any]], cap: int) -> list[Any]:
    """The runs that started while ``cap`` others were already running."""
    points = []
    for start, end, ident in intervals:
        points.append((start, 1, ident))
        points.append((end, 0, ident))
    points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
    running, over = 0, []
    for _, kind, ident in points:
        if kind:
            running += 1
            if running > cap:
                over.append(ident)
        else:
            running -= 1
    return over


#: A worker's heartbeat that came after its promise ran out, as it logs it
#: (worker/keeper.py): when, its pid, and how long after the previous one.
LATE_HEARTBEAT = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) (\d+) heartbeat ([\d.]+) s after the previous one",
    re.MULTILINE,
)
#: A release by another worker that read the starved one's heartbeat just before
#: it was renewed commits a moment after.
STARVED_SLACK = timedelta(seconds=1)


# The receivers of an outcome's signal run after the outcome committed: a
# worker killed between the two leaves the message ended (the database says
# so, and nothing runs it again) with its receiver never called.
ANNOUNCED_AFTER_COMMIT = {"succeeded": "succeeded", "failed": "failed"}


def _killed_before_announcing(
    message: dict[str, Any], runs: dict[int, list[dict[str, Any]]], kills: dict[int, datetime]
) -> bool:
    """Whether ``message`` ended as its callback's signal says, in a run whose worker
    was killed (SIGKILL) after that run started: its announcement may never have come."""
    if message["status"] != ANNOUNCED_AFTER_COMMIT[message["payload"]["where"]]:
        return False
    mine = runs.get(message["id"], [])
    if not mine:
        return False
    last = max(mine, key=lambda r: r["started"])
    killed = kills.get(last["pid"])
    return killed is not None and killed >= last["started"]


def late_heartbeats(logs: str) -> dict[int, list[tuple[datetime, datetime]]]:
    """Each worker's windows without a heartbeat past its promise, by pid (log times are
    this host's local time)."""
    windows: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for at, pid, gap in LATE_HEARTBEAT.findall(logs):
        end = datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f").astimezone()
        windows[int(pid)].append((end - timedelta(seconds=float(gap)), end))
    return windows


def check(run: Run, elapsed: float) -> Table:
    from django_delayq.cron.ticks import parse_key
    from django_delayq.models import Message
    from tests.testapp.adversary_handlers import ATOMIC_TIME_LIMIT, read_ledger
    from tests.testapp.models import Effect, Operation, Raised, Sent

    c = run.config
    table = Table(run.vendor)
    for adversary in ADVERSARIES:
        if not adversary.applies(run.vendor):
            table.skipped[adversary.name] = adversary.why_not

    queues = QUEUES + SQLITE_QUEUES
    messages = {
        m["id"]: m
        for m in Message.objects.filter(queue__in=queues).values(
            "id",
            "queue",
            "key",
            "status",
            "attempt_count",
            "max_attempts",
            "scheduled_time",
            "payload",
            "group",
            "last_error",
        )
    }
    by_key = {(m["queue"], m["key"]): m for m in messages.values()}
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    all_runs = read_ledger(str(run.ledger))
    for r in all_runs:
        runs[r["message_id"]].append(r)
    sent = set(Sent.objects.values_list("queue", "key"))
    ops = list(Operation.objects.values())
    raised = list(Raised.objects.values())
    effects = Counter(
        Effect.objects.filter(
            message_id__in=[i for i, m in messages.items() if m["queue"].endswith("atomic")]
        ).values_list("message_id", flat=True)
    )

    def adv(message: dict[str, Any]) -> str:
        payload = message["payload"] if isinstance(message["payload"], dict) else {}
        return str(payload.get("adv", "?"))

    kills = {e.pid: e.at for e in run.events if e.kind == "kill"}
    terms = {e.pid: e.at for e in run.events if e.kind == "term"}
    cuts = [e.at for e in run.events if e.kind == "disrupt"]
    table.fired["SIGKILL"] = len(kills)
    table.fired["SIGTERM + restart"] = len(terms)
    table.fired["connections cut"] = sum(e.detail for e in run.events if e.kind == "disrupt")

    def ended(r: dict[str, Any], upto: datetime | None = None) -> datetime:
        """When a run ended: its end (the ledger is a file: written whatever the
        database does), else its worker's SIGKILL."""
        if r["finished"] is not None:
            return r["finished"]
        killed = kills.get(r["pid"])
        if killed is not None and killed >= r["started"]:
            return killed
        return upto or r["started"]

    logs = "\n".join(
        consumer.log.read_text(errors="replace")
        for consumer in [*run.retired, *run.consumers, *(i for i, _ in run.impostors)]
    )
    # Attempts the workers recorded as failed though the handler returned (an
    # atomic handler's swallowed database error, a time limit), or handed back.
    failed = (
        {
            (int(m), int(a))
            for m, a in re.findall(r"message (\d+) \([^)]*\) attempt (\d+) failed", logs)
        }
        | {
            (int(m), int(a))
            for m, a in re.findall(
                r"message (\d+) \([^)]*\) ran past its time limit of [^:]*: attempt (\d+)", logs
            )
        }
        | {
            # Handed back by its worker, to run again (an atomic group's re-run
            # taken past its time limit, an outcome that could not be written).
            (int(m), int(a))
            for m, a in re.findall(r"message (\d+) \([^)]*\) attempt (\d+) handed back", logs)
        }
    )

    starved_windows = late_heartbeats(logs)
    starved_reruns: set[tuple[int, int]] = set()

    def starved(prev: dict[str, Any], nxt: dict[str, Any]) -> bool:
        """``prev``'s worker broke its heartbeat's promise while it ran ``prev``, and
        said so: others could take it for dead and run the message again. (Only
        where the run counts that as a cause: ``Config.starved_is_cause``.)"""
        if not c.starved_is_cause:
            return False
        until = prev["finished"] or nxt["started"]
        return any(
            start <= until and prev["started"] <= end + STARVED_SLACK and start <= nxt["started"]
            for start, end in starved_windows.get(prev["pid"], ())
        )

    def excused_by_starvation(prev: dict[str, Any], nxt: dict[str, Any]) -> bool:
        """:func:`starved`, counted in the figures when it is what excuses ``nxt``."""
        if not starved(prev, nxt):
            return False
        starved_reruns.add((prev["message_id"], nxt["attempt"]))
        return True

    def explained(prev: dict[str, Any], nxt: dict[str, Any]) -> bool:
        """Why a message may run again after ``prev``."""
        if prev["outcome"] == "raised":
            return True  # a planned failure
        if (prev["message_id"], prev["attempt"]) in failed:
            return True  # the worker recorded its failure (logged)
        if prev["queue"] == "adv-atomic" and (prev["pid"], prev["attempt"], prev["claimed"]) == (
            nxt["pid"],
            nxt["attempt"],
            nxt["claimed"],
        ):
            # The same attempt again, alone: an atomic group whose commit failed
            # (a member's time limit) rolled back and its worker runs each member
            # again in a transaction of its own ("atomic effect" checks that one
            # run's writes committed, once).
            return True
        killed = kills.get(prev["pid"])
        if killed is not None and prev["started"] <= killed <= nxt["started"]:
            return True
        if prev["pid"] in terms and terms[prev["pid"]] >= prev["started"]:
            return True
        window_end = (prev["finished"] or nxt["started"]) + timedelta(seconds=5)
        if any(prev["started"] - timedelta(seconds=1) <= t <= window_end for t in cuts):
            return True
        if prev["queue"] == "adv-held" and prev["version"] != nxt["version"]:
            return True
        # Last: counted only where nothing else explains it.
        return excused_by_starvation(prev, nxt)

    # lost or wrong end; ledger
    for queue, key in sent:
        m = by_key.get((queue, key))
        if m is None:
            table.violate("?", "lost or wrong end", key)
            continue
        expect = m["payload"].get("expect", "succeeded")
        if m["status"] != expect:
            table.violate(adv(m), "lost or wrong end", m["id"])
    for m in messages.values():
        if m["queue"] != "adv-ticks" and (m["queue"], m["key"]) not in sent:
            table.violate(adv(m), "lost or wrong end", m["id"])

    # twice at once, reruns without a cause, ran early
    for message_id, rs in runs.items():
        m = messages.get(message_id)
        if m is None:
            continue
        name = adv(m)
        for prev, nxt in zip(rs, rs[1:], strict=False):
            if not explained(prev, nxt):
                table.violate(name, "rerun w/o cause", message_id)
            limit_passed = prev["queue"] == "adv-atomic" and nxt["started"] - prev[
                "started"
            ] >= timedelta(seconds=ATOMIC_TIME_LIMIT)
            if (
                nxt["started"] < ended(prev, nxt["started"])
                and not limit_passed
                and not excused_by_starvation(prev, nxt)
            ):
                table.violate(name, "twice at once", message_id)
        for r in rs:
            due = m["scheduled_time"] if r["version"] == 2 or m["queue"] != "adv-held" else None
            if due is not None and r["started"] + CLOCK_SLACK < due and m["queue"] != "adv-op":
                table.violate(name, "ran early", message_id)

    # operators: what they did, and that it held
    for op in ops:
        m = messages[op["message_id"]]
        if op["action"] in HOLDS:
            table.fired[op["action"]] += 1 if op["changed"] else 0
            continue
        table.fired[adv(m)] += 1 if op["changed"] else 0
        rs = runs.get(op["message_id"], [])
        if op["action"] == "backdate" and not op["changed"]:
            table.violate(adv(m), "lost or wrong end", m["id"])
        if op["action"] == "cancel" and (rs or not op["changed"]):
            table.violate(adv(m), "lost or wrong end", m["id"])
        if op["action"] == "reschedule":
            if not op["changed"]:
                table.violate(adv(m), "lost or wrong end", m["id"])
            if any(r["started"] + CLOCK_SLACK < op["due"] for r in rs):
                table.violate(adv(m), "ran early", m["id"])
        # The retry allows one attempt more than the message had spent (a claim
        # that gave up after a killed worker's attempt counts), and that one
        # succeeds: attempt 2 of 2, or 3 of 3 after such a give-up.
        if op["action"] == "retry" and (
            not op["changed"]
            or m["status"] != "succeeded"
            or m["attempt_count"] != m["max_attempts"]
        ):
            table.violate(adv(m), "lost or wrong end", m["id"])

    # callbacks that raised: each (where, exception) once
    fired_pairs = Counter((r["where"], r["exception"]) for r in raised)
    for (_where, name), n in fired_pairs.items():
        table.fired[f"raise {name}"] += n
    for m in messages.values():
        p = m["payload"]
        if isinstance(p, dict) and p.get("where") and fired_pairs[p["where"], p["exc"]] == 0:
            if p["where"] in ANNOUNCED_AFTER_COMMIT and _killed_before_announcing(m, runs, kills):
                continue
            table.violate(adv(m), "lost or wrong end", f"{p['where']} never raised")

    # lanes: per worker and queue (the handler's concurrency, else the worker's), and global
    caps = dict.fromkeys(queues, c.concurrency) | {"adv-lane": 2, "adv-async": 4}
    lanes: dict[tuple[int, str], list[tuple[datetime, datetime, Any]]] = defaultdict(list)
    global_lanes: dict[str, list[tuple[datetime, datetime, Any]]] = defaultdict(list)
    for r in all_runs:
        end = ended(r)
        if r["queue"] == "adv-atomic":
            end = min(end, r["started"] + timedelta(seconds=ATOMIC_TIME_LIMIT))
        lanes[r["pid"], r["queue"]].append((r["started"], end, r["message_id"]))
        if r["queue"] in ("adv-global", "adv-ticks"):
            global_lanes[r["queue"]].append((r["started"], end, r["message_id"]))
    for (_pid, queue), intervals in lanes.items():
        for message_id in _intervals_over(intervals, caps[queue]):
            table.violate(adv(messages[message_id]), "lane over cap", message_id)
    for queue, cap in (("adv-global", 2), ("adv-ticks", 1)):
        for message_id in _intervals_over(global_lanes[queue], cap):
            table.violate(adv(messages[message_id]), "lane over cap", message_id)
    table.fired["lanes"] = sum(1 for r in all_runs if r["queue"] in ("adv-lane", "adv-global"))

    # ordered groups: one at a time, in order
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in all_runs:
        if r["queue"] == "adv-groups":
            groups[r["group"]].append(r)
    table.fired["ordered groups"] = len(groups)
    for group, rs in groups.items():
        rs.sort(key=lambda r: r["started"])
        for prev, nxt in zip(rs, rs[1:], strict=False):
            if nxt["version"] < prev["version"] or nxt["started"] < ended(prev):
                table.violate("ordered groups", "group order", group)
                break

    # atomic: an effect with every success, none without
    for m in messages.values():
        if m["queue"] in ("adv-atomic", "adv-long-atomic"):
            want = 1 if m["status"] == "succeeded" else 0
            if effects.get(m["id"], 0) != want:
                table.violate(adv(m), "atomic effect", m["id"])
            if m["attempt_count"] > 1 and m["payload"].get("mode"):
                table.fired[adv(m)] += 1
            elif adv(m) == "sqlite-long-atomic" and m["status"] == "succeeded":
                table.fired[adv(m)] += 1

    # async
    table.fired["async"] = sum(1 for r in all_runs if r["queue"] == "adv-async")

    # workflows: no step before its parents succeeded (the run's children are
    # all on_parent_failure="cancel"), none left waiting (drained), none twice
    from django_delayq.models import Dependency

    edges = Dependency.objects.filter(child__queue__in=["adv-flow", "adv-held"])
    for parent_id, child_id in edges.values_list("parent_id", "child_id"):
        parent = messages.get(parent_id)
        done = [r for r in runs.get(parent_id, []) if r["outcome"] == "ok"]
        name = "workflows" if messages[child_id]["queue"] == "adv-flow" else "lock-step"
        for r in runs.get(child_id, []):
            if parent is None or parent["status"] != "succeeded" or not done:
                table.violate(name, "step before parent", child_id)
            elif r["started"] < done[-1]["finished"]:
                table.violate(name, "step before parent", child_id)
    # rows in workflows (lock-row-step): each ended succeeded, and ran only once its
    # parent had succeeded, though the application held it as the parent ended
    from tests.testapp.models import Execution, Shipment

    rows = list(
        Shipment.objects.filter(reference__startswith="held-").values("pk", "reference", "status")
    )
    row_starts: dict[int, list[datetime]] = defaultdict(list)
    for pk, started in Execution.objects.filter(
        queue=ROWS, message_id__in=[row["pk"] for row in rows]
    ).values_list("message_id", "started"):
        row_starts[pk].append(started)
    for row in rows:
        parent = by_key.get(("adv-held", row["reference"].removesuffix("-row")))
        done = [r for r in runs.get(parent["id"], []) if r["outcome"] == "ok"] if parent else []
        if row["status"] != "succeeded" or not row_starts[row["pk"]]:
            table.violate("lock-row-step", "lost or wrong end", row["pk"])
        if any(not done or started < done[-1]["finished"] for started in row_starts[row["pk"]]):
            table.violate("lock-row-step", "step before parent", row["pk"])
    table.fired["workflows"] = sum(
        1
        for m in messages.values()
        if m["queue"] == "adv-flow"
        and (m["key"].endswith("-child") or "chain" in m["key"])
        and m["status"] in ("succeeded", "cancelled")
    )

    # cron ticks: claimed past their grace, cancelled, never run
    grace = timedelta(seconds=TICK_GRACE)
    for m in messages.values():
        if m["queue"] != "adv-ticks":
            continue
        parsed = parse_key(m["key"])
        if parsed is None:
            continue
        tick = parsed[2]
        first = [r for r in runs.get(m["id"], []) if r["attempt"] == 1]
        if any(r["claimed"] is not None and r["claimed"] > tick + grace for r in first):
            table.violate("cron ticks", "missed tick ran", m["id"])
        if m["status"] == "cancelled":
            table.fired["cron ticks"] += 1

    # stuck running: sampled during the run
    for message_id in run.stuck:
        m = messages.get(message_id)
        table.violate(adv(m) if m else "?", "stuck running", message_id)

    # the workers themselves
    table.general["worker crashes (unexpected exits)"] = run.crashes
    table.general["workers not exiting 0 on SIGTERM"] = sum(1 for x in run.exit_codes if x)
    table.general["coroutines never awaited"] = logs.count("was never awaited")
    table.general["threads that died unreplaced"] = logs.count("Exception in thread")
    # A live worker's name refused (78); taken over only once its holder was killed.
    from django_delayq.exceptions import WorkerNameTaken

    table.fired["impostor"] = len(run.impostor_exits)
    table.general["impostors that took a live worker's name"] = sum(
        1
        for code, victim_gone in run.impostor_exits
        if code != WorkerNameTaken.exit_code and not victim_gone
    )
    table.figures += [
        ("database", run.vendor),
        ("seconds to drain", round(elapsed, 1)),
        (
            "messages (without ticks)",
            sum(1 for m in messages.values() if m["queue"] != "adv-ticks"),
        ),
        ("runs recorded", len(all_runs)),
        ("ordered groups", c.groups),
        ("messages released from dead workers", released(logs)),
        (
            "heartbeats past their promise / reruns after one",
            f"{sum(len(w) for w in starved_windows.values())} / {len(starved_reruns)}",
        ),
        ("time limits hit", time_limits_hit(logs)),
        ("missed ticks logged", logs.count("missed")),
        ("worker reconnects logged", logs.count("database reachable again")),
        (
            "impostors refused / took a killed worker's name",
            f"{sum(1 for code, _ in run.impostor_exits if code == WorkerNameTaken.exit_code)}"
            f" / {sum(1 for code, gone in run.impostor_exits if gone and code != 78)}",
        ),
    ]
    return table


def run_adversaries(config: Config, env: dict[str, str], workdir: Path | None = None) -> Table:
    """One adversary run against the configured database, checked."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="delayq-adversaries-"))
    reset()
    run = Run(config, env, workdir)
    try:
        elapsed = run.execute()
    finally:
        kill_leftovers(run.consumers + run.retired + [i for i, _ in run.impostors])
        for helper in run.helpers:
            if helper.poll() is None:
                helper.kill()
                helper.wait(timeout=60)
    table = check(run, elapsed)
    table.figures.append(("logs", str(workdir)))
    return table


# -- command line ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", nargs="?", choices=["produce", "hold", "operate"])
    parser.add_argument("offset", nargs="?", type=float, default=0.0)
    parser.add_argument("--config", help="(internal) the run's Config as JSON")
    parser.add_argument("--short", action="store_true", help="the suite's short form")
    for name, value in asdict(Config()).items():
        parser.add_argument(f"--{name.rstrip('_').replace('_', '-')}", dest=name, type=type(value))
    parser.add_argument(
        "--database-url",
        default=os.environ.get("ADVERSARY_DATABASE_URL")
        or os.environ.get("CHAOS_DATABASE_URL")
        or "postgres://postgres@127.0.0.1:5432/delayq_chaos",
        help="the run's database (PostgreSQL, SQLite or MariaDB/MySQL; created, migrated, emptied)",
    )
    args = parser.parse_args(argv)

    if args.role:
        import django

        django.setup()
        config = Config(**json.loads(args.config))
        if args.role == "produce":
            produce(config)
        elif args.role == "hold":
            hold(config)
        else:
            operate(config, args.offset)
        return 0

    config = Config.short() if args.short else Config()
    for name in asdict(config):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    env = prepare_database(args.database_url, ("postgresql", "sqlite3", "mysql"))
    setup_django(env)
    print(
        f"adversaries: {config.workers} workers x {config.concurrency}, "
        f"{len(workload(config, 'postgresql'))} messages, {config.groups} ordered groups",
        flush=True,
    )
    table = run_adversaries(config, env)
    print(table.render())
    return 1 if table.failures else 0


if __name__ == "__main__":
    sys.exit(main())
