"""The health state a worker's probes read, its HTTP server, and its settings' checks."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_delayq.checks import check_health, check_settings
from django_delayq.conf import DEFAULTS
from django_delayq.health import Health, HealthServer
from tests.conftest import wait_for


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
def health(ticks: Ticks) -> Health:
    # Stale after 3 x max(poll 1 s, heartbeat 2 s) = 6 s; the heartbeat after 6 s too.
    return Health(loop_period=1.0, heartbeat_interval=2.0, clock=ticks)


def ready_health(health: Health) -> Health:
    health.turned()
    health.reached_database()
    health.beat()
    return health


# -- liveness ------------------------------------------------------------------------------------


def test_alive_while_the_loop_turns_and_stale_three_periods_after(health: Health, ticks: Ticks):
    health.turned()
    ticks.now += 6.0
    verdict = health.alive()
    assert (verdict.status, verdict.body["status"]) == (200, "ok")
    assert verdict.body["stale_after_seconds"] == 6.0
    ticks.now += 0.5
    verdict = health.alive()
    assert (verdict.status, verdict.body["status"]) == (503, "stale")
    assert verdict.body["last_loop_seconds_ago"] == 6.5
    health.turned()
    assert health.alive().ok


def test_an_announced_backoff_is_not_taken_for_a_stuck_loop(health: Health, ticks: Ticks):
    health.turned(pause=30.0)
    ticks.now += 35.0
    assert health.alive().ok
    ticks.now += 2.0  # 37 s > 30 s + 6 s
    assert not health.alive().ok


def test_the_shutdown_grace_counts_even_if_the_loop_turns_once_more(health: Health, ticks: Ticks):
    health.stopping(grace=30.0)
    ticks.now += 1.0
    health.turned()  # the loop's last turn, after the signal: must not shorten the grace
    ticks.now += 34.0
    assert health.alive().ok
    ticks.now += 2.0
    assert not health.alive().ok


# -- readiness -----------------------------------------------------------------------------------


def test_starting_until_it_claimed_and_beat(health: Health):
    assert health.ready().body["status"] == "starting"
    health.reached_database()
    assert (health.ready().status, health.ready().body["status"]) == (503, "starting")
    health.beat()
    verdict = health.ready()
    assert (verdict.status, verdict.body) == (
        200,
        {"status": "ready", "last_heartbeat_seconds_ago": 0.0},
    )


def test_unreachable_database_until_a_claim_goes_through(health: Health, ticks: Ticks):
    ready_health(health)
    health.database_failed()
    ticks.now += 2.5
    health.database_failed()  # the outage started at the first failure
    verdict = health.ready()
    assert (verdict.status, verdict.body["status"]) == (503, "database unreachable")
    assert verdict.body["database_unreachable_seconds"] == 2.5
    assert health.outage() == 2.5
    health.reached_database()
    health.beat()
    assert health.ready().ok
    assert health.outage() == 0.0


def test_a_stale_heartbeat_is_not_ready(health: Health, ticks: Ticks):
    ready_health(health)
    ticks.now += 6.5
    health.reached_database()
    verdict = health.ready()
    assert (verdict.status, verdict.body["status"]) == (503, "heartbeat stale")
    health.beat()
    assert health.ready().ok


def test_not_ready_from_the_moment_shutdown_begins(health: Health):
    ready_health(health)
    health.stopping(grace=10.0)
    health.reached_database()
    health.beat()
    verdict = health.ready()
    assert (verdict.status, verdict.body["status"]) == (503, "stopping")


# -- the HTTP server -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_server_answers_both_probes_with_json(health: Health, ticks: Ticks):
    port = free_port()
    server = HealthServer(
        health, port=port, address="127.0.0.1", worker="host:42", show_worker=True
    )
    server.start()
    try:
        assert get(port, "/readyz") == (
            503,
            {"status": "starting", "last_heartbeat_seconds_ago": None, "worker": "host:42"},
        )
        ready_health(health)
        status, body = get(port, "/readyz?verbose=1")
        assert (status, body["status"]) == (200, "ready")
        status, body = get(port, "/healthz")
        assert (status, body["status"], body["worker"]) == (200, "ok", "host:42")
        ticks.now += 60
        assert get(port, "/healthz")[0] == 503
        status, body = get(port, "/metrics")
        assert (status, body["paths"]) == (404, ["/healthz", "/readyz"])
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        get(port, "/healthz")


def test_the_answers_name_neither_host_nor_process_unless_asked(health: Health):
    port = free_port()
    name = f"{socket.gethostname()}:{os.getpid()}"
    server = HealthServer(health, port=port, address="127.0.0.1", worker=name)
    server.start()
    try:
        for path in ("/healthz", "/readyz"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", path)
            response = connection.getresponse()
            raw = response.read().decode()
            banner = response.headers["Server"]
            connection.close()
            assert "worker" not in json.loads(raw)
            assert socket.gethostname() not in raw and str(os.getpid()) not in raw
            assert "Python" not in banner
    finally:
        server.stop()
    with override_settings(DELAYQ={"HEALTH_SHOW_WORKER": True}):
        assert HealthServer(health, port=port, address="127.0.0.1", worker=name).show_worker


def test_the_servers_listen_on_the_loopback_interface_by_default():
    assert DEFAULTS["HEALTH_ADDRESS"] == DEFAULTS["METRICS_ADDRESS"] == "127.0.0.1"


def connect_slowly(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that each send a request line and never finish the request."""
    clients = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            client.sendall(b"GET /healthz HTTP/1.1\r\n")
        except OSError:
            pass  # refused at once: closed by the server, as it must be when it is full
        clients.append(client)
    return clients


