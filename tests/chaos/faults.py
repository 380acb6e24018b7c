"""Fault injection at every place the worker calls the database or the project's code.

A *site* is one call from a function of ``django_delayq/worker/`` to the
store, the heartbeats, maintenance, the signals or a handler: found in the
source (:func:`discover`), so a new call site appears here by itself. For a
site and an exception class, :func:`run_site` starts an in-process serving
worker on a workload that reaches every site (:data:`WORKLOAD`), makes that
one call raise once, and then checks what the worker promises whatever
happens to it: it recovers, or it stops with an error (``Worker.run``
raises: ``run_delayq`` exits non-zero); it never hangs; and afterwards, once
a clean worker has run what was left, every message has succeeded exactly
as it should (an atomic one with exactly one effect), none is left running.

``tests/integration/test_faults.py`` runs every site once (one exception class
each, in turn) and checks that each discovered site is reached; with
``DELAYQ_FAULTS=all`` (``make chaos``) every site with every class.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parents[2] / "django_delayq" / "worker"

#: Modules whose functions are the database's or the project's side of the worker.
CALLEES = {
    "claim",
    "settle",
    "leases",
    "groups",
    "liveness",
    "queries",
    "limits",
    "retention",
    "install",
    "signals",
    "dependencies",
}
#: Functions called by name that reach the database or the project's code.
NAMED = {
    "paused_queues",
    "record_success",
    "record_time_limit",
    "execute",
    "call_handler",
    "_group_goes_on",
    "_settle",
    "change",  # the outcome statements of execute._record (settle.fail, settle.snooze)
}


def exception_classes() -> list[type[BaseException]]:
    from django.db import DatabaseError, InterfaceError

    return [
        Exception,
        DatabaseError,
        InterfaceError,
        asyncio.CancelledError,
        KeyboardInterrupt,
        SystemExit,
    ]


@dataclass(frozen=True, order=True)
class Site:
    """A call from ``function`` (a qualified name) of ``worker/<module>.py`` to ``callee``."""

    module: str
    function: str
    callee: str

    def __str__(self) -> str:
        return f"worker/{self.module}.py {self.function} -> {self.callee}"


def discover() -> set[Site]:
    """Every call site of the worker's source that reaches the database or the project.

    A call inside a lambda belongs to the function around it (``from_site``
    matches its frame); a nested ``def`` is a function of its own.
    """
    sites: set[Site] = set()
    for path in sorted(WORKER.glob("*.py")):
        module = path.stem

        def visit(node: ast.AST, scope: list[str], module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, [*scope, child.name], module)
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    qualname = ".".join([*scope, child.name])
                    for call in _own_calls(child):
                        callee = _callee(call)
                        if callee is not None:
                            sites.add(Site(module, qualname, callee))
                    visit(child, [*scope, child.name, "<locals>"], module)

        visit(ast.parse(path.read_text()), [])
    return sites


def _own_calls(function: ast.AST) -> Iterator[ast.Call]:
    """The calls in ``function``'s body, lambdas included, nested functions not."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


#: Calls of a method on an object, by the text of the call (a user's retry policy,
#: the wake-up's wait on its LISTEN connection): the class whose method is replaced.
METHODS = {
    "policy.next_delay": ("django_delayq.retry", "FixedDelay", "next_delay"),
    "self.waker.wait": ("django_delayq.worker.wakeup", "Waker", "wait"),
}


