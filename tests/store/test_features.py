"""What each database can do (``store/features.py``) and what the server must be
(``store/server.py``), checked against the database the suite runs on.

The flags are stated per vendor; where a flag says the database can or
cannot do something, a probe asks the database itself.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from django_delayq import enqueue_many
from django_delayq.models import Message
from django_delayq.store import server
from django_delayq.store.features import (
    JDBC_DRIVERS,
    SQLITE_RETURNING,
    Features,
    JdbcDriver,
    features,
)
from django_delayq.store.sql import statement

pytestmark = pytest.mark.django_db

SQLITE_HAS_RETURNING = sqlite3.sqlite_version_info >= SQLITE_RETURNING

# Debian's packages of the JDBC drivers (MariaDB's serves MySQL servers too).
JDBC = {
    "postgresql": JdbcDriver(
        driver_class="org.postgresql.Driver",
        jar="/usr/share/java/postgresql.jar",
        package="libpostgresql-jdbc-java",
        options=("sslmode", "sslrootcert", "sslcert", "sslkey"),
    ),
    "mysql": JdbcDriver(
        driver_class="org.mariadb.jdbc.Driver",
        jar="/usr/share/java/mariadb-java-client.jar",
        package="libmariadb-java",
        url_query="?permitMysqlScheme",
    ),
    "sqlite": JdbcDriver(
        driver_class="org.sqlite.JDBC",
        jar="/usr/share/java/sqlite-jdbc.jar",
        package="libxerial-sqlite-jdbc-java",
    ),
}

EXPECTED = {
    "postgresql": Features(
        vendor="postgresql",
        returning=True,
        limit_in_subquery=True,
        array_parameters=True,
        skip_locked_subquery=True,
        notify=True,
        local_wake=False,
        json_rows="jsonb_array_elements",
        typed_json_rows=True,
        inserted_flag=True,
        json_containment=True,
        loose_index_scan=True,
        row_estimate="pg_class",
        binary_text=False,
        pipeline=True,
        client="psycopg",
        bulk_writer="copy",
        archive_delete="one_statement",
        archive_lock="advisory",
        naive_datetimes=False,
        file_database=False,
        default_port=5432,
        url_scheme="postgresql",
        jdbc=JDBC["postgresql"],
        group_commits=True,
        group_function=True,
        inline_constants=True,
    ),
    "sqlite": Features(
        vendor="sqlite",
        returning=SQLITE_HAS_RETURNING,
        limit_in_subquery=True,
        array_parameters=False,
        skip_locked_subquery=False,
        notify=False,
        local_wake=True,
        json_rows="json_each",
        typed_json_rows=False,
        inserted_flag=False,
        json_containment=False,
        loose_index_scan=True,
        row_estimate=None,
        binary_text=False,
        pipeline=True,
        client="sqlite3",
        bulk_writer="existing_keys",
        archive_delete="lock_database",
        archive_lock="file",
        naive_datetimes=True,
        file_database=True,
        default_port=None,
        url_scheme="sqlite",
        jdbc=JDBC["sqlite"],
        group_commits=False,
        group_function=False,
        inline_constants=False,
    ),
    "mysql": Features(
        vendor="mysql",
        returning=False,
        limit_in_subquery=False,
        array_parameters=False,
        skip_locked_subquery=False,
        notify=False,
        local_wake=False,
        json_rows="json_table",
        typed_json_rows=False,
        inserted_flag=False,
        json_containment=False,
        loose_index_scan=False,
        row_estimate="information_schema",
        binary_text=True,
        pipeline=True,
        client="MySQLdb",
        bulk_writer="insert_ignore",
        archive_delete="lock_rows",
        archive_lock="named",
        naive_datetimes=True,
        file_database=False,
        default_port=3306,
        url_scheme="mysql",
        jdbc=JDBC["mysql"],
        group_commits=False,
        group_function=False,
        no_wait=True,
        inline_constants=False,
    ),
}


def test_the_features_of_the_connection_are_its_vendors() -> None:
    assert features(connection) == EXPECTED[connection.vendor]
    assert features(connection) is features(connection)  # decided once per backend


def test_the_spark_session_loads_every_jdbc_driver() -> None:
    assert JDBC_DRIVERS == (JDBC["postgresql"], JDBC["mysql"], JDBC["sqlite"])


def test_the_pipeline_connects_with_the_backends_own_driver_module() -> None:
    """Spark's executors run without Django: they import the module it connects with."""
    module = connection.Database.__name__  # SQLite's backend uses sqlite3.dbapi2
    assert features(connection).client == module.partition(".")[0]


def test_naive_datetimes_where_django_stores_datetimes_without_a_zone() -> None:
    assert features(connection).naive_datetimes is not connection.features.supports_timezones


# -- probes: the database does what a flag says it does (or cannot) ---------------------


