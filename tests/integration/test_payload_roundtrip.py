"""Every JSON value is a payload, stored and handed to the handler unchanged.

``enqueue_many`` writes through different statements depending on
``on_conflict``, on the caller's transaction and on the database: the
one-statement insert of new keys (``producer._insert_new``, PostgreSQL and
SQLite), the upsert (``_upsert_returning``), MariaDB's ``mysql.write``. Each
must store the payload's JSON, not an SQL rendering of it, and a ``None``
payload as JSON ``null``.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_delayq import Outcome, enqueue, enqueue_many
from django_delayq.models import Message
from django_delayq.payload import MAX_PAYLOAD_DEPTH
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


# -- numbers that jsonb would change, and what cannot round-trip --------------

FLOATS = [
    pytest.param(1e308, id="1e308"),
    pytest.param(1e16, id="1e16"),
    pytest.param(-1.5e300, id="-1.5e300"),
    pytest.param(2.0**53, id="2**53-as-float"),
    pytest.param(123456789012345680.0, id="whole-float-18-digits"),
    pytest.param(1.0, id="1.0"),
    pytest.param(0.0, id="0.0"),
    pytest.param(1e-5, id="1e-5"),
    pytest.param(5e-324, id="smallest-subnormal"),
    pytest.param(1.7976931348623157e308, id="largest-float"),
    pytest.param(-2.5e-310, id="negative-subnormal"),
]


@pytest.mark.parametrize("in_atomic", [AUTOCOMMIT, IN_ATOMIC])
@pytest.mark.parametrize("number", FLOATS)
def test_a_float_comes_back_a_float_of_the_same_value(number, in_atomic):
    """PostgreSQL's jsonb keeps a number's digits, not its notation: ``1e+16`` came back
    as the int 10**16. Floats are written with a fraction and no exponent."""
    value = {"f": number, "list": [number, 1, True], "top": number}
    with caller(in_atomic):
        one = enqueue("default", value).message
        many = enqueue_many("default", [number, [number]], keys=["a", "b"])
    assert exact(stored(one)) == exact(value)
    assert exact(stored(many[0].message)) == exact(number)
    assert exact(stored(many[1].message)) == exact([number])


@pytest.mark.django_db
@pytest.mark.parametrize("number", FLOATS)
def test_a_float_saved_by_the_model_comes_back_a_float(number):
    """The admin's edit, the triage's edit and ``bulk_update`` save through the field."""
    message = enqueue("default", {"before": 1}).message
    message.payload = {"f": number}
    message.save(update_fields=["payload"])
    assert exact(stored(message)) == exact({"f": number})
    Message.objects.filter(pk=message.pk).update(payload=[number])
    assert exact(stored(message)) == exact([number])


@pytest.mark.django_db
@pytest.mark.parametrize("value", [-0.0, {"a": [1, -0.0]}], ids=["top", "nested"])
def test_negative_zero_is_refused_before_writing(value):
    """jsonb has no negative zero: ``-0.0`` would come back as ``0.0`` on PostgreSQL,
    so it is refused on every database, with its place in the payload."""
    with pytest.raises(ValueError, match=r"payload(\['a'\]\[1\])? is -0\.0"):
        enqueue("default", value)
    with pytest.raises(ValueError, match=r"message 1: payload(\['a'\]\[1\])? is -0\.0"):
        enqueue_many("default", [1, value])
    assert not Message.objects.exists()


# -- depth -------------------------------------------------------------------


def nested(depth: int, kind: str = "list") -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if kind == "list" or i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("in_atomic", [AUTOCOMMIT, IN_ATOMIC])
@pytest.mark.parametrize("kind", ["list", "mixed"])
def test_a_payload_nested_to_the_limit_round_trips_on_every_path(kind, in_atomic):
    value = nested(MAX_PAYLOAD_DEPTH, kind)
    with caller(in_atomic):
        one = enqueue("default", value).message
        many = enqueue_many("default", [value, value], keys=["a", "b"])
        again = enqueue("default", [value[0]], key="a", on_conflict="update")
    assert exact(stored(one)) == exact(value)
    assert exact(stored(many[1].message)) == exact(value)
    assert again.outcome is Outcome.UPDATED
    assert exact(stored(again.message)) == exact([value[0]])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("depth", [21, 31, 32, 36, 980, 5000])
def test_a_payload_nested_past_the_limit_is_refused_naming_it(depth):
    """MariaDB refused 32 levels and more (a 31-deep payload failed as a W050 collation
    error inside the batch's document); a 980-deep one was accepted elsewhere."""
    assert MAX_PAYLOAD_DEPTH == 20
    value = nested(depth)
    with pytest.raises(ValueError, match=r"payload\[0\]\[0\].* deeper than MAX_PAYLOAD_DEPTH"):
        enqueue("default", value)
    with pytest.raises(ValueError, match=r"message 1: payload.* than MAX_PAYLOAD_DEPTH \(20"):
        enqueue_many("default", [1, value])
    assert not Message.objects.exists()


@pytest.mark.parametrize("brackets", [21, 1000, 100_000])
def test_decoding_deep_text_names_the_limit_without_recursing(brackets):
    from django_delayq.payload import decode_payload

    text = "[" * brackets + "]" * brackets
    with pytest.raises(ValueError, match=r"nested deeper than MAX_PAYLOAD_DEPTH \(20"):
        decode_payload(text)
    # Brackets inside strings are text, not nesting.
    assert decode_payload(json.dumps({"s": text})) == {"s": text}
    assert decode_payload('{"s": "\\"[[["}') == {"s": '"[[['}


def test_decoding_applies_the_rules_of_enqueue():
    from django_delayq.payload import decode_payload

    assert exact(decode_payload("[1e16, 1, 1.0, true]")) == exact([1e16, 1, 1.0, True])
    for text, error in [
        ("[-0.0]", r"payload\[0\] is -0\.0"),
        ('{"a": "\\ud800"}', r"payload\['a'\] contains a lone surrogate"),
        ("[NaN]", r"payload\[0\] is nan"),
        ("{not json", "payload is not valid JSON"),
    ]:
        with pytest.raises(ValueError, match=error):
            decode_payload(text)


# -- the admin's payload form ---------------------------------------------------


def post_payload(client: Any, message: Message, text: str) -> Any:
    from tests.admin.message_pages import change_url

    return client.post(
        change_url(message.pk),
        {
            "kind": message.kind,
            "priority": str(message.priority),
            "max_attempts": "",
            "payload": text,
        },
    )


@pytest.mark.django_db
def test_the_admin_form_saves_floats_as_floats(admin_client):
    message = enqueue("default", {"before": 1}).message
    value = {"big": 1e308, "whole": 1e16, "tiny": 5e-324, "one": 1.0, "int": 1}
    response = post_payload(admin_client, message, json.dumps(value))
    assert response.status_code == 302
    assert exact(stored(message)) == exact(value)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "error"),
    [
        (json.dumps(nested(21)), "nested deeper than MAX_PAYLOAD_DEPTH (20"),
        (json.dumps(nested(36)), "nested deeper than MAX_PAYLOAD_DEPTH (20"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than MAX_PAYLOAD_DEPTH (20"),
        ('{"a": [-0.0]}', "is -0.0"),
        ('{"a": "\\udc80"}', "contains a lone surrogate"),
    ],
    ids=["21", "36", "100000-brackets", "negative-zero", "surrogate"],
)
def test_the_admin_form_refuses_what_enqueue_refuses(admin_client, text, error):
    message = enqueue("default", {"before": 1}).message
    response = post_payload(admin_client, message, text)
    assert response.status_code == 200
    assert error in response.content.decode()
    assert exact(stored(message)) == exact({"before": 1})


@pytest.mark.django_db
def test_the_depth_limit_holds_for_task_arguments_and_the_triage_edit():
    """A task's call is ``{"args": [...], ...}``: an argument has two levels less."""
    from django_delayq.triage import PayloadError, parse_payload
    from tests.testapp.tasks import echo

    echo.enqueue(nested(MAX_PAYLOAD_DEPTH - 2))
    with pytest.raises(ValueError, match=r"payload\['args'\]\[0\].* than MAX_PAYLOAD_DEPTH \(20"):
        echo.enqueue(nested(MAX_PAYLOAD_DEPTH - 1))
    assert Message.objects.count() == 1
    with pytest.raises(PayloadError, match=r"nested deeper than MAX_PAYLOAD_DEPTH \(20"):
        parse_payload("[" * 100_000 + "]" * 100_000)
