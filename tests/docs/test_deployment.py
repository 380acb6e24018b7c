"""The deployment guide's supervisor configurations agree with what run_delayq does.

The systemd unit and the Kubernetes Deployment are read from the page
itself (its ``ini`` and ``yaml`` blocks), and their ``run_delayq`` command
lines are parsed by the command's own parser: a renamed option, a probe on
the wrong path or port, or a stop timeout shorter than the worker's grace
fails here.
"""

from __future__ import annotations

import configparser
import ipaddress
import re
import shlex
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import load_command_class

from django_delayq.conf import DEFAULTS
from django_delayq.health import LIVE_PATH, READY_PATH

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "deployment.md"
GRACE = DEFAULTS["SHUTDOWN_GRACE"].total_seconds()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)


def run_delayq_options(argv: list[str]) -> Namespace:
    """``argv`` (a whole command line) parsed as run_delayq parses its own."""
    assert "run_delayq" in argv, argv
    args = argv[argv.index("run_delayq") + 1 :]
    parser = load_command_class("django_delayq", "run_delayq").create_parser(
        "manage.py", "run_delayq"
    )
    return parser.parse_args(args)


def seconds(value: str) -> float:
    """A systemd time span as the guide writes them: ``45`` or ``45s``."""
    match = re.fullmatch(r"(\d+)(s?)", value.strip())
    assert match, f"not a time span in seconds: {value!r}"
    return float(match.group(1))


@pytest.fixture(scope="module")
def unit() -> configparser.ConfigParser:
    # The guide's other ini block is PgBouncer's configuration.
    (text,) = [block for block in blocks("ini") if "[Service]" in block]
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep systemd's case
    parser.read_string(text)
    return parser


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    documents = [doc for text in blocks("yaml") for doc in yaml.safe_load_all(text) if doc]
    found = [doc for doc in documents if doc.get("kind") == "Deployment"]
    assert len(found) == 1, "the guide shows one Kubernetes Deployment"
    return found[0]


def test_the_systemd_unit_stops_the_worker_gracefully_and_restarts_it(unit):
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert seconds(service["TimeoutStopSec"]) > GRACE
    assert service["Restart"] in ("always", "on-failure")
    options = run_delayq_options(shlex.split(service["ExecStart"]))
    assert options.database_outage_limit is not None, "restarted when its database stays down"


def test_the_kubernetes_probes_are_the_ones_the_worker_serves(deployment):
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > GRACE
    (container,) = pod["containers"]
    options = run_delayq_options(container["command"])
    port = options.health_port
    assert port is not None, "the command must serve the probes"
    # The kubelet probes the pod's IP: the default (loopback) would fail every probe.
    address = options.health_address or DEFAULTS["HEALTH_ADDRESS"]
    assert not ipaddress.ip_address(address).is_loopback, "the probes come from outside the pod"
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    for probe, path in (("readinessProbe", READY_PATH), ("livenessProbe", LIVE_PATH)):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert named.get(get["port"], get["port"]) == port, probe


def test_the_compose_file_waits_longer_than_the_grace():
    compose = [
        doc for text in blocks("yaml") for doc in yaml.safe_load_all(text) if "services" in doc
    ]
    (worker,) = compose[0]["services"].values()
    assert seconds(worker["stop_grace_period"]) > GRACE
    assert run_delayq_options(worker["command"]) is not None
