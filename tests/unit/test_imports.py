"""No import circle inside the package: the modules form layers, each importing below it.

A circle of imports works only as long as every module in it reads the
others' names after the import finished (inside functions): the first
module-level ``from x import y`` that runs while ``x`` is half imported
fails, and which one runs first depends on which module a process happened
to import first. The graph is read from the source (AST), counting only the
imports that run when a module is imported: statements at the top of a
module (in its ``if``/``try``/``with`` blocks and class bodies too), not
those inside functions (they run when called, after every import finished)
nor under ``if TYPE_CHECKING:`` (never at run time).

Importing ``a.b.c`` also runs the packages ``a.b`` (its ``__init__``) first, so
an import counts for the packages it enters too, but not for the importer's
own packages: they are already being imported when it runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "django_delayq"
ROOT = PACKAGE.name

# Knots left on purpose (modules that import each other, sorted), each with why.
KNOWN_CYCLES: list[tuple[str, ...]] = []


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    # A directory without an __init__.py is a namespace package: nothing runs.
    for path in sorted(p for p in PACKAGE.rglob("*") if p.is_dir()):
        found.setdefault(".".join(path.relative_to(PACKAGE.parent).parts), path)
    return found


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def run_at_import(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that run when the module is imported."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not is_type_checking(node.test):
                yield from run_at_import(node.body)
            yield from run_at_import(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse):
                yield from run_at_import(block)
            yield from run_at_import(node.finalbody)
        elif isinstance(node, ast.With | ast.For | ast.While):
            yield from run_at_import(node.body)
        elif isinstance(node, ast.ClassDef):
            yield from run_at_import(node.body)


def imported(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> Iterator[str]:
    """The package's modules an import statement names (a module, or a name of one)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    assert node.level == 0, "the package uses absolute imports"
    base = node.module or ""
    yield base
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            yield f"{base}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """Each module's imports run at import time: the modules (and packages) they run."""
    modules = module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        if path.is_dir():
            continue
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in run_at_import(ast.parse(path.read_text()).body):
            for target in imported(node, modules):
                parts = target.split(".")
                for end in range(1, len(parts) + 1):
                    entered = ".".join(parts[:end])
                    if entered not in modules or entered == name:
                        continue
                    # The importer's own packages are already running.
                    if own == entered or own.startswith(entered + "."):
                        continue
                    graph[name].add(entered)
    return graph


def knots(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of modules (Tarjan): each module of a group
    imports each other one, through the others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def shortest_circle(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest circle from ``start`` through the group, as a path back to it."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph[node] & group):
                if other == start:
                    return [*paths[node], start]
                if other not in paths:
                    paths[other] = [*paths[node], other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"no circle through {start}")


def describe(graph: dict[str, set[str]], group: set[str]) -> str:
    """A knot as a shortest circle through each of its modules, then its modules."""
    circles = set()
    for start in sorted(group):
        ring = shortest_circle(graph, group, start)[:-1]
        first = ring.index(min(ring))  # one rotation of each circle
        ring = ring[first:] + ring[:first]
        circles.add((*ring, ring[0]))
    lines = [" -> ".join(circle) for circle in sorted(circles, key=lambda c: (len(c), c))]
    return "\n".join([*lines, f"(the knot: {', '.join(sorted(group))})"])


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert "django_delayq.store.claim" in graph["django_delayq.store.limits"]
    assert "django_delayq.conf" in graph["django_delayq.retry"]
    # Imports inside functions and under TYPE_CHECKING do not count.
    assert "django_delayq.enqueuing" not in graph[ROOT]
    assert not any(name.startswith("django_delayq.store") for name in graph["django_delayq.apps"])
    assert "django_delayq.store.groups" in graph["django_delayq.store.write"]
    assert "django_delayq.store.wakeup" in graph["django_delayq.store.groups"]
    # In the view that shows the page.
    assert "django_delayq.cron.install" not in graph["django_delayq.admin.schedules"]


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    found = [
        describe(graph, group) for group in knots(graph) if tuple(sorted(group)) not in KNOWN_CYCLES
    ]
    assert found == [], "import circles:\n" + "\n\n".join(found)


def test_a_circle_is_found_and_shown():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(sorted(group) for group in knots(graph)) == [["a", "b", "c"], ["e"]]
    assert describe(graph, {"a", "b", "c"}).splitlines()[0] == "a -> b -> c -> a"
