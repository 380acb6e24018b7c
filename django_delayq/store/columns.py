"""What every change of a queued row shares: the table's columns, its alias, batches.

Every state change of a queued row is a named function of the store, one
module per concern beside this one: the claim (``claim``), the outcomes of
held rows (``settle``), their leases (``leases``), ordered groups
(``groups``), operators' changes (``operators``), rows that the application
queues itself (``queue_fields``), pruning (``retention``) and cron ticks
(``ticks``). No module outside ``store/`` writes the queue columns.

Every function takes the table as ``model`` (or a queryset of it):
``Message``, or a model with ``entity.QueueFields``, whose rows are the
messages. Such a model has the columns of ``models.QueueColumns`` but none
of the message's bookkeeping (``updated_at``, ``finished_at``,
``error_fingerprint``, ``queue``, ``priority``) unless it declares them:
each change names every column a message gets, and :func:`fit` keeps
those the table has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from django.db import connections
from django.db.models import Field, Model, QuerySet

from django_delayq.models import Message
from django_delayq.routers import model_alias
from django_delayq.store.features import features

# The most values of a list that can grow without bound (ids, groups) one
# statement binds: every database limits a statement's parameters (65,535 on
# PostgreSQL with server-side binding, 32,766 on SQLite since 3.32 and 999
# before, MariaDB's packet size), so longer lists go in batches of this many.
IN_BATCH = 500


def db_alias(using: str | None, model: type[Model] = Message) -> str:
    return model_alias(model, using)


@cache
def _columns(model: type[Model]) -> frozenset[str]:
    return frozenset(f.name for f in model._meta.concrete_fields)


def fit(model: type[Model], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` without the columns ``model`` does not have."""
    columns = _columns(model)
    return {name: value for name, value in changes.items() if name in columns}


def has_column(model: type[Model], name: str) -> bool:
    return name in _columns(model)


def model_field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def quote_names(model: type[Model], connection: Any, *names: str) -> dict[str, str]:
    """The quoted table and column names of ``model`` for this backend (kept)."""
    key = (model, type(connection), names)
    found = _quoted_names.get(key)
    if found is None:
        qn = connection.ops.quote_name
        found = {name: qn(str(model_field(model, name).column)) for name in names}
        found["table"] = qn(model._meta.db_table)
        _quoted_names[key] = found
    return found


_quoted_names: dict[tuple[Any, ...], dict[str, str]] = {}


def batches(values: Sequence[Any], size: int = IN_BATCH) -> Iterable[list[Any]]:
    """``values`` in consecutive lists of at most ``size`` (see ``IN_BATCH``)."""
    for start in range(0, len(values), size):
        yield list(values[start : start + size])


def inlined(connection: Any, sql: str, params: Any) -> tuple[str, tuple[Any, ...]]:
    """A statement kept for reuse, with its constant parameters written into its text.

    Where the driver binds on the client (psycopg's default), every
    parameter is adapted on every call: a cached statement's constants
    (statuses, the worker's name, the lease) are adapted once instead, and
    only what changes (the lock token, the ids) is sent as a parameter.

    On SQLite it is what lets the claim use its partial indexes at all: the
    planner uses a partial index only for a condition whose values are
    written in the statement (``status IN ('pending', 'running')``), never for
    bound ones. With the statuses bound, each probe of a message's ordered
    group read every row of its queue: a claim among 11,000 due grouped
    messages took 108 s, holding the database's write lock throughout.
    """
    if not params:
        return sql, ()
    if connection.vendor == "sqlite":
        literals = [_sqlite_literal(value) for value in params]
        if any(literal is None for literal in literals):
            return sql, tuple(params)
        return (sql % tuple(literals)).replace("%", "%%"), ()
    if not features(connection).inline_constants:
        return sql, tuple(params)
    text = connection.ops.compose_sql(sql, tuple(params))
    return text.replace("%", "%%"), ()


def rows_with_literals(queryset: QuerySet[Any], alias: str) -> list[tuple[Any, ...]]:
    """``queryset``'s rows (a ``values_list``), its parameters written into the statement
    on SQLite, so that its partial indexes apply (see :func:`inlined`)."""
    if connections[alias].vendor != "sqlite":
        return list(queryset)
    sql, params = queryset.query.get_compiler(alias).as_sql()
    return _fetch_inlined(alias, sql, params)


def count_with_literals(queryset: QuerySet[Any], alias: str) -> int:
    """``queryset.count()``, its parameters written into the statement on SQLite
    (see :func:`rows_with_literals`)."""
    if connections[alias].vendor != "sqlite":
        return queryset.count()
    sql, params = queryset.order_by().values("pk").query.get_compiler(alias).as_sql()
    [(count,)] = _fetch_inlined(alias, f"SELECT COUNT(*) FROM ({sql}) delayq_counted", params)
    return int(count)


def _fetch_inlined(alias: str, sql: str, params: Any) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` run with its parameters written in (:func:`inlined`)."""
    connection = connections[alias]
    sql, params = inlined(connection, sql, params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()]


def _sqlite_literal(value: Any) -> str | None:
    """``value`` as an SQLite literal, for the types a claim's constants have (None:
    not one of them, keep it bound)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        text = str(value)
        if "\x00" in text:
            return None
        return "'" + text.replace("'", "''") + "'"
    return None
