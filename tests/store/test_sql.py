"""The named statements of ``store/sql/``: each one used, each one there when asked.

The code asks ``statement(name, features)`` for a statement only where the
database's ``Features`` lead to it (``USES`` below says where). Every name
the package passes to ``statement`` is found in its source, so a statement
nobody asks for, a name asked for that no file of that database holds, or
a placeholder the caller does not fill is caught here for all three
databases, whichever one the suite runs on.
"""

from __future__ import annotations

import ast
import re
import sqlite3
import string
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest

import django_delayq
from django_delayq.store import sql
from django_delayq.store.features import Features, _features
from django_delayq.store.sql import statement

PACKAGE = Path(django_delayq.__file__).parent
FILES = ("common.sql", "postgresql.sql", "sqlite.sql", "mysql.sql")
VENDORS = ("postgresql", "sqlite", "mysql")


def vendor_features(vendor: str) -> Features:
    return _features(vendor, sqlite3.sqlite_version_info)


@dataclass(frozen=True)
class Use:
    """Where the code asks for a statement, and the placeholders it fills."""

    asked: Callable[[Features], bool]
    fills: frozenset[str] = frozenset()


def use(asked: Callable[[Features], bool], *fills: str) -> Use:
    return Use(asked, frozenset(fills))


def always(_: Features) -> bool:
    return True


