"""``manage.py delayq_status``: per-queue counts and lag, flow control, then the workers;
``--health``: what the database does to the queue's tables (``store/pressure.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq import durations
from django_delayq.flowstats import QueueFlow, ScopeFlow, flow_stats
from django_delayq.liveness import held_by, workers
from django_delayq.management import arguments
from django_delayq.models import STAND_IN_PREFIX
from django_delayq.queues import paused_queues
from django_delayq.registry import registry
from django_delayq.stats import queue_stats
from django_delayq.store import pressure

COLUMNS = (
    "queue",
    "due",
    "scheduled",
    "running",
    "retrying",
    "waiting",
    "failed",
    "succeeded/1h",
    "lag",
    "state",
)

# The state of a queue that no handler of this project consumes (no @handler,
# no DelayQBackend queue): run_delayq here leaves its messages waiting.
NO_HANDLER = "no handler"
NO_HANDLER_NOTE = (
    f"{NO_HANDLER}: no handler in this project consumes the queue; "
    "run_delayq here leaves its messages waiting"
)

# The state of the queue of a QueueFields model's rows in workflows: each message
# stands for a row (store/row_steps.py), pending until the row ends.
ROWS = "rows in workflows"

# Flow control, for the queues above that have global limits or ordered groups
# in use: a row per queue ("-": no limit of its own) and one per limited kind
# ("queue/kind"). "started": starts in the rate's current window; "running":
# live leases, against the cap; "throttled": due messages wait for the limits;
# "held": messages waiting behind an earlier one of their group; "blocked":
# groups whose first message is failing (named below the table).
FLOW_COLUMNS = ("flow", "rate", "started", "cap", "running", "throttled", "held", "blocked")

# A worker is dead when its heartbeat is older than DELAYQ["WORKER_DEAD_AFTER"];
# "running" counts the messages it holds (a dead worker's are handed back by
# the live ones within a heartbeat).
WORKER_COLUMNS = ("worker", "state", "queues", "threads", "running", "last seen")


def _limit_cells(flow: ScopeFlow | None) -> tuple[str, str, str, str, str]:
    """rate, started, cap, running, throttled ("-": no such limit)."""
    if flow is None:
        return ("-", "-", "-", "-", "no")
    rate = flow.scope.rate
    cap = flow.scope.cap
    return (
        str(rate) if rate else "-",
        str(flow.started) if rate else "-",
        str(cap) if cap else "-",
        str(flow.running) if cap else "-",
        "yes" if flow.throttled else "no",
    )


def human(delta: timedelta) -> str:
    return durations.human(max(0.0, delta.total_seconds()), durations.STATUS)


class Command(BaseCommand):
    help = (
        "Print per-queue message counts, the age of the oldest due message (lag), "
        "whether the queue is paused or throttled and whether a handler of this project "
        "consumes it; then the queues' rate limits and concurrency caps and how close they "
        "are to them, the messages waiting for their group and the blocked groups; then "
        "the live and dead workers (--all-workers: the stopped ones too)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue", action="append", dest="queues", metavar="QUEUE", type=arguments.queue_name
        )
        parser.add_argument("--database", default=None, type=arguments.database_alias)
        parser.add_argument(
            "--all-workers",
            action="store_true",
            help="List every worker the database remembers (a day after its last heartbeat), "
            "the cleanly stopped ones too.",
        )
        parser.add_argument(
            "--health",
            action="store_true",
            help="Instead of the queues: what the database does to the queue's tables "
            "(transactions holding the vacuum horizon, dead rows, autovacuum, sizes, "
            "the notification queue), each problem with what to do. Exits 1 if there is one.",
        )
        parser.add_argument(
            "--long-transaction",
            type=arguments.seconds(zero=True),
            default=pressure.LONG_TRANSACTION.total_seconds(),
            metavar="SECONDS",
            help="With --health: a transaction open longer than this is a problem "
            "(default %(default)g).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["health"]:
            self._health(options["database"], options["long_transaction"])
            return
        stats = queue_stats(options["queues"], using=options["database"])
        paused = paused_queues(options["queues"], using=options["database"])
        handled = set(registry.queues())
        names = {s.queue for s in stats} | paused
        flows = flow_stats(names, using=options["database"]) if names else []
        throttled = {flow.queue for flow in flows if flow.throttled}

        def state(queue: str) -> str:
            text = "paused" if queue in paused else "active"
            if queue in throttled:
                text += ", throttled"
            if queue.startswith(STAND_IN_PREFIX):
                # No worker consumes it: its messages stand for rows in workflows.
                return ROWS
            return text if queue in handled else f"{text}, {NO_HANDLER}"

        rows = [
            (
                s.queue,
                s.due,
                s.scheduled,
                s.running,
                s.retrying,
                s.waiting,
                f"{s.failed}+" if s.failed_more else s.failed,
                s.succeeded,
                human(s.lag),
                state(s.queue),
            )
            for s in stats
        ]
        # A paused queue is worth showing even while it holds no message.
        shown = {s.queue for s in stats}
        rows += [(q, 0, 0, 0, 0, 0, 0, 0, "0s", state(q)) for q in sorted(paused - shown)]
        rows.sort(key=lambda row: row[0])
        if not rows:
            self.stdout.write("no messages")
        else:
            self._table(COLUMNS, rows)
            if any(row[-1].endswith(NO_HANDLER) for row in rows):
                self.stdout.write(NO_HANDLER_NOTE)
        self._flows(flows)
        self._workers(options["database"], every=options["all_workers"])

    def _health(self, using: str | None, long_transaction: float) -> None:
        limits = pressure.Limits(long_transaction=timedelta(seconds=long_transaction))
        checks = pressure.health(using, limits)
        width = max(len(c.name) for c in checks)
        for check in checks:
            mark = "!" if check.problem else " "
            self.stdout.write(f"{mark} {check.name.ljust(width)}  {check.value}")
        problems = [c for c in checks if c.problem]
        if problems:
            self.stdout.write("")
        for check in problems:
            self.stdout.write(f"! {check.name}: {check.advice}")
        if problems:
            raise CommandError(f"{len(problems)} health problem(s)", returncode=1)

    def _flows(self, flows: list[QueueFlow]) -> None:
        if not flows:
            return
        rows: list[tuple[object, ...]] = []
        for flow in flows:
            own = next((s for s in flow.scopes if not s.kind), None)
            rows.append((flow.queue, *_limit_cells(own), flow.held, flow.blocked))
            rows += [(s.scope.name, *_limit_cells(s), "", "") for s in flow.scopes if s.kind]
        self.stdout.write("")
        self._table(FLOW_COLUMNS, rows)
        for flow in flows:
            if flow.blocked_groups:
                more = flow.blocked - len(flow.blocked_groups)
                names = ", ".join(flow.blocked_groups) + (f" and {more} more" if more else "")
                self.stdout.write(f"blocked groups of {flow.queue}: {names}")

    def _workers(self, using: str | None, *, every: bool) -> None:
        known = workers(using)
        # A worker stopped cleanly said goodbye and holds nothing: in a list of
        # many restarts it is noise, so it is only counted. A dead one stays
        # (its messages went back to the others; a crash is news).
        shown = [w for w in known if every or w.state != "stopped"]
        hidden = len(known) - len(shown)
        if shown:
            held = held_by([w.name for w in shown], using)
            self.stdout.write("")
            self._table(
                WORKER_COLUMNS,
                [
                    (
                        w.name,
                        w.state,
                        ",".join(w.queues),
                        w.concurrency,
                        held.get(w.name, 0),
                        human(w.seen_ago) + " ago",
                    )
                    for w in shown
                ],
            )
        if hidden:
            if not shown:
                self.stdout.write("")
            self.stdout.write(f"{hidden} stopped worker(s) (--all-workers lists them)")

    def _table(self, columns: tuple[str, ...], rows: Sequence[tuple[object, ...]]) -> None:
        table = [columns, *[tuple(str(c) for c in row) for row in rows]]
        widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
        for n, row in enumerate(table):
            self.stdout.write(
                "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                ).rstrip()
            )
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))
