"""The ``delayq`` pytest fixture (loaded through the ``pytest11`` entry point).

Kept apart from :mod:`django_delayq.testing` so that loading the plugin
imports nothing of Django: pytest loads it before Django is configured, and
in every project that merely has django-delayq installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_delayq.testing import DelayQ


@pytest.fixture
def delayq(db: None) -> Iterator[DelayQ]:
    """Run due messages in-process, assert on enqueued ones, move the queue's clock.

    Requests pytest-django's ``db`` (``transactional_db`` wins when the test
    asks for it too). The queue's clock is restored after the test.
    """
    from django_delayq.testing import DelayQ

    with DelayQ() as helper:
        yield helper
