from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_delayq.checks import check_flow_limits, check_settings
from django_delayq.conf import get_config


def ids(settings_value):
    with override_settings(DELAYQ=settings_value):
        return sorted(e.id for e in check_settings())


def test_defaults_pass():
    assert ids({}) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"LEASE": "60"}, ["django_delayq.E002"]),
        ({"LEASE": -1}, ["django_delayq.E003"]),
        ({"POLL_INTERVAL": timedelta(0)}, ["django_delayq.E003"]),
        ({"LEASE": 10**15}, ["django_delayq.E003"]),
        ({"RETENTION": timedelta.max}, ["django_delayq.E003"]),
        ({"HEARTBEAT_INTERVAL": 10**15}, ["django_delayq.E003"]),
        ({"LEASE": float("-inf")}, ["django_delayq.E003"]),
        ({"QUEUES": {"emails": {"TIME_LIMIT": float("inf")}}}, ["django_delayq.E003"]),
        ({"CONCURRENCY": 0}, ["django_delayq.E004"]),
        ({"BATCH_SIZE": 2.5}, ["django_delayq.E004"]),
        ({"MAX_ATTEMPTS": True}, ["django_delayq.E004"]),
        ({"MAX_ATTEMPTS": 1_000_001}, ["django_delayq.E004"]),
        ({"QUEUES": {"emails": {"MAX_ATTEMPTS": 2**31}}}, ["django_delayq.E004"]),
        ({"RETRY_POLICY": "no.such.Policy"}, ["django_delayq.E005"]),
        ({"QUEUES": {"emails": {"LEASE": 0}}}, ["django_delayq.E003"]),
        ({"QUEUES": {"emails": {"RETENTION": 5}}}, ["django_delayq.E006"]),
        ({"QUEUES": []}, ["django_delayq.E006"]),
        ({"LEASEE": 5}, ["django_delayq.W001"]),
        ({"QUEUES": {"emails": {"RATE_LIMIT": "100/d"}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"RATE_LIMIT": "0/s"}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"RATE_LIMIT": "100001/s"}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"RATE_LIMIT": "1" * 5000 + "/s"}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"RATE_LIMIT": 100}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"GLOBAL_CONCURRENCY": 0}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"GLOBAL_CONCURRENCY": True}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"GLOBAL_CONCURRENCY": 2.5}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"GLOBAL_CONCURRENCY": "3"}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"GROUP_AFTER_FAILURE": "skip"}}}, ["django_delayq.E007"]),
        ({"QUEUES": {"emails": {"GROUP_AFTER_FAILURE": None}}}, ["django_delayq.E007"]),
        # Flow control is per queue only.
        ({"RATE_LIMIT": "100/m"}, ["django_delayq.W001"]),
        ({"GROUP_AFTER_FAILURE": "continue"}, ["django_delayq.W001"]),
    ],
)
def test_bad_settings_are_reported(value, expected):
    assert ids(value) == expected


# Django 6's manage.py check runs the database checks too (the JSON field's asks
# the connection), so it needs the database as a user's check does.
@pytest.mark.django_db
def test_bad_settings_fail_manage_check():
    with (
        override_settings(DELAYQ={"CONCURRENCY": -2}),
        pytest.raises(SystemCheckError, match="E004"),
    ):
        call_command("check")


def test_durations_accept_seconds_and_override_settings_resets_cache():
    with override_settings(DELAYQ={"LEASE": 12}):
        assert get_config()["LEASE"] == timedelta(seconds=12)
    assert get_config()["LEASE"] != timedelta(seconds=12)


