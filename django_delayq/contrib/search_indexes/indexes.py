"""The search indexes' definitions, and building or dropping them on PostgreSQL.

The statements follow the conditions ``django_delayq.search`` writes, so the
planner can match them: a pattern operator class for ``LIKE 'word%'`` whatever
the database's collation, ``group <> ''`` and ``last_error <> ''`` as both the
index's and the search's condition (rows without one cost nothing), and
``upper(last_error)`` as Django's ``icontains`` compares it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model


@dataclass(frozen=True)
class SearchIndex:
    name: str
    #: ``CREATE INDEX`` after the table's name: ``{col}`` style names are filled in.
    definition: str
    extension: str | None = None


INDEXES = (
    SearchIndex("delayq_search_key_idx", "({key} varchar_pattern_ops)"),
    SearchIndex("delayq_search_group_idx", "({group} varchar_pattern_ops) WHERE {group} <> ''"),
    SearchIndex("delayq_search_payload_idx", "USING gin ({payload} jsonb_path_ops)"),
    SearchIndex(
        "delayq_search_error_idx",
        "USING gin (upper({last_error}) gin_trgm_ops) WHERE {last_error} <> ''",
        extension="pg_trgm",
    ),
)


def _columns(connection: BaseDatabaseWrapper, model: type[Model]) -> dict[str, str]:
    columns = {}
    for name in ("key", "group", "payload", "last_error"):
        column = cast("Field[Any, Any]", model._meta.get_field(name)).column
        columns[name] = connection.ops.quote_name(column or name)
    return columns


def create_sql(
    connection: BaseDatabaseWrapper, model: type[Model], index: SearchIndex, *, concurrently: bool
) -> str:
    how = "CONCURRENTLY " if concurrently else ""
    table = connection.ops.quote_name(model._meta.db_table)
    definition = index.definition.format(**_columns(connection, model))
    return f"CREATE INDEX {how}IF NOT EXISTS {index.name} ON {table} {definition}"


def create(
    connection: BaseDatabaseWrapper,
    model: type[Model],
    indexes: tuple[SearchIndex, ...] = INDEXES,
    *,
    concurrently: bool = True,
) -> None:
    """Build ``indexes`` (PostgreSQL only), skipping those already valid.

    ``CREATE INDEX CONCURRENTLY`` that fails (a deadlock, a cancelled
    ``migrate``) leaves an invalid index behind, which ``IF NOT EXISTS``
    would keep: such a leftover is dropped and built again.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for index in indexes:
            if index.extension:
                cursor.execute(f"CREATE EXTENSION IF NOT EXISTS {index.extension}")
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = %s AND c.relnamespace = to_regnamespace(current_schema())",
                [index.name],
            )
            row = cursor.fetchone()
            if row is not None and not row[0]:
                cursor.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}{index.name}")
            cursor.execute(create_sql(connection, model, index, concurrently=concurrently))


def drop(
    connection: BaseDatabaseWrapper,
    indexes: tuple[SearchIndex, ...] = INDEXES,
    *,
    concurrently: bool = True,
) -> None:
    """Drop ``indexes`` (PostgreSQL only); the extension stays, others may use it."""
    if connection.vendor != "postgresql":
        return
    how = "CONCURRENTLY " if concurrently else ""
    with connection.cursor() as cursor:
        for index in indexes:
            cursor.execute(f"DROP INDEX {how}IF EXISTS {index.name}")
