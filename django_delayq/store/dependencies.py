"""Workflows: a message enqueued ``after=`` others runs once they have finished.

Each ``after=`` is one edge (``Dependency``) from a parent to the child. A
child waits as a held ordered-group member does: ``pending`` with no due
time (its due time stays in ``scheduled_time``), so no claim and no
next-due read ever visits it. An edge is *ended* once its parent has
finished (``parent_ended`` holds the status it ended with); a child whose
edges have all ended is released (due at its scheduled time), and one
with a parent that failed is cancelled, kept waiting or released
according to its ``on_parent_failure``.

Who ends the edges (:func:`settle`): the worker that finished a parent,
right after the outcome committed (the parent's ``has_children`` tells it
to look, so messages without children cost nothing); an operator's
operation; the enqueue of a child whose parents finished already; and a
sweep of every worker's maintenance, for what a crash or a race left
undone (a child enqueued in the very moment its parent finished).

Exactly once: every change of a child's edges and of the child itself
happens under the child's row lock, taken first, in id order. Parents
finishing at the same moment on different workers then take turns on
their common child, and the last one sees every other parent's edge
ended: the child is released once (the release's ``WHERE`` repeats that
it is still waiting), never twice and never not at all.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
)
from django.db.models.functions import Greatest

from django_delayq import clock
from django_delayq.fingerprint import fingerprint
from django_delayq.models import Dependency, Message
from django_delayq.status import ACTIVE, FINISHED, Status
from django_delayq.store.columns import IN_BATCH, batches, db_alias

#: Parent statuses that count as a failure for ``on_parent_failure``.
PARENT_FAILED = (Status.FAILED, Status.CANCELLED)

# Open edges whose parent has finished, read per round of :func:`settle`.
ROUND = IN_BATCH


def not_waiting() -> Q:
    """Rows that wait for no parent (every edge ended), for the held-row tests."""
    return Q(on_parent_failure="") | Q(
        ~Exists(Dependency.objects.filter(child=OuterRef("pk"), parent_ended=""))
    )


def attach(children: Sequence[int], parents: Sequence[int], policy: str, *, using: str) -> None:
    """Make the new ``children`` wait for ``parents`` (in their ``after=`` order).

    Run in the transaction that wrote the children: they are held, their
    edges written, the parents marked as having children, and the edges of
    parents that have finished already are ended at once (a child of
    finished parents is due as soon as this commits).
    """
    if not children or not parents:
        return
    rows = Message._base_manager.using(using)
    for chunk in batches(list(children)):
        rows.filter(pk__in=chunk, status=Status.PENDING).update(
            on_parent_failure=policy, next_attempt_time=None
        )
    Dependency.objects.using(using).bulk_create(
        [
            Dependency(child_id=child, parent_id=parent, position=i)
            for child in children
            for i, parent in enumerate(parents)
        ],
        batch_size=IN_BATCH,
    )
    for chunk in batches(list(parents)):
        rows.filter(pk__in=chunk, has_children=False).update(has_children=True)
    settle(children=children, using=using)


@dataclass
class Settled:
    """What :func:`settle` did: the children it released and those it cancelled."""

    released: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.released or self.cancelled)


def settle(
    parents: Collection[int] | None = None,
    *,
    children: Collection[int] | None = None,
    using: str | None = None,
) -> Settled:
    """End the open edges whose parent has finished, and release or cancel their children.

    ``parents`` / ``children``: only the edges from / to these (both None:
    every open edge, the sweep). A child cancelled by its parent's failure
    is finished too: its own children follow, down the graph.
    """
    alias = db_alias(using)
    done = Settled()
    edges = Dependency.objects.using(alias).filter(
        parent_ended="", parent__status__in=list(FINISHED)
    )
    if parents is None and children is None:
        _rounds(edges, alias, done)
    for chunk in batches(sorted(parents or ())):
        _rounds(edges.filter(parent_id__in=chunk), alias, done)
    for chunk in batches(sorted(children or ())):
        _rounds(edges.filter(child_id__in=chunk), alias, done)
    followed = 0
    while followed < len(done.cancelled):
        # Finished now: their children's edges end too.
        chunk = done.cancelled[followed : followed + IN_BATCH]
        followed += len(chunk)
        _rounds(edges.filter(parent_id__in=chunk), alias, done)
    if done.released:
        from django_delayq.store.groups import wake

        queues: set[str] = set()
        for chunk in batches(done.released):
            rows = Message._base_manager.using(alias).filter(pk__in=chunk)
            queues.update(rows.values_list("queue", flat=True).distinct())
        wake(queues, using=alias)
    return done


def _rounds(edges: QuerySet[Dependency], alias: str, done: Settled) -> None:
    """End ``edges`` (open, their parent finished), ``ROUND`` at a time, each round a
    transaction of its own; an edge someone else ended meanwhile drops out."""
    while True:
        found = list(
            edges.order_by("child_id").values_list("pk", "child_id", "parent__status")[:ROUND]
        )
        if not found:
            return
        with transaction.atomic(using=alias):
            _end_edges(found, alias, done)


def _end_edges(found: list[tuple[int, int, str]], alias: str, done: Settled) -> None:
    """End the edges of ``found`` (edge, child, parent's status) under their children's
    locks, then release or cancel each child that can go."""
    kids = sorted({child for _, child, _ in found})
    # The children's row locks first, in id order: whoever ends edges of the
    # same child waits here, and then sees the others' edges ended.
    locked = _lock_waiting(kids, alias)
    by_status: dict[str, list[int]] = {}
    for edge, _, status in found:
        by_status.setdefault(status, []).append(edge)
    for status, ids in by_status.items():
        Dependency.objects.using(alias).filter(pk__in=ids, parent_ended="").update(
            parent_ended=status
        )
    if locked:
        _decide(locked, alias, done)


def _decide(locked: dict[int, tuple[str, str, str]], alias: str, done: Settled) -> None:
    """Release or cancel each waiting child of ``locked`` (id: queue, group, policy;
    its row lock held) that its edges let go."""
    rows = Message._base_manager.using(alias)
    counts = (
        Dependency.objects.using(alias)
        .filter(child_id__in=list(locked))
        .values("child_id")
        .order_by()
        .annotate(
            open=Count("pk", filter=Q(parent_ended="")),
            failed=Count("pk", filter=Q(parent_ended__in=PARENT_FAILED)),
        )
    )
    edges = {row["child_id"]: (row["open"], row["failed"]) for row in counts}
    release: list[int] = []
    cancel: list[int] = []
    for child, (_, _, policy) in locked.items():
        open_, failed = edges.get(child, (0, 0))  # none left: its parents were deleted
        if failed and policy == "cancel":
            cancel.append(child)
        elif not open_ and (not failed or policy == "run"):
            release.append(child)
    now = clock.sql_now()
    if release:
        rows.filter(pk__in=release, status=Status.PENDING, next_attempt_time__isnull=True).update(
            next_attempt_time=Greatest(F("scheduled_time"), now), updated_at=now
        )
        grouped = {pk: _Row(*locked[pk][:2]) for pk in release if locked[pk][1]}
        if grouped:
            from django_delayq.store.groups import hold_back

            hold_back(grouped, using=alias)
        done.released.extend(release)
    if cancel:
        _cancel(cancel, alias)
        done.cancelled.extend(cancel)


def _lock_waiting(kids: Sequence[int], alias: str) -> dict[int, tuple[str, str, str]]:
    """Lock those of ``kids`` that wait for parents, in id order; id: queue, group, policy."""
    rows = (
        Message._base_manager.using(alias)
        .filter(pk__in=list(kids), status=Status.PENDING, next_attempt_time__isnull=True)
        .exclude(on_parent_failure="")
        .select_for_update()
        .order_by("pk")
    )
    return {
        pk: (queue, group, policy)
        for pk, queue, group, policy in rows.values_list(
            "pk", "queue", "group", "on_parent_failure"
        )
    }


@dataclass(frozen=True)
class _Row:
    queue: str
    group: str


def _cancel(children: list[int], alias: str) -> None:
    """Cancel ``children``, each naming the first parent whose failure did it."""
    edges = Dependency.objects.using(alias).filter(
        child_id__in=children, parent_ended__in=PARENT_FAILED
    )
    edges.update(cancelled_child=True)
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
            error_fingerprint=fingerprint(error),
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
        edges.filter(parent_id__in=chunk).exclude(parent_ended="").update(
            parent_ended="", cancelled_child=False
        )
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
        frontier.extend(victims)  # their children that their cancellation cancelled
    if reopened:
        settle(children=reopened, using=alias)
    return len(reopened)


def orphaned(children: Collection[int], *, using: str | None = None) -> Settled:
    """Decide for ``children`` whose edges were deleted with their parent (an
    operator's delete): one left with no open edge goes."""
    alias = db_alias(using)
    done = Settled()
    for chunk in batches(sorted(children)):
        with transaction.atomic(using=alias):
            locked = _lock_waiting(chunk, alias)
            if locked:
                _decide(locked, alias, done)
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
    """Whether ``message`` still has a parent that did not end (read now)."""
    return (
        Dependency.objects.using(message._state.db or db_alias(None))
        .filter(child_id=message.pk, parent_ended="")
        .exists()
    )


def parents_of(message: Message) -> list[Message]:
    """``message``'s parents, in the order of its ``after=``."""
    alias = message._state.db or db_alias(None)
    order = list(
        Dependency.objects.using(alias)
        .filter(child_id=message.pk)
        .order_by("position")
        .values_list("parent_id", flat=True)
    )
    found = Message._base_manager.using(alias).in_bulk(order)
    return [found[pk] for pk in order if pk in found]


def children_of(message: Message) -> QuerySet[Message]:
    """The messages enqueued ``after=`` ``message``."""
    alias = message._state.db or db_alias(None)
    return Message._base_manager.using(alias).filter(
        pk__in=Dependency.objects.using(alias).filter(parent_id=message.pk).values("child_id")
    )


def needed(rows: QuerySet[Any]) -> QuerySet[Any]:
    """``rows`` without the parents that a child still waiting or running needs (its
    result, its edge): what pruning and deleting finished messages must keep."""
    if rows.model is not Message:
        return rows
    return rows.exclude(
        Q(has_children=True)
        & Exists(Dependency.objects.filter(parent=OuterRef("pk"), child__status__in=list(ACTIVE)))
    )
