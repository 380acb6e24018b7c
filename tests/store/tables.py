"""The two kinds of queue table the store serves, behind one small interface.

``Message`` (the library's table) and ``Shipment`` (a ``QueueFields`` model
of the test app, whose rows are the messages) have different columns: a
``Shipment`` has no ``queue``, ``key``, ``updated_at``, ``finished_at``,
``error_fingerprint`` or ``superseded_at``. :meth:`Table.expect` keeps the
columns a table has, so one test states a behaviour for both.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, connections
from django.db.models import Model

from django_delayq import clock, enqueue
from django_delayq.models import Message
from django_delayq.store import claim as store_claim
from django_delayq.store import columns
from django_delayq.store.features import Features, features
from tests.conftest import FakeClock
from tests.testapp.models import Shipment

LEASE = timedelta(seconds=30)

_NOW = object()


@dataclass(frozen=True)
class Table:
    model: type[Model]

    @property
    def name(self) -> str:
        return self.model.__name__

    def add(self, *, status: str = "pending", due: Any = _NOW, **fields: Any) -> Any:
        """Create a row (due now on the test's clock unless ``due`` says otherwise); its pk."""
        now = clock.now()
        values: dict[str, Any] = {
            "status": status,
            "next_attempt_time": now if due is _NOW else due,
            **fields,
        }
        if self.model is Message:
            values.setdefault("queue", "q")
            values.setdefault("key", uuid.uuid4().hex)
            values.setdefault("payload", {})
            values.setdefault("scheduled_time", now)
        else:
            values.setdefault("reference", uuid.uuid4().hex[:12])
        return self.model._base_manager.create(**values).pk

    def claim(
        self,
        limit: int = 10,
        *,
        queues: Sequence[str] = ("q",),
        worker: str = "w",
        lease: timedelta = LEASE,
        **options: Any,
    ) -> store_claim.Claim:
        return store_claim.claim(
            list(queues), limit, worker=worker, lease=lease, model=self.model, **options
        )

    def state(self, pk: Any) -> dict[str, Any]:
        """Every column of the row as stored."""
        row = self.model._base_manager.get(pk=pk)
        return {f.attname: getattr(row, f.attname) for f in self.model._meta.concrete_fields}

    def states(self) -> dict[Any, dict[str, Any]]:
        return {pk: self.state(pk) for pk in self.pks()}

    def pks(self) -> set[Any]:
        return set(self.model._base_manager.values_list("pk", flat=True))

    def has(self, column: str) -> bool:
        return columns.has_column(self.model, column)

    def expect(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` without the columns this table does not have."""
        return {name: value for name, value in values.items() if self.has(name)}

    def objects(self) -> Any:
        return self.model._base_manager.all()

    def set(self, pk: Any, **fields: Any) -> None:
        """Change a row behind the store's back (to build a state)."""
        assert self.model._base_manager.filter(pk=pk).update(**fields) == 1


def subset(state: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``state`` that ``expected`` names (for a readable assertion diff)."""
    return {name: state[name] for name in expected}


TABLES = [Table(Message), Table(Shipment)]

MESSAGE = Table(Message)
SHIPMENT = Table(Shipment)
FINISHED = ("succeeded", "failed", "cancelled")
# A due time in the past that the test clock never reaches (the tests of
# statements compiled once run on the database's clock).
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
EXTENDED = timedelta(seconds=90)


def can() -> Features:
    return features(connection)


def at(seconds: float) -> datetime:
    """The test clock's now plus ``seconds``."""
    return clock.now() + timedelta(seconds=seconds)


def copies(template: Any, count: int, *, key: str, group: str, queue: str | None = None) -> None:
    """Insert ``count`` copies of the message ``template``, in one statement of SQL.

    Copy ``i`` (from 1, in that order of ids) has the key ``f"{key}{i}"``, the
    group ``f"{group}{i}"`` and, with ``queue``, the queue ``f"{queue}{i}"``;
    every other column is the template's. Tests that need more rows than a
    statement takes parameters build them this way, in about a second.
    """
    qn = connection.ops.quote_name
    vendor = connection.vendor
    if vendor == "mysql":
        numbered = "CONCAT(%s, CAST(n.i AS CHAR))"
    elif vendor == "postgresql":
        numbered = "%s || n.i::text"
    else:
        numbered = "%s || n.i"
    fields = [f for f in Message._meta.concrete_fields if not f.primary_key]
    values, params = [], []
    for field in fields:
        prefix = {"key": key, "group": group, "queue": queue}.get(field.name)
        if prefix is not None:
            values.append(numbered)
            params.append(prefix)
        else:
            values.append(f"t.{qn(field.column)}")
    table = qn(Message._meta.db_table)
    if vendor == "postgresql":
        numbers, recursive = "generate_series(1, %s) AS n(i)", ""
    else:
        numbers = "n"
        recursive = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s) "
    sql = (
        f"INSERT INTO {table} ({', '.join(qn(f.column) for f in fields)}) "
        f"{recursive}SELECT {', '.join(values)} FROM {table} AS t, {numbers} "
        f"WHERE t.{qn('id')} = %s"
    )
    params = [count, *params, template] if recursive else [*params, count, template]
    with connection.cursor() as cursor:
        if vendor == "mysql":
            # The recursion's cap (MariaDB's, MySQL's): a server may set it low.
            cursor.execute("SELECT VERSION() LIKE '%%MariaDB%%'")
            variable = (
                "max_recursive_iterations" if cursor.fetchone()[0] else "cte_max_recursion_depth"
            )
            cursor.execute(f"SET SESSION {variable} = GREATEST(@@{variable}, %s)", [count + 1])
        cursor.execute(sql, params)


def analyze() -> None:
    """Give PostgreSQL's planner the statistics a table of this size has in production
    (autovacuum's): without them it takes the copies for a few rows and plans so."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(Message._meta.db_table)}")


def in_thread(function: Callable[[], Any]) -> Callable[[], Any]:
    """``function`` for another thread: on its own connection, closed afterwards."""

    def run() -> Any:
        try:
            return function()
        finally:
            connections.close_all()

    return run


def superseded_message(fake_clock: FakeClock) -> int:
    """A message running attempt 1 whose newer version (due in a minute) waits."""
    first = enqueue("q", {"v": 1}, key="k", max_attempts=3)
    claimed = MESSAGE.claim()
    assert [m.pk for m in claimed.messages] == [first.message.pk]
    fake_clock.advance(1)
    newer = enqueue(
        "q", {"v": 2}, key="k", run_at=at(60), max_attempts=4, priority=2, on_conflict="update"
    )
    assert newer.outcome == "updated"
    state = MESSAGE.state(first.message.pk)
    assert (state["status"], state["superseded_at"]) == ("running", clock.now())
    assert state["lock_token"] == claimed.token
    return first.message.pk


def newer_version(state: dict[str, Any], now: datetime) -> dict[str, Any]:
    return {
        "status": "pending",
        "next_attempt_time": state["scheduled_time"],
        "attempt_count": 0,
        "max_attempts": 4,
        "superseded_at": None,
        "finished_at": None,
        "lock_token": None,
        "payload": {"v": 2},
        "priority": 2,
        "updated_at": now,
    }