def closed_by_server(client: socket.socket) -> bool:
    """Whether the server ended this connection (what it sent, if anything, then EOF)."""
    try:
        while True:
            data = client.recv(4096, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def handler_threads() -> int:
    return sum("process_request" in t.name for t in threading.enumerate())


@pytest.mark.parametrize("which", ["health", "metrics"])
def test_slow_and_idle_clients_are_cut_off_and_their_number_is_capped(health: Health, which: str):
    port = free_port()
    if which == "health":
        server: Any = HealthServer(
            health,
            port=port,
            address="127.0.0.1",
            worker="w",
            request_timeout=1.0,
            max_connections=4,
        )
        server.start()
        stop = server.stop
        open_connections = lambda: server._server.open_connections  # noqa: E731
    else:
        pytest.importorskip("prometheus_client")
        from django_delayq.metrics import serve

        httpd = serve(port, "127.0.0.1", request_timeout=1.0, max_connections=4)

        def stop() -> None:
            httpd.shutdown()
            httpd.server_close()

        open_connections = lambda: httpd.open_connections  # noqa: E731
    clients = connect_slowly(port, 40)
    try:
        seen: list[int] = []

        def all_closed() -> bool:
            seen.append(handler_threads())
            assert open_connections() <= 4
            return all(closed_by_server(c) for c in clients)

        wait_for(all_closed, timeout=60, message="the server to close every slow connection")
        assert max(seen) <= 4, seen
        # The server serves on once they are gone.
        path = "/healthz" if which == "health" else "/metrics"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            assert response.status == 200
    finally:
        for client in clients:
            client.close()
        stop()


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6")
def test_the_server_listens_on_an_ipv6_address(health: Health):
    with socket.socket(socket.AF_INET6) as sock:
        try:
            sock.bind(("::1", 0))
        except OSError:
            pytest.skip("::1 is not configured")
        port = sock.getsockname()[1]
    server = HealthServer(health, port=port, address="::1", worker="w")
    server.start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{port}/healthz", timeout=5) as response:
            assert json.loads(response.read())["status"] == "ok"
    finally:
        server.stop()


def test_a_taken_port_is_a_configuration_error(health: Health):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = HealthServer(health, port=port, address="127.0.0.1", worker="w")
        with pytest.raises(ImproperlyConfigured, match=f"health checks on 127.0.0.1:{port}"):
            server.start()


# -- settings and options --------------------------------------------------------------------------


def ids(delayq: dict) -> list[str]:
    with override_settings(DELAYQ=delayq):
        return sorted(e.id for e in [*check_settings(), *check_health()])


def test_health_settings_pass():
    assert ids({"HEALTH_PORT": 8080, "HEALTH_ADDRESS": "127.0.0.1"}) == []
    assert ids({"HEALTH_PORT": None, "DATABASE_OUTAGE_LIMIT": None}) == []
    assert ids({"DATABASE_OUTAGE_LIMIT": 120}) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"HEALTH_PORT": 0}, ["django_delayq.E032"]),
        ({"HEALTH_PORT": 65536}, ["django_delayq.E032"]),
        ({"HEALTH_PORT": "8080"}, ["django_delayq.E032"]),
        ({"HEALTH_ADDRESS": None}, ["django_delayq.E032"]),
        ({"HEALTH_SHOW_WORKER": "yes"}, ["django_delayq.E032"]),
        ({"DATABASE_OUTAGE_LIMIT": 0}, ["django_delayq.E003"]),
        ({"DATABASE_OUTAGE_LIMIT": -5}, ["django_delayq.E003"]),
        ({"DATABASE_OUTAGE_LIMIT": "2m"}, ["django_delayq.E002"]),
    ],
)
def test_bad_health_settings_are_reported(value: dict, expected: list[str]):
    assert ids(value) == expected


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--health-port", "0", "TCP port"),
        ("--health-port", "70000", "TCP port"),
        ("--health-port", "http", "whole number"),
        ("--database-outage-limit", "0", "positive number of seconds"),
        ("--database-outage-limit", "-3", "positive number of seconds"),
        ("--database-outage-limit", "nan", "positive number of seconds"),
        ("--database-outage-limit", "2m", "number of seconds"),
    ],
)
def test_bad_options_stop_the_command_before_it_starts(option: str, value: str, message: str):
    with pytest.raises(CommandError, match=message):
        call_command("run_delayq", "--burst", option, value)
