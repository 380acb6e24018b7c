"""The outcomes of held rows: acknowledged, failed (or retried later), snoozed.

A worker's changes (ack, fail, snooze here; release and extend in
``leases``) are compare-and-set statements on ``(id, lock_token)`` with
``status = 'running'`` (:func:`update_held`): a worker whose lease expired,
and whose row was claimed again by someone else, can no longer change it.
An attempt's end leaves the newer version of its message due if one waits
(:func:`ending`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Hashable, Iterable, Mapping
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import OperationalError, connections, transaction
from django.db.models import Case, F, Field, Model, Q, Value, When
from django.db.models.sql.subqueries import UpdateQuery

from django_delayq import clock
from django_delayq.fingerprint import fingerprint
from django_delayq.models import Message
from django_delayq.status import Status
from django_delayq.store import dependencies, direct
from django_delayq.store.columns import db_alias, fit, has_column, inlined, model_field, quote_names
from django_delayq.store.features import features
from django_delayq.store.sql import statement

# What an attempt's end leaves when a newer version of its message waits
# (enqueue with on_conflict="update" while it ran): that version, due at its
# scheduled time, from its first attempt. Whatever the attempt's outcome,
# the message is not finished: it has a version still to run.
_NEWER_VERSION: dict[str, Any] = {
    "status": Status.PENDING,
    "next_attempt_time": F("scheduled_time"),
    "attempt_count": 0,
    "max_attempts": F("max_attempts"),
    "finished_at": None,
    "lock_token": None,
    "superseded_at": None,
}


def ending(model: type[Model], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` that end an attempt, made to leave a waiting newer version due."""
    out = dict(changes)
    if "status" not in changes or not has_column(model, "superseded_at"):
        return out
    waiting = Q(superseded_at__isnull=False)
    for name, newer in _NEWER_VERSION.items():
        field = model_field(model, name)
        out[name] = Case(
            When(waiting, then=_as_expression(newer, field)),
            default=_as_expression(changes.get(name, F(name)), field),
            output_field=field,
        )
    # superseded_at last: MySQL evaluates SET assignments in order, and every
    # CASE above must see the column as it was.
    out["superseded_at"] = out.pop("superseded_at")
    return out


def _as_expression(value: Any, field: Field[Any, Any]) -> Any:
    return value if hasattr(value, "resolve_expression") else Value(value, output_field=field)


def update_held(
    ids: Iterable[Any],
    token: uuid.UUID,
    changes: Mapping[str, Any],
    *,
    using: str | None,
    model: type[Model],
    returning: bool = False,
    same_as: Hashable = None,
    skip_locked: bool = False,
) -> Any:
    """Apply ``changes`` to the rows of ``ids`` still held under ``token``, in one statement.

    Returns how many rows changed, or with ``returning`` the set of their
    ids. Django compiles the SET clause (field preparation, the database
    clock, ``F()``); the WHERE clause (``held_rows``) is written once per
    table, because building it with the ORM cost more CPU than the whole
    round trip: a profile of ``atomic=True`` handlers put half of the
    worker's CPU per message in ``QuerySet.filter`` and its compilation for
    the acknowledgement. ``same_as`` names changes that are the same on
    every call (an acknowledgement), so their compiled SET clause is kept.
    ``skip_locked`` leaves out rows another transaction has locked instead
    of waiting for them: the worker's own housekeeping must never wait for
    a group of atomic handlers to commit.
    """
    ids = list(ids)
    if not ids:
        return set() if returning else 0
    alias = db_alias(using, model)
    connection = connections[alias]
    can = features(connection)
    locks = connection.features.has_select_for_update
    no_wait = skip_locked and can.no_wait and not returning
    if (returning and not can.returning) or (
        skip_locked and locks and not can.skip_locked_subquery and not no_wait
    ):
        # MariaDB/MySQL: lock the rows still held (skipping those another
        # transaction holds, if asked), then change exactly those.
        with transaction.atomic(using=alias):
            held = model._base_manager.using(alias).filter(
                pk__in=ids, lock_token=token, status=Status.RUNNING
            )
            mine = set(held.select_for_update(skip_locked=skip_locked).values_list("pk", flat=True))
            if mine:
                update_held(mine, token, changes, using=alias, model=model, same_as=same_as)
        return mine if returning else len(mine)
    sql, params = _held_update(
        ids, token, changes, alias, model, same_as, skip_locked=skip_locked, returning=returning
    )
    if no_wait:
        return _without_waiting(connection, sql, params)
    # The same text again and again when its changes are (an acknowledgement's).
    again = same_as is not None and len(ids) <= direct.PREPARED_ROWS
    if returning:
        return {row[0] for row in direct.fetch(connection, sql, params, prepare=again)}
    return direct.execute(connection, sql, params, prepare=again)


