"""run_delayq's health probes and its exit on a lost database, with real processes.

The database outage is real: the worker connects through a TCP proxy
(``tests/process/proxy.py``) that the test cuts; SQLite, a file, has no
server to lose.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from django.db import connection

from django_delayq import enqueue
from django_delayq.exceptions import DatabaseUnreachable
from django_delayq.models import Message
from tests.conftest import ROOT, wait_for
from tests.process.proxy import TcpProxy
from tests.testapp.models import Execution

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, dict] | None:
    """``(status, JSON body)`` of a probe, or None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except (urllib.error.URLError, ConnectionError):
        return None


def answers(port: int, path: str, status: int, state: str) -> dict | None:
    """The probe's body if it answers ``status`` with ``state``, else None (for wait_for)."""
    found = probe(port, path)
    if found is None or found[0] != status or found[1]["status"] != state:
        return None
    return found[1]


def health_options(port: int) -> list[str]:
    return ["--health-port", str(port), "--health-address", "127.0.0.1"]


@pytest.fixture
def proxied_env(worker_env: dict[str, str]) -> Iterator[tuple[TcpProxy, dict[str, str]]]:
    """A proxy to the test database, and the environment of a worker that goes through it."""
    if connection.vendor not in DEFAULT_PORTS:
        pytest.skip("SQLite is a file: there is no database server to become unreachable")
    settings = connection.settings_dict
    upstream = (
        settings["HOST"] or "127.0.0.1",
        int(settings["PORT"] or DEFAULT_PORTS[connection.vendor]),
    )
    proxy = TcpProxy(upstream)
    url = urlsplit(os.environ["DATABASE_URL"])
    user, _, _ = url.netloc.rpartition("@")
    netloc = f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}"
    # A heartbeat every half second: readiness after a recovery need not wait 5 s.
    env = {"DATABASE_URL": url._replace(netloc=netloc).geturl(), "DELAYQ_TEST_HEARTBEAT": "0.5"}
    yield proxy, env
    proxy.close()


def test_probes_follow_a_worker_from_start_to_a_graceful_stop(spawn_worker):
    port = free_port()
    worker = spawn_worker("--queue", "default", *health_options(port))
    ready = wait_for(
        lambda: answers(port, "/readyz", 200, "ready"), timeout=60, message="/readyz to be 200"
    )
    assert isinstance(ready, dict)
    assert "worker" not in ready  # DELAYQ["HEALTH_SHOW_WORKER"] is off
    assert 0 <= ready["last_heartbeat_seconds_ago"] < 15
    alive = probe(port, "/healthz")
    assert alive is not None
    status, body = alive
    assert (status, body["status"]) == (200, "ok") and "worker" not in body
    assert body["stale_after_seconds"] == 15  # 3 x max(POLL_INTERVAL 1 s, HEARTBEAT_INTERVAL 5 s)

    # A handler still running when SIGTERM comes: the worker stays up to let
    # it finish, not ready (out of rotation) but alive.
    message = enqueue("default", {"sleep": 5}).message
    wait_for(
        lambda: Execution.objects.filter(message_id=message.pk).exists(),
        message="the message to start",
    )
    worker.signal(signal.SIGTERM)
    wait_for(
        lambda: answers(port, "/readyz", 503, "stopping"),
        timeout=30,
        message="/readyz to answer 503 once shutdown began",
    )
    assert answers(port, "/healthz", 200, "ok"), "alive while it finishes its handler"
    assert worker.wait(timeout=60) == 0, worker.output
    assert Message.objects.get(pk=message.pk).status == "succeeded"
    assert probe(port, "/readyz") is None  # the server stopped with the worker
    assert "health checks at http://127.0.0.1:" in worker.output


