"""Run the fenced Python examples of the documentation's tutorial and how-to pages.

Each page's ```` ```python ```` blocks run in order, as a reader would paste
them. A block is skipped only when the line before its fence is
``<!-- no-test -->`` (or ``<!-- no-test: why -->``): shell sessions are not
Python blocks, and the few skipped ones are things that cannot run in a test
(a server's configuration, Spark, a placeholder).

What a block is depends on its first line:

* ``# settings.py`` (or ``# proj/settings.py``): a settings fragment. It runs
  in a scratch namespace (``BASE_DIR`` is defined); the ``DELAYQ`` and
  ``TASKS`` it defines apply to the rest of the page (``override_settings``).
* ``# app/models.py``: a models module. Its models join the test app (so they
  have an app label without an ``INSTALLED_APPS`` entry), get their tables,
  and are dropped and forgotten after the page. ``from app.models import X``
  works in later blocks.
* ``# app/anything.py``: a module of that dotted name (``app.anything``),
  importable by later blocks; a handler, task or admin defined there is
  registered as it would be in a project.
* anything else: the page's shell, one namespace for all such blocks, where
  top-level ``await`` works (through ``async_to_sync``, so the sync code it
  awaits runs in the test's thread and connection).

After each block, the ``test_*`` functions it defined run (a ``delayq``
argument gets a :class:`django_delayq.testing.DelayQ` helper, ``settings``
pytest-django's settings wrapper), and so do the ``unittest.TestCase`` classes.
After the page, Django's system checks must report no error (nor any warning
of django-delayq), and everything the page registered (handlers, schedules,
admin classes, signal receivers, models, modules, settings) is undone.

``fenced_blocks`` gives a page's blocks of every language (``test_tutorial.py``
follows the tutorial with them, in a new project, as its reader does).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
import types
import unittest
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: The pages whose examples must run: the tutorial and the how-to guides.
PAGE_GLOBS = ("tutorial.md", "howto/*.md")

#: The app the examples' models join.
HOST_APP = "testapp"
HOST_PACKAGE = "tests.testapp"

SKIP_RE = re.compile(r"^<!--\s*no-test\b.*-->\s*$")
FENCE_RE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
#: A block's first line naming the file it is: ``# app/handlers.py``, ``# pytest.ini``.
HEADER_RE = re.compile(r"^#\s*(?P<path>[\w./-]+\.(?:py|ini))\b")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code, 1-based
    code: str
    skip: bool
    language: str = "python"  # the first word after the opening fence

    @property
    def where(self) -> str:
        return f"{_shown(self.page)}:{self.line}"

    @property
    def header(self) -> str | None:
        first = self.code.lstrip("\n").split("\n", 1)[0]
        match = HEADER_RE.match(first)
        return match["path"] if match else None


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def pages() -> list[Path]:
    found: list[Path] = []
    for pattern in PAGE_GLOBS:
        found += sorted(DOCS.glob(pattern))
    return found


def python_blocks(page: Path) -> list[Block]:
    """The page's ```` ```python ```` blocks, in order, with their skip markers."""
    return [block for block in fenced_blocks(page) if block.language == "python"]


def fenced_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks of every language, in order, with their skip markers."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        match = FENCE_RE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, info = match["fence"], match["info"].strip()
        start = index + 1
        end = start
        while end < len(lines):
            closing = FENCE_RE.match(lines[end])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            end += 1
        previous = next((s for s in reversed(lines[:index]) if s.strip()), "")
        blocks.append(
            Block(
                page=page,
                line=start + 1,
                code="\n".join(lines[start:end]) + "\n",
                skip=bool(SKIP_RE.match(previous.strip())),
                language=(info.split(maxsplit=1) or [""])[0],
            )
        )
        index = end + 1
    return blocks


# -- undoing what a page registered --------------------------------------------------------


def _signals() -> list[Any]:
    from django_delayq import signals

    found = [getattr(signals, name) for name in signals.__all__]
    try:
        from django_delayq import backends
    except Exception:  # no Tasks framework installed
        return found
    return found + [backends.task_enqueued, backends.task_started, backends.task_finished]