def _held_update(
    ids: list[Any],
    token: uuid.UUID,
    changes: Mapping[str, Any],
    alias: str,
    model: type[Model],
    same_as: Hashable,
    *,
    skip_locked: bool,
    returning: bool,
) -> tuple[str, list[Any]]:
    """``UPDATE <table> SET <changes> WHERE <held_rows>`` and its parameters."""
    connection = connections[alias]
    can = features(connection)
    sql, set_params = _set_clause(model, alias, changes, same_as)
    if can.array_parameters:
        id_params: list[Any] = [ids]
    else:
        pk = model_field(model, "pk")
        id_params = [pk.get_db_prep_value(i, connection) for i in ids]
    where = _held_where(
        model,
        connection,
        0 if can.array_parameters else len(ids),
        unlocked=skip_locked and can.skip_locked_subquery,
        returning=returning,
    )
    params = [
        *set_params,
        *id_params,
        model_field(model, "lock_token").get_db_prep_value(token, connection),
    ]
    return sql + where, params


def _without_waiting(connection: Any, sql: str, params: list[Any]) -> int:
    """Run ``sql`` (an ``UPDATE``) unless a row it would change is locked by another
    transaction: then nothing changes and it returns 0, as for rows no longer held
    (MariaDB/MySQL: a lock wait timeout of 0 for this one statement).

    The caller tells the two apart by reading the rows (:func:`leases.states`).
    """
    can = features(connection)
    if connection.mysql_is_mariadb:
        text = statement("no_wait_mariadb", can).format(sql=sql)
    else:
        verb, rest = sql.split(" ", 1)
        text = statement("no_wait_mysql", can).format(verb=verb, rest=rest)
    try:
        with connection.cursor() as cursor:
            cursor.execute(text, params)
            return int(cursor.rowcount)
    except OperationalError as exc:
        if exc.args and exc.args[0] == LOCK_WAIT_TIMEOUT:
            return 0
        raise


# MariaDB's and MySQL's error "Lock wait timeout exceeded".
LOCK_WAIT_TIMEOUT = 1205


def _held_where(
    model: type[Model], connection: Any, ids: int, *, unlocked: bool, returning: bool
) -> str:
    """`` WHERE <held_rows> [RETURNING pk]`` (``ids`` placeholders; 0: one array), kept."""
    key = (model, type(connection), ids, unlocked, returning)
    text = _held_wheres.get(key)
    if text is None:
        quoted = quote_names(model, connection, "pk", "lock_token", "status")
        name = "held_rows_unlocked" if unlocked else "held_rows"
        condition = statement(name, features(connection)).format(
            ids=", ".join(["%s"] * ids), **quoted
        )
        text = f" WHERE {condition}" + (f" RETURNING {quoted['pk']}" if returning else "")
        if len(_held_wheres) < 1024:  # one per batch size where ids are placeholders
            _held_wheres[key] = text
    return text


_held_wheres: dict[tuple[Any, ...], str] = {}


_set_clauses: dict[tuple[Hashable, type[Model], str], tuple[str, tuple[Any, ...]]] = {}


def _set_clause(
    model: type[Model], alias: str, changes: Mapping[str, Any], same_as: Hashable
) -> tuple[str, tuple[Any, ...]]:
    """``UPDATE <table> SET ...`` and its parameters, compiled by Django.

    Kept under ``same_as`` while the clock is the database's (a replaced
    clock puts its time into the parameters).
    """
    key = (same_as, model, alias)
    if same_as is not None and not clock.is_overridden() and key in _set_clauses:
        return _set_clauses[key]
    query = UpdateQuery(model)
    query.add_update_values(ending(model, fit(model, changes)))
    sql, params = query.get_compiler(alias).as_sql()
    if same_as is not None and not clock.is_overridden():
        sql, params = inlined(connections[alias], sql, params)
        _set_clauses[key] = (sql, tuple(params))
    return sql, tuple(params)


def _succeeded() -> dict[str, Any]:
    """What an acknowledgement writes."""
    now = clock.sql_now()
    return {
        "status": Status.SUCCEEDED,
        "next_attempt_time": None,
        "lock_token": None,
        "finished_at": now,
        "updated_at": now,
    }


def ack(
    ids: Iterable[Any],
    token: uuid.UUID,
    *,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
    result: Any = None,
) -> int:
    """Mark rows succeeded; returns how many were still ours (``skip_locked``: and
    not locked by another transaction, see :func:`update_held`). ``result``: what
    the handler returned (its ``value``), written as ``Message.result``."""
    changes = _succeeded()
    if result is not None:
        changes["result"] = result.value
    return int(
        update_held(
            ids,
            token,
            changes,
            using=using,
            model=model,
            same_as="succeeded" if result is None else None,
            skip_locked=skip_locked,
        )
    )


