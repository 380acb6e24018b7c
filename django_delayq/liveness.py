"""Worker heartbeats: who is consuming, who died, and what the dead held.

Each ``run_delayq`` process keeps one ``WorkerState`` row fresh (its lease
keeper thread writes ``last_seen`` every ``HEARTBEAT_INTERVAL``, with the
database's clock). A row that stops moving for ``WORKER_DEAD_AFTER`` belongs
to a dead process (SIGKILL, out of memory, a lost host): live workers hand
its running messages back at once, so they are redelivered within seconds
instead of at the end of their leases. A clean shutdown sets ``stopped_at``.

The hand-back is the same compare-and-set as a lease expiry: it clears the
lock token, so should the "dead" worker only have been frozen (a long GC
pause, a network partition), nothing it records afterwards is accepted.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Model

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.exceptions import WorkerNameTaken
from django_delayq.models import WORKER_NAME_MAX_LENGTH, Message, WorkerState
from django_delayq.routers import queue_alias
from django_delayq.store import leases
from django_delayq.store.server import pid_alive, process_alive
from django_delayq.values import check_text

logger = logging.getLogger("django_delayq.worker")

# Rows of workers dead (or stopped) for longer than this are deleted.
FORGET_AFTER = timedelta(days=1)
#: How often a worker forgets the rows of workers gone that long.
FORGET_INTERVAL = timedelta(hours=1)


def validate_worker_name(name: object) -> str:
    """A worker's name: a non-empty str of at most 255 characters, without NUL."""
    name = check_text(name, "worker name", WORKER_NAME_MAX_LENGTH, nul=True)
    if not name.strip():
        raise ValueError("worker name must not be empty")
    return name


def _db(using: str | None) -> str:
    return queue_alias(using)


def dead_after() -> timedelta:
    return to_timedelta(get_config()["WORKER_DEAD_AFTER"])


#: The runs of a worker in this process that have not ended (``Worker.run`` adds
#: its ``instance`` and takes it away, whatever happens): an earlier run of this
#: process under its name that is not among them is over, whatever its row says.
RUNNING_HERE: set[uuid.UUID] = set()


def register(
    name: str,
    *,
    queues: Collection[str],
    concurrency: int,
    alive_for: timedelta | None = None,
    using: str | None = None,
    instance: uuid.UUID | None = None,
    wait: Callable[[float], bool] | None = None,
    hand_back: bool = True,
) -> None:
    """Record (or re-record, after a restart that reused the name) this worker.

    A row of this name belonged to an earlier worker under the same name
    (``--name``, a pid used again after a reboot or in a container, a worker
    run again in the same process): whatever it still holds (it was killed,
    or could not hand everything back when it stopped) is handed back first,
    since from now on this worker's heartbeat would keep it "alive" (see
    :func:`beat`).

    Unless that worker lives: its heartbeat's promise (``alive_until``) holds
    and it has not stopped. Then this one does not take the name
    (:class:`~django_delayq.exceptions.WorkerNameTaken`), since each would
    hand back the other's running messages. ``wait``: sleep this many seconds
    (False if interrupted) until the promise runs out, and take the name if
    no heartbeat renewed it; a worker restarted at once after a kill need
    not be started again. A process of this host that is gone, or an
    earlier run of this very process, is over whatever its row says.

    ``hand_back=False``: a running worker taking its name back (its row was
    deleted, or a successor that took it is over) hands nothing back here:
    it holds messages under that name itself, and its keeper hands back the
    others (``leases.release_unheld``, which asks its book).
    """
    alias = _db(using)
    instance = instance or uuid.uuid4()
    rows = WorkerState.objects.using(alias)
    fields = {
        "host": socket.gethostname()[:255],
        "pid": os.getpid(),
        "queues": list(queues),
        "concurrency": concurrency,
        "started_at": clock.sql_now(),
        "last_seen": clock.sql_now(),
        "alive_until": clock.sql_now_plus(alive_for or dead_after()),
        "stopped_at": None,
        "instance": instance,
    }
    # On SQLite every worker is on this host, and a long transaction holding
    # the write lock keeps every heartbeat back: whether the process lives decides.
    os_decides = connections[alias].vendor == "sqlite"
    waited = False
    holder: Mapping[str, Any] | None = None
    for _ in range(3):
        holder = (
            rows.filter(name=name)
            .annotate(db_now=clock.sql_now())
            .values("instance", "host", "pid", "last_seen", "alive_until", "stopped_at", "db_now")
            .first()
        )
        if holder is None:
            try:
                with transaction.atomic(using=alias):
                    rows.create(name=name, **fields)
            except IntegrityError:  # registered concurrently under the same name
                continue
            break
        if not _over(holder, instance, os_decides):
            # Its promise may run out unrenewed (killed, and restarted at once
            # under the same name): wait for that once, then it is over or alive.
            if wait is None or waited or holder["alive_until"] is None:
                raise WorkerNameTaken(name, holder["host"], holder["pid"])
            left = (holder["alive_until"] - holder["db_now"]).total_seconds()
            waited = True
            if not wait(min(max(left, 0.0), 60.0) + 0.05):
                raise WorkerNameTaken(name, holder["host"], holder["pid"])
            continue
        # Taken only as read: a worker that took it meanwhile changed the row.
        same = rows.filter(name=name, last_seen=holder["last_seen"])
        same = (
            same.filter(instance__isnull=True)
            if holder["instance"] is None
            else same.filter(instance=holder["instance"])
        )
        if not same.update(**fields):
            continue
        if hand_back and holder["instance"] != instance:
            released = leases.release_workers([name], using=alias).get(name, 0)
            if released:
                logger.warning(
                    "an earlier worker named %s left %d message(s) running; released them",
                    name,
                    released,
                )
        break
    else:  # the name changed hands under each look
        raise WorkerNameTaken(name, *((holder["host"], holder["pid"]) if holder else ("?", 0)))


