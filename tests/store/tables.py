"""The two kinds of queue table the store serves, behind one small interface.

``Message`` (the library's table) and ``Shipment`` (a ``QueueFields`` model
of the test app, whose rows are the messages) have different columns: a
``Shipment`` has no ``queue``, ``key``, ``updated_at``, ``finished_at``,
``error_fingerprint`` or ``superseded_at``. :meth:`Table.expect` keeps the
columns a table has, so one test states a behaviour for both.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Model

from django_delayq import clock
from django_delayq.models import Message
from django_delayq.store import changes
from django_delayq.store.features import Features, features
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
    ) -> changes.Claim:
        return changes.claim(
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
        return changes.has_column(self.model, column)

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


def can() -> Features:
    return features(connection)


def at(seconds: float) -> datetime:
    """The test clock's now plus ``seconds``."""
    return clock.now() + timedelta(seconds=seconds)
