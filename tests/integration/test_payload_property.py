"""The payload round trip, as a property: any JSON value within the documented limits
comes back equal, with its types, through every way in (``enqueue``, ``enqueue_many``,
the admin's payload form); anything outside them is refused before writing, with an
error that names what is wrong and where.

Equality is type-strict (``tests.json_values.exact``): ``1``, ``1.0`` and
``True`` differ, and so do ``0.0`` and ``-0.0``. ``DELAYQ_HYPOTHESIS_PROFILE=thorough``
runs 10,000 cases per property (``tests/payload_strategies.py``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import hypothesis
import pytest

from django_delayq import enqueue, enqueue_many
from django_delayq.models import Message
from tests.json_values import exact
from tests.payload_strategies import OUTSIDE, examples, json_values

pytestmark = pytest.mark.django_db

_keys = itertools.count()


def key() -> str:
    return f"p{next(_keys)}"


def stored(pk: int) -> Any:
    return Message.objects.get(pk=pk).payload


@examples()
@hypothesis.given(value=json_values())
def test_enqueue_gives_back_any_payload_within_the_limits(value):
    result = enqueue("default", value, key=key())
    assert exact(stored(result.message.pk)) == exact(value)


@examples(0.5)
@hypothesis.given(values=hypothesis.strategies.lists(json_values(), min_size=1, max_size=4))
def test_enqueue_many_gives_back_every_payload_within_the_limits(values):
    results = enqueue_many("default", values, keys=[key() for _ in values])
    assert [exact(stored(r.message.pk)) for r in results] == [exact(v) for v in values]


@examples(0.5)
@hypothesis.given(value=json_values())
def test_the_admin_form_gives_back_any_payload_within_the_limits(admin_client, value):
    from tests.admin.message_pages import change_url

    message = enqueue("default", {"before": 1}, key=key()).message
    response = admin_client.post(
        change_url(message.pk),
        {"kind": "", "priority": "0", "max_attempts": "", "payload": json.dumps(value)},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert exact(stored(message.pk)) == exact(value)


@examples()
@hypothesis.given(bad=OUTSIDE)
def test_anything_outside_the_limits_is_refused_before_writing(bad):
    value, named = bad
    before = Message.objects.count()
    with pytest.raises((TypeError, ValueError), match=r"payload") as one:
        enqueue("default", value, key=key())
    assert named in str(one.value)
    with pytest.raises((TypeError, ValueError), match=r"^message 1: payload") as many:
        enqueue_many("default", [1, value], keys=[key(), key()])
    assert named in str(many.value)
    assert Message.objects.count() == before


@examples(0.2)
@hypothesis.given(bad=OUTSIDE)
def test_the_admin_form_refuses_anything_outside_the_limits(admin_client, bad):
    from tests.admin.message_pages import change_url

    value, named = bad
    if "keys must be strings" in named:
        return  # JSON text has string keys only: {"1": "x"} is a valid payload
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return  # no JSON text to send: a form cannot hold it
    message = enqueue("default", {"before": 1}, key=key()).message
    response = admin_client.post(
        change_url(message.pk),
        {"kind": "", "priority": "0", "max_attempts": "", "payload": text},
    )
    assert response.status_code == 200
    page = response.content.decode()
    # A NUL at the top is refused by Django's own check of the field first.
    assert named in page or (named == "NUL" and "Null characters are not allowed" in page)
    assert exact(stored(message.pk)) == exact({"before": 1})
