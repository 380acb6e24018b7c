"""What a database can do for the queue, decided once per backend.

The data-access layer asks these flags, never the vendor's name: a statement
that differs between databases is chosen by what it needs (``RETURNING``,
``NOTIFY``, an array parameter), so adding a backend means filling in one
:class:`Features`, and the flags say why each variant exists.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import cache

from django.db.backends.base.base import BaseDatabaseWrapper

# UPDATE/INSERT ... RETURNING arrived in SQLite 3.35 (Django 5.2 needs 3.31).
SQLITE_RETURNING = (3, 35)


@dataclass(frozen=True)
class Features:
    vendor: str
    #: ``UPDATE``/``INSERT ... RETURNING``: a write and its read in one round trip
    #: (the one-statement claim, the upsert that reports each outcome).
    returning: bool
    #: ``LIMIT`` inside an ``IN (subquery)``: the claim's pick and its update in one
    #: statement (MySQL refuses it).
    limit_in_subquery: bool
    #: ``id = ANY(%s)`` with one array parameter, whatever the number of ids.
    array_parameters: bool
    #: ``FOR UPDATE SKIP LOCKED`` inside an ``UPDATE``'s own subquery on the same
    #: table, so housekeeping skips rows another transaction holds.
    skip_locked_subquery: bool
    #: ``LISTEN``/``NOTIFY``: producers wake idle workers on commit.
    notify: bool
    #: No ``NOTIFY``, but producers and workers share the machine that holds the
    #: database file: they wake them through local sockets (``localwake.py``).
    local_wake: bool
    #: How one JSON document of new rows is expanded into rows.
    json_rows: str  # "jsonb_array_elements", "json_each" or "json_table"
    #: The document holds each payload as a JSON value (else as a JSON string of
    #: its text: SQLite's json_extract and MySQL's JSON_TABLE would turn a
    #: scalar into an SQL value).
    typed_json_rows: bool
    #: ``xmax = 0`` tells an upsert's inserted rows from its updated ones.
    inserted_flag: bool
    #: ``payload @> {...}``: containment a GIN index can answer.
    json_containment: bool
    #: ``WITH RECURSIVE`` loose index scan for the distinct values of an indexed
    #: column (MySQL plans its own).
    loose_index_scan: bool
    #: Where the planner keeps its row estimate (None: nowhere cheap).
    row_estimate: str | None  # "pg_class", "information_schema" or None
    #: Queue and key columns compare byte-wise (MariaDB/MySQL, by the README's
    #: collation), so case-insensitive search needs an explicit collation.
    binary_text: bool
    #: The Spark pipeline can write and read this database.
    pipeline: bool
    #: The constants of a statement kept for reuse can be written into its text
    #: (``ops.compose_sql``), so only what changes is bound on each call.
    inline_constants: bool
    #: Successes committed in batches and atomic handlers in group transactions
    #: (``ACK_DELAY``): worth it where a commit waits for the write-ahead log,
    #: and safe where the lease keeper can skip the rows an open group locks.
    group_commits: bool
    #: The claim's ordered-group condition is a server-side function whose
    #: plan the server keeps per connection (``delayq_group_clear``), rather
    #: than two subqueries planned again with every claim sent as text.
    group_function: bool
    #: One statement is kept from waiting for a row lock (where there is no
    #: ``SKIP LOCKED`` subquery in an ``UPDATE``) by a lock wait timeout of its
    #: own: MariaDB's ``SET STATEMENT ... FOR``, MySQL's ``SET_VAR`` hint. SQLite
    #: has no row locks; PostgreSQL skips them.
    no_wait: bool = False


@cache
def _features(vendor: str, sqlite_version: tuple[int, ...]) -> Features:
    postgres = vendor == "postgresql"
    sqlite = vendor == "sqlite"
    mysql = vendor == "mysql"
    return Features(
        vendor=vendor,
        returning=postgres or (sqlite and sqlite_version >= SQLITE_RETURNING),
        limit_in_subquery=not mysql,
        array_parameters=postgres,
        skip_locked_subquery=postgres,
        notify=postgres,
        local_wake=sqlite,
        json_rows="jsonb_array_elements" if postgres else "json_table" if mysql else "json_each",
        typed_json_rows=postgres,
        inserted_flag=postgres,
        json_containment=postgres,
        loose_index_scan=postgres or sqlite,
        row_estimate="pg_class" if postgres else "information_schema" if mysql else None,
        binary_text=mysql,
        pipeline=postgres or sqlite or mysql,
        inline_constants=postgres,
        group_commits=postgres,
        group_function=postgres,
        no_wait=mysql,
    )


def features(connection: BaseDatabaseWrapper) -> Features:
    """The features of ``connection``'s database."""
    return _features(connection.vendor, sqlite3.sqlite_version_info)