@contextmanager
def restored_registrations() -> Iterator[None]:
    """Handlers, schedules, admin classes and pages, and signal receivers as they were."""
    from django.contrib import admin

    from django_delayq.admin import messages as message_admin
    from django_delayq.cron import declared
    from django_delayq.registry import registry

    handlers, models = dict(registry._handlers), dict(registry._models)
    schedules = dict(declared._declared)
    admins = dict(admin.site._registry)
    extra_urls, object_tools = list(message_admin.EXTRA_URLS), list(message_admin.OBJECT_TOOLS)
    receivers = {id(s): (s, list(s.receivers)) for s in _signals()}
    try:
        yield
    finally:
        registry._handlers.clear()
        registry._handlers.update(handlers)
        registry._models.clear()
        registry._models.update(models)
        declared._declared.clear()
        declared._declared.update(schedules)
        admin.site._registry.clear()
        admin.site._registry.update(admins)
        message_admin.EXTRA_URLS[:] = extra_urls
        message_admin.OBJECT_TOOLS[:] = object_tools
        for signal, saved in receivers.values():
            signal.receivers = saved
            signal.sender_receivers_cache.clear()


# -- the page's modules ------------------------------------------------------------------------


class Page:
    """One page's run: its shell namespace, its modules, its models and settings."""

    def __init__(self, path: Path, stack: ExitStack, fixtures: dict[str, Callable[[], Any]]):
        self.path = path
        self.stack = stack
        self.fixtures = fixtures
        name = path.relative_to(DOCS) if path.is_relative_to(DOCS) else Path(path.name)
        slug = re.sub(r"\W", "_", str(name.with_suffix("")))
        self.shell = self._module(f"docs_examples.{slug}")

    def _module(self, name: str, run_as: str | None = None) -> types.ModuleType:
        """A fresh module registered as ``name`` (and its parent packages, as stubs)."""
        top = name.split(".", 1)[0]
        if top not in sys.modules and importlib.util.find_spec(top) is not None:
            raise AssertionError(
                f"{self.path}: an example module named {name!r} would shadow the real "
                f"package {top!r}; use another name in the docs"
            )
        parts = name.split(".")
        for depth in range(1, len(parts)):
            package = ".".join(parts[:depth])
            if package not in sys.modules:
                stub = types.ModuleType(package)
                stub.__path__ = []
                sys.modules[package] = stub
                self.stack.callback(sys.modules.pop, package, None)
        module = types.ModuleType(run_as or name)
        sys.modules[name] = module
        self.stack.callback(sys.modules.pop, name, None)
        if run_as:
            sys.modules[run_as] = module
            self.stack.callback(sys.modules.pop, run_as, None)
        return module

    def run(self, block: Block) -> None:
        header = block.header
        if header is None:
            self._exec(block, self.shell.__dict__)
        elif Path(header).name == "settings.py":
            self._settings(block)
        elif Path(header).name == "models.py":
            self._models(block, header)
        else:
            name = header.removesuffix(".py").replace("/", ".")
            self._exec(block, self._module(name).__dict__)

    def _exec(self, block: Block, namespace: dict[str, Any]) -> None:
        from asgiref.sync import async_to_sync

        before = set(namespace)
        # Blank lines first, so that tracebacks point at the page's own lines.
        source = "\n" * (block.line - 1) + block.code
        code = compile(source, str(block.page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if code.co_flags & inspect.CO_COROUTINE:

            async def run() -> None:
                await eval(code, namespace)

            async_to_sync(run)()
        else:
            exec(code, namespace)
        self._run_tests(block, {k: namespace[k] for k in set(namespace) - before})

    def _settings(self, block: Block) -> None:
        from django.test import override_settings

        namespace: dict[str, Any] = {"BASE_DIR": Path("/tmp/delayq-docs-example")}
        self._exec(block, namespace)
        applied = {k: namespace[k] for k in ("DELAYQ", "TASKS") if k in namespace}
        if applied:
            override = override_settings(**applied)
            override.enable()
            self.stack.callback(override.disable)

    def _models(self, block: Block, header: str) -> None:
        from django.apps import apps
        from django.db import connection

        name = header.removesuffix(".py").replace("/", ".")
        run_as = f"{HOST_PACKAGE}.docs_{name.replace('.', '_')}"
        known = dict(apps.all_models[HOST_APP])
        module = self._module(name, run_as=run_as)
        module.__dict__["__name__"] = run_as
        try:
            self._exec(block, module.__dict__)
        finally:
            new = [m for k, m in apps.all_models[HOST_APP].items() if k not in known]
            self.stack.callback(self._forget_models, new)
        with connection.schema_editor() as editor:
            for model in new:
                editor.create_model(model)
                self.stack.callback(self._drop_model, model)

    @staticmethod
    def _drop_model(model: type) -> None:
        from django.db import connection

        with connection.schema_editor() as editor:
            editor.delete_model(model)

    @staticmethod
    def _forget_models(models: list[type]) -> None:
        from django.apps import apps

        for model in models:
            apps.all_models[HOST_APP].pop(model._meta.model_name, None)  # type: ignore[attr-defined]
        apps.clear_cache()

    def _run_tests(self, block: Block, defined: dict[str, Any]) -> None:
        for name, value in defined.items():
            if name.startswith("test_") and inspect.isfunction(value):
                self._call_test(block, value)
            elif (
                isinstance(value, type)
                and issubclass(value, unittest.TestCase)
                and value.__module__ not in ("unittest", "django.test.testcases")
                and not name.startswith("_")
            ):
                self._run_testcase(block, value)

    def _call_test(self, block: Block, function: Callable[..., Any]) -> None:
        kwargs = {}
        for parameter in inspect.signature(function).parameters:
            if parameter not in self.fixtures:
                raise AssertionError(
                    f"{block.where}: {function.__name__} asks for fixture {parameter!r}, "
                    f"which the examples' runner does not provide ({', '.join(self.fixtures)})"
                )
            kwargs[parameter] = self.fixtures[parameter]
        with _as_a_test(), ExitStack() as stack:
            values = {k: stack.enter_context(_as_context(v())) for k, v in kwargs.items()}
            function(**values)

    @staticmethod
    def _run_testcase(block: Block, case: type[unittest.TestCase]) -> None:
        result = unittest.TestResult()
        with _as_a_test():
            unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
        problems = result.errors + result.failures
        if problems or not result.testsRun:
            details = "\n".join(f"{test}:\n{trace}" for test, trace in problems)
            raise AssertionError(f"{block.where}: {case.__name__} failed\n{details}")


@contextmanager
def _as_a_test() -> Iterator[None]:
    """What a test of the reader's would start from: an empty queue and mailbox.

    As under pytest-django's ``db`` fixture, the test runs in a transaction
    that is rolled back afterwards; the queue's tables are emptied inside it,
    so messages the page's earlier examples left are out of the test's way.
    """
    from django.core import mail
    from django.db import transaction

    from django_delayq.models import Message, QueueState, WorkerState

    if hasattr(mail, "outbox"):
        mail.outbox.clear()
    with transaction.atomic():
        for model in (Message, QueueState, WorkerState):
            model.objects.all().delete()
        try:
            yield
        finally:
            transaction.set_rollback(True)


@contextmanager
def _as_context(value: Any) -> Iterator[Any]:
    """Enter a context manager (a DelayQ helper), or pass a plain value through."""
    if hasattr(value, "__enter__") and hasattr(value, "__exit__"):
        with value as entered:
            yield entered
    else:
        yield value


def _is_suite_handler(func: Callable[..., Any]) -> bool:
    module = str(func.__module__)
    if module.startswith(f"{HOST_PACKAGE}.docs_"):
        return False  # an example's models module
    return module.startswith(("tests.", "django_delayq."))


def suite_queues() -> set[str]:
    """The queues that the test suite's own handlers consume (not the Tasks runner's)."""
    from django_delayq.registry import registry

    return {
        spec.queue
        for spec in registry.all()
        if _is_suite_handler(spec.func) and not str(spec.func.__module__).startswith("django_")
    }


def run_page(path: Path, fixtures: dict[str, Callable[[], Any]]) -> None:
    """Run every runnable Python block of ``path``, then the checks; undo it all."""
    from django.core import checks

    from django_delayq.registry import registry

    taken = suite_queues()
    blocks = [b for b in python_blocks(path) if not b.skip]
    with ExitStack() as stack:
        stack.enter_context(restored_registrations())
        page = Page(path, stack, fixtures)
        for block in blocks:
            try:
                page.run(block)
            except BaseException as exc:
                exc.add_note(f"in the example at {block.where}")
                raise
            clashes = {
                spec.queue
                for spec in registry.all()
                if spec.queue in taken and not _is_suite_handler(spec.func)
            }
            if clashes:
                raise AssertionError(
                    f"{block.where}: the example registers a handler for the test suite's "
                    f"queue(s) {', '.join(sorted(clashes))}; use another queue name"
                )
        problems = [
            message
            for message in checks.run_checks()
            if message.level >= checks.ERROR
            or (message.level >= checks.WARNING and str(message.id).startswith("django_delayq."))
        ]
        if problems:
            raise AssertionError(
                f"{_shown(path)}: the system checks fail after its examples:\n"
                + "\n".join(str(p) for p in problems)
            )
