"""The reference pages cover the code: every setting, command option, check, signal, metric.

The settings and commands references are generated (``docs/_ext``); these
tests read the code independently of the generator and compare. When
``DELAYQ_DOCS_HTML`` names a built site (``make docs`` sets it), the built
pages are checked too.
"""

from __future__ import annotations

import argparse
import ast
import html
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "django_delayq"
sys.path.insert(0, str(DOCS / "_ext"))

import delayq_reference as reference  # noqa: E402

DJANGO_BASE = reference.DJANGO_BASE_DESTS


def command_files() -> list[str]:
    folder = PACKAGE / "management" / "commands"
    return sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")


def own_options(name: str) -> dict[str, set[str]]:
    """Every option string and positional of a command's parsers, read from argparse."""
    from django.core.management import load_command_class

    parser = load_command_class("django_delayq", name).create_parser("manage.py", name)
    found: dict[str, set[str]] = {}
    todo: list[tuple[str, argparse.ArgumentParser, bool]] = [(name, parser, True)]
    while todo:
        program, current, top = todo.pop()
        names: set[str] = set()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    names.add(sub)
                    todo.append((f"{program} {sub}", subparser, False))
            elif isinstance(action, argparse._HelpAction) or (top and action.dest in DJANGO_BASE):
                continue
            elif action.option_strings:
                names |= set(action.option_strings)
            else:
                names.add(action.metavar or action.dest.upper())
        found[program] = names
    return found


# -- settings ---------------------------------------------------------------------------------


def test_every_setting_has_an_entry_with_its_default_and_an_explanation() -> None:
    from django_delayq.conf import DEFAULTS

    text = "\n".join(reference.settings_rst())
    entries = {s.name: s for s in reference.settings_entries()}
    assert list(entries) == list(DEFAULTS)
    for name, value in DEFAULTS.items():
        assert f".. setting:: {name}\n" in text, name
        assert entries[name].value == value
        assert entries[name].help, f"DEFAULTS[{name!r}] has no comment above it in conf.py"


def test_the_settings_page_renders_the_generated_reference() -> None:
    assert ".. delayq-settings::" in (DOCS / "reference" / "settings.md").read_text()


def test_a_setting_without_a_comment_is_caught(tmp_path: Path, monkeypatch) -> None:
    conf = tmp_path / "conf.py"
    conf.write_text(
        "DEFAULTS = {\n    # Documented.\n    'LEASE': 60,\n    'POLL_INTERVAL': 5,\n}\n"
    )
    monkeypatch.setattr(reference, "_conf_file", lambda: conf)
    monkeypatch.setattr(
        "django_delayq.conf.DEFAULTS", {"LEASE": 60, "POLL_INTERVAL": 5}, raising=True
    )
    entries = {s.name: s.help for s in reference.settings_entries()}
    assert entries == {"LEASE": "Documented.", "POLL_INTERVAL": ""}


# -- management commands ----------------------------------------------------------------------


def test_every_command_has_its_reference_entry() -> None:
    page = (DOCS / "reference" / "commands.md").read_text()
    documented = set(re.findall(r"^\.\. delayq-command:: (\w+)$", page, flags=re.M))
    assert documented == set(command_files())
    assert reference.command_names() == command_files()


@pytest.mark.parametrize("name", command_files())
def test_every_option_of_the_command_is_in_its_reference(name: str) -> None:
    text = "\n".join(reference.command_rst(name))
    options = own_options(name)
    assert set(options) == set(reference.command_options(name))
    for program, names in options.items():
        assert f".. program:: {program}\n" in text
        section = text.split(f".. program:: {program}\n", 1)[1].split(".. program::", 1)[0]
        signatures = re.findall(r"^\.\. option:: (.+)$", section, flags=re.M)
        shown = {part.split()[0] for sig in signatures for part in sig.split(", ")}
        missing = {n for n in names if n not in shown and f"``{n}``" not in section}
        assert not missing, f"{program}: not in the reference: {sorted(missing)}"


def test_notes_for_options_a_command_does_not_have_are_refused() -> None:
    with pytest.raises(KeyError, match="--no-such-option"):
        reference.command_rst("run_delayq", {"--no-such-option": "text"})


# -- checks, signals, metrics, logs -------------------------------------------------------------


def test_every_system_check_id_is_in_the_checks_page() -> None:
    ids: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        ids |= set(re.findall(r"django_delayq\.[EW]\d{3}", path.read_text()))
    page = (DOCS / "reference" / "checks.md").read_text()
    assert ids, "no check ids found in the code"
    assert not {i for i in ids if f"`{i}`" not in page}


def test_every_signal_is_in_the_signals_page() -> None:
    from django_delayq import signals

    page = (DOCS / "reference" / "signals.md").read_text()
    for name in signals.__all__:
        assert f"py:data:: {name}\n" in page, name
        assert f"signals.{name}`" in page, name


def test_every_metric_and_log_field_is_in_the_metrics_page() -> None:
    from django_delayq import logs

    source = (PACKAGE / "metrics.py").read_text()
    tree = ast.parse(source)
    names = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"delayq_[a-z_]+", node.value)
    }
    page = (DOCS / "reference" / "metrics.md").read_text()
    assert names
    # Counters are exposed with _total, info metrics with _info.
    missing = {
        n for n in names if not any(f"`{n}{suffix}" in page for suffix in ("", "_total", "_info"))
    }
    assert not missing
    assert not {f for f in logs.FIELDS if f"`{f}`" not in page}


# -- the built site (make docs) ------------------------------------------------------------------


def built_page(relative: str) -> str:
    root = os.environ.get("DELAYQ_DOCS_HTML")
    if not root:
        pytest.skip("DELAYQ_DOCS_HTML is not set: make docs checks the built site")
    return html.unescape((Path(root) / relative).read_text())


def test_the_built_settings_page_has_every_setting() -> None:
    from django_delayq.conf import DEFAULTS

    page = built_page("reference/settings.html")
    assert not {n for n in DEFAULTS if f'id="setting-{n}"' not in page}


def test_the_built_commands_page_has_every_option() -> None:
    page = built_page("reference/commands.html")
    for name in command_files():
        for program, names in own_options(name).items():
            prefix = f"cmdoption-{program.replace(' ', '-')}-"
            for option in names:
                if option.startswith("-"):
                    assert f'id="{prefix}{option.lstrip("-")}"' in page, f"{program} {option}"
                elif option.isupper():  # a positional argument
                    assert f'id="{prefix}arg-{option}"' in page, f"{program} {option}"
                else:  # a subcommand
                    assert f'id="cmdoption-{program}-{option}-' in page.replace(" ", "-") or (
                        f"{program} {option}" in page
                    ), f"{program} {option}"


def test_the_statement_size_of_enqueue_many_is_the_codes() -> None:
    from django_delayq.store import write

    page = (DOCS / "howto" / "producing.md").read_text()
    assert f"up to {write.CHUNK_ROWS:,} messages per statement" in page


def test_the_pytest_fixture_documented_by_hand_exists() -> None:
    from django_delayq import pytest_plugin

    page = (DOCS / "reference" / "api.md").read_text()
    assert ".. py:function:: delayq()\n   :module: django_delayq.pytest_plugin" in page
    assert callable(pytest_plugin.delayq)
