"""Workflows: a message enqueued ``after=`` others runs once they have finished.

Each ``after=`` is one edge (``Dependency``) from a parent to the child. A
child waits as a held ordered-group member does: ``pending`` with no due
time (its due time stays in ``scheduled_time``), so no claim and no
next-due read ever visits it. An edge is *ended* once its parent has
finished (``parent_ended`` holds the status it ended with), and the child
counts its parents that have not ended (``parents_waiting``) and those that
ended failed or cancelled (``parents_failed``). The change that brings the
first count to 0 releases the child (due at its scheduled time); one that
brings it a failed parent cancels it, keeps it waiting or, once none waits,
releases it, by its ``on_parent_failure``.

Who ends the edges (:func:`settle`): the worker that finished a parent,
right after the outcome committed (the parent's ``has_children`` tells it
to look, so messages without children cost nothing); an operator's
operation; the enqueue of a child whose parents finished already; and a
sweep of every worker's maintenance, for what a crash or a race left
undone (a child enqueued in the very moment its parent finished).

Exactly once: an edge ends once (its ``UPDATE`` repeats ``parent_ended =
''``), and the child's counts change in the same transaction, under the
child's row lock. On PostgreSQL both are one statement (``end_edges``):
parents finishing at the same moment on several workers change their
common child one after the other, and only the change that reaches 0
releases it. Elsewhere the children are locked first, in id order, and
their edges read again under the lock (SQLite has one writer at a time).

A worker never waits long for a child's row lock (``skip_locked``): a
producer's transaction may hold it for as long as it likes (an upsert of
the child's key), and the worker's acknowledgements would wait behind it.
The edges to a child locked elsewhere stay open (:func:`settle_without_waiting`
waits a few milliseconds, as another worker's statement on the same child
ends), and the sweep, which passes locked children, ends them later.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import OperationalError, connections, transaction
from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Coalesce, Greatest

from django_delayq import clock
from django_delayq.conf import get_config
from django_delayq.fingerprint import fingerprint
from django_delayq.models import STAND_IN_PREFIX, Dependency, Message
from django_delayq.status import FINISHED, Status
from django_delayq.store import direct
from django_delayq.store.columns import IN_BATCH, batches, db_alias, quote_names
from django_delayq.store.features import features
from django_delayq.store.sql import statement
from django_delayq.store.wakeup import NOTIFY_CHANNEL

#: Parent statuses that count as a failure for ``on_parent_failure``.
PARENT_FAILED = (Status.FAILED, Status.CANCELLED)

# Open edges whose parent has finished, read per round of the locked path.
ROUND = IN_BATCH


def not_waiting() -> Q:
    """Rows that no parent holds back (none, or their parents let them go), for the
    held-row tests."""
    return (
        Q(on_parent_failure="")
        | Q(parents_waiting=0, parents_failed=0)
        | Q(parents_waiting=0, on_parent_failure="run")
    )


def waiting_rows() -> Q:
    """Workflow steps waiting for their parents: pending, no due time, and parents that
    have not all let them go (a released step an ordered group holds is not one).
    The one condition the admin's filter, ``delayq_status``, the dashboard and the
    metrics count by; :func:`waits` is its twin for a row in hand."""
    return Q(status=Status.PENDING, next_attempt_time__isnull=True) & ~not_waiting()


def waits(message: Any) -> bool:
    """:func:`waiting_rows` for a row already read (the admin's pages)."""
    policy = getattr(message, "on_parent_failure", "")
    return (
        message.status == Status.PENDING
        and message.next_attempt_time is None
        and bool(policy)
        and not (message.parents_waiting == 0 and (message.parents_failed == 0 or policy == "run"))
    )


def attach(children: Sequence[int], parents: Sequence[int], policy: str, *, using: str) -> None:
    """Make the new ``children`` wait for ``parents`` (in their ``after=`` order).

    Run in the transaction that wrote the children: see :func:`attach_each`.
    """
    if parents:
        attach_each(dict.fromkeys(children, parents), policy, using=using)


def attach_each(parents_of: Mapping[int, Sequence[int]], policy: str, *, using: str) -> None:
    """Make each new child wait for its own parents (in their ``after=`` order).

    Run in the transaction that wrote the children: they are held, their
    edges written, the parents marked as having children, and the edges of
    parents that have finished already are ended at once (a child of
    finished parents is due as soon as this commits). The Spark loader's
    rows each name their own parents; ``enqueue`` names one list for all.
    """
    parents_of = {child: parents for child, parents in parents_of.items() if parents}
    if not parents_of:
        return
    rows = Message._base_manager.using(using)
    by_count: dict[int, list[int]] = {}
    for child, parents in parents_of.items():
        by_count.setdefault(len(parents), []).append(child)
    for count, children in by_count.items():
        for chunk in batches(children):
            rows.filter(pk__in=chunk, status=Status.PENDING).update(
                on_parent_failure=policy,
                next_attempt_time=None,
                parents_waiting=count,
                parents_failed=0,
            )
    Dependency.objects.using(using).bulk_create(
        [
            Dependency(child_id=child, parent_id=parent, position=i)
            for child, parents in parents_of.items()
            for i, parent in enumerate(parents)
        ],
        batch_size=IN_BATCH,
    )
    every = list(dict.fromkeys(p for parents in parents_of.values() for p in parents))
    for chunk in batches(every):
        # updated_at too: the Spark archive deletes only rows still at the
        # version it read, and a parent that now has children must stay.
        rows.filter(pk__in=chunk, has_children=False).update(
            has_children=True, updated_at=clock.sql_now()
        )
    settle(children=list(parents_of), using=using)


@dataclass
class Settled:
    """What :func:`settle` did: the children it released and those it cancelled."""

    released: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    #: The queues of the released ones whose idle workers are still to wake.
    queues: set[str] = field(default_factory=set)
    #: The released ones in ordered groups (their group may hold them still).
    grouped: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: Some child was locked by another transaction: its edges stay open.
    skipped: bool = False
    #: The released or cancelled ones that stand for a row of a ``QueueFields``
    #: model (``store/row_steps.py``): their rows follow them in :func:`_after`.
    stand_ins: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.released or self.cancelled)

    @property
    def told(self) -> bool:
        """Children were released, and the release's own statement woke the workers of
        their queues (PostgreSQL's NOTIFY, with their due times): none of them is held
        by an ordered group, and no queue is left to wake. The worker that released
        them then keeps the next due time it read (``Claimer.something_due``)."""
        return bool(self.released) and not self.grouped and not self.queues

    def add(self, other: Settled) -> None:
        self.released += other.released
        self.cancelled += other.cancelled
        self.queues |= other.queues
        self.grouped.update(other.grouped)
        self.skipped = other.skipped


