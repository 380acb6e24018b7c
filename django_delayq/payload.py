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
    and the NUL character, which PostgreSQL's jsonb cannot store; rather than
    silently altering the text, the caller is told where it is.
    """
    stack: list[tuple[Any, Trail]] = [(payload, None)]
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
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    limit = get_config()["MAX_PAYLOAD_SIZE"]
    if limit and len(text) * 4 > limit:  # cheap bound first: UTF-8 is at most 4 bytes a char
        size = len(text.encode())
        if size > limit:
            raise ValueError(
                f"{where}payload is {size} bytes encoded, over DELAYQ['MAX_PAYLOAD_SIZE'] ({limit})"
            )
    return text
