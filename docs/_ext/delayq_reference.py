"""The generated parts of the reference: management commands and settings.

Everything here is read from the code itself, so the documentation cannot
drift from it: each command's options come from its argparse parser
(``Command().create_parser("manage.py", name)``), each setting's default and
explanation from ``django_delayq.conf`` (``DEFAULTS`` and the comment above
each of its keys). The Sphinx extension (``delayq_docs``) renders the reST
built here, and ``tests/docs`` compares it with the code; this module does
not import Sphinx, so the tests run without it.

Django must be set up before these functions are called.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

#: Options every Django command has; the reference names them once instead.
DJANGO_BASE_DESTS = frozenset(
    {
        "help",
        "version",
        "verbosity",
        "settings",
        "pythonpath",
        "traceback",
        "no_color",
        "force_color",
        "skip_checks",
    }
)

COMMANDS_PACKAGE = "django_delayq.management.commands"


# -- management commands ---------------------------------------------------------------


def command_names() -> list[str]:
    """Every management command django-delayq ships, by name."""
    package = importlib.import_module(COMMANDS_PACKAGE)
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.ispkg)


def command_module_file(name: str) -> str:
    module = importlib.import_module(f"{COMMANDS_PACKAGE}.{name}")
    return str(module.__file__)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The command's own parser, exactly as ``manage.py NAME --help`` builds it."""
    from django.core.management import load_command_class

    command = load_command_class("django_delayq", name)
    return command.create_parser("manage.py", name)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _own_actions(parser: argparse.ArgumentParser, top: bool) -> list[argparse.Action]:
    """The parser's arguments, less Django's common ones, ``--help`` and subcommands."""
    return [
        a
        for a in parser._actions
        if not (top and a.dest in DJANGO_BASE_DESTS)
        and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]


def parsers(name: str) -> Iterator[tuple[str, argparse.ArgumentParser, bool]]:
    """``(program, parser, is_top)``: the command, then each of its subcommands."""
    parser = command_parser(name)
    yield name, parser, True
    for sub, subparser in _subparsers(parser).items():
        yield f"{name} {sub}", subparser, False


def command_options(name: str) -> dict[str, list[str]]:
    """Every option string and positional name of the command, by (sub)program.

    What the reference must show (the tests compare the two).
    """
    result: dict[str, list[str]] = {}
    for program, parser, top in parsers(name):
        names: list[str] = []
        for action in _own_actions(parser, top):
            names += list(action.option_strings) or [_positional_name(action)]
        for sub in _subparsers(parser):
            names.append(sub)
        result[program] = names
    return result


def _positional_name(action: argparse.Action) -> str:
    if action.metavar:
        return str(action.metavar)
    return str(action.dest).upper()


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    # A fixed width: argparse otherwise wraps to the terminal's $COLUMNS.
    return argparse.HelpFormatter(parser.prog, width=88)