def test_an_sqlite_without_returning_is_reported(monkeypatch):
    from types import SimpleNamespace

    from django_delayq.store import server

    sqlite = SimpleNamespace(vendor="sqlite")
    monkeypatch.setattr(server.sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(server.sqlite3, "sqlite_version", "3.31.1")
    problem = server.version_problem(sqlite)
    assert problem is not None and problem.check_id == "django_delayq.E051"
    assert "3.35" in str(problem) and "3.31.1" in str(problem)


def test_good_flow_control_settings_pass():
    queues = {
        "emails": {"RATE_LIMIT": " 100 / m ", "GLOBAL_CONCURRENCY": 3},
        "webhooks": {"RATE_LIMIT": "100000/h", "GROUP_AFTER_FAILURE": "continue"},
        "orders": {"GROUP_AFTER_FAILURE": "block", "CONCURRENCY": 2},
        "reports": {"RATE_LIMIT": None, "GLOBAL_CONCURRENCY": None},  # None: no limit
    }
    assert ids({"QUEUES": queues}) == []


def test_a_flow_control_error_names_the_queue_and_the_problem():
    bad = {"QUEUES": {"emails": {"RATE_LIMIT": "100/d", "GLOBAL_CONCURRENCY": -1}}}
    with override_settings(DELAYQ=bad):
        messages = sorted(e.msg for e in check_settings())
    assert messages == [
        "DELAYQ['QUEUES']['emails']: GLOBAL_CONCURRENCY must be a positive integer, got -1",
        "DELAYQ['QUEUES']['emails']: RATE_LIMIT '100/d' is not a rate: write 'N/s', 'N/m' or "
        "'N/h' (e.g. '100/m')",
    ]
    with override_settings(DELAYQ={"QUEUES": {"q": {"GROUP_AFTER_FAILURE": "skip"}}}):
        [error] = check_settings()
    assert error.msg == (
        "DELAYQ['QUEUES']['q']: GROUP_AFTER_FAILURE must be one of 'block', 'continue', got 'skip'"
    )


def test_a_misspelt_flow_key_is_not_a_per_queue_setting():
    with override_settings(DELAYQ={"QUEUES": {"emails": {"RATE_LIMITS": "5/s"}}}):
        [error] = check_settings()
    assert error.id == "django_delayq.E006"
    assert "RATE_LIMIT, GLOBAL_CONCURRENCY, GROUP_AFTER_FAILURE" in error.hint


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"RATE_LIMIT": "5/s"}, "RATE_LIMIT"),
        ({"GLOBAL_CONCURRENCY": 2}, "GLOBAL_CONCURRENCY"),
        ({"RATE_LIMIT": "5/s", "GLOBAL_CONCURRENCY": 2}, "RATE_LIMIT and GLOBAL_CONCURRENCY"),
    ],
)
def test_global_limits_on_a_queue_of_model_rows_are_reported(overrides, named):
    from tests.testapp.models import Shipment

    # "shipments" is consumed by @handler(..., model=Shipment) (tests/testapp/handlers.py).
    with override_settings(DELAYQ={"QUEUES": {"shipments": overrides}}):
        [error] = check_flow_limits()
    assert error.id == "django_delayq.E008"
    assert error.obj is Shipment
    assert error.msg == (
        f"DELAYQ['QUEUES']['shipments'] sets {named}, but the queue holds the rows of "
        "testapp.Shipment: global limits apply to queues of messages only"
    )


@pytest.mark.parametrize(
    "queues",
    [
        {"shipments": {"GROUP_AFTER_FAILURE": "continue", "CONCURRENCY": 1}},
        {"shipments": {"RATE_LIMIT": None, "GLOBAL_CONCURRENCY": None}},
        {"default": {"RATE_LIMIT": "5/s", "GLOBAL_CONCURRENCY": 2}},  # a queue of messages
        {"shipments": "not a dict"},  # E006's
    ],
)
def test_other_settings_of_a_model_queue_are_not_e008(queues):
    with override_settings(DELAYQ={"QUEUES": queues}):
        assert check_flow_limits() == []


# Django 6's manage.py check runs the database checks too (the JSON field's asks
# the connection), so it needs the database as a user's check does.
@pytest.mark.django_db
def test_a_bad_limit_fails_manage_check():
    with (
        override_settings(DELAYQ={"QUEUES": {"emails": {"GLOBAL_CONCURRENCY": 0}}}),
        pytest.raises(SystemCheckError, match="E007"),
    ):
        call_command("check")
    with (
        override_settings(DELAYQ={"QUEUES": {"shipments": {"RATE_LIMIT": "1/s"}}}),
        pytest.raises(SystemCheckError, match="E008"),
    ):
        call_command("check")
