"""The architecture the file tree promises, checked: one owner for the queue table.

``store/`` is the only package that writes the queue columns, and nothing in
it imports from the layers above it. These tests read the source (AST), so a
new module that writes ``status`` with an ``update()`` fails here before it
fails in production.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "django_delayq"
STORE = PACKAGE / "store"
QUEUE_COLUMNS = {
    "status",
    "next_attempt_time",
    "attempt_count",
    "lock_token",
    "locked_by",
    "superseded_at",
}
WRITES = {"update", "bulk_update", "bulk_create", "create", "get_or_create", "update_or_create"}
# The layers above the store, which it must not import.
ABOVE = (
    "django_delayq.worker",
    "django_delayq.admin",
    "django_delayq.enqueuing",
    "django_delayq.operations",
    "django_delayq.cron",
    "django_delayq.backends",
    "django_delayq.contrib",
    "django_delayq.management",
    "django_delayq.triage",
    "django_delayq.stats",
    "django_delayq.flowstats",
)


def sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "migrations" not in p.parts)


def test_only_the_store_writes_the_queue_columns():
    found = []
    for path in sources(PACKAGE):
        if STORE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            written = {k.arg for k in node.keywords if k.arg} & QUEUE_COLUMNS
            if node.func.attr in WRITES and written:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {sorted(written)}")
            if node.func.attr == "save" and any(k.arg == "update_fields" for k in node.keywords):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} save(update_fields)")
    assert found == []


def test_no_hand_written_statement_on_the_queue_table_outside_the_store():
    found = []
    for path in sources(PACKAGE):
        if STORE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = " ".join(node.value.upper().split())
                for verb in ("UPDATE DJANGO_DELAYQ_MESSAGE", "INSERT INTO DJANGO_DELAYQ_MESSAGE",
                             "DELETE FROM DJANGO_DELAYQ_MESSAGE"):  # fmt: skip
                    if verb in text:
                        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {verb}")
    assert found == []


def test_the_store_imports_nothing_above_it():
    found = []
    for path in sources(STORE):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [
                f"{path.relative_to(PACKAGE)}:{node.lineno} {name}"
                for name in names
                if name.startswith(ABOVE)
            ]
    assert found == []


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in sources(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("django_delayq"):
                found += [
                    f"{path.relative_to(PACKAGE)}:{node.lineno} {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    assert found == []


def test_the_settings_module_imports_nothing_of_the_package():
    """``conf`` is read by every module: importing any of them from it (even
    inside a function) ties them all into one import circle. The caches that
    depend on the settings are dropped from ``apps.py`` instead."""
    tree = ast.parse((PACKAGE / "conf.py").read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [None])
    ]
    assert [name for name in imported if name and name.startswith("django_delayq")] == []