def _signature(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """``--queue QUEUE, -q QUEUE`` as the option directive wants it."""
    formatter = _formatter(parser)
    if not action.option_strings:
        return _positional_name(action)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    args = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
    return ", ".join(f"{s} {args}" for s in action.option_strings)


def usage(parser: argparse.ArgumentParser, top: bool = True) -> str:
    """argparse's usage line, without Django's common options (named once, below)."""
    formatter = _formatter(parser)
    actions = [a for a in parser._actions if not (top and a.dest in DJANGO_BASE_DESTS)]
    formatter.add_usage(parser.usage, actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def escape(text: str) -> str:
    """Plain text (an argparse help) as reST text: no accidental inline markup."""
    for char in ("\\", "*", "`", "|", "_"):
        text = text.replace(char, "\\" + char)
    return text


def _sentence(text: str) -> str:
    """Help texts are often fragments; the facts that follow are sentences."""
    text = text.strip()
    if text and text[0].islower():
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return _formatter(parser)._expand_help(action)


def _facts(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Required, repeatable, choices, default and exclusions, as short phrases."""
    facts: list[str] = []
    if action.required and action.option_strings:
        facts.append("Required.")
    if isinstance(action, argparse._AppendAction):
        facts.append("Repeatable.")
    elif action.nargs in ("+", "*"):
        facts.append("Takes several values." if action.option_strings else "Any number of them.")
    if action.choices is not None:
        facts.append("One of " + ", ".join(f"``{c}``" for c in action.choices) + ".")
    default = action.default
    if (
        default not in (None, False, argparse.SUPPRESS, [], "")
        and action.nargs != 0
        and "default" not in (action.help or "")
    ):
        shown = " ".join(map(str, default)) if isinstance(default, list) else str(default)
        facts.append(f"Default: ``{shown}``.")
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            others = [a.option_strings[0] for a in group._group_actions if a is not action]
            facts.append("Not together with " + ", ".join(f"``{o}``" for o in others) + ".")
    return facts


def command_rst(name: str, notes: dict[str, str] | None = None) -> list[str]:
    """The reference of one command (and its subcommands) as reST lines.

    ``notes`` adds text to options by option string or positional name
    (``{"--queue": "Only these queues."}``; ``"archive --queue"`` for one
    subcommand's); a note for an option the command does not have is a
    ``KeyError``, so the notes cannot outlive the options.
    """
    notes = dict(notes or {})
    known = set()
    for program, names in command_options(name).items():
        sub = program[len(name) :].strip()
        known |= {n for n in names} | {f"{sub} {n}" for n in names if sub}
    unknown = sorted(set(notes) - known)
    if unknown:
        raise KeyError(f"{name}: notes for options it does not have: {', '.join(unknown)}")
    lines: list[str] = []
    for program, parser, top in parsers(name):
        if not top:
            lines += [".. rubric:: " + program, ""]
        lines += [f".. program:: {program}", ""]
        if parser.description:
            lines += [escape(parser.description), ""]
        lines += [".. code-block:: text", ""]
        lines += ["   " + line if line else "" for line in usage(parser, top).splitlines()]
        lines.append("")
        subs = _subparsers(parser)
        if subs:
            lines += ["Subcommands: " + ", ".join(f"``{s}``" for s in subs) + " (below).", ""]
        for action in _own_actions(parser, top):
            lines += [f".. option:: {_signature(parser, action)}", ""]
            body = [_sentence(escape(_help(parser, action)))] if _help(parser, action) else []
            sub = program[len(name) :].strip()
            for key in action.option_strings or [_positional_name(action)]:
                for qualified in (key, f"{sub} {key}"):
                    if qualified in notes:
                        body.append(notes[qualified])
            body += _facts(parser, action)
            text = " ".join(part for part in body if part) or "(no description)"
            lines += ["   " + text, ""]
        if top:
            lines += [
                "Django's common options are accepted too: ``--verbosity``, ``--settings``, "
                "``--pythonpath``, ``--traceback``, ``--no-color``, ``--force-color``, "
                "``--skip-checks``, ``--version`` and ``--help``.",
                "",
            ]
    return lines


# -- settings ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    name: str
    value: Any  # the default, as DEFAULTS holds it
    source: str  # the default as written in conf.py
    help: str  # the comment above the key in conf.py


def _conf_file() -> Path:
    from django_delayq import conf

    return Path(str(conf.__file__))


def conf_file() -> str:
    return str(_conf_file())


def settings_entries() -> list[Setting]:
    """Every key of ``conf.DEFAULTS``, in order, with its default and its comment."""
    from django_delayq.conf import DEFAULTS

    path = _conf_file()
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    found: dict[str, Setting] = {}
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target = node.target.id
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            first = node.targets[0]
            target = first.id if isinstance(first, ast.Name) else None
        if target != "DEFAULTS" or not isinstance(node.value, ast.Dict):
            continue
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                continue
            comment: list[str] = []
            index = key.lineno - 2  # the line above the key (0-based)
            while index >= 0 and lines[index].strip().startswith("#"):
                comment.insert(0, lines[index].strip().lstrip("#").strip())
                index -= 1
            source = ast.get_source_segment(text, value) or repr(DEFAULTS[key.value])
            found[key.value] = Setting(
                name=key.value,
                value=DEFAULTS.get(key.value),
                source=" ".join(source.split()),
                help=" ".join(comment),
            )
    missing = [name for name in DEFAULTS if name not in found]
    if missing:
        raise LookupError(f"DEFAULTS keys not found in {path}: {', '.join(missing)}")
    return [found[name] for name in DEFAULTS]


def human_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size and seconds % size == 0:
            amount = int(seconds // size)
            return f"{amount} {unit[:-1] if amount == 1 else unit}"
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    return f"{seconds:g} seconds" if seconds != 1 else "1 second"


def settings_rst() -> list[str]:
    """Every setting as a ``setting`` object (target of the ``setting`` role)."""
    from django_delayq.checks import QUEUE_KEYS
    from django_delayq.conf import DURATION_SETTINGS

    lines: list[str] = []
    for setting in settings_entries():
        default = f"Default: ``{setting.source}``"
        if isinstance(setting.value, timedelta):
            default += f" ({human_duration(setting.value)})"
        elif isinstance(setting.value, int) and not isinstance(setting.value, bool):
            if setting.source != str(setting.value):
                default += f" ({setting.value:,})"
        facts = [default + "."]
        if setting.name in DURATION_SETTINGS:
            facts.append("A duration: a ``timedelta`` or a number of seconds.")
        if setting.name in QUEUE_KEYS:
            facts.append("Can be set per queue, in :setting:`QUEUES`.")
        lines += [f".. setting:: {setting.name}", ""]
        lines += ["   " + " ".join(facts), ""]
        lines += ["   " + (setting.help or "(no description)"), ""]
    return lines
