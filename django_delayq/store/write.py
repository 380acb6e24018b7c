"""New messages: the one write path of ``enqueue``, cron ticks, the Tasks backend and Spark.

Whatever produces them, new messages are written by one statement per chunk
(``store/inserts.py``), copies of one template (``store/new_rows.py``); what
an existing ``(queue, key)`` gets is the conflict clause, reported per key as
an ``Outcome``.

Per database (``features``): PostgreSQL and SQLite return what they wrote
(``RETURNING``); MariaDB/MySQL have no ``RETURNING``, so there the new keys
are inserted with ``INSERT IGNORE`` inside a savepoint, and read back, and
updates are written through the ORM (``store/without_returning.py``). The
Spark loader's statements are ``store/loader.py``'s, the wake-up of idle
workers ``store/wakeup.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.models import Message
from django_delayq.store import localwake
from django_delayq.store.features import features
from django_delayq.store.groups import hold_back
from django_delayq.store.inserts import cached_insert, rows_document
from django_delayq.store.new_rows import Batch, Outcome, Written, existing_rows, row
from django_delayq.store.rows import rows_from
from django_delayq.store.wakeup import NOTIFY_CHANNEL
from django_delayq.store.without_returning import write_without_returning

# Rows per statement: the rows travel as one JSON document, not as bound
# parameters each.
CHUNK_ROWS = 5000
# MariaDB/MySQL: payload text per statement, well under the default
# max_allowed_packet (16 MiB on MariaDB, 64 MiB on MySQL) even when JSON
# escaping doubles the text.
CHUNK_BYTES = 4 * 1024 * 1024


def write(
    connection: BaseDatabaseWrapper,
    shared: Message,
    keys: Sequence[str],
    encoded: Mapping[str, str],
    payloads: Mapping[str, Any],
    on_conflict: str,
    *,
    wake: str | None = None,
    groups: Mapping[str, str] | None = None,
) -> Written:
    """Write the messages of ``keys`` (distinct); the outcome and row of each key.

    ``encoded`` is each payload's checked JSON text (``encode_payload``),
    ``payloads`` the values themselves (for the returned rows). Keys are
    written in sorted order, so producers whose batches overlap take the key
    locks in the same order and wait for each other instead of deadlocking.
    Grouped messages (the template's group, or ``groups``: each key's) are
    written in the order given instead: their ids are their order in their
    group; and each one that an earlier message of its group holds back is
    then marked held (``groups.hold_back``).
    ``wake``: the wake-up's body (``notify_body``), sent when a row was
    written: by the insert itself on PostgreSQL (its NOTIFY), on commit to
    the local workers on SQLite. Run it in a transaction when there is more
    than one chunk, or when the messages are grouped.
    """
    can = features(connection)
    grouped = groups is not None or bool(shared.group)
    ordered = list(keys) if grouped else sorted(keys)
    batch: Batch = (connection, shared, encoded, payloads, on_conflict, groups)
    if not can.returning:
        out = write_without_returning(batch, _chunks(ordered, encoded, CHUNK_ROWS, CHUNK_BYTES))
    else:
        out = {}
        riding = wake if can.notify else None
        for chunk in _chunks(ordered, encoded, CHUNK_ROWS, None):
            out.update(_write_chunk(batch, chunk, riding))
    if grouped:
        _hold_back(connection, out)
    if wake is not None and can.local_wake:
        if any(outcome is not Outcome.IGNORED for outcome, _ in out.values()):
            localwake.on_commit(connection, wake)
    return out


def _hold_back(connection: BaseDatabaseWrapper, out: Written) -> None:
    """Mark held the written messages that an earlier message of their group holds back."""
    written = {m.pk: m for o, m in out.values() if o is not Outcome.IGNORED and m.group}
    for pk in hold_back(written, using=connection.alias):
        written[pk].next_attempt_time = None


def _write_chunk(batch: Batch, keys: list[str], wake: str | None) -> Written:
    connection, shared, encoded, payloads, on_conflict, groups = batch
    can = features(connection)
    single = len(keys) == 1
    statement_ = cached_insert(
        connection, on_conflict, wake is not None, groups is not None, single
    )
    params = statement_.params(shared, connection)
    if single:
        (key,) = keys
        one = {"key": key, "payload": encoded[key]}
        if groups is not None:
            one["group"] = groups[key]
        params.extend(one[name] for name in statement_.source_fields)
    else:
        params.append(
            rows_document(
                can,
                keys,
                [encoded[k] for k in keys],
                None if groups is None else [groups[k] for k in keys],
            )
        )
    if wake is not None and can.notify:
        params += [NOTIFY_CHANNEL, wake]
    existing: set[str] = set()
    if statement_.returns_rows and not can.inserted_flag:
        # Without xmax, tell inserts from updates by what was there before;
        # SQLite serialises writers, so this cannot race within our write.
        existing = set(existing_rows(connection, shared.queue, keys).values_list("key", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(statement_.sql, params)
        fetched = cursor.fetchall()
    out: Written = {}
    if statement_.returns_rows:
        for values, message in zip(fetched, rows_from(Message, connection, fetched), strict=True):
            inserted = bool(values[-1]) if can.inserted_flag else message.key not in existing
            out[message.key] = (Outcome.CREATED if inserted else Outcome.UPDATED, message)
    else:
        for pk, key in fetched:
            message = row(shared, key, payloads[key], pk)
            if groups is not None:
                message.group = groups[key]
            message._state.db = connection.alias
            out[key] = (Outcome.CREATED, message)
    missing = [k for k in keys if k not in out]
    if missing:
        for message in existing_rows(connection, shared.queue, missing):
            out[message.key] = (Outcome.IGNORED, message)
    return out


def _chunks(
    keys: list[str], encoded: Mapping[str, str], rows: int, size: int | None
) -> Iterator[list[str]]:
    """``keys`` in groups that fit one statement (by count, and by payload size if given)."""
    chunk: list[str] = []
    total = 0
    for key in keys:
        length = len(encoded[key]) + len(key)
        if chunk and (len(chunk) >= rows or (size is not None and total + length > size)):
            yield chunk
            chunk, total = [], 0
        chunk.append(key)
        total += length
    if chunk:
        yield chunk


__all__ = ["CHUNK_BYTES", "CHUNK_ROWS", "write"]
