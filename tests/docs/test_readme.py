"""The README is a landing page: short, and its links into the documentation work."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_stays_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_the_readmes_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local
    assert not [link for link in local if not (ROOT / link).exists()]


def test_the_two_commands_are_there() -> None:
    text = README.read_text()
    assert "$ make demo    #" in text
    assert "$ make test    #" in text
