"""The tutorial, followed as its reader follows it: it shows what the commands print.

The page's blocks are taken in order (``examples.fenced_blocks``) and done in
a new directory:

* a ``console`` block's ``$`` commands run (``python``, ``django-admin`` and
  ``pytest`` are this interpreter's, where Django, pytest-django and
  django-delayq are installed; the install commands, ``SETUP``, are what the
  test itself does), and what each prints must be what the block shows under
  it, line by line, once ``normalised`` (the timestamps, host names, pids,
  paths and durations of two runs differ; a line ``...`` stands for any
  lines). A command whose shown output has a ``^C`` runs until the lines
  before it have appeared (with a deadline), then gets SIGINT;
* a block whose first line names a file (``# accounts/handlers.py``,
  ``# pytest.ini``) is that file; a ``settings.py`` one is added at the end of
  the settings ``startproject`` wrote (an element ``...`` of a list stands
  for the list as it was), and only on the Django versions its header names,
  if it names some: ``# mysite/settings.py (Django 5.2 and 6.0)``;
* any other ``python`` block is typed into ``manage.py shell`` (with the
  imports of the shell's earlier blocks, as in one session), and a
  ``print(...)  # shown`` line must print what its comment shows.

Warnings are errors in every command: the reader must see none. The run is
on this interpreter's Django, and again on Django 6.1 or later when the
Django 6 environment (``.venv-dj6``, ``VENV_DJ6``) has it.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import wait_for
from tests.docs import examples

PAGE = examples.DOCS / "tutorial.md"

#: The tutorial's install commands: the directory is the test's, and the
#: interpreter running the test has the packages.
SETUP = (
    "mkdir mysite && cd mysite",
    "python3 -m venv .venv && . .venv/bin/activate",
    'pip install django pytest-django "/path/to/django-delayq"',
)

#: How long a command may take.
DEADLINE = 60
#: How long a serving worker may take to print what the page shows before its ``^C``.
OUTPUT_DEADLINE = 30

#: What legitimately differs from one run to the next, and its placeholder.
VARYING = (
    (re.compile(r"^\^C"), ""),  # the terminal's echo of Ctrl-C
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"), "<time>"),
    (re.compile(r"\bworker \S+:\d+"), "worker <host>:<pid>"),
    (re.compile(r"\S+\.sock\b"), "<socket>"),
    (re.compile(r"^Date: .*"), "Date: <date>"),
    (re.compile(r"^Message-ID: .*"), "Message-ID: <id>"),
    (re.compile(r"\b\d+(?:\.\d+)?m?s\b"), "<duration>"),  # a lag, a test run's time
    (re.compile(r"(?<=\S) {2,}"), " "),  # a table's column widths follow its values
)
ANY_LINES = "..."
EMAIL_HEADER_RE = re.compile(r"^[A-Z][\w-]*: ")
EMAIL_END = "-" * 79

SETTINGS_CONDITION_RE = re.compile(r"\(Django (?P<versions>[\d.]+(?:(?:, | and )[\d.]+)*)\)")
SHOWN_PRINT_RE = re.compile(r"^print\(.*\)\s+#\s?(?P<shown>.*)$")
PRINT_MARK = "[printed]"


def normalised(lines: list[str]) -> list[str]:
    """``lines`` with what varies between runs replaced by placeholders.

    Django's console email is Django's: its header lines are put in name
    order and a blank line before its closing dashes is dropped (both differ
    between Django versions).
    """
    done: list[str] = []
    for line in lines:
        for pattern, placeholder in VARYING:
            line = pattern.sub(placeholder, line)
        line = line.rstrip()
        if line == EMAIL_END and done and not done[-1]:
            done.pop()
        done.append(line)
    start = 0
    while start < len(done):
        end = start
        while end < len(done) and EMAIL_HEADER_RE.match(done[end]):
            end += 1
        if any(line.startswith("MIME-Version: ") for line in done[start:end]):
            done[start:end] = sorted(done[start:end])
        start = end + 1
    return done


def matches(shown: list[str], printed: list[str]) -> bool:
    """Whether ``printed`` is ``shown``, where a line ``...`` stands for any lines."""
    if not shown:
        return not printed
    if shown[0].strip() == ANY_LINES:
        return any(matches(shown[1:], printed[skip:]) for skip in range(len(printed) + 1))
    return bool(printed) and shown[0] == printed[0] and matches(shown[1:], printed[1:])


def assert_shows(where: str, shown: list[str], printed: str) -> None:
    expected, actual = normalised(shown), normalised(printed.splitlines())
    if not matches(expected, actual):
        diff = difflib.unified_diff(expected, actual, "the tutorial", "the run", lineterm="")
        raise AssertionError(
            f"{where}: the output differs from what the tutorial shows "
            f"(normalised):\n" + "\n".join(diff) + "\n\nprinted:\n" + printed
        )


@dataclass(frozen=True)
class Command:
    where: str
    text: str
    shown: list[str]

    @property
    def interrupted(self) -> bool:
        """The page stops it with Ctrl-C (a serving worker)."""
        return any(line.startswith("^C") for line in self.shown)


def commands(block: examples.Block) -> list[Command]:
    """A console block's ``$`` commands, each with the lines shown under it."""
    found: list[Command] = []
    for offset, line in enumerate(block.code.splitlines()):
        if line.startswith("$ "):
            found.append(Command(replace(block, line=block.line + offset).where, line[2:], []))
        else:
            assert found, f"{block.where}: output before any command"
            found[-1].shown.append(line)
    return found


