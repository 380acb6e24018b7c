"""System checks and start-up errors of the metrics settings (E030, E031)."""

from __future__ import annotations

import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_delayq.checks import check_metrics, check_settings
from django_delayq.worker import Worker


def ids(delayq: dict) -> list[str]:
    with override_settings(DELAYQ=delayq):
        return sorted(e.id for e in [*check_settings(), *check_metrics()])


@pytest.fixture
def without_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import prometheus_client`` fail, as where the extra is not installed."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)


def test_metrics_settings_pass():
    assert ids({"METRICS_PORT": 9108, "METRICS_ADDRESS": "127.0.0.1", "METRICS_INTERVAL": 5}) == []
    assert ids({"METRICS_PORT": None}) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"METRICS_PORT": 0}, ["django_delayq.E031"]),
        ({"METRICS_PORT": 65536}, ["django_delayq.E031"]),
        ({"METRICS_PORT": "9108"}, ["django_delayq.E031"]),
        ({"METRICS_PORT": True}, ["django_delayq.E031"]),
        ({"METRICS_ADDRESS": None}, ["django_delayq.E031"]),
        ({"METRICS_INTERVAL": "15"}, ["django_delayq.E002"]),
        ({"METRICS_INTERVAL": 0}, ["django_delayq.E003"]),
    ],
)
def test_bad_metrics_settings_are_reported(value, expected):
    assert ids(value) == expected


# Django 6's manage.py check runs the database checks too (the JSON field's asks
# the connection), so it needs the database as a user's check does.
@pytest.mark.django_db
def test_metrics_without_prometheus_client_is_a_check_error(without_prometheus):
    assert ids({"METRICS_PORT": 9108}) == ["django_delayq.E030"]
    assert ids({}) == []  # metrics off: nothing needed
    with (
        override_settings(DELAYQ={"METRICS_PORT": 9108}),
        pytest.raises(SystemCheckError, match="prometheus-client is not installed"),
    ):
        call_command("check")


def test_a_worker_with_metrics_needs_prometheus_client(without_prometheus):
    with pytest.raises(ImproperlyConfigured, match=r"django-delayq\[prometheus\]"):
        Worker(["default"], metrics_port=9108)
    assert Worker(["default"]).metrics is None