def settle(
    parents: Collection[int] | None = None,
    *,
    children: Collection[int] | None = None,
    using: str | None = None,
    skip_locked: bool = False,
) -> Settled:
    """End the open edges whose parent has finished, and release or cancel their children.

    ``parents`` / ``children``: only the edges from / to these (both None:
    every open edge, the sweep). A child cancelled by its parent's failure
    is finished too: its own children follow, down the graph.
    ``skip_locked``: leave open the edges to a child another transaction has
    locked (``Settled.skipped`` says so) rather than wait for it.
    """
    alias = db_alias(using)
    done = Settled()
    if parents is None and children is None:
        from django_delayq.store import row_steps

        # Rows that ended without their stand-ins: the edges below end with them.
        row_steps.sweep(alias, skip_locked=skip_locked)
        _end(alias, done, None, None, skip_locked)
    for chunk in batches(sorted(parents or ())):
        _end(alias, done, "parent_id", chunk, skip_locked)
    for chunk in batches(sorted(children or ())):
        _end(alias, done, "child_id", chunk, skip_locked)
    _follow(alias, done, skip_locked)
    return done


def _follow(alias: str, done: Settled, skip_locked: bool) -> None:
    """The children cancelled are finished now: their own children's edges end too,
    down the graph; then what follows a release (:func:`_after`)."""
    followed = 0
    while followed < len(done.cancelled):
        chunk = done.cancelled[followed : followed + IN_BATCH]
        followed += len(chunk)
        _end(alias, done, "parent_id", chunk, skip_locked)
    _after(alias, done)