USES: dict[str, Use] = {
    # claim.py
    "claim": use(
        lambda f: f.limit_in_subquery, "set", "picked", "columns", "pk", "lock_token", "table"
    ),
    "claim_lanes": use(always, "lanes", "pk", "order", "limit"),
    "claim_lane": use(always, "picked", "number"),
    # settle.py
    "held_rows": use(always, "ids", "pk", "lock_token", "status", "table"),
    "held_rows_unlocked": use(
        lambda f: f.skip_locked_subquery, "ids", "pk", "lock_token", "status", "table"
    ),
    "held_pairs": use(lambda f: f.array_parameters, "pk", "lock_token", "status"),
    "held_pairs_unlocked": use(lambda f: f.array_parameters, "pk", "lock_token", "status", "table"),
    "no_wait_mariadb": use(lambda f: f.no_wait, "sql"),
    "no_wait_mysql": use(lambda f: f.no_wait, "verb", "rest"),
    # retention.py
    "delete_archived": use(lambda f: f.pipeline and f.array_parameters, "table"),
    "count_ids": use(lambda f: f.pipeline and f.array_parameters, "table"),
    "delete_ids": use(lambda f: f.pipeline and not f.array_parameters, "table"),
    "archived_versions": use(lambda f: f.pipeline and not f.array_parameters, "table"),
    # groups.py
    "create_group_clear": use(
        lambda f: f.group_function, "table", "queue", "group", "status", "id", "due"
    ),
    "create_holder_gone": use(
        lambda f: f.group_function, "workers", "name", "stopped_at", "last_seen", "alive_until"
    ),
    "drop_holder_gone": use(
        lambda f: f.group_function, "workers", "name", "stopped_at", "last_seen", "alive_until"
    ),
    "drop_group_clear": use(
        lambda f: f.group_function, "table", "queue", "group", "status", "id", "due"
    ),
    # ended.py
    "create_ended_function": use(lambda f: f.notify, "table", "id", "status", "waited"),
    "create_ended_trigger": use(lambda f: f.notify, "table", "id", "status", "waited"),
    "create_deleted_trigger": use(lambda f: f.notify, "table", "id", "status", "waited"),
    "drop_ended_triggers": use(lambda f: f.notify, "table", "id", "status", "waited"),
    "mark_waited": use(lambda f: f.notify, "table", "id", "status", "waited"),
    # dependencies.py
    "end_edges": use(
        lambda f: f.array_parameters,
        "message",
        "dependency",
        "edges",
        "now",
        "due",
        "policy",
        "notes",
        "noted",
        "locked",
        "only_locked",
        "lock_wait",
        "parents",
        "also",
        "id",
        "status",
        "queue",
        "key",
        "group",
        "parents_waiting",
        "parents_failed",
        "finished_at",
        "last_error",
        "scheduled_time",
        "updated_at",
        "parent_id",
        "child_id",
        "position",
        "parent_ended",
    ),  # fmt: skip
    "end_edges_notes": use(lambda f: f.array_parameters and f.notify, "queue"),
    "end_edges_locked": use(
        lambda f: f.array_parameters,
        "id",
        "edges",
        "message",
        "child_id",
        "dependency",
        "parent_id",
        "parent_ended",
        "status",
    ),  # fmt: skip
    "end_edges_only_locked": use(lambda f: f.array_parameters, "child_id", "id", "message"),
    "end_edges_lock_wait": use(lambda f: f.array_parameters, "ms"),
    "end_edges_async_commit": use(lambda f: f.array_parameters),
    "end_edges_acked": use(lambda f: f.array_parameters, "outcome", "id", "queue", "key", "status"),
    "end_edges_acked_rows": use(lambda f: f.array_parameters, "id", "status", "noted"),
    # queries.py
    "distinct_values": use(lambda f: f.loose_index_scan, "col", "table", "where"),
    "next_due": use(always, "due", "table", "status", "queues"),
    "row_estimate": use(lambda f: f.row_estimate is not None),
    # server.py
    "column_collations": use(lambda f: f.binary_text),
    "binary_columns": use(
        lambda f: f.binary_text,
        "table",
        "queue",
        "key",
        "group",
        "queue_length",
        "key_length",
        "group_length",
        "collation",
    ),
    # inserts.py
    "json_rows": use(always, "key_length", "group_length"),
    "json_rows_key": use(always),
    "json_rows_payload": use(always),
    "json_rows_grouped": use(always, "key_length", "group_length"),
    "json_rows_group": use(always),
    "insert_rows": use(always, "table", "columns", "values", "source"),
    "insert_values": use(lambda f: f.returning, "table", "columns", "values"),
    "one_row_payload": use(lambda f: f.returning),
    "ignore_conflicts": use(lambda f: f.returning, "table", "queue", "key"),
    "update_conflicts": use(
        lambda f: f.returning, "table", "queue", "key", "distinct", "payload_distinct"
    ),
    "distinct": use(lambda f: f.returning),
    "payload_distinct": use(lambda f: f.returning, "table"),
    "inserted": use(lambda f: f.returning and f.inserted_flag),
    "with_notify": use(lambda f: f.notify, "insert"),
    # wakeup.py
    "notify": use(lambda f: f.notify),
    # without_returning.py
    "read_shared": use(lambda f: not f.returning, "select"),
    # loader.py
    "loaded_rows": use(lambda f: f.pipeline, "order", "pick"),
    "loaded_rows_grouped": use(lambda f: f.pipeline, "order", "pick"),
    "loaded_key": use(lambda f: f.pipeline),
    "loaded_group": use(lambda f: f.pipeline),
    "loaded_keys": use(lambda f: f.pipeline),
    "loaded_payload": use(lambda f: f.pipeline),
    "loaded_due": use(lambda f: f.pipeline),
    "load_counts": use(lambda f: f.pipeline and f.inserted_flag, "insert"),
    "loaded_existing": use(lambda f: f.pipeline and f.returning and not f.inserted_flag, "table"),
    "loaded_table": use(
        lambda f: f.pipeline and not f.returning, "key_length", "group_length", "collation"
    ),
    "loaded_changed": use(lambda f: f.pipeline and not f.returning, "table"),
    "duplicate_key_update": use(lambda f: f.pipeline and not f.returning, "table", "changed"),
}


def names_asked_in_the_source() -> dict[str, set[str]]:
    """Every statement name the package passes to ``statement(...)``, and where.

    A literal name counts; so does a variable, with every name assigned to
    it in the same function (``"a" if ... else "b"``).
    """
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(function):
                if not (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == "statement"
                ):
                    continue
                where = f"{path.relative_to(PACKAGE)}:{call.lineno}"
                for name in _literals(call.args[0], function, where):
                    found.setdefault(name, set()).add(where)
    return found


