"""Every JSON value is a payload, stored and handed to the handler unchanged.

``enqueue_many`` writes through different statements depending on
``on_conflict``, on the caller's transaction and on the database: the
one-statement insert of new keys (``producer._insert_new``, PostgreSQL and
SQLite), the upsert (``_upsert_returning``), MariaDB's ``mysql.write``. Each
must store the payload's JSON, not an SQL rendering of it, and a ``None``
payload as JSON ``null``.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_delayq import Outcome, enqueue, enqueue_many
from django_delayq.models import Message
from tests.json_values import JSON_VALUES, exact
from tests.testapp.models import Effect

# Outside any transaction (PostgreSQL's one-statement fast path) and inside
# the caller's (the test's own transaction, plus an explicit atomic block).
AUTOCOMMIT = pytest.param(False, id="autocommit", marks=pytest.mark.django_db(transaction=True))
IN_ATOMIC = pytest.param(True, id="atomic", marks=pytest.mark.django_db)


def caller(in_atomic: bool) -> Any:
    return transaction.atomic() if in_atomic else nullcontext()


def stored(message: Message) -> Any:
    return Message.objects.get(pk=message.pk).payload


@pytest.mark.parametrize("in_atomic", [AUTOCOMMIT, IN_ATOMIC])
@pytest.mark.parametrize("on_conflict", ["ignore", "update", "error"])
@pytest.mark.parametrize("value", JSON_VALUES)
def test_enqueue_stores_the_payload_exactly(value, on_conflict, in_atomic):
    with caller(in_atomic):
        result = enqueue("default", value, on_conflict=on_conflict)
    assert result.outcome is Outcome.CREATED
    assert exact(result.message.payload) == exact(value)
    assert exact(stored(result.message)) == exact(value)


@pytest.mark.parametrize("in_atomic", [AUTOCOMMIT, IN_ATOMIC])
@pytest.mark.parametrize("on_conflict", ["ignore", "update", "error"])
def test_enqueue_many_stores_every_payload_exactly(on_conflict, in_atomic):
    values = [p.values[0] for p in JSON_VALUES]
    keys = [f"k{i:02}" for i in range(len(values))]
    with caller(in_atomic):
        results = enqueue_many("default", values, keys=keys, on_conflict=on_conflict)
    assert [r.outcome for r in results] == [Outcome.CREATED] * len(values)
    by_key = {m.key: m.payload for m in Message.objects.all()}
    assert [exact(by_key[k]) for k in keys] == [exact(v) for v in values]


@pytest.mark.django_db
@pytest.mark.parametrize("value", JSON_VALUES)
def test_update_replaces_the_payload_exactly(value):
    enqueue("default", {"before": 1}, key="k")
    result = enqueue("default", value, key="k", on_conflict="update")
    assert result.outcome is Outcome.UPDATED
    assert exact(result.message.payload) == exact(value)
    assert exact(stored(result.message)) == exact(value)


@pytest.mark.django_db
@pytest.mark.parametrize("value", JSON_VALUES)
def test_update_with_the_same_payload_is_ignored(value):
    at = timezone.now() + timedelta(minutes=5)
    first = enqueue("default", value, key="k", run_at=at).message
    again = enqueue("default", value, key="k", run_at=at, on_conflict="update")
    assert again.outcome is Outcome.IGNORED
    assert exact(stored(first)) == exact(value)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("before", "after"),
    [
        (1, True),
        (True, 1),
        (0, False),
        (False, 0),
        ({"on": 1}, {"on": True}),
        ([0], [False]),
    ],
    ids=repr,
)
def test_update_to_a_value_python_calls_equal_but_of_another_type(before, after):
    """``True == 1`` in Python, but not in JSON: the new payload is written."""
    at = timezone.now() + timedelta(minutes=5)
    message = enqueue("default", before, key="k", run_at=at).message
    result = enqueue("default", after, key="k", run_at=at, on_conflict="update")
    assert result.outcome is Outcome.UPDATED
    assert exact(stored(message)) == exact(after)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", JSON_VALUES)
def test_the_handler_receives_the_payload_exactly(value, run_worker):
    message = enqueue("payloads", value).message
    run_worker(["payloads"])
    assert Message.objects.get(pk=message.pk).status == "succeeded"
    assert Effect.objects.get(message_id=message.pk).value == exact(value)[1]


@pytest.mark.django_db
def test_a_message_without_a_payload_holds_json_null():
    """``payload`` defaults to ``None``: JSON ``null``, never SQL NULL (the column is NOT NULL)."""
    message = enqueue("default").message
    assert exact(stored(message)) == exact(None)
    assert Message.objects.filter(payload=None).get() == message