#: How long :func:`settle_without_waiting` tries again for the children it found
#: locked, in doubling pauses from the first (another worker's statement on
#: the same child holds it a few milliseconds).
PATIENCE = (0.002, 0.004, 0.008, 0.016, 0.032)
#: PostgreSQL: how long a worker's ``end_edges`` waits for a child's row lock.
LOCK_WAIT = sum(PATIENCE)
LOCK_NOT_AVAILABLE = "55P03"


def settle_without_waiting(
    parents: Collection[Any], *, using: str | None = None, model: type[Model] = Message
) -> Settled:
    """:func:`settle` for the edges of ``parents`` as a worker does it: never waiting
    long for a child's row lock (:data:`LOCK_WAIT` on PostgreSQL; elsewhere trying
    again for :data:`PATIENCE`), then leaving what is still locked to the sweep
    (``Settled.skipped``).

    ``model``: ``parents`` are rows of that ``QueueFields`` model that ended;
    their stand-ins end with them first (``row_steps.ended_parents``), and
    nothing is read when none of its rows takes part in a workflow.
    """
    if model is not Message:
        from django_delayq.store import row_steps

        parents = row_steps.ended_parents(model, parents, db_alias(using), skip_locked=True)
        if not parents:
            return Settled()
    done = settle(parents, using=using, skip_locked=True)
    if features(connections[db_alias(using)]).array_parameters:
        return done
    for pause in PATIENCE:
        if not done.skipped:
            break
        time.sleep(pause)
        done.add(settle(parents, using=using, skip_locked=True))
    return done


def _end(
    alias: str, done: Settled, column: str | None, ids: list[int] | None, skip_locked: bool
) -> None:
    """End the open edges of finished parents (``column`` in ``ids``; None: all)."""
    connection = connections[alias]
    if features(connection).array_parameters:
        _end_in_one_statement(connection, done, column, ids, skip_locked)
        return
    edges = Dependency.objects.using(alias).filter(
        parent_ended="", parent__status__in=list(FINISHED)
    )
    if column is not None:
        edges = edges.filter(**{f"{column}__in": ids})
    passed: set[int] = set()  # locked by another transaction: not read again
    while True:
        kids = sorted(
            set(edges.exclude(child_id__in=passed).values_list("child_id", flat=True)[:ROUND])
        )
        if not kids:
            return
        with transaction.atomic(using=alias):
            passed |= _end_locked(kids, alias, done, skip_locked)


