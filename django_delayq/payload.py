"""Checking payloads before they are written.

A payload must survive a round trip through every supported database's JSON
column unchanged, so it is checked here, at enqueue time, where the caller
can still fix it: a worker must never meet a payload it cannot decode.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from django_delayq.conf import get_config
from django_delayq.values import SURROGATE, escape_surrogates

JSONScalar = str | int | float | bool | None

#: How deeply arrays and objects may nest in a payload: ``[]`` and ``{"a": 1}``
#: are 1 deep, ``{"a": [1]}`` 2, a scalar 0. MariaDB refuses JSON nested 32
#: deep or more, and a payload is written inside a document of its own
#: (a batch's rows) and searched with JSON functions, so every database is
#: held to this one limit, checked before anything is written.
MAX_PAYLOAD_DEPTH = 20

# A float in exponent notation, as ``repr`` writes it (``1e+16``, ``5e-324``):
# searched in the encoded text, where a string's text may match too, which
# only costs a second encoding.
_EXPONENT = re.compile(r"[0-9]e[-+][0-9]")


def _has_exponent(text: str) -> bool:
    # The substrings first: a search of them is many times quicker than the pattern's.
    return ("e+" in text or "e-" in text) and _EXPONENT.search(text) is not None


# Where a value sits in the payload: (parent trail, key or index), or None at
# the top. Kept as links and only spelled out for an error message, because
# formatting a path for every value cost more than encoding the payload.
Trail = tuple["Trail", object] | None


def _path(trail: Trail) -> str:
    steps: list[str] = []
    while trail is not None:
        trail, step = trail
        steps.append(f"[{step}]" if isinstance(step, int) else f"[{step!r}]")
    return "payload" + "".join(reversed(steps))


def check_payload(payload: Any, where: str = "") -> int:
    """Raise ``TypeError``/``ValueError`` naming the offending path; return the encoded size."""
    return len(encode_payload(payload, where).encode())


def encode_payload(payload: Any, where: str = "", *, max_size: int | None = None) -> str:
    """Check ``payload`` and return its JSON text (what the database will store).

    Refused: anything JSON cannot hold (with its type and path), non-string
    keys, NaN and infinities (not JSON, and PostgreSQL's jsonb rejects them),
    the NUL character, which PostgreSQL's jsonb cannot store (rather than
    silently altering the text, the caller is told where it is), a lone
    surrogate (``"\\ud800"``: no UTF-8 text, so no database stores it),
    ``-0.0`` (jsonb's numbers have no negative zero: it would come back as
    ``0.0``), a payload that contains itself, and one nested deeper than
    :data:`MAX_PAYLOAD_DEPTH`.

    Floats are written so that every database gives them back as the same
    float: never in exponent notation, and always with a fraction
    (``10000000000000000.0`` for ``1e16``), because jsonb keeps a number's
    digits, not its notation, and a number without a fraction reads back as
    an int.

    ``json.dumps`` runs first (in C): it refuses cycles, so the walk that
    follows, which checks what ``json.dumps`` lets through (keys that are not
    strings, NUL), never meets one and keeps no record of where it is. Only
    when ``json.dumps`` fails does the walk run with that record, to name
    the offending path: a shared value that is no cycle stays accepted.

    ``max_size``: the most bytes the encoded text may take (None:
    ``DELAYQ["MAX_PAYLOAD_SIZE"]``; 0: any, and no settings are read, as on
    a Spark executor).
    """
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        _walk(payload, where, cycles=True)
        if isinstance(exc, RecursionError):
            raise _too_deep(where, "payload", None) from None
        raise ValueError(f"{where}payload cannot be encoded as JSON: {exc}") from exc
    try:
        # Far quicker than a search for them: only a lone surrogate fails.
        data: bytes | None = text.encode()
    except UnicodeEncodeError:
        data = None
    _walk(payload, where, cycles=False, surrogates=data is None)
    if _has_exponent(text):
        text = _encode(payload)
        data = None
    limit = get_config()["MAX_PAYLOAD_SIZE"] if max_size is None else max_size
    if limit and len(text) * 4 > limit:  # cheap bound first: UTF-8 is at most 4 bytes a char
        size = len(text.encode() if data is None else data)
        if size > limit:
            raise ValueError(
                f"{where}payload is {size} bytes encoded, over DELAYQ['MAX_PAYLOAD_SIZE'] ({limit})"
            )
    return text


# Pushed after a container's items when the walk looks for cycles: popping it
# means the container's items are done, so the container is no longer open.
_CLOSE = object()


def dumps(value: Any) -> str:
    """``value``'s JSON text as payloads are written (floats as :func:`encode_payload`
    writes them), unchecked: for values checked already, or not stored."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if _has_exponent(text):
        try:
            text = _encode(value)
        except RecursionError:
            pass
    return text