def _callee(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    text = ast.unparse(func)
    if text in METHODS:
        return text
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id in CALLEES:
            return f"{func.value.id}.{func.attr}"
    if isinstance(func, ast.Name) and func.id in NAMED:
        return func.id
    return None


# -- injection -------------------------------------------------------------------------


@dataclass
class Injection:
    site: Site
    error: type[BaseException]
    fired: int = 0
    calls: int = 0


def _target(site: Site) -> tuple[Any, str]:
    """The object and attribute to replace so that ``site`` calls the replacement."""
    caller = importlib.import_module(f"django_delayq.worker.{site.module}")
    if site.callee in METHODS:
        module, cls, method = METHODS[site.callee]
        return getattr(importlib.import_module(module), cls), method
    if "." in site.callee:
        name, attr = site.callee.split(".", 1)
        return getattr(caller, name), attr
    if site.callee == "change":
        # execute._record looks its statement up in _OUTCOMES: settle.fail or
        # settle.snooze, replaced in that table.
        return caller, "_OUTCOMES"
    return caller, site.callee


@contextmanager
def inject(site: Site, error: type[BaseException]) -> Iterator[Injection]:
    """Make ``site``'s call raise ``error`` the first time it is made from that function."""
    injection = Injection(site, error)
    owner, attr = _target(site)
    original = getattr(owner, attr)
    lock = threading.Lock()

    def from_site() -> bool:
        frame = sys._getframe(2)
        code = frame.f_code
        return Path(code.co_filename).stem == site.module and (
            code.co_qualname == site.function
            or code.co_qualname.startswith(site.function + ".<locals>.<lambda>")
        )

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(*args: Any, **kwargs: Any) -> Any:
            if from_site():
                with lock:
                    injection.calls += 1
                    fire = injection.fired == 0
                    if fire:
                        injection.fired += 1
                if fire:
                    raise error(f"injected at {site}")
            return function(*args, **kwargs)

        return faulty

    replaced: Any
    if attr == "_OUTCOMES":
        replaced = {k: (wrap(v[0]), *v[1:]) for k, v in original.items()}
    else:
        replaced = wrap(original)
    setattr(owner, attr, replaced)
    try:
        yield injection
    finally:
        setattr(owner, attr, original)


# -- the workload ------------------------------------------------------------------------

#: What every run enqueues: (queue, payload, group); it reaches every site between them
#: (with the settings of :func:`settings_for`).
WORKLOAD: list[tuple[str, dict[str, Any], str]] = [
    ("default", {}, ""),
    ("default", {"retry_in": 0}, ""),  # a snooze
    ("chaos", {"fail": 1}, ""),  # a retry
    ("chaos", {}, "g"),  # an ordered group
    ("chaos", {}, "g"),
    ("chaos", {"discard": "given up"}, "h"),  # a group going on past a failure
    ("chaos", {}, "h"),
    ("chaos-atomic", {}, ""),  # atomic handlers (grouped on PostgreSQL)
    ("chaos-atomic", {}, ""),
    ("async", {}, ""),
    ("limited", {}, ""),  # a global limit's claim
    ("outlives", {}, ""),  # past its time limit
    ("stolen", {}, ""),  # claimed away while it runs: its success finds it gone
    ("stolen", {"fail": 1}, ""),  # ...and its failure too
]
QUEUES = sorted({queue for queue, _, _ in WORKLOAD})
#: The workflow's parent of every run that must run alone (run_site) waits this
#: long, unless the rest of the workload is over first (then it is run at once).
PARENT_DELAY = 600
ATOMIC = {"chaos-atomic"}


def settings_for(base: dict[str, Any]) -> dict[str, Any]:
    """Intervals short enough that every periodic site runs within a second or two."""
    queues = dict(base.get("QUEUES", {}))
    queues["chaos"] = {**queues.get("chaos", {}), "GROUP_AFTER_FAILURE": "continue"}
    return {
        **base,
        "QUEUES": queues,
        "LEASE": 0.6,
        "HEARTBEAT_INTERVAL": 0.1,
        "WORKER_DEAD_AFTER": 0.5,
        "POLL_INTERVAL": 0.1,
        "PRUNE_INTERVAL": 0.2,
        "RETENTION": 3600,
        "CRON_INSTALL_INTERVAL": 0.2,
        "SHUTDOWN_GRACE": 2,
    }


@dataclass
class Outcome:
    site: Site
    error: str
    fired: bool
    crashed: str = ""
    hung: bool = False
    violations: list[str] = field(default_factory=list)


def run_site(site: Site, error: type[BaseException], *, timeout: float = 30.0) -> Outcome:
    """One run: the workload through a worker whose ``site`` raises ``error`` once."""
    from django.db import connections

    from django_delayq import enqueue
    from django_delayq.models import Message
    from django_delayq.operations import run_now
    from django_delayq.worker import Worker
    from tests.testapp.handlers import ASYNC

    ASYNC.clear()
    # A workflow's parent claimed with the rest (where successes are batched, its
    # success is, and the batch releases its child), and its child.
    early = enqueue("default", {}).message
    messages = [early, enqueue("default", {}, after=[early]).message]
    messages += [enqueue(queue, payload, group=group).message for queue, payload, group in WORKLOAD]
    # A workflow's parent that runs once the rest is done (alone, so its success
    # and its child's release are one statement on PostgreSQL), and its child.
    # It is made due when the rest is over, not after a fixed time: on a busy
    # machine the rest still ran then, the worker batched the parent's success
    # with theirs, and the site of the one-statement release was never reached.
    rest = list(messages)
    parent = enqueue("default", {}, delay=PARENT_DELAY).message
    messages += [parent, enqueue("default", {}, after=[parent]).message]
    parent_due = False
    outcome = Outcome(site, error.__name__, fired=False)
    with inject(site, error) as injection:
        worker = Worker(QUEUES, concurrency=2)
        raised: list[BaseException] = []

        def serve() -> None:
            try:
                worker.run()
            except BaseException as exc:  # the worker stops with an error: allowed
                raised.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while thread.is_alive() and time.monotonic() < deadline:
            if not parent_due:
                if _all_done(rest) or _only_retries_later(rest):
                    run_now(Message.objects.filter(pk=parent.pk))
                    parent_due = True
            elif _all_done(messages) or _only_retries_later(messages):
                break
            time.sleep(0.05)
        _stop_with_work_queued(worker, thread)
        worker.stop()
        thread.join(timeout)
        outcome.hung = thread.is_alive() or not _threads_end(timeout)
        outcome.fired = injection.fired > 0
        if raised:
            outcome.crashed = f"{type(raised[0]).__name__}: {raised[0]}"
    if outcome.hung:
        outcome.violations.append("the worker did not stop")
        return outcome
    _recover(messages + list(Message.objects.filter(queue="default", key__startswith="tail-")))
    outcome.violations += _violations(messages)
    return outcome


def _threads_end(timeout: float) -> bool:
    """Whether every thread of the worker ended (a late handler's, after it returned)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name.startswith("delayq-")]:
            return True
        time.sleep(0.02)
    return False


def _all_done(messages: list[Any]) -> bool:
    from django_delayq.models import Message

    return not Message.objects.filter(
        pk__in=[m.pk for m in messages], status__in=["pending", "running"]
    ).exists()


def _only_retries_later(messages: list[Any]) -> bool:
    """Whether every unfinished message waits for a retry due later than a second
    from now (the fallback delay after a retry policy raised is a minute, the
    suite's FixedDelay too): nothing more happens in this run, and the recovery
    below runs them at once."""
    from django.db.models import Q

    from django_delayq import clock
    from django_delayq.models import Message

    soon = clock.now() + timedelta(seconds=1)
    unfinished = Message.objects.filter(
        pk__in=[m.pk for m in messages], status__in=["pending", "running"]
    )
    return (
        unfinished.exists()
        and not unfinished.filter(Q(status="running") | Q(next_attempt_time__lte=soon)).exists()
    )


def _stop_with_work_queued(worker: Any, thread: threading.Thread) -> None:
    """Stop while messages wait in the worker's queue: the shutdown hands them back."""
    from django_delayq import enqueue_many
    from django_delayq.models import Message

    if not thread.is_alive():
        return
    tail = enqueue_many(
        "default",
        [{"sleep": 0.2}] * 6,
        keys=[f"tail-{i}-{time.monotonic_ns()}" for i in range(6)],
    )
    deadline = time.monotonic() + 5
    ids = [r.message.pk for r in tail]
    while time.monotonic() < deadline and thread.is_alive():
        if Message.objects.filter(pk__in=ids, status="running").exists():
            return
        time.sleep(0.01)


def _recover(messages: list[Any], timeout: float = 60.0) -> None:
    """Run clean workers until every message is finished (or the time is up).

    Retries due later run now, as an operator's "run now" makes them: what
    the run proves is that each message is still there and ends once.
    """
    from django_delayq import operations
    from django_delayq.models import Message
    from django_delayq.worker import Worker

    ids = [m.pk for m in messages]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Message.objects.filter(pk__in=ids, status__in=["pending", "running"]).exists():
            return
        operations.run_now(
            Message.objects.filter(pk__in=ids, status="pending", next_attempt_time__isnull=False)
        )
        Worker(QUEUES, burst=True, concurrency=2).run()
        time.sleep(0.05)


def _violations(messages: list[Any]) -> list[str]:
    from django_delayq.models import Dependency, Message
    from tests.testapp.models import Effect

    found = []
    rows = {m.pk: m for m in Message.objects.filter(pk__in=[m.pk for m in messages])}
    for message in messages:
        row = rows.get(message.pk)
        expected = "failed" if message.payload.get("discard") else "succeeded"
        if row is None:
            found.append(f"message {message.pk} is gone")
        elif row.status != expected:
            found.append(f"message {row.pk} ({row.queue}) ended {row.status}: {row.last_error}")
        if message.queue in ATOMIC:
            effects = Effect.objects.filter(message_id=message.pk).count()
            if effects != 1:
                found.append(f"atomic message {message.pk} has {effects} effects")
    running = Message.objects.filter(status="running").count()
    if running:
        found.append(f"{running} message(s) left running")
    # Each workflow's child ran after its parent's success had committed, and the
    # parent's edge to it was ended once, as a success.
    for edge in Dependency.objects.filter(child_id__in=rows).select_related("parent", "child"):
        parent, child = edge.parent, edge.child
        if edge.parent_ended != "succeeded":
            found.append(f"the edge {parent.pk} -> {child.pk} ended {edge.parent_ended!r}")
        started = child.last_attempt_time
        if started is None or started < parent.updated_at:
            found.append(f"child {child.pk} started {started} before its parent's success")
    return found
