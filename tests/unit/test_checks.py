from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_delayq.checks import check_settings
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
    ],
)
def test_bad_settings_are_reported(value, expected):
    assert ids(value) == expected


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