def django_version(python: str) -> tuple[int, int]:
    done = subprocess.run(
        [python, "-c", "import django; print(*django.VERSION[:2])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=DEADLINE,
    )
    major, minor = done.stdout.split()
    return int(major), int(minor)


class Reader:
    """Someone doing the tutorial's steps in ``directory`` with ``python``."""

    def __init__(self, directory: Path, python: str) -> None:
        self.directory = directory
        self.python = python
        self.django = django_version(python)
        self.shell_imports: list[str] = []
        bin_dir = str(Path(python).parent)
        self.env = {
            name: value
            for name, value in os.environ.items()
            if name not in ("DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")
            and not name.startswith(("DJANGO_", "DELAYQ_", "PYTEST_"))
        }
        self.env.update(
            PATH=bin_dir + os.pathsep + self.env.get("PATH", ""),
            PYTHONWARNINGS="error",
            PYTHONUNBUFFERED="1",  # as on a terminal: the log and the emails in order
            COLUMNS="80",
        )
        self.programs = {
            "python": [python],
            "django-admin": [python, "-m", "django"],
            "pytest": [python, "-m", "pytest"],
        }

    def follow(self, page: Path) -> None:
        for block in examples.fenced_blocks(page):
            if block.skip:
                continue
            if block.language == "console":
                for command in commands(block):
                    if command.text not in SETUP:
                        self.run(command)
            elif block.header:
                self.write(block)
            elif block.language == "python":
                self.shell(block)

    # -- console ---------------------------------------------------------------------------

    def argv(self, command: Command) -> list[str]:
        program, *args = shlex.split(command.text)
        assert program in self.programs and not {"&&", "|", ";", ">"} & set(args), (
            f"{command.where}: the test does not know how to run {command.text!r}"
        )
        return [*self.programs[program], *args]

    def run(self, command: Command) -> None:
        argv = self.argv(command)
        with tempfile.TemporaryFile("w+") as log:
            process = subprocess.Popen(
                argv, cwd=self.directory, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                if command.interrupted:
                    self.interrupt_when_shown(process, log, command)
                returncode = process.wait(timeout=DEADLINE)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            log.seek(0)
            printed = log.read()
        assert returncode == 0, f"{command.where}: {command.text} exited {returncode}:\n{printed}"
        assert_shows(command.where, command.shown, printed)

    @staticmethod
    def interrupt_when_shown(
        process: subprocess.Popen[bytes], log: IO[str], command: Command
    ) -> None:
        """Ctrl-C once the lines shown before ``^C`` have been printed (or at the deadline)."""
        before = next(i for i, line in enumerate(command.shown) if line.startswith("^C"))
        wanted = normalised(command.shown[:before])
        fd = log.fileno()

        def printed_enough() -> bool:
            text = os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
            printed = normalised(text[: text.rfind("\n") + 1].splitlines())
            # As many lines as shown, the last of them among them (a console email's
            # closing dashes come in a write of their own).
            return process.poll() is not None or (
                len(printed) >= len(wanted) and all(line in printed for line in wanted[-1:])
            )

        # At the deadline too: the comparison then says what is missing.
        with contextlib.suppress(AssertionError):
            wait_for(printed_enough, timeout=OUTPUT_DEADLINE)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)

    # -- files and the shell -----------------------------------------------------------------

    def write(self, block: examples.Block) -> None:
        path = self.directory / str(block.header)
        if path.name != "settings.py":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code)
            return
        first_line = block.code.split("\n", 1)[0]
        condition = SETTINGS_CONDITION_RE.search(first_line)
        if condition:
            versions = re.split(r", | and ", condition["versions"])
            if "{}.{}".format(*self.django) not in versions:
                return
        with path.open("a") as settings:
            settings.write("\n" + with_startprojects_lists(block.code) + "\n")

    def shell(self, block: examples.Block) -> None:
        """The block typed into ``manage.py shell``, after the session's earlier imports."""
        tree = ast.parse(block.code)
        mark = f"print = __import__('functools').partial(print, {PRINT_MARK!r})"
        code = "\n".join([*self.shell_imports, mark, block.code])
        self.shell_imports += [
            ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
        ]
        done = subprocess.run(
            [self.python, "manage.py", "shell", "-c", code],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
        assert done.returncode == 0, f"{block.where}: the shell failed:\n{done.stdout}{done.stderr}"
        shown = [
            match["shown"]
            for line in block.code.splitlines()
            if (match := SHOWN_PRINT_RE.match(line.strip()))
        ]
        printed = [
            line.removeprefix(PRINT_MARK + " ")
            for line in done.stdout.splitlines()
            if line.startswith(PRINT_MARK)
        ]
        assert_shows(block.where, shown, "\n".join(printed))


def with_startprojects_lists(code: str) -> str:
    """A settings block in which a list's element ``...`` is the list already there."""
    tree = ast.parse(code)
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.List)
        ):
            name = node.targets[0].id
            node.value.elts = [
                ast.Starred(ast.Name(name, ast.Load()), ast.Load())
                if isinstance(element, ast.Constant) and element.value is Ellipsis
                else element
                for element in node.value.elts
            ]
    return ast.unparse(ast.fix_missing_locations(tree))


def django6_python() -> str:
    """The Django 6 environment's interpreter, if it has Django 6.1 or later."""
    venv = examples.ROOT / os.environ.get("VENV_DJ6", ".venv-dj6")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no Django 6 environment at {venv}")
    if django_version(str(python)) < (6, 1):
        pytest.skip(f"{venv} has Django {django_version(str(python))}, not 6.1 or later")
    return str(python)


@pytest.mark.process
@pytest.mark.parametrize("django", ["this", "6.1"], ids=["this-django", "django-6.1"])
def test_the_tutorial_shows_what_its_commands_print(django: str, tmp_path: Path) -> None:
    if django == "this":
        python = sys.executable
    elif django_version(sys.executable) >= (6, 1):
        pytest.skip("this interpreter's Django is 6.1 or later: the other run is on it")
    else:
        python = django6_python()
    Reader(tmp_path, python).follow(PAGE)
