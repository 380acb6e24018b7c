"""Rows read back from the statements that write and return in one round trip.

The claim (``UPDATE ... RETURNING``) and the upsert of new messages
(``INSERT ... RETURNING``) bypass the ORM's SELECT, so the columns are
listed here in the model's order and the backend's and the fields'
converters (JSON, time zones) run here, as a query's would.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import models

_Row = TypeVar("_Row", bound=models.Model)


def returned_columns(model: type[models.Model], quote_name: Any) -> str:
    """Every column of ``model``, for ``RETURNING``, in :func:`rows_from` order."""
    table = quote_name(model._meta.db_table)
    return ", ".join(f"{table}.{quote_name(f.column)}" for f in model._meta.concrete_fields)


_Converters = tuple[list[str], list[tuple[int, Any, list[Any]]]]


def _lookup(model: type[models.Model], connection: Any) -> _Converters:
    """The field names and converters of ``model``, kept on the connection (one per
    thread): looking them up again took a third of a one-message claim's CPU."""
    kept: dict[type[models.Model], _Converters] = connection.__dict__.setdefault(
        "_delayq_converters", {}
    )
    found = kept.get(model)
    if found is None:
        fields = model._meta.concrete_fields
        converters = []
        for i, field in enumerate(fields):
            col = field.get_col(model._meta.db_table)
            found_ = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
            if found_:
                converters.append((i, col, found_))
        found = kept[model] = ([f.attname for f in fields], converters)
    return found


def rows_from(model: type[_Row], connection: Any, rows: Any) -> list[_Row]:
    """Instances from raw rows of :func:`returned_columns` (extra trailing values ignored).

    The converters are looked up once per model and connection, as the ORM's
    compiler does once per query.
    """
    names, converters = _lookup(model, connection)
    out = []
    for row in rows:
        values = list(row[: len(names)])
        for i, col, found in converters:
            value = values[i]
            for converter in found:
                value = converter(value, col, connection)
            values[i] = value
        out.append(model.from_db(connection.alias, names, values))
    return out