def _over(holder: Mapping[str, Any], instance: uuid.UUID, os_decides: bool) -> bool:
    """Whether the run that holds a name (its row's values) is over: this very run,
    stopped, an earlier run of this process, a gone process of this host, or past its
    heartbeat's promise (``os_decides``: a live process of this host never is)."""
    if holder["instance"] == instance or holder["stopped_at"] is not None:
        return True
    here = holder["host"] == socket.gethostname()[:255]
    if here and holder["pid"] == os.getpid():
        return holder["instance"] not in RUNNING_HERE
    if here and not pid_alive(holder["pid"]):
        return True
    if here and os_decides:
        return False
    return holder["alive_until"] is None or holder["alive_until"] <= holder["db_now"]


def beat(
    name: str,
    *,
    alive_for: timedelta | None = None,
    using: str | None = None,
    instance: uuid.UUID | None = None,
) -> int:
    """Refresh this worker's ``last_seen``, and promise it beats again within ``alive_for``
    (``alive_until``); returns 0 if its row is gone, or (``instance``) no longer this
    run's: another worker took the name once this one broke its promise.

    While that promise holds, no claim takes a message this worker runs, even
    if its lease lapsed (``queries.claimable_condition``): the keeper that
    beats is the one that extends the leases, so a worker that keeps its
    promise is alive, and its lease lapsed only because another transaction
    held the row. A worker that breaks it (killed, frozen) loses its messages
    when their leases run out, as before.
    """
    now = clock.sql_now()
    rows = WorkerState.objects.using(_db(using)).filter(name=name)
    if instance is not None:
        rows = rows.filter(instance=instance)
    return rows.update(
        last_seen=now,
        alive_until=clock.sql_now_plus(alive_for or dead_after()),
        stopped_at=None,
    )


def mark_stopped(name: str, *, using: str | None = None, instance: uuid.UUID | None = None) -> None:
    """Record a clean stop (``instance``: only if the name is still this run's, not a
    successor's that took it over)."""
    now = clock.sql_now()
    rows = WorkerState.objects.using(_db(using)).filter(name=name)
    if instance is not None:
        rows = rows.filter(instance=instance)
    rows.update(last_seen=now, alive_until=now, stopped_at=now)


def release_dead(
    me: str, *, using: str | None = None, models: Collection[type[Model]] = ()
) -> dict[str, int]:
    """Hand back the running messages of dead workers; returns counts by worker.

    ``models``: the ``QueueFields`` tables whose rows to hand back too (those
    the calling worker claims from).

    The messages become due at once and keep their attempt count (the attempt
    was spent: a message that kills every worker that runs it still stops at
    ``max_attempts``).

    On SQLite a worker of this host whose process lives is not dead, whatever
    its heartbeat (as for the claim, ``queries.claimable_condition``): every
    worker is on the host that has the file, and none can write a heartbeat
    while a long transaction (an atomic handler's, a producer's) holds the
    write lock, so once it ends every worker's heartbeat looks old.
    """
    alias = _db(using)
    cutoff = clock.sql_now_plus(-dead_after())
    states = WorkerState.objects.using(alias)
    dead = list(
        states.filter(last_seen__lt=cutoff, stopped_at__isnull=True)
        .exclude(name=me)
        .values_list("name", flat=True)
    )
    if connections[alias].vendor == "sqlite":
        dead = [name for name in dead if not process_alive(name)]
    released = leases.release_workers(dead, using=alias, models=models)
    for name, count in released.items():
        logger.warning(
            "worker %s stopped sending heartbeats; released %d message(s) it held", name, count
        )
    return released


def forget_gone(*, using: str | None = None) -> int:
    """Delete the rows of workers unseen for ``FORGET_AFTER`` (a day); returns how many.

    Housekeeping of the status page, not of the messages: the maintenance
    thread runs it hourly rather than with every heartbeat's look for dead
    workers (a transaction and a DELETE every few seconds of an idle worker).
    """
    forget = clock.sql_now_plus(-max(FORGET_AFTER, dead_after()))
    deleted, _ = WorkerState.objects.using(_db(using)).filter(last_seen__lt=forget).delete()
    return deleted


@dataclass(frozen=True)
class WorkerView:
    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen: datetime
    stopped_at: datetime | None
    seen_ago: timedelta
    state: str  # "live", "dead" or "stopped"


def workers(using: str | None = None) -> list[WorkerView]:
    """Every known worker with its state, judged by the database's clock."""
    limit = dead_after()
    rows = (
        WorkerState.objects.using(_db(using))
        .annotate(db_now=clock.sql_now())
        .order_by("host", "name")
    )
    views = []
    for row in rows:
        ago = max(timedelta(0), row.db_now - row.last_seen)  # type: ignore[attr-defined]
        state = "stopped" if row.stopped_at else "live" if ago <= limit else "dead"
        views.append(
            WorkerView(
                name=row.name,
                host=row.host,
                pid=row.pid,
                queues=list(row.queues or []),
                concurrency=row.concurrency,
                started_at=row.started_at,
                last_seen=row.last_seen,
                stopped_at=row.stopped_at,
                seen_ago=ago,
                state=state,
            )
        )
    return views


def held_by(names: Collection[str], using: str | None = None) -> dict[str, int]:
    """How many running messages each of these workers holds."""
    counts: dict[str, int] = {}
    rows = Message.objects.using(_db(using)).held_by(names).values_list("locked_by", flat=True)
    for name in rows:
        counts[name] = counts.get(name, 0) + 1
    return counts
