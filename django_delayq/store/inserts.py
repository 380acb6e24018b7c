"""The statement that writes new messages, built once per backend and shape.

Whatever produces them, new messages are written by one statement per chunk,
``INSERT ... SELECT`` from a source of rows (a single message: ``INSERT ...
VALUES`` of its own parameters, :func:`one_row`): one JSON document ``[[key,
payload], ...]`` for ``enqueue_many`` (one parameter however many messages:
the statement stays small, its text never changes, psycopg can prepare it),
or the Spark loader's temporary table (``store/loader.py``). Every other
column is one parameter, the same for the whole call (``new_rows.template``).
What an existing ``(queue, key)`` gets is the conflict clause: skipped
(``ignore``/``error``), or updated (``update``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.flow import GROUP_MAX_LENGTH
from django_delayq.models import KEY_MAX_LENGTH, Message
from django_delayq.store import new_rows
from django_delayq.store.features import Features, features
from django_delayq.store.rows import returned_columns
from django_delayq.store.sql import statement

INSERT_FIELDS = [f for f in Message._meta.concrete_fields if not f.primary_key]
# The template's columns that differ between calls (template()'s arguments);
# every other column of a new message is the same for all.
PER_CALL_FIELDS = frozenset(
    {"queue", "kind", "priority", "next_attempt_time", "scheduled_time", "max_attempts"}
    | {"created_at", "updated_at", "group"}
)


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
    blank = new_rows.blank()
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


def cached_insert(
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


__all__ = [
    "Insert",
    "Source",
    "cached_insert",
    "insert",
    "json_rows",
    "one_row",
    "rows_document",
]
