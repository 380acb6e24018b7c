"""The Spark loader's statements: the rows a partition loaded, written as ``enqueue_many``
writes them.

The pipeline's executors run these with plain drivers, without Django; the
statement is ``store/inserts.py``'s, from the temporary table ``delayq_load``
instead of a JSON document, so a pipeline ``--on-conflict update`` means
exactly what ``enqueue(..., on_conflict="update")`` means.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_delayq.flow import GROUP_MAX_LENGTH
from django_delayq.models import KEY_MAX_LENGTH, Message
from django_delayq.store import server
from django_delayq.store.columns import inlined
from django_delayq.store.features import features
from django_delayq.store.groups import hold_back_loaded
from django_delayq.store.inserts import Source, insert
from django_delayq.store.sql import statement


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
    as ``write.write`` does for grouped messages, the rows are written in the
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
    if grouped:
        # SQLite uses delayq_group_idx, a partial index, only for a condition
        # whose statuses are written into the statement: bound, each loaded
        # row's probe of its group read the whole queue.
        written, still_bound = inlined(connection, hold_back_sql, hold_back_params)
        if still_bound:
            hold_back_sql = hold_back_sql.replace("%s", "?")
        else:  # the executor's driver takes the text as it is
            hold_back_sql, hold_back_params = written.replace("%%", "%"), ()
    return BulkLoad(
        built.sql.replace("%s", "?"),
        params,
        existing_sql=statement("loaded_existing", can).format(table=table),
        hold_back_sql=hold_back_sql,
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


__all__ = ["BulkLoad", "bulk_load"]