def _literals(node: ast.expr, function: ast.AST, where: str) -> list[str]:
    if isinstance(node, ast.Name):
        values = [
            name
            for assign in ast.walk(function)
            if isinstance(assign, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == node.id for t in assign.targets)
            for name in _literals(assign.value, function, where)
        ]
        assert values, f"{where}: cannot tell which statement {node.id} names"
        return values
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literals(node.body, function, where) + _literals(node.orelse, function, where)
    raise AssertionError(f"{where}: a statement name this test cannot read: {ast.dump(node)}")


ASKED = names_asked_in_the_source()


def test_the_source_asks_for_statements() -> None:
    # The reader of the source works: it finds literal names and variables.
    assert {"claim", "held_rows", "held_rows_unlocked", "update_conflicts"} <= set(ASKED)


def test_every_statement_the_code_asks_for_is_listed_here_and_nothing_else() -> None:
    assert set(ASKED) == set(USES)


@pytest.mark.parametrize("filename", FILES)
def test_every_statement_of_every_file_is_asked_for_by_the_code(filename: str) -> None:
    unused = [name for name in sql.names(filename) if name not in ASKED]
    assert not unused


@pytest.mark.parametrize("vendor", VENDORS)
def test_every_statement_the_code_asks_of_a_database_exists_for_it(vendor: str) -> None:
    can = vendor_features(vendor)
    missing = []
    for name, how in USES.items():
        if how.asked(can):
            try:
                statement(name, can)
            except KeyError:
                missing.append(name)
    assert not missing


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_databases_own_statements_are_all_asked_of_it(vendor: str) -> None:
    """No block in ``<vendor>.sql`` that the code never asks of that database."""
    can = vendor_features(vendor)
    dead = [name for name in sql.names(f"{vendor}.sql") if not USES[name].asked(can)]
    assert not dead


def test_every_shared_statement_is_asked_of_a_database_that_does_not_override_it() -> None:
    own = {vendor: set(sql.names(f"{vendor}.sql")) for vendor in VENDORS}
    dead = [
        name
        for name in sql.names("common.sql")
        if not any(
            USES[name].asked(vendor_features(vendor)) and name not in own[vendor]
            for vendor in VENDORS
        )
    ]
    assert not dead


@pytest.mark.parametrize("vendor", VENDORS)
def test_every_placeholder_is_one_the_caller_fills(vendor: str) -> None:
    can = vendor_features(vendor)
    for name, how in USES.items():
        if not how.asked(can):
            continue
        text = statement(name, can)
        fields = {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
        assert fields <= how.fills, (name, fields - how.fills)
        if how.fills:
            text.format(**dict.fromkeys(how.fills, "x"))  # braces are balanced or doubled


@pytest.mark.parametrize("filename", FILES)
def test_the_file_parses_into_named_non_empty_statements(filename: str) -> None:
    text = resources.files(sql).joinpath(filename).read_text(encoding="utf-8")
    headers = [line for line in text.splitlines() if line.startswith("-- name")]
    assert all(re.fullmatch(r"-- name: \w+", line) for line in headers), headers
    names = sql.names(filename)
    assert len(names) == len(headers), "a name is used twice in the file"
    assert names, "no statement"
    # Before the first block: comments only.
    preamble = text.split("-- name:", 1)[0]
    assert all(not line or line.startswith("--") for line in preamble.splitlines())
    for name in names:
        body = sql._load(filename)[name]
        assert body, f"{name} is empty"
        assert not body.startswith("--"), f"{name} is only comments"
        # Fragments are joined into other statements: no terminator.
        assert not body.rstrip().endswith(";"), name


def test_a_name_no_file_holds_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="no statement 'nope' for postgresql"):
        statement("nope", vendor_features("postgresql"))


def test_a_databases_own_statement_overrides_the_shared_one() -> None:
    common = statement("held_rows", vendor_features("sqlite"))
    own = statement("held_rows", vendor_features("postgresql"))
    assert "IN ({ids})" in common and "ANY(%s)" in own
    assert statement("insert_rows", vendor_features("mysql")).startswith("INSERT IGNORE")
