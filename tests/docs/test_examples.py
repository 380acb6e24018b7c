"""The Python examples of the tutorial and the how-to guides run (see ``examples.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.docs import examples


def _delayq() -> object:
    from django_delayq.testing import DelayQ

    return DelayQ()


@pytest.mark.parametrize("page", examples.pages(), ids=lambda p: str(p.relative_to(examples.DOCS)))
def test_the_page_examples_run(page: Path, transactional_db: None) -> None:
    examples.run_page(page, fixtures={"delayq": _delayq, "settings": _settings})


@contextmanager
def _settings() -> Iterator[Any]:
    """pytest-django's ``settings`` fixture: changes are undone after the example's test."""
    from pytest_django.fixtures import SettingsWrapper

    wrapper = SettingsWrapper()
    try:
        yield wrapper
    finally:
        wrapper.finalize()


def test_the_pages_have_runnable_examples() -> None:
    """The runner finds the pages and their blocks; few are left out."""
    found = {
        p.relative_to(examples.DOCS).as_posix(): examples.python_blocks(p) for p in examples.pages()
    }
    assert "tutorial.md" in found
    assert len(found) >= 8, sorted(found)
    blocks = [b for bs in found.values() for b in bs]
    skipped = [b for b in blocks if b.skip]
    assert len(blocks) >= 40
    assert len(skipped) <= len(blocks) // 4, [b.where for b in skipped]


def test_the_block_parser_reads_fences_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n"
        "```python\nx = 1\n```\n\n"
        "<!-- no-test: a placeholder -->\n"
        "```python\nnot python at all\n```\n\n"
        "````markdown\n```python\ninside = 'a nested fence'\n```\n````\n\n"
        "```console\n$ echo no\n```\n"
        "```python\n# shop/models.py\ny = 2\n```\n"
    )
    blocks = examples.python_blocks(page)
    assert [(b.line, b.skip, b.header) for b in blocks] == [
        (4, False, None),
        (9, True, None),
        (22, False, "shop/models.py"),
    ]
    assert blocks[0].code == "x = 1\n"


def test_an_example_on_a_queue_of_the_suite_is_refused(tmp_path: Path, transactional_db: None):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\n# clash/handlers.py\nfrom django_delayq import handler\n\n\n"
        '@handler("atomic", kind="docs-example")\ndef clash(message):\n    pass\n```\n'
    )
    with pytest.raises(AssertionError, match="the test suite's queue"):
        examples.run_page(page, fixtures={})
    from django_delayq.registry import registry

    assert not [s for s in registry.all() if s.kind == "docs-example"]  # undone


def test_a_failing_example_names_its_page_and_line(tmp_path: Path, transactional_db: None):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 1\nassert x == 2\n```\n")
    with pytest.raises(AssertionError) as failure:
        examples.run_page(page, fixtures={})
    assert f"in the example at {page}:4" in failure.value.__notes__
    assert failure.traceback[-1].lineno + 1 == 5  # the page's own line
