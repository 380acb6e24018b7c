"""New messages: the one write path of ``enqueue``, cron ticks, the Tasks backend and Spark.

Whatever produces them, new messages are written by one statement per chunk,
``INSERT ... SELECT`` from a source of rows (a single message: ``INSERT ...
VALUES`` of its own parameters, :func:`one_row`): one JSON document ``[[key,
payload], ...]`` for ``enqueue_many`` (one parameter however many messages:
the statement stays small, its text never changes, psycopg can prepare it),
or the Spark loader's temporary table. Every other column is one parameter,
the same for the whole call (:func:`template`). What an existing ``(queue,
key)`` gets is the conflict clause: skipped (``ignore``/``error``), or
updated (``update``), reported per key as an :class:`Outcome`.

Per database (``features``): PostgreSQL and SQLite return what they wrote
(``RETURNING``); MariaDB/MySQL have no ``RETURNING``, so there the new keys
are inserted with ``INSERT IGNORE`` inside a savepoint, and read back, and
updates are written through the ORM (:func:`_write_without_returning`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState

from django_delayq import clock
from django_delayq.conf import get_config, to_timedelta
from django_delayq.exceptions import DelayQError
from django_delayq.flow import GROUP_MAX_LENGTH
from django_delayq.models import KEY_MAX_LENGTH, Message
from django_delayq.status import FINISHED, Status
from django_delayq.store import localwake, server
from django_delayq.store.features import Features, features
from django_delayq.store.groups import hold_back, hold_back_loaded
from django_delayq.store.rows import returned_columns, rows_from
from django_delayq.store.sql import statement

NOTIFY_CHANNEL = "django_delayq"

# Rows per statement: the rows travel as one JSON document, not as bound
# parameters each.
CHUNK_ROWS = 5000
# MariaDB/MySQL: payload text per statement, well under the default
# max_allowed_packet (16 MiB on MariaDB, 64 MiB on MySQL) even when JSON
# escaping doubles the text.
CHUNK_BYTES = 4 * 1024 * 1024
# MariaDB/MySQL: a concurrent producer that commits one of our new keys
# between our read and our insert makes us read again; each round locks what
# it read.
MAX_ROUNDS = 10

INSERT_FIELDS = [f for f in Message._meta.concrete_fields if not f.primary_key]
# The template's columns that differ between calls (template()'s arguments);
# every other column of a new message is the same for all.
PER_CALL_FIELDS = frozenset(
    {"queue", "kind", "priority", "next_attempt_time", "scheduled_time", "max_attempts"}
    | {"created_at", "updated_at", "group"}
)
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


class Outcome(enum.StrEnum):
    """What an enqueue did with its key: wrote a new message, rewrote the one there,
    or left that one as it was."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


Written = dict[str, tuple[Outcome, Message]]


# -- the rows -----------------------------------------------------------------------


def template(
    queue: str,
    *,
    kind: str,
    priority: int,
    due: datetime,
    max_attempts: int | None,
    now: datetime,
    group: str = "",
) -> Message:
    """What every message of one call shares: everything but its key and payload
    (and its group, when a call gives one per message).

    Built from a blank message made once: ``Model.__init__`` costs more than
    the rest of a single enqueue's Python work.
    """
    shared = row(_blank(), "", None)
    shared.queue = queue
    shared.kind = kind
    shared.priority = priority
    shared.next_attempt_time = shared.scheduled_time = due
    shared.max_attempts = max_attempts
    shared.created_at = shared.updated_at = now
    shared.group = group
    return shared


@cache
def _blank() -> Message:
    # The times are set by template(); the epoch only stands in.
    epoch = datetime.fromtimestamp(0, tz=UTC)
    return Message(
        queue="",
        key="",
        payload=None,
        status=Status.PENDING,
        scheduled_time=epoch,
        created_at=epoch,
        updated_at=epoch,
    )


def row(shared: Message, key: str, payload: Any, pk: int | None = None) -> Message:
    """A copy of ``shared`` for one message, without running ``Model.__init__``."""
    message = Message.__new__(Message)
    message.__dict__.update(shared.__dict__)
    message._state = state = ModelState()
    message.key = key
    message.payload = payload
    if pk is not None:
        message.id = pk
        state.adding = False
    return message


