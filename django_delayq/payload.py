"""Checking payloads before they are written.

A payload must survive a round trip through every supported database's JSON
column unchanged, so it is checked here, at enqueue time, where the caller
can still fix it: a worker must never meet a payload it cannot decode.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django_delayq.conf import get_config

JSONScalar = str | int | float | bool | None


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


def encode_payload(payload: Any, where: str = "") -> str:
    """Check ``payload`` and return its JSON text (what the database will store).

    Refused: anything JSON cannot hold (with its type and path), non-string
    keys, NaN and infinities (not JSON, and PostgreSQL's jsonb rejects them),
    the NUL character, which PostgreSQL's jsonb cannot store (rather than
    silently altering the text, the caller is told where it is), a payload
    that contains itself, and one nested too deeply for JSON.

    ``json.dumps`` runs first (in C): it refuses cycles, so the walk that
    follows, which checks what ``json.dumps`` lets through (keys that are not
    strings, NUL), never meets one and keeps no record of where it is. Only
    when ``json.dumps`` fails does the walk run with that record, to name
    the offending path: a shared value that is no cycle stays accepted.
    """
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        _walk(payload, where, cycles=True)
        if isinstance(exc, RecursionError):
            raise ValueError(f"{where}payload is nested too deeply to encode as JSON") from None
        raise ValueError(f"{where}payload cannot be encoded as JSON: {exc}") from exc
    _walk(payload, where, cycles=False)
    limit = get_config()["MAX_PAYLOAD_SIZE"]
    if limit and len(text) * 4 > limit:  # cheap bound first: UTF-8 is at most 4 bytes a char
        size = len(text.encode())
        if size > limit:
            raise ValueError(
                f"{where}payload is {size} bytes encoded, over DELAYQ['MAX_PAYLOAD_SIZE'] ({limit})"
            )
    return text


# Pushed after a container's items when the walk looks for cycles: popping it
# means the container's items are done, so the container is no longer open.
_CLOSE = object()


def _walk(payload: Any, where: str, *, cycles: bool) -> None:
    """Raise ``TypeError``/``ValueError`` for the first value the database cannot store.

    With ``cycles``, it also keeps the containers it is inside of (those on the
    path from the top), and refuses a value that is one of them. A container
    referred to twice but not from inside itself is no cycle, and is accepted.
    """
    stack: list[tuple[Any, Any]] = [(payload, None)]
    open_containers: dict[int, Trail] = {}
    while stack:
        value, trail = stack.pop()
        if value is None or isinstance(value, bool | int):
            continue
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError(
                    f"{where}{_path(trail)} contains a NUL character (\\x00), which "
                    "PostgreSQL's JSON type cannot store; encode or strip it first"
                )
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"{where}{_path(trail)} is {value!r}, which JSON cannot hold")
            continue
        if cycles and isinstance(value, dict | list | tuple):
            if id(value) in open_containers:
                outer = open_containers[id(value)]
                raise ValueError(
                    f"{where}{_path(trail)} refers to {_path(outer)}, which contains it: "
                    "a payload cannot contain itself"
                )
            open_containers[id(value)] = trail
            stack.append((_CLOSE, id(value)))
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(
                        f"{where}{_path(trail)} has a key of type {type(k).__name__} "
                        f"({k!r}); JSON object keys must be strings"
                    )
                if "\x00" in k:
                    raise ValueError(f"{where}{_path(trail)} has a key containing NUL (\\x00)")
                stack.append((v, (trail, k)))
            continue
        if isinstance(value, list | tuple):
            stack.extend((v, (trail, i)) for i, v in enumerate(value))
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
