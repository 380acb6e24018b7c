"""Checks of plain values that every entry point shares (enqueue, handlers, cron, the
admin's operations, the settings' checks), so that one bad value gets one message
wherever it comes in."""

from __future__ import annotations

from typing import TypeGuard


def check_text(
    value: object, name: str, max_length: int, where: str = "", *, nul: bool = False
) -> str:
    """``value`` if it is a str of at most ``max_length`` characters (and, with ``nul``,
    no NUL character: PostgreSQL's text cannot hold one), else a ``TypeError`` or
    ``ValueError`` that names ``name`` (after ``where``)."""
    if not isinstance(value, str):
        raise TypeError(f"{where}{name} must be a str, got {type(value).__name__}")
    if len(value) > max_length:
        raise ValueError(f"{where}{name} is {len(value)} characters, over {max_length}")
    if nul and "\x00" in value:
        raise ValueError(f"{where}{name} contains a NUL character (\\x00)")
    return value


def is_int_between(value: object, low: int, high: int) -> TypeGuard[int]:
    """Whether ``value`` is an int (a bool is not) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
