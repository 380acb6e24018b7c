"""The chaos run: real producers, real ``run_delayq`` workers, real faults.

P producer processes enqueue messages (most in transactions that commit,
some in transactions that roll back, some with duplicate keys, some delayed
by a few seconds) and write a ledger row in the same transaction as each
enqueue. C consumer processes (``manage.py run_delayq``) run handlers that
record every execution. Meanwhile the harness SIGKILLs workers at random
moments, SIGTERMs and restarts others, terminates every database connection
of the run's database once (``pg_terminate_backend``), and one queue's
handler outlives its time limit. Some transactions write a workflow: a
fan-in child enqueued ``after=`` the parents written before it (parents
finishing at once on different workers, through the kills and the cut).
When everything has drained, the invariants are checked and printed as
figures (``Figures.table()``).

Used by ``make chaos`` (``python -m tests.chaos.harness``, full size) and by
``tests/chaos/test_chaos.py`` (about a tenth of it, inside the suite).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

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

QUEUES = ("chaos", "chaos-atomic", "chaos-slow")
SLOW_SLEEP = 4.0  # seconds; the chaos-slow handler's time limit is 1.5 s
DUPLICATE_KEYS = 50  # size of the key space the producers share


@dataclass
class Config:
    producers: int = 4
    consumers: int = 4
    messages: int = 20_000
    kills: int = 10
    terms: int = 2
    disruptions: int = 1
    slow: int = 3
    concurrency: int = 4
    lease: float = 5.0
    heartbeat: float = 0.5
    dead_after: float = 3.0
    seed: int = 7
    timeout: float = 900.0

    @classmethod
    def short(cls) -> Config:
        """About a tenth of the full run, for the suite."""
        return cls(messages=2_000, kills=2, terms=1, slow=2, timeout=240.0)


@dataclass
class Figures:
    rows: list[tuple[str, object, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def add(self, name: str, value: object, expect: str = "") -> None:
        self.rows.append((name, value, expect))

    def check(self, name: str, value: int, why: str) -> None:
        """A figure that must be 0; anything else is a violation."""
        self.add(name, value, "0")
        if value:
            self.violations.append(f"{name}: {value} ({why})")

    def table(self) -> str:
        width = max(len(n) for n, _, _ in self.rows)
        lines = [f"{'figure'.ljust(width)}  {'value':>10}  must be", "-" * (width + 24)]
        for name, value, expect in self.rows:
            lines.append(f"{name.ljust(width)}  {str(value):>10}  {expect}")
        lines.append("")
        lines.append("PASS" if not self.violations else "FAIL: " + "; ".join(self.violations))
        return "\n".join(lines)

    def value(self, name: str) -> object:
        return next(v for n, v, _ in self.rows if n == name)


# -- producers ---------------------------------------------------------------


def produce(index: int, count: int, slow: int, seed: int) -> None:
    """One producer process: enqueue ``count`` committed messages, plus rollbacks."""
    from django.db import InterfaceError, InternalError, OperationalError, connection, transaction

    from django_delayq import enqueue, enqueue_many
    from tests.testapp.models import Sent

    rng = random.Random(seed * 1000 + index)

    class Rollback(Exception):
        pass

    def send(items: list[dict[str, Any]], rollback: bool) -> None:
        with transaction.atomic():
            plain = [
                i for i in items if i["queue"] == "chaos" and not i["delay"] and not i.get("fan_in")
            ]
            if len(plain) >= 3 and rng.random() < 0.5:
                results = enqueue_many(
                    "chaos", [i["payload"] for i in plain], keys=[i["key"] for i in plain]
                )
                for item, result in zip(plain, results, strict=True):
                    item["outcome"] = result.outcome
                rest = [i for i in items if i not in plain]
            else:
                rest = items
            written: dict[Any, Any] = {}  # by id: a shared key written twice is one parent
            for item in rest:
                if item.get("fan_in"):
                    # A workflow's child: after every message written before it
                    # in this transaction (a duplicate key's row may be older).
                    parents = list(written.values())
                    result = enqueue(item["queue"], item["payload"], key=item["key"], after=parents)
                else:
                    result = enqueue(
                        item["queue"], item["payload"], key=item["key"], delay=item["delay"] or None
                    )
                item["outcome"] = result.outcome
                written[result.message.pk] = result
            Sent.objects.bulk_create(
                Sent(
                    producer=index,
                    queue=i["queue"],
                    key=i["key"],
                    outcome=str(i["outcome"]),
                    delayed=bool(i["delay"]),
                )
                for i in items
            )
            if rollback:
                raise Rollback

    sent = rolled_back = n = 0
    pending_slow = slow
    while sent < count:
        rollback = rng.random() < 0.1
        items = []
        for _ in range(min(rng.randint(1, 12), count - sent if not rollback else 12)):
            n += 1
            payload: dict[str, Any] = {"n": n}
            queue, delay = "chaos", 0.0
            if rollback:
                key = f"p{index}-rb-{n}"
            elif pending_slow:
                pending_slow -= 1
                queue, key = "chaos-slow", f"p{index}-slow-{n}"
                payload = {"sleep": SLOW_SLEEP}
            elif rng.random() < 0.05:
                key = f"dup-{rng.randrange(DUPLICATE_KEYS)}"
            else:
                key = f"p{index}-{n}"
                if rng.random() < 0.15:
                    queue = "chaos-atomic"
            if queue != "chaos-slow" and rng.random() < 0.1:
                delay = round(rng.uniform(0.5, 3.0), 3)
            items.append({"queue": queue, "key": key, "payload": payload, "delay": delay})
        last = items[-1] if items else {}
        plain = last.get("queue") != "chaos-slow" and not str(last.get("key", "")).startswith(
            "dup-"
        )
        if len(items) >= 2 and plain and rng.random() < 0.15:
            # A fan-in: the batch's last message waits for all the others.
            child = items[-1]
            child.update(queue="chaos", delay=0.0, payload={"n": n}, fan_in=True)
            child["key"] = f"p{index}-{'rb-' if rollback else ''}fan-{n}"
        for attempt in range(100):
            try:
                send(items, rollback)
                break
            except Rollback:
                break
            except (OperationalError, InterfaceError, InternalError) as exc:
                # The connection was cut (the harness terminates backends):
                # send the same keys again; a commit whose reply was lost is
                # harmless, its keys are IGNORED the second time. Through
                # PgBouncer, a backend cut during COMMIT can reach psycopg as
                # "received 2 results from command 'COMMIT'" (InternalError).
                if isinstance(exc, InternalError) and "results from command" not in str(exc):
                    raise
                connection.close()
                time.sleep(min(2.0, 0.05 * 2**attempt))
        else:
            raise SystemExit(f"producer {index}: the database never came back")
        if rollback:
            rolled_back += len(items)
        else:
            sent += len(items)
    print(f"producer {index}: committed {sent}, rolled back {rolled_back}", flush=True)


# -- the run -----------------------------------------------------------------


class Run:
    def __init__(self, config: Config, env: dict[str, str], workdir: Path) -> None:
        self.config = config
        self.env = {
            **env,
            "DELAYQ_TEST_LEASE": str(config.lease),
            "DELAYQ_TEST_HEARTBEAT": str(config.heartbeat),
            "DELAYQ_TEST_DEAD_AFTER": str(config.dead_after),
            "DELAYQ_TEST_POLL": "0.5",
            "DELAYQ_TEST_GRACE": "30",
            "DELAYQ_LOG_LEVEL": "INFO",
            "DELAYQ_LOG_TIMES": "1",
        }
        self.workdir = workdir
        self.rng = random.Random(config.seed)
        self.consumers: list[Consumer] = []
        self.retired: list[Consumer] = []
        self.events: list[Event] = []
        self.crashes = 0
        self.exit_codes: list[int] = []
        self.drained = now()
        self._spawned = 0
        self._logs: list[IO[bytes]] = []

    # processes

    def spawn_consumer(self) -> Consumer:
        self._spawned += 1
        queues = [arg for q in QUEUES for arg in ("--queue", q)]
        consumer = spawn_worker(
            [*queues, "--concurrency", str(self.config.concurrency), "--batch-size", "8"],
            self.env,
            self.workdir / f"consumer-{self._spawned}.log",
        )
        self.consumers.append(consumer)
        return consumer

    def spawn_producers(self) -> list[subprocess.Popen[bytes]]:
        c = self.config
        share, extra = divmod(c.messages, c.producers)
        procs = []
        for i in range(c.producers):
            count = share + (1 if i < extra else 0)
            slow = c.slow if i == 0 else 0
            log = (self.workdir / f"producer-{i}.log").open("wb")
            self._logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.chaos.harness", "produce"]
                    + [str(i), str(count), str(slow), str(c.seed)],
                    cwd=ROOT,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        return procs

    def retire(self, consumer: Consumer) -> None:
        consumer.ended = now()
        self.consumers.remove(consumer)
        self.retired.append(consumer)

    # faults

    def kill_one(self) -> None:
        victim = self.rng.choice(self.consumers)
        self.events.append(kill(victim))
        self.retire(victim)
        self.spawn_consumer()

    def term_one(self) -> None:
        victim = self.rng.choice(self.consumers)
        victim.expected_exit = True
        self.events.append(Event(now(), "term", victim.proc.pid))
        victim.proc.send_signal(signal.SIGTERM)
        self.retire(victim)
        self.spawn_consumer()

    def disrupt(self) -> None:
        """Terminate every connection to this run's database but the harness's own."""
        self.events.append(cut_connections())

    # main loop

    def progress(self) -> float:
        from tests.testapp.models import Execution

        return Execution.objects.count() / max(1, self.config.messages)

    def active(self) -> int:
        from django_delayq.models import Message

        return Message.objects.active().filter(queue__in=QUEUES).count()

    def execute(self) -> float:
        c = self.config
        started = time.monotonic()
        deadline = started + c.timeout
        for _ in range(c.consumers):
            self.spawn_consumer()
        producers = self.spawn_producers()
        # Faults are spread over the run by progress (fraction of executions
        # recorded), with jitter, so they land at random moments of the work.
        plan: list[tuple[float, str]] = []
        for i in range(c.kills):
            plan.append(((i + self.rng.uniform(0.3, 0.9)) / (c.kills + 0.5) * 0.9, "kill"))
        for i in range(c.terms):
            plan.append(((i + self.rng.uniform(0.2, 0.8)) / c.terms * 0.8, "term"))
        for i in range(c.disruptions):
            plan.append(((i + 0.5) / c.disruptions * 0.7, "disrupt"))
        plan.sort()
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"chaos run did not drain within {c.timeout:.0f} s")
            for consumer in list(self.consumers):
                code = consumer.proc.poll()
                if code is not None and not consumer.expected_exit:
                    self.crashes += 1
                    self.retire(consumer)
                    self.spawn_consumer()
            for proc in producers:
                if proc.poll() not in (None, 0):
                    raise RuntimeError(f"a producer failed (see {self.workdir})")
            done = plan[0][0] if plan else None
            progress = self.progress()
            if done is not None and progress >= done:
                kind = plan.pop(0)[1]
                getattr(
                    self, {"kill": "kill_one", "term": "term_one", "disrupt": "disrupt"}[kind]
                )()
                continue
            if not plan and all(p.poll() == 0 for p in producers) and not self.active():
                break
            time.sleep(0.2)  # pacing of the harness's own polling, not synchronisation
        elapsed = time.monotonic() - started
        self.drained = now()
        with (self.workdir / "events.txt").open("w") as out:
            for event in self.events:
                out.write(f"{event.at.isoformat()} {event.kind} pid={event.pid} {event.detail}\n")
        for consumer in self.consumers:
            # A consumer spawned moments ago may still be starting: its stop
            # is judged once it has said it consumes (it holds nothing before).
            wait_until_consuming(consumer)
            consumer.expected_exit = True
            consumer.proc.send_signal(signal.SIGTERM)
        self.exit_codes = [consumer.proc.wait(timeout=120) for consumer in self.consumers]
        terminated = {e.pid for e in self.events if e.kind == "term"}
        for consumer in self.retired:
            code = consumer.proc.wait(timeout=120)
            if consumer.proc.pid in terminated:
                self.exit_codes.append(code)
        for log in self._logs:
            log.close()
        return elapsed


def reset(using: str = "default") -> None:
    from django_delayq.models import Dependency, Message, WorkerState
    from tests.testapp.models import Effect, Execution, Sent

    empty((Dependency, Message, WorkerState, Execution, Effect, Sent), using)


# -- invariants --------------------------------------------------------------


def check(run: Run, elapsed: float) -> Figures:
    from django_delayq.models import Message
    from tests.testapp.handlers import CHAOS_TIME_LIMIT
    from tests.testapp.models import Effect, Execution, Sent

    c = run.config
    figures = Figures()
    ledger = list(Sent.objects.values_list("queue", "key", "outcome", "delayed"))
    committed = {(q, k) for q, k, _, _ in ledger}
    messages = {
        (m["queue"], m["key"]): m
        for m in Message.objects.filter(queue__in=QUEUES).values(
            "id", "queue", "key", "status", "attempt_count", "scheduled_time"
        )
    }
    by_id = {m["id"]: m for m in messages.values()}
    executions = list(
        Execution.objects.filter(queue__in=QUEUES)
        .order_by("message_id", "attempt", "started")
        .values("message_id", "attempt", "worker", "queue", "started", "finished")
    )
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in executions:
        runs[e["message_id"]].append(dict(e))

    kills = {e.pid: e.at for e in run.events if e.kind == "kill"}
    terms = {e.pid: e.at for e in run.events if e.kind == "term"}
    disruptions = [e for e in run.events if e.kind == "disrupt"]

    figures.add("producers x consumers", f"{c.producers}x{c.consumers}")
    figures.add("consumer threads each", c.concurrency)
    figures.add(
        "lease / heartbeat / dead after (s)", f"{c.lease:g}/{c.heartbeat:g}/{c.dead_after:g}"
    )
    figures.add("seconds to drain", round(elapsed, 1))
    figures.add("committed messages", len(committed))
    figures.add("enqueue calls (ledger rows)", len(ledger))
    dup_calls = sum(1 for _, k, _, _ in ledger if k.startswith("dup-"))
    dup_keys = {k for _, k, _, _ in ledger if k.startswith("dup-")}
    figures.add("duplicate-key enqueues", dup_calls)
    figures.add("distinct duplicate keys", len(dup_keys))
    figures.add("delayed messages", len({(q, k) for q, k, _, d in ledger if d}))
    figures.add("atomic messages", sum(1 for q, _ in committed if q == "chaos-atomic"))
    figures.add("slow messages (outlive their time limit)", c.slow)

    lost = [qk for qk in committed if messages.get(qk, {}).get("status") != "succeeded"]
    figures.check("lost (committed, not succeeded)", len(lost), f"e.g. {lost[:5]}")
    rolled_back_rows = [qk for qk in messages if "-rb-" in qk[1]]
    orphans = [e for e in executions if e["message_id"] not in by_id]
    figures.check(
        "rolled-back messages processed",
        len(rolled_back_rows) + len(orphans),
        "a message from a rolled-back transaction exists or ran",
    )
    extra = [qk for qk in messages if qk not in committed]
    figures.check("messages not in the ledger", len(extra), f"e.g. {extra[:5]}")

    # Redeliveries: every execution after a message's first, with its cause.
    causes: Counter[str] = Counter()
    unexplained_redeliveries = []
    overlaps = 0
    unexplained_overlaps = []
    for message_id, attempts in runs.items():
        for prev, nxt in zip(attempts, attempts[1:], strict=False):
            pid = int(prev["worker"])
            ended = prev["finished"]
            killed = kills.get(pid)
            if killed is not None and killed >= prev["started"]:
                ended = min(ended, killed) if ended else killed
            limit = timedelta(seconds=CHAOS_TIME_LIMIT)
            if (
                prev["queue"] == "chaos-slow"
                and nxt["started"] - prev["started"] >= limit
                and (ended is None or ended - prev["started"] > limit)
            ):
                cause = "time limit"
            elif killed is not None and prev["started"] <= killed <= nxt["started"]:
                cause = "SIGKILL"
            elif cuts := [
                d.at
                for d in disruptions
                if prev["started"] - timedelta(seconds=1)
                <= d.at
                <= (ended or nxt["started"]) + timedelta(seconds=5)
            ]:
                cause = "connection cut"
                # Its outcome (or its "finished" mark) could not be written:
                # the handler ended with that database error, at the cut (a
                # SIGKILL of its worker later on does not make it longer).
                ended = prev["finished"] or max(prev["started"], min(cuts))
            elif pid in terms and terms[pid] >= prev["started"]:
                cause = "SIGTERM grace"
            else:
                cause = "unexplained"
                unexplained_redeliveries.append((message_id, prev["attempt"], nxt["attempt"]))
            causes[cause] += 1
            if ended is None or nxt["started"] < ended:
                overlaps += 1
                # Two runs at once are only legitimate once the first one's
                # lease was revoked: past its time limit (the keeper failed
                # the attempt and stopped extending the lease).
                limit_passed = nxt["started"] - prev["started"] >= timedelta(
                    seconds=CHAOS_TIME_LIMIT
                )
                if not (prev["queue"] == "chaos-slow" and limit_passed):
                    unexplained_overlaps.append((message_id, prev["attempt"], nxt["attempt"]))
    figures.add("executions recorded", len(executions))
    figures.add("redeliveries", sum(causes.values()))
    for cause in ("SIGKILL", "time limit", "connection cut", "SIGTERM grace"):
        figures.add(f"  after {cause}", causes[cause])
    figures.check(
        "  without a cause", len(unexplained_redeliveries), f"e.g. {unexplained_redeliveries[:5]}"
    )
    figures.add("overlapping runs of one message", overlaps)
    figures.check(
        "concurrent runs within a valid lease",
        len(unexplained_overlaps),
        f"e.g. {unexplained_overlaps[:5]}",
    )

    dup_messages = [m for (q, k), m in messages.items() if k.startswith("dup-")]
    figures.check(
        "duplicate keys with more than one message",
        len(dup_keys) - len(dup_messages) if len(dup_messages) != len(dup_keys) else 0,
        "the (queue, key) constraint let a duplicate in",
    )
    unexplained_ids = {m for m, _, _ in unexplained_redeliveries}
    dup_twice = [m["id"] for m in dup_messages if m["id"] in unexplained_ids]
    figures.check(
        "duplicate keys processed more than once", len(dup_twice), f"e.g. {dup_twice[:5]}"
    )

    atomic_ids = {m["id"] for (q, _), m in messages.items() if q == "chaos-atomic"}
    effects = Counter(
        Effect.objects.filter(message_id__in=atomic_ids).values_list("message_id", flat=True)
    )
    not_once = [i for i in atomic_ids if effects.get(i, 0) != 1]
    figures.add("atomic effect rows", sum(effects.values()))
    figures.check(
        "atomic messages without exactly one effect", len(not_once), f"e.g. {not_once[:5]}"
    )

    # Workflows: each child ran only after every parent's successful run ended. The
    # successful run is the parent's last attempt: an earlier one that outlived its
    # time limit may end later still (its late end counts for nothing), and a
    # child that starts between the two is no violation.
    from django_delayq.models import Dependency

    edges = list(
        Dependency.objects.filter(child__queue__in=QUEUES).values_list("parent_id", "child_id")
    )
    children = {child for _, child in edges}
    before = set()
    for parent, child in edges:
        last = by_id.get(parent, {}).get("attempt_count")
        finished = [
            e["finished"]
            for e in runs.get(parent, [])
            if e["finished"] is not None and e["attempt"] == last
        ]
        if not finished or by_id.get(parent, {}).get("status") != "succeeded":
            if runs.get(child):
                before.add(child)
        elif any(e["started"] < max(finished) for e in runs.get(child, [])):
            before.add(child)
    figures.add("workflow children (fan-ins)", len(children))
    figures.add("  their parents", len(edges))
    figures.check(
        "  children run before a parent succeeded", len(before), f"e.g. {sorted(before)[:5]}"
    )

    early = [
        e
        for e in executions
        if e["message_id"] in by_id and e["started"] < by_id[e["message_id"]]["scheduled_time"]
    ]
    figures.check("runs before their due time", len(early), "a delayed message ran early")

    logs = "\n".join(
        consumer.log.read_text(errors="replace") for consumer in [*run.retired, *run.consumers]
    )
    figures.add("SIGKILLs", len(kills))
    figures.add("SIGTERM + restart", len(terms))
    figures.add(
        "connection cuts (backends terminated)",
        ", ".join(str(d.detail) for d in disruptions) or "0",
    )
    figures.add("worker reconnects logged", logs.count("database reachable again"))
    figures.add("messages released from dead workers", released(logs))
    figures.add("time limits hit", time_limits_hit(logs))
    figures.check("worker crashes (unexpected exits)", run.crashes, "a worker died by itself")
    bad_exits = sum(1 for code in run.exit_codes if code != 0)
    figures.check("workers not exiting 0 on SIGTERM", bad_exits, "unclean shutdown")
    if disruptions:
        # Workers running at the cut that lived on for a while (not killed
        # right after it) must have run messages after it, without a restart.
        cut = disruptions[0].at
        through = {
            str(consumer.proc.pid): consumer.ended or run.drained
            for consumer in run.consumers + run.retired
            if consumer.started < cut
            and (consumer.ended or run.drained) > cut + timedelta(seconds=5)
        }
        recovered = {
            pid
            for pid, until in through.items()
            if Execution.objects.filter(worker=pid, started__gt=cut, started__lt=until).exists()
        }
        figures.add(
            "workers through the cut / working after it", f"{len(through)}/{len(recovered)}"
        )
        figures.check(
            "workers that did not recover from the cut",
            len(set(through) - recovered),
            "a worker stopped processing after its connections were terminated",
        )
    return figures


def run_chaos(config: Config, env: dict[str, str], workdir: Path | None = None) -> Figures:
    """Run one chaos round against the configured database and check it."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="delayq-chaos-"))
    reset()
    run = Run(config, env, workdir)
    try:
        elapsed = run.execute()
    finally:
        kill_leftovers(run.consumers + run.retired)
    figures = check(run, elapsed)
    figures.add("worker logs", str(workdir))
    return figures


