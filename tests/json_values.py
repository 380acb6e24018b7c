"""Every kind of JSON value, for the payload round-trip tests.

A payload is any JSON value, and it must come back as it was given: the
same value of the same type (``True``, not ``1``; the string ``"123"``, not
the number; ``None`` for ``null``). The strings that look like other JSON
values catch a payload written as SQL text instead of JSON text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

JSON_VALUES = [
    pytest.param({"b": [1, "x"], "a": {"on": True, "off": None}}, id="object"),
    pytest.param([1, "two", 3.5, False, None, {}], id="array"),
    pytest.param("hello", id="string"),
    pytest.param("123", id="numeric-string"),
    pytest.param("", id="empty-string"),
    pytest.param("true", id="string-true"),
    pytest.param("null", id="string-null"),
    pytest.param('"quoted"', id="string-quoted"),
    pytest.param(" 7 ", id="string-spaced-number"),
    pytest.param("Zoë ✓", id="string-unicode"),
    pytest.param(42, id="integer"),
    pytest.param(0, id="zero"),
    pytest.param(2**64 + 1, id="big-integer"),
    pytest.param(1.5, id="float"),
    pytest.param(True, id="true"),
    pytest.param(False, id="false"),
    pytest.param(None, id="null"),
]


def exact(value: Any) -> tuple[type, str]:
    """``value`` told apart from every other JSON value, its type included.

    ``True == 1`` and ``{"a": True} == {"a": 1}`` in Python, but not here.
    Keys are sorted: PostgreSQL's jsonb keeps its own key order.
    """
    return type(value), json.dumps(value, sort_keys=True)
