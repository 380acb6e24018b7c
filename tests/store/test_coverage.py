"""Every change the store makes has its tests in this directory.

Each module of ``store/`` that changes queued rows has its contract in
``test_<module>.py``: a new public function there needs a test there that
calls it (``<module>.<name>(``), on every database the suite runs on.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MODULES = [
    "columns",
    "claim",
    "settle",
    "leases",
    "groups",
    "operators",
    "queue_fields",
    "retention",
    "ticks",
]
# The building blocks the other modules share, tested through every change they
# serve rather than on their own.
SHARED = {
    "columns": {"db_alias", "model_field", "quote_names", "inlined"},
    "settle": {"update_held", "ending"},
}


@pytest.mark.parametrize("name", MODULES)
def test_every_public_function_of_a_change_module_has_a_test_of_its_own(name: str) -> None:
    module = importlib.import_module(f"django_delayq.store.{name}")
    source = (HERE / f"test_{name}.py").read_text()
    public = [
        function
        for function, value in vars(module).items()
        if inspect.isfunction(value)
        and value.__module__ == module.__name__
        and not function.startswith("_")
        and function not in SHARED.get(name, set())
    ]
    assert public
    untested = [function for function in public if f"{name}.{function}(" not in source]
    assert not untested
