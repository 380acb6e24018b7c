"""Fixtures of the store's conformance suite."""

from __future__ import annotations

import pytest

from tests.store.tables import TABLES, Table


@pytest.fixture(params=TABLES, ids=lambda t: t.name)
def table(request: pytest.FixtureRequest) -> Table:
    """Each test that takes it runs on ``Message`` and on the ``QueueFields`` model."""
    return request.param
