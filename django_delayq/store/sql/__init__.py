"""The statements the ORM cannot write, named, one file per database where they differ.

Each ``.sql`` file holds blocks like::

    -- name: held_rows
    -- The rows of some ids still running under one lock token.
    {pk} = ANY(%s) AND {lock_token} = %s AND {status} = %s

``statement(name, features)`` returns the block for that database
(``postgresql.sql``, ``sqlite.sql``, ``mysql.sql``), else the shared one
(``common.sql``). Placeholders in braces are table and column names, quoted
by the caller (``str.format``), or fragments that differ by database where a
shared statement names them (``update_conflicts``' ``{distinct}``); ``%s``
are the statement's parameters. Everything else the store sends is compiled
by Django.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from django_delayq.store.features import Features

_BLOCK = re.compile(
    r"^-- name: (?P<name>\w+)\n(?P<doc>(?:--[^\n]*\n)*)(?P<sql>.*?)(?=^-- name: |\Z)", re.M | re.S
)


@cache
def _load(filename: str) -> dict[str, str]:
    text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
    return {m["name"]: m["sql"].strip() for m in _BLOCK.finditer(text)}


def statement(name: str, features: Features) -> str:
    """The text of statement ``name`` for this database."""
    own = _load(f"{features.vendor}.sql")
    if name in own:
        return own[name]
    common = _load("common.sql")
    if name in common:
        return common[name]
    raise KeyError(f"no statement {name!r} for {features.vendor}")


def names(filename: str) -> list[str]:
    """The statements of one file (for the tests that check every one is used)."""
    return list(_load(filename))
