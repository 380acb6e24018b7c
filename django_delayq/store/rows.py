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


def rows_from(model: type[_Row], connection: Any, rows: Any) -> list[_Row]:
    """Instances from raw rows of :func:`returned_columns` (extra trailing values ignored).

    The converters are looked up once per call, as the ORM's compiler does.
    """
    fields = model._meta.concrete_fields
    names = [f.attname for f in fields]
    converters = []
    for i, field in enumerate(fields):
        col = field.get_col(model._meta.db_table)
        found = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if found:
            converters.append((i, col, found))
    out = []
    for row in rows:
        values = list(row[: len(fields)])
        for i, col, found in converters:
            value = values[i]
            for converter in found:
                value = converter(value, col, connection)
            values[i] = value
        out.append(model.from_db(connection.alias, names, values))
    return out