def _end_in_one_statement(
    connection: Any, done: Settled, column: str | None, ids: list[int] | None, skip_locked: bool
) -> None:
    """PostgreSQL: :func:`_end` as the statement ``end_edges`` (autocommit, or the
    caller's transaction).

    ``skip_locked``: the sweep (``column`` None) locks the children first and
    passes those another transaction holds; a worker's edges of its parents
    wait for a child's lock at most :data:`LOCK_WAIT` (another worker ending a
    common child's edges holds it for a statement), then stay open for the
    sweep. The statement stays the plain one there: its planning is most of
    its cost, and a chain's every step runs it.
    """
    given: list[Any] = []  # the condition's parameters
    p = _names(connection)
    if column is None:
        condition = "TRUE"
    elif column == "parent_id":
        # On the parent's primary key: each parent read by its id.
        condition = f"p.{p['id']} = ANY(%s)"
        given.append(list(ids or ()))
    else:
        condition = f"d.{p['child_id']} = ANY(%s)"
        given.append(list(ids or ()))
    tail = _notify_tail(connection)
    sweep = skip_locked and column is None
    # In autocommit only: the settings last until the end of the transaction.
    bounded = skip_locked and not sweep and not connection.in_atomic_block
    try:
        # The locking form names the condition twice: the children, the edges.
        # A worker's release after its parents' outcome is the same text at every
        # step of a chain: prepared where that is safe (store/direct.py).
        rows = direct.fetch(
            connection,
            _end_edges_text(connection, condition, locking=sweep, bounded=bounded),
            given * (1 + sweep) + tail,
            prepare=not sweep and len(ids or ()) == 1,
        )
    except OperationalError as exc:
        if not bounded or getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        # A child of this call is held elsewhere: lock the children first,
        # passing those held (their edges stay open, for the sweep), and end
        # the rest now. Planned at each use, but met only under contention;
        # bounded too (an edge's row lock), so it never waits longer either.
        done.skipped = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    _end_edges_text(connection, condition, locking=True, bounded=True),
                    given * 2 + tail,
                )
                rows = cursor.fetchall()
        except OperationalError as again:
            if getattr(again.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            return  # every edge of this call stays open, for the sweep
    before = len(done.cancelled)
    _read_ended(done, rows, notified=bool(tail))
    if len(done.cancelled) > before:
        _mark_cancelled(done.cancelled[before:], connection.alias)


def with_outcome(
    connection: Any, outcome: str, params: Sequence[Any], *, prepare: bool
) -> tuple[int, Settled] | None:
    """Write a parent's outcome and release (or cancel) its children in one statement.

    ``outcome`` is the outcome's ``UPDATE`` with its compare-and-set (no
    ``RETURNING``), ``params`` its parameters. Returns how many rows it
    changed and what the release did; None where it cannot be one statement
    (not PostgreSQL, or inside the caller's transaction), or where a child's
    row lock held elsewhere made it give up after :data:`LOCK_WAIT`: then
    nothing was written, and the caller writes the outcome alone and
    releases after it (:func:`settle_without_waiting`). What follows the
    release is the caller's to do once it knows the outcome written
    (:func:`follow_up`). A worker that ran a parent alone acknowledges it so:
    a chain's step is one round trip and one commit less.
    """
    can = features(connection)
    if not can.array_parameters or connection.in_atomic_block:
        return None
    text = _end_edges_text(
        connection,
        "TRUE",  # the edges of every row the outcome changed
        locking=False,
        bounded=True,
        outcome=outcome,
    )
    tail = _notify_tail(connection)
    try:
        rows = direct.fetch(connection, text, [*params, *tail], prepare=prepare)
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        return None
    done = Settled()
    ended = [row for row in rows if row[3] != Status.SUCCEEDED]
    _read_ended(done, ended, notified=bool(tail))
    return len(rows) - len(ended), done


def follow_up(done: Settled, *, using: str) -> None:
    """What follows the release :func:`with_outcome` made, once the outcome is known
    written: the children it cancelled are marked, their own children follow them
    down the graph, and the released ones are held by their groups or their
    queues woken. Apart from the outcome's statement, so that an error here is
    the release's (the sweep finishes it), never the outcome's."""
    if done.cancelled:
        _mark_cancelled(done.cancelled, using)
    _follow(using, done, skip_locked=True)


def _names(connection: Any) -> dict[str, str]:
    """The quoted names end_edges uses: the message table's and the edges'."""
    message = quote_names(
        Message,
        connection,
        "id",
        "status",
        "queue",
        "key",
        "group",
        "parents_waiting",
        "parents_failed",
        "finished_at",
        "last_error",
        "scheduled_time",
        "updated_at",
    )
    edge = quote_names(Dependency, connection, "parent_id", "child_id", "position", "parent_ended")
    return {
        "message": message["table"],
        "dependency": edge["table"],
        **{k: v for k, v in message.items() if k != "table"},
        **{k: v for k, v in edge.items() if k != "table"},
    }


def _notify_tail(connection: Any) -> list[Any]:
    """The wake-up's parameter, where the release notifies (it rides on the statement:
    one round trip less per step of a chain)."""
    return [NOTIFY_CHANNEL] if features(connection).notify and get_config()["NOTIFY"] else []


def _end_edges_text(
    connection: Any, condition: str, *, locking: bool, bounded: bool, outcome: str | None = None
) -> str:
    """The text of ``end_edges`` (kept: the same at every step of a chain).

    ``locking``: children locked first (the sweep's form). ``bounded``: a
    worker's statement in autocommit, whose wait for a child's lock is
    bounded; after its parent's outcome committed it also commits without
    waiting for the log (with ``outcome``, the outcome commits with it and
    waits as every outcome does).
    """
    notes = bool(_notify_tail(connection))
    key = (type(connection), connection.alias, condition, locking, bounded, outcome, notes)
    text = _texts.get(key)
    if text is not None:
        return text
    can = features(connection)
    names = _names(connection)
    noted = ", (SELECT count(*) FROM notes)" if notes else ""
    ctes = ""
    if outcome is not None:
        ctes += statement("end_edges_acked", can).format(outcome=outcome, **names) + " "
    if locking:
        ctes += statement("end_edges_locked", can).format(edges=condition, **names) + " "
    wait = ""
    if bounded:
        wait = " " + statement("end_edges_lock_wait", can).format(ms=int(LOCK_WAIT * 1000))
        if outcome is None:
            wait += " " + statement("end_edges_async_commit", can)
    text = statement("end_edges", can).format(
        notes=statement("end_edges_notes", can).format(queue=names["queue"]) if notes else "",
        noted=noted,
        locked=ctes,
        only_locked=" " + statement("end_edges_only_locked", can).format(**names)
        if locking
        else "",
        lock_wait=wait,
        parents="acked" if outcome is not None else names["message"],
        also=statement("end_edges_acked_rows", can).format(noted=noted, **names)
        if outcome is not None
        else "",
        edges=condition,
        now=_now_sql(),
        due=connection.ops.quote_name("next_attempt_time"),
        policy=connection.ops.quote_name("on_parent_failure"),
        **names,
    )
    if len(_texts) < 256:
        _texts[key] = text
    return text


_texts: dict[tuple[Any, ...], str] = {}


def _read_ended(done: Settled, rows: Sequence[Sequence[Any]], *, notified: bool) -> None:
    """What end_edges returned: the children it released, and those it cancelled
    (``notified``: the statement woke the released ones' queues)."""
    for pk, queue, group, status, released, *_ in rows:
        if released:
            _released(done, pk, queue, group, notified=notified)
        elif status == Status.CANCELLED:
            done.cancelled.append(pk)
            _stand_in(done, pk, queue)


def _now_sql() -> str:
    """The statement's time: the database's, or a replaced clock's (tests), as a literal."""
    if clock.is_overridden():
        now: datetime = clock.now()
        return f"'{now.isoformat()}'::timestamptz"
    return "STATEMENT_TIMESTAMP()"


def _end_locked(kids: list[int], alias: str, done: Settled, skip_locked: bool) -> set[int]:
    """End the open edges of finished parents of ``kids`` under the children's locks
    (taken first, in id order; the edges read again under them), and change each
    waiting child's counts; then release or cancel those that can go. Returns the
    children another transaction held (``skip_locked``), whose edges stay open."""
    rows = Message._base_manager.using(alias).filter(pk__in=kids).order_by("pk")
    got = _lock_children(rows, skip_locked)
    passed: set[int] = set()
    if len(got) < len(kids):
        passed = set(rows.exclude(pk__in=got).values_list("pk", flat=True))  # not deleted
        done.skipped = done.skipped or bool(passed)
    locked = {pk: place for pk, place in got.items() if place is not None}
    edges = list(
        Dependency.objects.using(alias)
        .filter(child_id__in=kids, parent_ended="", parent__status__in=list(FINISHED))
        .exclude(child_id__in=passed)
        .values_list("pk", "child_id", "parent__status")
    )
    by_status: dict[str, list[int]] = {}
    ended: dict[int, list[int]] = {}  # child: [ended, failed]
    for edge, child, status in edges:
        by_status.setdefault(status, []).append(edge)
        counts = ended.setdefault(child, [0, 0])
        counts[0] += 1
        counts[1] += status in PARENT_FAILED
    for status, ids in by_status.items():
        for chunk in batches(ids):
            Dependency.objects.using(alias).filter(pk__in=chunk, parent_ended="").update(
                parent_ended=status
            )
    rows = Message._base_manager.using(alias)
    for child, (n, f) in ended.items():
        if child in locked:
            rows.filter(pk=child).update(
                parents_waiting=F("parents_waiting") - n, parents_failed=F("parents_failed") + f
            )
            queue, group, policy, waiting, failed = locked[child]
            locked[child] = (queue, group, policy, waiting - n, failed + f)
    _decide({k: v for k, v in locked.items() if k in ended}, alias, done)
    return passed


def _lock_children(
    rows: QuerySet[Message], skip_locked: bool
) -> dict[int, tuple[str, str, str, int, int] | None]:
    """Lock ``rows`` in id order (``skip_locked``: passing those another transaction
    holds) and read them in the same statement: id: (queue, group, policy, parents
    waiting, parents failed) for a child that waits for its parents, else None."""
    locked = rows.select_for_update(skip_locked=skip_locked).values_list(
        "pk",
        "status",
        "next_attempt_time",
        "queue",
        "group",
        "on_parent_failure",
        "parents_waiting",
        "parents_failed",
    )
    return {
        pk: (queue, group, policy, waiting, failed)
        if status == Status.PENDING and due is None and policy
        else None
        for pk, status, due, queue, group, policy, waiting, failed in locked
    }


def _lock_waiting(kids: Sequence[int], alias: str) -> dict[int, tuple[str, str, str, int, int]]:
    """Lock those of ``kids`` that wait for parents, in id order (see _lock_children)."""
    rows = (
        Message._base_manager.using(alias)
        .filter(pk__in=list(kids), status=Status.PENDING, next_attempt_time__isnull=True)
        .exclude(on_parent_failure="")
        .order_by("pk")
    )
    return {pk: place for pk, place in _lock_children(rows, False).items() if place is not None}


def _decide(locked: dict[int, tuple[str, str, str, int, int]], alias: str, done: Settled) -> None:
    """Release or cancel each waiting child of ``locked`` (its row lock held, its
    counts current) that its parents let go."""
    rows = Message._base_manager.using(alias)
    release: list[int] = []
    cancel: list[int] = []
    for child, (_, _, policy, waiting, failed) in locked.items():
        if failed and policy == "cancel":
            cancel.append(child)
        elif not waiting and (not failed or policy == "run"):
            release.append(child)
    now = clock.sql_now()
    for chunk in batches(release):
        rows.filter(pk__in=chunk, status=Status.PENDING, next_attempt_time__isnull=True).update(
            next_attempt_time=Greatest(F("scheduled_time"), now), updated_at=now
        )
    for pk in release:
        _released(done, pk, *locked[pk][:2])
    if cancel:
        _cancel(cancel, alias)
        done.cancelled.extend(cancel)
        for pk in cancel:
            _stand_in(done, pk, locked[pk][0])


def _released(done: Settled, pk: int, queue: str, group: str, *, notified: bool = False) -> None:
    done.released.append(pk)
    if _stand_in(done, pk, queue):
        return  # no worker consumes its queue: its row follows it (_after)
    if not notified:
        done.queues.add(queue)
    if group:
        done.grouped[pk] = (queue, group)


def _stand_in(done: Settled, pk: int, queue: str | None) -> bool:
    """Note ``pk`` for its row to follow if it stands for one; whether it does."""
    if queue is not None and queue.startswith(STAND_IN_PREFIX):
        done.stand_ins.append(pk)
        return True
    return False


def _after(alias: str, done: Settled) -> None:
    """What follows a release: a released step behind its ordered group is held by
    it again, and the idle workers of the released ones' queues are woken."""
    if done.grouped:
        from django_delayq.store.groups import hold_back

        hold_back({pk: _Row(*where) for pk, where in done.grouped.items()}, using=alias)
    if done.queues:
        from django_delayq.store.groups import wake

        wake(done.queues, using=alias)
    if done.stand_ins:
        from django_delayq.store import row_steps

        stand_ins, done.stand_ins = done.stand_ins, []
        row_steps.follow(alias, stand_ins)


@dataclass(frozen=True)
class _Row:
    queue: str
    group: str


def _cancel(children: list[int], alias: str) -> None:
    """Cancel ``children`` (locked), each naming the first parent whose failure did it."""
    edges = Dependency.objects.using(alias).filter(
        child_id__in=children, parent_ended__in=PARENT_FAILED
    )
    first: dict[int, tuple[int, str, str, str]] = {}
    for child, parent, queue, key, status in edges.order_by("position").values_list(
        "child_id", "parent_id", "parent__queue", "parent__key", "parent_ended"
    ):
        first.setdefault(child, (parent, queue, key, status))
    now = clock.sql_now()
    for child in children:
        parent, queue, key, status = first.get(child, (0, "?", "?", "failed"))
        error = f"Cancelled: parent {queue}/{key} (#{parent}) ended {status}"
        Message._base_manager.using(alias).filter(pk=child, status=Status.PENDING).update(
            status=Status.CANCELLED,
            next_attempt_time=None,
            finished_at=now,
            updated_at=now,
            last_error=error,
        )
    _mark_cancelled(children, alias)


def _mark_cancelled(children: list[int], alias: str) -> None:
    """The failed edges of cancelled ``children`` are what cancelled them (a retry of
    such a parent reopens them); their errors get their fingerprint (failure triage)."""
    for chunk in batches(children):
        Dependency.objects.using(alias).filter(
            child_id__in=chunk, parent_ended__in=PARENT_FAILED
        ).update(cancelled_child=True)
        rows = Message._base_manager.using(alias).filter(pk__in=chunk)
        for pk, error in rows.values_list("pk", "last_error"):
            rows.filter(pk=pk).update(error_fingerprint=fingerprint(error))


def _recount(children: Sequence[int], alias: str) -> None:
    """Count each child's waiting and failed parents again from its edges (after an
    operator reopened or deleted some)."""
    edges = Dependency.objects.using(alias).filter(child_id=OuterRef("pk"))
    for chunk in batches(list(children)):
        Message._base_manager.using(alias).filter(pk__in=chunk).update(
            parents_waiting=Coalesce(
                Subquery(
                    edges.filter(parent_ended="")
                    .values("child_id")
                    .annotate(n=Count("pk"))
                    .values("n")
                ),
                0,
            ),
            parents_failed=Coalesce(
                Subquery(
                    edges.filter(parent_ended__in=PARENT_FAILED)
                    .values("child_id")
                    .annotate(n=Count("pk"))
                    .values("n")
                ),
                0,
            ),
        )


def reopen(parents: Iterable[int], *, using: str | None = None) -> int:
    """A retried parent's children wait for it again: its edges open, and the
    descendants its failure cancelled are pending again, waiting, down the graph.

    Run in the retry's transaction. A reopened message whose other parents
    failed too is cancelled again, naming one of them. Returns how many
    cancelled messages were reopened.
    """
    alias = db_alias(using)
    rows = Message._base_manager.using(alias)
    edges = Dependency.objects.using(alias)
    frontier = sorted(set(parents))
    touched: set[int] = set()
    reopened: list[int] = []
    while frontier:
        chunk, frontier = frontier[:IN_BATCH], frontier[IN_BATCH:]
        victims = sorted(
            set(
                edges.filter(
                    parent_id__in=chunk, cancelled_child=True, child__status=Status.CANCELLED
                ).values_list("child_id", flat=True)
            )
        )
        opened = edges.filter(parent_id__in=chunk).exclude(parent_ended="")
        touched.update(opened.values_list("child_id", flat=True))
        opened.update(parent_ended="", cancelled_child=False)
        if not victims:
            continue
        # Every edge that cancelled them opens again: a parent still failed
        # ends it again below, and cancels them again.
        edges.filter(child_id__in=victims, cancelled_child=True).update(
            parent_ended="", cancelled_child=False
        )
        rows.filter(pk__in=victims, status=Status.CANCELLED).update(
            status=Status.PENDING,
            next_attempt_time=None,
            finished_at=None,
            updated_at=clock.sql_now(),
            attempt_count=0,
        )
        reopened.extend(victims)
        touched.update(victims)
        frontier.extend(victims)  # their children that their cancellation cancelled
    if touched:
        _recount(sorted(touched), alias)
    if reopened:
        _rows_wait_again(reopened, alias)
        settle(children=reopened, using=alias)
    return len(reopened)


def _rows_wait_again(reopened: list[int], alias: str) -> None:
    """The rows whose stand-ins ``reopen`` reopened, cancelled with them: waiting again."""
    from django_delayq.store import row_steps

    messages = Message._base_manager.using(alias)
    for chunk in batches(reopened):
        stand_ins = messages.filter(pk__in=chunk, queue__startswith=STAND_IN_PREFIX)
        for queue, key in stand_ins.values_list("queue", "key"):
            model = row_steps.model_for(queue)
            if model is not None:
                model._base_manager.using(alias).filter(pk=key, status=Status.CANCELLED).update(
                    status=Status.PENDING, next_attempt_time=None, last_error="", lock_token=None
                )


def orphaned(children: Collection[int], *, using: str | None = None) -> Settled:
    """Decide for ``children`` whose edges were deleted with their parent (an
    operator's delete): one left with no parent to wait for goes."""
    alias = db_alias(using)
    done = Settled()
    for chunk in batches(sorted(children)):
        with transaction.atomic(using=alias):
            locked = _lock_waiting(chunk, alias)
            if locked:
                _recount(list(locked), alias)
                _decide(_lock_waiting(list(locked), alias), alias, done)
    _after(alias, done)
    return done


def forget(ids: Collection[int], *, using: str | None = None) -> None:
    """Delete the edges to and from the messages of ``ids`` (deleted, or about to be)."""
    alias = db_alias(using)
    edges = Dependency.objects.using(alias)
    for chunk in batches(sorted(ids)):
        edges.filter(child_id__in=chunk).delete()
        edges.filter(parent_id__in=chunk).delete()


def in_workflows() -> ExpressionWrapper[Q]:
    """Whether a message is a workflow's step or parent (its edges go with it)."""
    return ExpressionWrapper(
        Q(has_children=True) | ~Q(on_parent_failure=""), output_field=BooleanField()
    )


def waiting(message: Message) -> bool:
    """Whether ``message`` waits for its parents (read now)."""
    rows = Message._base_manager.using(message._state.db or db_alias(None))
    return rows.filter(waiting_rows(), pk=message.pk).exists()


def parents_of(message: Message) -> list[Message]:
    """``message``'s parents, in the order of its ``after=`` (those whose row is gone left
    out)."""
    return [parent for parent in parents_by_place(message) if parent is not None]


def parents_by_place(message: Message) -> list[Message | None]:
    """``message``'s parents, one per place of its ``after=``: None where the row is gone."""
    alias = message._state.db or db_alias(None)
    order = list(
        Dependency.objects.using(alias)
        .filter(child_id=message.pk)
        .order_by("position")
        .values_list("parent_id", flat=True)
    )
    found = Message._base_manager.using(alias).in_bulk(order)
    return [found.get(pk) for pk in order]


def children_of(message: Message) -> QuerySet[Message]:
    """The messages enqueued ``after=`` ``message``."""
    alias = message._state.db or db_alias(None)
    return Message._base_manager.using(alias).filter(
        pk__in=Dependency.objects.using(alias).filter(parent_id=message.pk).values("child_id")
    )


def needed(rows: QuerySet[Any]) -> QuerySet[Any]:
    """``rows`` without the parents that a child which may still run needs (its result,
    its edge): what pruning and archiving finished messages must keep.

    A child that failed or was cancelled may still run: an operator's retry
    runs it again, and it reads its parents' results then. Only a child that
    succeeded (or is gone) needs its parents no more.
    """
    if rows.model is not Message:
        return rows
    return rows.exclude(
        Q(has_children=True)
        & Exists(
            Dependency.objects.filter(parent=OuterRef("pk")).exclude(child__status=Status.SUCCEEDED)
        )
    )