def table() -> str:
    return connection.ops.quote_name(Message._meta.db_table)


def runs(sql: str, params: list[Any] | None = None) -> bool:
    """Whether the database accepts ``sql`` (in a savepoint: a refusal leaves no trace)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            if cursor.description is not None:
                cursor.fetchall()
    except DatabaseError:
        return False
    return True


PROBES: dict[str, Callable[[], bool]] = {
    "returning": lambda: runs(f"UPDATE {table()} SET priority = priority WHERE 1 = 0 RETURNING id"),
    "limit_in_subquery": lambda: runs(
        f"UPDATE {table()} SET priority = priority "
        f"WHERE id IN (SELECT id FROM {table()} ORDER BY id LIMIT 1)"
    ),
    "array_parameters": lambda: runs("SELECT 1 WHERE 1 = ANY(%s)", [[1, 2]]),
    "notify": lambda: runs("SELECT pg_notify('delayq_probe', '')"),
    "json_containment": lambda: runs(f"SELECT 1 FROM {table()} WHERE payload @> %s", ["{}"]),
    "inserted_flag": lambda: runs(f"SELECT xmax FROM {table()} WHERE 1 = 0"),
}


@pytest.mark.parametrize("flag", PROBES)
def test_a_flag_is_true_exactly_where_the_database_does_it(flag: str) -> None:
    assert PROBES[flag]() is getattr(features(connection), flag)


def test_skip_locked_subquery_runs_where_it_is_said_to() -> None:
    if not features(connection).skip_locked_subquery:
        pytest.skip("asked only where the flag is set")
    assert runs(
        f"UPDATE {table()} SET priority = priority "
        f"WHERE id IN (SELECT id FROM {table()} WHERE 1 = 0 FOR UPDATE SKIP LOCKED)"
    )


def test_the_json_rows_source_expands_one_document_into_rows() -> None:
    can = features(connection)
    source = statement("json_rows", can).format(key_length=255)
    key, payload = statement("json_rows_key", can), statement("json_rows_payload", can)
    if can.typed_json_rows:
        document = '[["a", {"x": [1, "é"]}], ["b", null]]'
        expected = [("a", {"x": [1, "é"]}), ("b", None)]
    else:
        # The payload travels as its JSON text, returned as is.
        document = '[["a", "{\\"x\\":[1,\\"é\\"]}"], ["b", "null"]]'
        expected = [("a", '{"x":[1,"é"]}'), ("b", "null")]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {key}, {payload} FROM {source}", [document])
        rows = [tuple(row) for row in cursor.fetchall()]
    if can.typed_json_rows:
        rows = [(k, json.loads(p) if isinstance(p, str) else p) for k, p in rows]
    assert sorted(rows, key=lambda r: r[0]) == expected


def test_keys_that_differ_in_case_or_trailing_space_are_different_messages() -> None:
    """The byte-wise queue and key columns (``binary_text``: by collation on MariaDB)."""
    results = enqueue_many("q", [1, 2, 3], keys=["k", "K", "k "])
    assert [r.outcome for r in results] == ["created"] * 3
    assert Message.objects.filter(queue="q", key="k").count() == 1
    enqueue_many("Q", [1], keys=["k"])
    assert sorted(Message.objects.values_list("queue", flat=True)) == ["Q", "q", "q", "q"]


# -- server checks ---------------------------------------------------------------------------


def test_this_server_can_run_the_queue() -> None:
    assert server.version_problem(connection) is None


def test_the_queue_key_and_group_columns_compare_exactly() -> None:
    assert server.collation_problems(connection) == []
    if features(connection).binary_text:
        collations = server.column_collations(connection)
        assert set(collations) == {"queue", "key", "message_group"}
        assert all(server.exact_collation(c) for c in collations.values()), collations
        assert server.binary_collation(connection) in server.binary_columns_sql(connection)


def test_an_old_sqlite_is_refused_with_its_check_id(monkeypatch: pytest.MonkeyPatch) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's own version check")
    monkeypatch.setattr(server.sqlite3, "sqlite_version_info", (3, 34, 1))
    problem = server.version_problem(connection)
    assert problem is not None and problem.check_id == "django_delayq.E051"
    assert "3.35" in str(problem)


@pytest.mark.parametrize(
    ("collation", "exact"),
    [
        ("utf8mb4_nopad_bin", True),
        ("utf8mb4_0900_bin", True),
        ("utf8mb4_0900_as_cs", True),
        ("utf8mb4_bin", False),  # PAD SPACE: "a" equals "a "
        ("utf8mb4_general_ci", False),
        ("utf8mb4_unicode_ci", False),
        ("utf8mb4_0900_ai_ci", False),
    ],
)
def test_exact_collation_tells_every_two_strings_apart(collation: str, exact: bool) -> None:
    assert server.exact_collation(collation) is exact