# -- the statement ---------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where an ``INSERT ... SELECT`` takes its per-row values from.

    ``sql`` is the FROM clause (its parameters come first); ``columns`` maps
    a field name to its expression over the source. Every other column is a
    parameter of the call, from the template. Without ``sql`` the statement
    is an ``INSERT ... VALUES`` of one row whose ``columns`` are parameters.
    """

    sql: str | None
    columns: Mapping[str, str]


def json_rows(can: Features, grouped: bool = False) -> Source:
    """The rows of one JSON document ``[[key, payload], ...]`` (enqueue_many), or
    ``[[key, payload, group], ...]`` when each message names its own group."""
    columns = {
        "key": statement("json_rows_key", can),
        "payload": statement("json_rows_payload", can),
    }
    if grouped:
        columns["group"] = statement("json_rows_group", can)
    return Source(
        statement("json_rows_grouped" if grouped else "json_rows", can).format(
            key_length=KEY_MAX_LENGTH, group_length=GROUP_MAX_LENGTH
        ),
        columns,
    )


def one_row(can: Features, grouped: bool = False) -> Source:
    """One message's key and payload (and group) as parameters of an ``INSERT ...
    VALUES``: what a single ``enqueue()`` writes. With Django's default (statements
    sent as text, planned on every call) the server plans it about a tenth faster
    than the rows of a one-row JSON document (docs: Performance, Enqueue)."""
    columns = {"key": "%s", "payload": statement("one_row_payload", can)}
    if grouped:
        columns["group"] = "%s"
    return Source(None, columns)


@dataclass(frozen=True)
class Insert:
    """An ``INSERT ... SELECT`` (or ``VALUES``) of new messages, built once per backend
    and shape.

    Building it (quoting, column types) costs more than sending it; only the
    parameters are computed per call: first ``per_call`` from the template,
    then ``constants`` (prepared once, or written into the text where the
    driver binds on the client); the source's own parameters follow.
    """

    sql: str
    per_call: tuple[Any, ...]
    constants: tuple[Any, ...]
    returns_rows: bool  # every column (and the inserted flag), else (id, key)
    # The source's fields in the order of their parameters (one_row's).
    source_fields: tuple[str, ...] = ()
    # The template's values go to the driver as they are (PostgreSQL: every
    # parameter is typed in the text, and psycopg adapts these types itself);
    # otherwise through each field's preparation.
    as_is: bool = False

    def params(self, shared: Message, connection: BaseDatabaseWrapper) -> list[Any]:
        if self.as_is:
            values = shared.__dict__
            params = [values[field.attname] for field in self.per_call]
        else:
            params = [
                field.get_db_prep_save(getattr(shared, field.attname), connection)
                for field in self.per_call
            ]
        params.extend(self.constants)
        return params


def insert(
    connection: BaseDatabaseWrapper,
    source: Source,
    *,
    on_conflict: str,
    returning: str | None,
    notify: bool = False,
) -> Insert:
    """The statement writing new messages from ``source``.

    ``on_conflict``: "ignore" (and "error") skip existing keys, "update"
    rewrites them (``update_conflicts``). ``returning``: "keys" (the id and
    key of each inserted row), "rows" (every column of each inserted or
    updated row, then whether it was inserted), or None. ``notify`` wraps it
    with the wake-up of idle workers (PostgreSQL).
    """
    can = features(connection)
    qn = connection.ops.quote_name
    per_call = [f for f in INSERT_FIELDS if f.name in PER_CALL_FIELDS - set(source.columns)]
    constant = [
        f for f in INSERT_FIELDS if f.name not in PER_CALL_FIELDS and f.name not in source.columns
    ]
    ordered = [*per_call, *constant, *(f for f in INSERT_FIELDS if f.name in source.columns)]
    blank = _blank()
    constants = {
        f.name: f.get_db_prep_save(getattr(blank, f.attname), connection) for f in constant
    }
    if can.inline_constants:
        connection.ensure_connection()
    values = []
    for field in ordered:
        if field.name in source.columns:
            values.append(source.columns[field.name])
        elif field.name in constants and can.inline_constants:
            # The same for every message: in the text, not adapted on every call.
            literal = cast(Any, connection.ops).compose_sql("%s", [constants[field.name]])
            values.append(f"{literal.replace('%', '%%')}::{field.db_type(connection)}")
        elif can.array_parameters:
            # Typed parameters: a prepared statement's types never depend on the values.
            values.append(f"%s::{field.db_type(connection)}")
        else:
            values.append("%s")
    table = qn(Message._meta.db_table)
    sql = statement("insert_rows" if source.sql else "insert_values", can).format(
        table=table,
        columns=", ".join(qn(str(f.column)) for f in ordered),
        values=", ".join(values),
        source=source.sql,
    )
    if can.returning:
        names = {"table": table, "queue": qn("queue"), "key": qn("key")}
        clash = "ignore_conflicts"
        if on_conflict == "update":
            # update_conflicts is shared; its comparisons are the database's own.
            clash = "update_conflicts"
            names["distinct"] = statement("distinct", can)
            names["payload_distinct"] = statement("payload_distinct", can).format(**names)
        sql += " " + statement(clash, can).format(**names)
        if returning == "keys":
            sql += f" RETURNING {qn('id')}, {qn('key')}"
        elif returning == "rows":
            sql += f" RETURNING {returned_columns(Message, qn)}"
            if can.inserted_flag:
                sql += ", " + statement("inserted", can)
    if notify and can.notify:
        sql = statement("with_notify", can).format(insert=sql)
    return Insert(
        sql,
        tuple(per_call),
        () if can.inline_constants else tuple(constants.values()),
        returns_rows=returning == "rows",
        source_fields=tuple(f.name for f in ordered if f.name in source.columns),
        as_is=can.array_parameters,
    )


_inserts: dict[tuple[type, str, bool, bool, bool], Insert] = {}


def _cached_insert(
    connection: BaseDatabaseWrapper,
    on_conflict: str,
    notify: bool,
    grouped: bool = False,
    single: bool = False,
) -> Insert:
    """The statement of ``enqueue_many`` (a JSON document's rows), or of one message
    (``single``: :func:`one_row`)."""
    on_conflict = "update" if on_conflict == "update" else "ignore"
    key = (type(connection), on_conflict, notify, grouped, single)
    found = _inserts.get(key)
    if found is None:
        can = features(connection)
        returning = None if not can.returning else "rows" if on_conflict == "update" else "keys"
        found = _inserts[key] = insert(
            connection,
            one_row(can, grouped) if single else json_rows(can, grouped),
            on_conflict=on_conflict,
            returning=returning,
            notify=notify,
        )
    return found


def rows_document(
    can: Features,
    keys: Sequence[str],
    encoded: Sequence[str],
    groups: Sequence[str] | None = None,
) -> str:
    """Keys and payloads (and groups) as one JSON document, joined from the payloads'
    checked text."""
    if groups is not None:
        dumps = json.dumps
        if can.typed_json_rows:
            rows: Iterator[str] = (
                f"[{dumps(k, ensure_ascii=False)},{e},{dumps(g, ensure_ascii=False)}]"
                for k, e, g in zip(keys, encoded, groups, strict=True)
            )
        else:
            rows = (
                dumps([k, e, g], ensure_ascii=False)
                for k, e, g in zip(keys, encoded, groups, strict=True)
            )
    elif can.typed_json_rows:
        rows = (
            f"[{json.dumps(k, ensure_ascii=False)},{e}]" for k, e in zip(keys, encoded, strict=True)
        )
    else:
        rows = (json.dumps([k, e], ensure_ascii=False) for k, e in zip(keys, encoded, strict=True))
    return "[" + ",".join(rows) + "]"


@dataclass(frozen=True)
class BulkLoad:
    """The Spark loader's statements: shipped to executors, which run them with plain drivers."""

    sql: str  # the insert (PostgreSQL: with its counts, see load_counts)
    params: tuple[Any, ...]
    existing_sql: str = ""  # SQLite: how many loaded keys existed before
    # MariaDB/MySQL: the temporary table to create, and with on_conflict="update"
    # the upsert of keys that exist, run after ``sql`` (an INSERT IGNORE that
    # writes the new keys only, so its row count is the created rows).
    table_sql: str = ""
    update_sql: str = ""
    # Grouped rows: what holds back the written messages that wait behind their
    # group (groups.hold_back_loaded), run after the insert in its transaction.
    hold_back_sql: str = ""
    hold_back_params: tuple[Any, ...] = ()


def bulk_load(
    connection: BaseDatabaseWrapper, shared: Message, on_conflict: str, *, grouped: bool = False
) -> BulkLoad:
    """Write the rows a Spark partition loaded into its temporary table ``delayq_load``.

    The same columns, template and conflict clause as ``enqueue_many``'s, so
    a pipeline ``--on-conflict update`` means exactly what ``enqueue(...,
    on_conflict="update")`` means; only the source differs (and each row
    brings its own due time). Parameters are plain values (a ``TextChoices``
    member would make executors import Django to unpickle it); SQLite's
    driver takes ``?`` placeholders. MariaDB/MySQL, without ``RETURNING`` or
    ``ON CONFLICT``: the insert is ``enqueue_many``'s ``INSERT IGNORE`` (its
    row count is what it created), and ``update`` runs the same insert again
    with ``ON DUPLICATE KEY UPDATE`` (``duplicate_key_update``, the twin of
    ``update_conflicts``), whose row count is twice what it updated.

    ``grouped``: each row brings its group too (``grp``; "" for none), and,
    as :func:`write` does for grouped messages, the rows are written in the
    order they were loaded (``ord``), not sorted by key, so that their ids
    are their order within their group; then the hold-back statement marks
    held those an earlier message of their group holds back.
    """
    can = features(connection)
    update = on_conflict == "update"
    qn = connection.ops.quote_name
    due = statement("loaded_due", can)
    columns = {
        "key": statement("loaded_key", can),
        "payload": statement("loaded_payload", can),
        "next_attempt_time": due,
        "scheduled_time": due,
    }
    if grouped:
        columns["group"] = statement("loaded_group", can)
    source = Source(
        statement("loaded_rows_grouped" if grouped else "loaded_rows", can).format(
            order="DESC" if update else "ASC", pick="max" if update else "min"
        ),
        columns,
    )
    built = insert(connection, source, on_conflict=on_conflict, returning=None)
    params = _plain(built.params(shared, connection))
    hold_back_sql, hold_back_params = "", ()
    if grouped:
        hold_back_sql, hold = hold_back_loaded(
            connection, shared.queue, statement("loaded_keys", can), shared.updated_at
        )
        hold_back_params = _plain(hold)
    table = qn(Message._meta.db_table)
    if can.inserted_flag:
        return BulkLoad(
            statement("load_counts", can).format(insert=built.sql),
            params,
            hold_back_sql=hold_back_sql,
            hold_back_params=hold_back_params,
        )
    if not can.returning:
        # MariaDB/MySQL: INSERT IGNORE writes the new keys; with update, the
        # same rows again with ON DUPLICATE KEY UPDATE rewrite the changed ones.
        update_sql = ""
        if update:
            changed = statement("loaded_changed", can).format(table=table)
            clause = statement("duplicate_key_update", can).format(table=table, changed=changed)
            update_sql = f"{built.sql} {clause}"
        return BulkLoad(
            built.sql,
            params,
            table_sql=statement("loaded_table", can).format(
                key_length=KEY_MAX_LENGTH,
                group_length=GROUP_MAX_LENGTH,
                collation=server.binary_collation(connection),
            ),
            update_sql=update_sql,
            hold_back_sql=hold_back_sql,
            hold_back_params=hold_back_params,
        )
    return BulkLoad(
        built.sql.replace("%s", "?"),
        params,
        existing_sql=statement("loaded_existing", can).format(table=table),
        hold_back_sql=hold_back_sql.replace("%s", "?"),
        hold_back_params=hold_back_params,
    )


def _plain(params: Sequence[Any]) -> tuple[Any, ...]:
    """Parameters as the builtin values they stand for (executors do not import Django)."""
    plain = []
    for p in params:
        if isinstance(p, enum.Enum):
            p = p.value
        elif isinstance(p, int) and not isinstance(p, bool) and type(p) is not int:
            p = int(p)  # a driver's typed integer (psycopg's Int4)
        plain.append(p)
    return tuple(plain)


# -- writing -----------------------------------------------------------------------------


# One write() call, what each chunk of its keys is written with: the connection,
# the template, the encoded payloads, the payloads, on_conflict and each key's
# group if the call gave one per message (a plain tuple: no dearer than
# passing them one by one).
_Groups = Mapping[str, str] | None
_Batch = tuple[BaseDatabaseWrapper, Message, Mapping[str, str], Mapping[str, Any], str, _Groups]


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
    batch: _Batch = (connection, shared, encoded, payloads, on_conflict, groups)
    if not can.returning:
        out = _write_without_returning(batch, ordered)
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


def _write_chunk(batch: _Batch, keys: list[str], wake: str | None) -> Written:
    connection, shared, encoded, payloads, on_conflict, groups = batch
    can = features(connection)
    single = len(keys) == 1
    statement_ = _cached_insert(
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
        existing = set(_existing(connection, shared.queue, keys).values_list("key", flat=True))
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
        for message in _existing(connection, shared.queue, missing):
            out[message.key] = (Outcome.IGNORED, message)
    return out


def _existing(connection: BaseDatabaseWrapper, queue: str, keys: Sequence[str]) -> Any:
    return Message.objects.using(connection.alias).filter(queue=queue, key__in=list(keys))


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


# -- MariaDB/MySQL: no RETURNING ------------------------------------------------------


class _Raced(DelayQError):
    """A concurrent producer committed one of our new keys: read again."""

    def __init__(self, existing: int) -> None:
        super().__init__(existing)
        self.existing = existing  # how many of the chunk's keys were found


def _write_without_returning(batch: _Batch, keys: list[str]) -> Written:
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
    for chunk in _chunks(keys, encoded, CHUNK_ROWS, CHUNK_BYTES):
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


def _write_chunk_without_returning(batch: _Batch, keys: list[str], lock: bool | str) -> Written:
    connection, shared, encoded, payloads, on_conflict, groups = batch
    existing = {m.key: m for m in _read(connection, shared.queue, keys, lock)}
    new = [k for k in keys if k not in existing]
    out: Written = {}
    if new:
        statement_ = _cached_insert(connection, "ignore", False, groups is not None)
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
        ids = dict(_existing(connection, shared.queue, new).values_list("key", "id"))
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
    rows = _existing(connection, queue, keys)
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
    current.next_attempt_time = new.next_attempt_time
    current.superseded_at = None
    current.lock_token = None
    current.status = Status.PENDING


# -- wake-up -----------------------------------------------------------------------------


def notify_body(connection: BaseDatabaseWrapper, queue: str, due: datetime) -> str | None:
    """The NOTIFY payload for a wake-up, or None where there is no NOTIFY.

    It carries the due time so that a worker sleeping until a later message
    shortens its sleep for a sooner one. A message due after the next poll
    needs none: an idle worker sleeps at most ``POLL_INTERVAL`` and then
    looks up the next due time, so it learns of the message before it is
    due (and the NOTIFY would cost every commit a global lock for nothing).
    """
    config = get_config()
    can = features(connection)
    if not (can.notify or can.local_wake) or not config["NOTIFY"]:
        return None
    if due - clock.now() > to_timedelta(config["POLL_INTERVAL"]):
        return None
    return json.dumps({"queue": queue, "due": due.timestamp()})


def notify(connection: BaseDatabaseWrapper, queue: str, due: datetime) -> None:
    """Wake idle workers of ``queue``; sent on commit, dropped on rollback (a NOTIFY on
    PostgreSQL, datagrams to the local workers on SQLite)."""
    body = notify_body(connection, queue, due)
    if body is None:
        return
    if features(connection).local_wake:
        localwake.on_commit(connection, body)
        return
    with connection.cursor() as cursor:
        cursor.execute(statement("notify", features(connection)), [NOTIFY_CHANNEL, body])


__all__ = [
    "CHUNK_ROWS",
    "NOTIFY_CHANNEL",
    "BulkLoad",
    "bulk_load",
    "Outcome",
    "Source",
    "apply_update",
    "insert",
    "notify",
    "notify_body",
    "row",
    "same_content",
    "template",
    "write",
]
