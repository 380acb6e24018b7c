"""Checks of plain values that every entry point shares (enqueue, handlers, cron, the
admin's operations, the settings' checks), so that one bad value gets one message
wherever it comes in."""

from __future__ import annotations

import re
from typing import TypeGuard

#: A lone surrogate (``"\\ud800"``, what ``surrogateescape`` makes of bytes that are no
#: UTF-8): Python holds it in a str, but it is no text any database stores.
SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written as ``\\udXXX``: storable text, whatever
    ``text`` holds (an exception's message, a traceback)."""
    if SURROGATE.search(text) is None:
        return text
    return SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def check_text(
    value: object, name: str, max_length: int, where: str = "", *, nul: bool = False
) -> str:
    """``value`` if it is a str of at most ``max_length`` characters (and, with ``nul``,
    no NUL character: PostgreSQL's text cannot hold one), and no lone surrogate (no
    database stores one), else a ``TypeError`` or ``ValueError`` that names ``name``
    (after ``where``)."""
    if not isinstance(value, str):
        raise TypeError(f"{where}{name} must be a str, got {type(value).__name__}")
    if len(value) > max_length:
        raise ValueError(f"{where}{name} is {len(value)} characters, over {max_length}")
    if nul and "\x00" in value:
        raise ValueError(f"{where}{name} contains a NUL character (\\x00)")
    found = SURROGATE.search(value)
    if found is not None:
        raise ValueError(
            f"{where}{name} contains a lone surrogate ({escape_surrogates(found.group())} at "
            f"character {found.start()}), which is no UTF-8 text and no database stores"
        )
    return value


def is_int_between(value: object, low: int, high: int) -> TypeGuard[int]:
    """Whether ``value`` is an int (a bool is not) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