def test_readiness_follows_the_database_through_an_outage(proxied_env, spawn_worker):
    proxy, env = proxied_env
    port = free_port()
    worker = spawn_worker("--queue", "default", *health_options(port), env=env)
    wait_for(lambda: answers(port, "/readyz", 200, "ready"), timeout=60, message="readiness")

    proxy.cut()
    down = wait_for(
        lambda: answers(port, "/readyz", 503, "database unreachable"),
        timeout=30,
        message="/readyz to report the unreachable database",
    )
    assert isinstance(down, dict) and down["database_unreachable_seconds"] >= 0
    # The worker is not stuck, only waiting for its database: no restart.
    assert answers(port, "/healthz", 200, "ok")

    proxy.restore()
    wait_for(
        lambda: answers(port, "/readyz", 200, "ready"),
        timeout=60,
        message="/readyz to recover with the database",
    )
    message = enqueue("default", {}).message
    wait_for(
        lambda: Message.objects.get(pk=message.pk).status == "succeeded",
        timeout=30,
        message="the worker to consume again",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert "database reachable again" in worker.output


def test_a_database_unreachable_past_the_limit_stops_the_worker_with_status_75(
    proxied_env, spawn_worker
):
    proxy, env = proxied_env
    # Short leases and grace: the message it holds comes back soon after it exits.
    env = {**env, "DELAYQ_TEST_LEASE": "2", "DELAYQ_TEST_GRACE": "0.5"}
    message = enqueue("default", {"sleep": 60, "sleep_attempts": 1}).message
    port = free_port()
    worker = spawn_worker(
        "--queue", "default", "--database-outage-limit", "3", *health_options(port), env=env
    )
    wait_for(lambda: answers(port, "/readyz", 200, "ready"), timeout=60, message="readiness")
    wait_for(
        lambda: Execution.objects.filter(message_id=message.pk).exists(),
        message="the message to start",
    )

    proxy.cut()
    wait_for(
        lambda: answers(port, "/readyz", 503, "database unreachable"),
        timeout=30,
        message="/readyz to report the unreachable database before the worker gives up",
    )
    assert worker.wait(timeout=60) == DatabaseUnreachable.exit_code == 75, worker.output
    assert "over DATABASE_OUTAGE_LIMIT (3 s): stopping, exit status 75" in worker.output
    assert "CommandError: the database stayed unreachable for over 3 s" in worker.output

    # Nothing is lost: the message it held returns when its lease expires.
    rescuer = spawn_worker("--queue", "default", env={"DELAYQ_TEST_LEASE": "2"})
    wait_for(
        lambda: Message.objects.get(pk=message.pk).status == "succeeded",
        timeout=60,
        message="the held message to be redelivered and succeed",
    )
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    assert Message.objects.get(pk=message.pk).attempt_count == 2


def test_a_worker_that_starts_without_its_database_gives_up(proxied_env, spawn_worker):
    proxy, env = proxied_env
    proxy.cut()
    port = free_port()
    worker = spawn_worker(
        "--queue", "default", "--database-outage-limit", "2", *health_options(port), env=env
    )
    if connection.vendor == "mysql":
        # Django's start-up checks of MariaDB/MySQL query the server: it
        # cannot start at all, and says so.
        assert worker.wait(timeout=60) == 1, worker.output
        assert "CommandError: cannot reach the database to check it" in worker.output
        return
    wait_for(
        lambda: answers(port, "/readyz", 503, "database unreachable"),
        timeout=60,
        message="/readyz to report the unreachable database",
    )
    assert worker.wait(timeout=60) == 75, worker.output
    assert "over DATABASE_OUTAGE_LIMIT (2 s)" in worker.output


def test_a_taken_health_port_stops_the_command_with_a_clear_error(worker_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "django", "run_delayq", "--burst", *health_options(port)],
            cwd=ROOT,
            env=worker_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"CommandError: cannot serve health checks on 127.0.0.1:{port}" in done.stderr


def outside_address() -> str | None:
    """An address of this host that is not loopback (the interface of the default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
        except OSError:
            return None
        address = str(sock.getsockname()[0])
    return None if address.startswith("127.") else address


def threads_and_files(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_the_probes_listen_on_loopback_and_slow_clients_cannot_exhaust_the_worker(spawn_worker):
    from django_delayq.httpserver import MAX_CONNECTIONS

    port = free_port()
    # No --health-address: the default.
    worker = spawn_worker("--queue", "default", "--health-port", str(port))
    wait_for(lambda: answers(port, "/readyz", 200, "ready"), timeout=60, message="readiness")
    outside = outside_address()
    if outside is not None:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((outside, port), timeout=5).close()

    # Connections that send a request line and never finish their request.
    threads, files = threads_and_files(worker.pid)
    clients = []
    for _ in range(100):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            client.sendall(b"GET /healthz HTTP/1.1\r\n")
        except OSError:
            pass  # already closed by the worker: it serves no more at once
        clients.append(client)

    def all_closed() -> bool:
        # A thread and a socket per connection served, at most MAX_CONNECTIONS at once
        # (and a few to spare for the worker's own threads and connections).
        now = threads_and_files(worker.pid)
        assert now[0] <= threads + MAX_CONNECTIONS + 4, (threads, now)
        assert now[1] <= files + MAX_CONNECTIONS + 8, (files, now)
        done = 0
        for client in clients:
            try:
                while client.recv(4096, socket.MSG_DONTWAIT):
                    pass
                done += 1  # EOF
            except BlockingIOError:
                pass
            except OSError:
                done += 1  # reset
        return done == len(clients)

    try:
        wait_for(all_closed, timeout=90, message="the worker to close every slow connection")
    finally:
        for client in clients:
            client.close()
    # The probes answer on, and the worker stops as ever.
    assert answers(port, "/healthz", 200, "ok")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert "health checks at http://127.0.0.1:" in worker.output
