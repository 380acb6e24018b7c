"""MariaDB/MySQL: new messages written without ``RETURNING``.

There is no ``RETURNING`` (nor ``ON CONFLICT``), so the new keys are inserted
with ``INSERT IGNORE`` inside a savepoint, and read back, and updates are
written through the ORM (:func:`write_without_returning`), by the Python
twins of PostgreSQL's and SQLite's upsert (:func:`same_content`,
:func:`apply_update`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.exceptions import DelayQError
from django_delayq.models import Message
from django_delayq.status import FINISHED, Status
from django_delayq.store.features import features
from django_delayq.store.inserts import cached_insert, rows_document
from django_delayq.store.new_rows import Batch, Outcome, Written, existing_rows, row
from django_delayq.store.sql import statement

# MariaDB/MySQL: a concurrent producer that commits one of our new keys
# between our read and our insert makes us read again; each round locks what
# it read.
MAX_ROUNDS = 10

# What on_conflict="update" writes over an existing message.
UPDATED_FIELDS = [
    "payload",
    "kind",
    "priority",
    "max_attempts",
    "scheduled_time",
    "updated_at",
    "next_attempt_time",
    "attempt_count",
    "last_error",
    "last_traceback",
    "finished_at",
    "lock_token",
    "status",
    "superseded_at",
]


class _Raced(DelayQError):
    """A concurrent producer committed one of our new keys: read again."""

    def __init__(self, existing: int) -> None:
        super().__init__(existing)
        self.existing = existing  # how many of the chunk's keys were found


def write_without_returning(batch: Batch, chunks: Iterable[list[str]]) -> Written:
    """Per chunk, inside a savepoint: read the existing rows (locked when they may be
    updated), insert the others with ``INSERT IGNORE`` from one JSON document, and read
    back their ids.

    The insert's row count says whether every new key was ours: InnoDB makes
    an insert wait for a concurrent uncommitted insert of the same key, so a
    short count means another producer committed it first. Then the
    savepoint is rolled back and the chunk read again, in a way that sees
    that row (:func:`_read`), so a message reported CREATED was created by
    this call and no other. A round that finds no more rows than the
    previous one means the column's collation merged two different keys
    (``django_delayq.W050``): that is an error, not a race.
    """
    connection, shared, encoded, _, on_conflict, _ = batch
    out: Written = {}
    for chunk in chunks:
        seen = -1
        for round_ in range(MAX_ROUNDS):
            try:
                with transaction.atomic(using=connection.alias):
                    lock: bool | str = "update" if on_conflict == "update" else round_ > 0
                    out.update(_write_chunk_without_returning(batch, chunk, lock))
                break
            except _Raced as raced:
                if raced.existing == seen:
                    # Nobody added a row since the last round: the unique
                    # index calls two of our different keys equal.
                    raise ImproperlyConfigured(
                        f"keys of queue {shared.queue!r} collide with stored keys that "
                        "differ only in case or trailing spaces: the key column's collation "
                        "is not exact (see the check django_delayq.W050: manage.py check "
                        f"--database {connection.alias})"
                    ) from None
                seen = raced.existing
        else:
            raise RuntimeError(
                f"enqueue_many: concurrent producers kept inserting the same keys of queue "
                f"{shared.queue!r}; gave up after {MAX_ROUNDS} rounds"
            )
    return out


def _write_chunk_without_returning(batch: Batch, keys: list[str], lock: bool | str) -> Written:
    connection, shared, encoded, payloads, on_conflict, groups = batch
    existing = {m.key: m for m in _read(connection, shared.queue, keys, lock)}
    new = [k for k in keys if k not in existing]
    out: Written = {}
    if new:
        statement_ = cached_insert(connection, "ignore", False, groups is not None)
        params = statement_.params(shared, connection)
        params.append(
            rows_document(
                features(connection),
                new,
                [encoded[k] for k in new],
                None if groups is None else [groups[k] for k in new],
            )
        )
        with connection.cursor() as cursor:
            cursor.execute(statement_.sql, params)
            inserted = int(cursor.rowcount)
        if inserted != len(new):
            raise _Raced(len(existing))
        ids = dict(existing_rows(connection, shared.queue, new).values_list("key", "id"))
        for key in new:
            message = row(shared, key, payloads[key], ids[key])
            if groups is not None:
                message.group = groups[key]
            message._state.db = connection.alias
            out[key] = (Outcome.CREATED, message)
    changed: list[Message] = []
    for key, current in existing.items():
        new_version = row(shared, key, payloads[key])
        if on_conflict != "update" or same_content(current, new_version):
            out[key] = (Outcome.IGNORED, current)
            continue
        apply_update(current, new_version)
        changed.append(current)
        out[key] = (Outcome.UPDATED, current)
    if changed:
        Message.objects.using(connection.alias).bulk_update(changed, UPDATED_FIELDS)
    return out


def _read(
    connection: BaseDatabaseWrapper, queue: str, keys: list[str], lock: bool | str
) -> list[Message]:
    """The existing rows of ``keys``: locked for update, read fresh, or plainly read.

    ``lock="update"`` locks them (they may be rewritten). ``lock=True`` (a
    round after a race) must see rows committed since this transaction's
    snapshot: under READ COMMITTED, Django's default, a plain read does;
    under REPEATABLE READ a shared-lock read does. Neither takes exclusive
    locks, so producers that all waited on the same new key do not deadlock
    upgrading their shared locks.
    """
    rows = existing_rows(connection, queue, keys)
    if lock == "update":
        return list(rows.select_for_update())
    isolation = getattr(connection, "isolation_level", None) or "repeatable read"
    if lock and isolation not in ("read committed", "read uncommitted"):
        # Compiled for this connection's alias (not the default database's).
        select, params = rows.query.get_compiler(using=connection.alias).as_sql()
        sql = statement("read_shared", features(connection)).format(select=select)
        return list(Message.objects.raw(sql, params, using=connection.alias))
    return list(rows)


def same_content(current: Message, new: Message) -> bool:
    """Whether ``update`` would change nothing (the twin of ``update_conflicts``' WHERE)."""
    return (
        current.status == Status.PENDING
        and all(
            getattr(current, f) == getattr(new, f)
            for f in ("kind", "priority", "max_attempts", "next_attempt_time")
        )
        and _same_json(current.payload, new.payload)
    )


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON: Python's ``==`` calls ``True`` and ``1`` equal, JSON does not."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def apply_update(current: Message, new: Message) -> None:
    """What ``update`` writes over ``current`` (the twin of ``update_conflicts``' SET).

    A running message keeps its attempt (lock token, lease): the new version
    waits for it to end (``superseded_at``), and its due time is the later of
    the lease and the new version's, so that a lease which lapses does not let
    a claim run the new version early.
    """
    if current.status in FINISHED:
        current.attempt_count = 0
        current.last_error = current.last_traceback = ""
    for name in ("payload", "kind", "priority", "max_attempts", "scheduled_time", "updated_at"):
        setattr(current, name, getattr(new, name))
    current.finished_at = None
    if current.status == Status.RUNNING:
        current.superseded_at = new.updated_at
        lease, due = current.next_attempt_time, new.next_attempt_time
        if due is not None and (lease is None or due > lease):
            current.next_attempt_time = due
        return
    # A workflow step still waiting for its parents: they release it, not an update.
    waits = current.parents_waiting > 0 or (
        current.parents_failed > 0 and current.on_parent_failure == "wait"
    )
    current.next_attempt_time = None if waits else new.next_attempt_time
    current.superseded_at = None
    current.lock_token = None
    current.status = Status.PENDING


__all__ = ["apply_update", "same_content", "write_without_returning"]