# -- command line --------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    prod = sub.add_parser("produce", help="(internal) one producer process")
    for name in ("index", "count", "slow", "seed"):
        prod.add_argument(name, type=int)
    defaults = Config()
    for name in ("producers", "consumers", "messages", "kills", "terms", "slow", "concurrency"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    for name in ("lease", "timeout"):
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name))
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("CHAOS_DATABASE_URL")
        or "postgres://postgres@127.0.0.1:5432/delayq_chaos",
        help="PostgreSQL database of the run (created and migrated; its tables are emptied)",
    )
    args = parser.parse_args(argv)

    if args.command == "produce":
        import django

        django.setup()
        produce(args.index, args.count, args.slow, args.seed)
        return 0

    env = prepare_database(args.database_url)
    setup_django(env)
    config = Config(
        producers=args.producers,
        consumers=args.consumers,
        messages=args.messages,
        kills=args.kills,
        terms=args.terms,
        slow=args.slow,
        concurrency=args.concurrency,
        lease=args.lease,
        timeout=args.timeout,
        seed=args.seed,
    )
    print(
        f"chaos: {config.producers} producers x {config.consumers} consumers, "
        f"{config.messages} messages, {config.kills} SIGKILLs, {config.terms} SIGTERMs, "
        f"{config.disruptions} connection cut(s)",
        flush=True,
    )
    figures = run_chaos(config, env)
    print(figures.table())
    return 1 if figures.violations else 0


if __name__ == "__main__":
    sys.exit(main())
