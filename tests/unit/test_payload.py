import datetime
import decimal

import pytest
from django.test import override_settings

from django_delayq.payload import check_payload, encode_payload
from tests.conftest import finishes_within


def test_plain_json_is_accepted():
    assert check_payload({"a": [1, 2.5, "x", None, True, {"b": []}]}) > 0


def test_non_serialisable_names_type_and_path():
    with pytest.raises(
        TypeError, match=r"payload\['order'\]\['items'\]\[1\] is of type decimal.Decimal"
    ):
        check_payload({"order": {"items": [1, decimal.Decimal("2.5")]}})


def test_datetime_is_refused_with_path():
    with pytest.raises(TypeError, match=r"payload\['when'\] is of type datetime.datetime"):
        check_payload({"when": datetime.datetime(2026, 1, 1)})


def test_non_string_keys_are_refused():
    with pytest.raises(TypeError, match="keys must be strings"):
        check_payload({1: "x"})


def test_nan_is_refused():
    with pytest.raises(ValueError, match="JSON cannot hold"):
        check_payload({"x": float("nan")})


def test_nul_is_refused_with_path():
    with pytest.raises(ValueError, match=r"payload\['note'\] contains a NUL"):
        check_payload({"note": "a\x00b"})


@override_settings(DELAYQ={"MAX_PAYLOAD_SIZE": 100})
def test_oversized_payload_is_refused():
    with pytest.raises(ValueError, match="over DELAYQ\\['MAX_PAYLOAD_SIZE'\\] \\(100\\)"):
        check_payload({"x": "y" * 200})


def test_a_dict_that_contains_itself_is_refused_with_its_path():
    payload: dict = {"a": 1}
    payload["self"] = payload
    with pytest.raises(ValueError, match=r"payload\['self'\] refers to payload, which contains it"):
        finishes_within(10, lambda: check_payload(payload))


def test_a_list_that_contains_itself_is_refused_with_its_path():
    items: list = [1, 2]
    items.append(items)
    with pytest.raises(ValueError, match=r"payload\[2\] refers to payload, which contains it"):
        finishes_within(10, lambda: check_payload(items))


def test_a_deeper_cycle_names_both_ends():
    order: dict = {"lines": [{"sku": "A1"}]}
    order["lines"][0]["order"] = order["lines"]
    with pytest.raises(
        ValueError,
        match=r"payload\['lines'\]\[0\]\['order'\] refers to payload\['lines'\], which contains it",
    ):
        finishes_within(10, lambda: check_payload({"x": 1, **order}))


def test_a_shared_value_that_is_not_a_cycle_is_accepted():
    shared = {"id": 7, "tags": ["a"]}
    payload = {"first": shared, "second": [shared, shared], "third": {"again": shared}}
    text = finishes_within(10, lambda: encode_payload(payload))
    assert text.count('{"id":7,"tags":["a"]}') == 4


def test_a_payload_nested_too_deeply_for_json_is_a_value_error():
    payload: list = []
    for _ in range(5000):
        payload = [payload]
    with pytest.raises(ValueError, match=r"payload\[.deep.\]\[0\].* deeper than MAX_PAYLOAD_DEPTH"):
        finishes_within(10, lambda: check_payload({"deep": payload}))
