"""What a database can do for the queue, decided once per backend.

The data-access layer asks these flags, never the vendor's name: a statement
that differs between databases is chosen by what it needs (``RETURNING``,
``NOTIFY``, an array parameter), so adding a backend means filling in one
:class:`Features`, and the flags say why each variant exists. The Spark
pipeline (``contrib/spark``) asks them too: how its executors connect, write
and delete, how it locks an archive run, reads datetimes and reaches the
database through JDBC (a :class:`JdbcDriver`).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import cache

from django.db.backends.base.base import BaseDatabaseWrapper

# UPDATE/INSERT ... RETURNING arrived in SQLite 3.35 (Django 5.2 needs 3.31).
SQLITE_RETURNING = (3, 35)


@dataclass(frozen=True)
class JdbcDriver:
    """The JDBC driver the Spark pipeline reads a database with, as Debian packages it."""

    #: The driver's class (the ``driver`` option of Spark's JDBC source).
    driver_class: str
    #: Where the Debian package puts the jar: the Spark session loads every one
    #: there is, and a job that reads through JDBC stops first without its own.
    jar: str
    #: The Debian package of the jar, named when the jar is missing.
    package: str
    #: Appended to the JDBC URL (after the database's name).
    url_query: str = ""
    #: The database's ``OPTIONS`` the driver takes as properties of the same name.
    options: tuple[str, ...] = ()


POSTGRESQL_JDBC = JdbcDriver(
    driver_class="org.postgresql.Driver",
    jar="/usr/share/java/postgresql.jar",
    package="libpostgresql-jdbc-java",
    # The TLS settings are libpq's names, which the driver takes too.
    options=("sslmode", "sslrootcert", "sslcert", "sslkey"),
)
# MariaDB's driver serves MySQL servers too, under the jdbc:mysql scheme (see
# Features.url_scheme); Connector/J 3 takes such a URL only with
# permitMysqlScheme (2.x does anyway).
MARIADB_JDBC = JdbcDriver(
    driver_class="org.mariadb.jdbc.Driver",
    jar="/usr/share/java/mariadb-java-client.jar",
    package="libmariadb-java",
    url_query="?permitMysqlScheme",
)
SQLITE_JDBC = JdbcDriver(
    driver_class="org.sqlite.JDBC",
    jar="/usr/share/java/sqlite-jdbc.jar",
    package="libxerial-sqlite-jdbc-java",
)
#: Every driver the Spark session loads (those whose jar is there), whichever
#: database a job reads.
JDBC_DRIVERS = (POSTGRESQL_JDBC, MARIADB_JDBC, SQLITE_JDBC)


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
    #: The Spark pipeline (``contrib/spark``) can write and read this database;
    #: the fields below, to ``jdbc``, say how (where it can).
    pipeline: bool
    #: The DB-API module Spark's executors write with: they run without Django,
    #: so they connect with its backend's driver directly, given the backend's
    #: own ``get_connection_params()``.
    client: str  # "psycopg", "MySQLdb" or "sqlite3"
    #: How an executor writes its partition's rows (``store.loader.bulk_load``'s
    #: statements) and counts what was created and updated: ``COPY`` into the
    #: temporary table and one upsert that counts (``inserted_flag``); or rows
    #: inserted in a ``BEGIN IMMEDIATE`` transaction, the created ones being the
    #: loaded keys that were not there before (one writer at a time: nothing
    #: changes between the count and the upsert); or ``INSERT IGNORE``, then
    #: ``ON DUPLICATE KEY UPDATE``, counted by their row counts (no
    #: ``RETURNING``).
    bulk_writer: str  # "copy", "existing_keys" or "insert_ignore"
    #: How an executor deletes archived rows still at their archived version
    #: (``store.retention.archived_delete``'s statements): one ``DELETE`` on id
    #: arrays that re-checks each row's version itself (``array_parameters``);
    #: else read the current versions, compare them and delete by id, in a
    #: transaction that locks the rows it reads (``FOR UPDATE``) or, where there
    #: is one writer at a time, takes the write lock first (``BEGIN IMMEDIATE``).
    archive_delete: str  # "one_statement", "lock_rows" or "lock_database"
    #: One archive run per database at a time, by a lock that ends with its
    #: holder: a transaction advisory lock, a named lock (``GET_LOCK``), or an
    #: ``flock`` on a file beside the database (where there is no server).
    archive_lock: str  # "advisory", "named" or "file"
    #: Datetimes are stored without a zone, in UTC (Django's way where the
    #: column has no zone: SQLite's text, MariaDB/MySQL's ``DATETIME(6)``), so
    #: Spark reads them as text (a JDBC driver would read them in the JVM's
    #: zone) and writes and compares them as the text Django stores, not as
    #: instants with an offset.
    naive_datetimes: bool
    #: The database is a file that ``NAME`` names, not a server: the executors
    #: and the JDBC driver open it by its path (so it cannot be in memory), and
    #: it has no host, port or user.
    file_database: bool
    #: The server's port when ``PORT`` is empty (None: no server).
    default_port: int | None
    #: The scheme of the database's URLs: the JDBC URL's (``jdbc:SCHEME:``, by
    #: which Spark picks its SQL dialect: ``mysql`` for MariaDB's driver too,
    #: as only Spark's MySQL dialect quotes names with backticks, where another
    #: would send "id", a string, to the server) and the one naming the
    #: database in the archive's run journal.
    url_scheme: str
    #: The JDBC driver Spark reads the message table with (``jdbc.py``).
    jdbc: JdbcDriver
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
        client="psycopg" if postgres else "MySQLdb" if mysql else "sqlite3",
        bulk_writer="copy" if postgres else "insert_ignore" if mysql else "existing_keys",
        archive_delete="one_statement" if postgres else "lock_rows" if mysql else "lock_database",
        archive_lock="advisory" if postgres else "named" if mysql else "file",
        naive_datetimes=sqlite or mysql,
        file_database=sqlite,
        default_port=5432 if postgres else 3306 if mysql else None,
        url_scheme="postgresql" if postgres else "mysql" if mysql else "sqlite",
        jdbc=POSTGRESQL_JDBC if postgres else MARIADB_JDBC if mysql else SQLITE_JDBC,
        inline_constants=postgres,
        group_commits=postgres,
        group_function=postgres,
        no_wait=mysql,
    )


def features(connection: BaseDatabaseWrapper) -> Features:
    """The features of ``connection``'s database."""
    return _features(connection.vendor, sqlite3.sqlite_version_info)