def ack_releasing(
    message_id: Any,
    token: uuid.UUID,
    *,
    using: str,
    skip_locked: bool = False,
    result: Any = None,
) -> tuple[int, dependencies.Settled] | None:
    """:func:`ack` of one workflow parent and the release of its children, in one
    statement (PostgreSQL, autocommit: :func:`dependencies.with_outcome`).

    Returns whether the acknowledgement took (1 or 0) and what the release
    did, or None where it cannot be one statement: nothing was written then,
    and the caller acknowledges alone and releases after.
    """
    changes = _succeeded()
    if result is not None:
        changes["result"] = result.value
    same_as = "succeeded" if result is None else None
    sql, params = _held_update(
        [message_id],
        token,
        changes,
        using,
        Message,
        same_as,
        skip_locked=skip_locked,
        returning=False,
    )
    return dependencies.with_outcome(connections[using], sql, params, prepare=same_as is not None)


def ack_held(
    held: Mapping[uuid.UUID, Collection[Any]],
    *,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
) -> set[tuple[Any, uuid.UUID]]:
    """Mark the rows of several claims succeeded at once; returns the (id, token) still ours.

    One statement per lock token, in one transaction when there are several,
    so the caller learns exactly which acknowledgements took (the others
    were claimed again after their lease expired). Judged per attempt: a
    worker may hold one row under two tokens (it claimed it again after
    losing its lease), and only the attempt whose token the row carries is
    acknowledged. ``skip_locked``: rows another transaction has locked are
    left out too, rather than waited for (the caller reads which of those
    are still held, :func:`leases.states`, and tries them again later).
    """
    alias = db_alias(using, model)
    if not held:
        return set()
    connection = connections[alias]
    if len(held) > 1 and features(connection).array_parameters:
        return _ack_pairs(held, alias, model, skip_locked=skip_locked)
    mine: set[tuple[Any, uuid.UUID]] = set()
    with transaction.atomic(using=alias) if len(held) > 1 else nullcontext():
        for token, ids in held.items():
            kept = update_held(
                ids,
                token,
                _succeeded(),
                using=alias,
                model=model,
                returning=True,
                same_as="succeeded",
                skip_locked=skip_locked,
            )
            mine.update((pk, token) for pk in kept)
    return mine


def _ack_pairs(
    held: Mapping[uuid.UUID, Collection[Any]],
    alias: str,
    model: type[Model],
    *,
    skip_locked: bool = False,
) -> set[tuple[Any, uuid.UUID]]:
    """``ack_held`` of several claims in one statement (PostgreSQL): the (id, token)
    pairs as two arrays. A worker's acknowledgements at a low rate span about
    as many claims as messages, and a statement per claim was most of their cost."""
    connection = connections[alias]
    sql, set_params = _set_clause(model, alias, _succeeded(), "succeeded")
    name = "held_pairs_unlocked" if skip_locked else "held_pairs"
    where = statement(name, features(connection)).format(
        **quote_names(model, connection, "pk", "lock_token", "status")
    )
    prepared = {t: model_field(model, "lock_token").get_db_prep_value(t, connection) for t in held}
    ids = [pk for pks in held.values() for pk in pks]
    tokens = [prepared[t] for t, pks in held.items() for _ in pks]
    rows = direct.fetch(
        connection,
        f"{sql} {where}",
        [*set_params, ids, tokens],
        prepare=len(ids) <= direct.PREPARED_ROWS,
    )
    token_of = {value: t for t, value in prepared.items()}
    return {(pk, token_of.get(value, value)) for pk, value in rows}


def fail(
    message_id: Any,
    token: uuid.UUID,
    *,
    error: str,
    traceback: str = "",
    retry_at: datetime | None,
    retry_in: timedelta | None = None,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
) -> int:
    """Record a failed attempt: reschedule, or give up if both times are None.

    ``retry_in`` is measured on the database's clock (what the worker uses);
    ``retry_at`` is an absolute instant.
    """
    now = clock.sql_now()
    changes: dict[str, object] = {
        "last_error": error,
        "error_fingerprint": fingerprint(error),
        "last_traceback": traceback,
        "lock_token": None,
        "updated_at": now,
    }
    if retry_in is not None:
        changes.update(status=Status.PENDING, next_attempt_time=clock.sql_now_plus(retry_in))
    elif retry_at is None:
        changes.update(status=Status.FAILED, next_attempt_time=None, finished_at=now)
    else:
        changes.update(status=Status.PENDING, next_attempt_time=retry_at)
    return int(
        update_held([message_id], token, changes, using=using, model=model, skip_locked=skip_locked)
    )


def snooze(
    message_id: Any,
    token: uuid.UUID,
    *,
    run_at: datetime | timedelta,
    max_attempts: int,
    using: str | None = None,
    model: type[Model] = Message,
    skip_locked: bool = False,
) -> int:
    """Reschedule without spending an attempt (``Retry``): raise the cap by one.

    ``run_at`` is an instant, or a delay measured on the database's clock.
    """
    when = clock.sql_now_plus(run_at) if isinstance(run_at, timedelta) else run_at
    changes = {
        "status": Status.PENDING,
        "next_attempt_time": when,
        "lock_token": None,
        "max_attempts": max_attempts,
        "updated_at": clock.sql_now(),
    }
    return int(
        update_held([message_id], token, changes, using=using, model=model, skip_locked=skip_locked)
    )
