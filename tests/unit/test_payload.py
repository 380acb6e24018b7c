import datetime
import decimal

import pytest
from django.test import override_settings

from django_delayq.payload import check_payload


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