def decode_payload(text: str | bytes, where: str = "", *, max_size: int | None = None) -> Any:
    """The payload of a JSON text, checked as :func:`encode_payload` checks one
    (``max_size``: as there; 0 checks no size, and needs no settings).

    A ``ValueError`` names what is wrong: not JSON (with the position),
    nested deeper than :data:`MAX_PAYLOAD_DEPTH` (found before the parser
    recurses into it), or a value :func:`encode_payload` refuses.
    """
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8", "surrogateescape")
    check_text_depth(text, where)
    try:
        value = json.loads(text)
    except RecursionError:  # not reached: the depth is bounded above
        raise _too_deep(where, "payload", None) from None
    except ValueError as exc:
        raise ValueError(f"{where}payload is not valid JSON: {exc}") from None
    encode_payload(value, where, max_size=max_size)
    return value


def check_text_depth(text: str, where: str = "") -> None:
    """A ``ValueError`` naming :data:`MAX_PAYLOAD_DEPTH` if arrays and objects nest deeper
    than it in the JSON ``text`` (read without parsing it: no recursion)."""
    depth = _text_depth(text)
    if depth > MAX_PAYLOAD_DEPTH:
        raise _too_deep(where, "payload", depth)


# What opens or closes a container outside a string, and a whole string
# (skipped: brackets in it count for nothing).
_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def _text_depth(text: str) -> int:
    """How deeply arrays and objects nest in a JSON text (a guess for text that is not
    JSON, which the parser then refuses)."""
    if "[" not in text and "{" not in text:
        return 0
    depth = deepest = 0
    for match in _STRUCTURE.finditer(text):
        char = match.group()[0]
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_PAYLOAD_DEPTH:
                    return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def _too_deep(where: str, what: str, depth: int | None) -> ValueError:
    found = "" if depth is None else f" ({depth} or more levels)"
    return ValueError(
        f"{where}{what} is nested deeper than MAX_PAYLOAD_DEPTH ({MAX_PAYLOAD_DEPTH} levels of "
        f"arrays and objects){found}"
    )


def _float_text(value: float) -> str:
    """A float's shortest digits, written out without an exponent and with a fraction."""
    text = repr(value)
    if "e" in text:
        text = format(Decimal(text), "f")
    if "." not in text and text[-1:].isdigit():
        text += ".0"
    return text


def _encode(value: Any) -> str:
    """``json.dumps`` (compact, not ASCII), but floats as :func:`_float_text` writes them."""
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(
                f"{json.dumps(k, ensure_ascii=False)}:{_encode(v)}" for k, v in value.items()
            )
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _walk(payload: Any, where: str, *, cycles: bool, surrogates: bool = True) -> None:
    """Raise ``TypeError``/``ValueError`` for the first value the database cannot store.

    With ``cycles``, it also keeps the containers it is inside of (those on the
    path from the top), and refuses a value that is one of them. A container
    referred to twice but not from inside itself is no cycle, and is accepted.
    ``surrogates``: look for lone surrogates in strings and keys (the caller
    knows there are none when the whole text has none).
    """
    stack: list[tuple[Any, Any, int]] = [(payload, None, 0)]
    open_containers: dict[int, Trail] = {}
    while stack:
        value, trail, depth = stack.pop()
        if value is None or isinstance(value, bool | int):
            continue
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError(
                    f"{where}{_path(trail)} contains a NUL character (\\x00), which "
                    "PostgreSQL's JSON type cannot store; encode or strip it first"
                )
            if surrogates and SURROGATE.search(value):
                raise _surrogate(where, _path(trail), value)
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"{where}{_path(trail)} is {value!r}, which JSON cannot hold")
            if value == 0 and math.copysign(1.0, value) < 0:
                raise ValueError(
                    f"{where}{_path(trail)} is -0.0, which PostgreSQL's JSON type stores "
                    "as 0.0; pass 0.0"
                )
            continue
        if isinstance(value, dict | list | tuple):
            depth += 1
            if depth > MAX_PAYLOAD_DEPTH:
                raise _too_deep(where, _path(trail), None)
        if cycles and isinstance(value, dict | list | tuple):
            if id(value) in open_containers:
                outer = open_containers[id(value)]
                raise ValueError(
                    f"{where}{_path(trail)} refers to {_path(outer)}, which contains it: "
                    "a payload cannot contain itself"
                )
            open_containers[id(value)] = trail
            stack.append((_CLOSE, id(value), 0))
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(
                        f"{where}{_path(trail)} has a key of type {type(k).__name__} "
                        f"({k!r}); JSON object keys must be strings"
                    )
                if "\x00" in k:
                    raise ValueError(f"{where}{_path(trail)} has a key containing NUL (\\x00)")
                if surrogates and SURROGATE.search(k):
                    raise _surrogate(where, f"{_path(trail)} has a key that", k)
                stack.append((v, (trail, k), depth))
            continue
        if isinstance(value, list | tuple):
            stack.extend((v, (trail, i), depth) for i, v in enumerate(value))
            continue
        if value is _CLOSE:
            del open_containers[trail]
            continue
        kind = type(value)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        raise TypeError(
            f"{where}{_path(trail)} is of type {name}, "
            "which is not JSON-serialisable (use str, int, float, bool, None, list or dict)"
        )


def _surrogate(where: str, what: str, text: str) -> ValueError:
    found = SURROGATE.search(text)
    assert found is not None
    return ValueError(
        f"{where}{what} contains a lone surrogate ({escape_surrogates(found.group())} at "
        f"character {found.start()}), which is no UTF-8 text and no database stores; "
        "decode the text it came from properly, or escape it"
    )
