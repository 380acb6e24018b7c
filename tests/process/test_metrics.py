"""Prometheus metrics scraped over HTTP from a real run_delayq process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_delayq import enqueue, enqueue_many
from django_delayq.queues import pause_queue
from tests.conftest import ROOT, wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the /metrics page, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape_when_up(port: int) -> dict | None:
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return None


def test_worker_serves_counters_histogram_depth_lag_and_liveness(spawn_worker):
    # A paused queue keeps its due messages: depth and lag are known.
    pause_queue("slow")
    an_hour_ago = timezone.now() - timedelta(hours=1)
    enqueue_many("slow", [{}, {}], run_at=an_hour_ago)
    enqueue_many("default", [{}, {}, {}])
    enqueue_many("default", [{}, {}], delay=timedelta(hours=1))
    enqueue("other", {"fail": 9}, key="doomed")  # fails, retried in 60 s
    # Outlives its handler's time limit once: the keeper fails that attempt.
    enqueue("chaos-slow", {"sleep": 4, "sleep_attempts": 1}, key="late")
    started = time.time()
    port = free_port()
    worker = spawn_worker(
        "--queue", "default", "--queue", "other", "--queue", "slow", "--queue", "chaos-slow",
        "--concurrency", "2",
        "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
    )  # fmt: skip

    def processed() -> dict | None:
        samples = scrape_when_up(port)
        if samples is None:
            return None
        done = value(
            samples, "delayq_messages_processed_total", queue="default", outcome="succeeded"
        )
        retried = value(
            samples, "delayq_messages_processed_total", queue="other", outcome="retrying"
        )
        late = [
            value(samples, "delayq_messages_processed_total", queue="chaos-slow", outcome=o)
            for o in ("retrying", "succeeded")
        ]
        return samples if (done, retried, late) == (3, 1, [1, 1]) else None

    samples = wait_for(processed, timeout=60, message="the attempts to be counted")
    assert isinstance(samples, dict)
    assert value(samples, "delayq_processing_seconds_count", queue="default") == 3
    assert value(samples, "delayq_processing_seconds_count", queue="other") == 1
    assert value(samples, "delayq_processing_seconds_bucket", queue="default", le="+Inf") == 3
    assert value(samples, "delayq_queue_depth", queue="slow", state="due") == 2
    assert value(samples, "delayq_queue_depth", queue="default", state="scheduled") == 2
    lag = value(samples, "delayq_queue_lag_seconds", queue="slow")
    assert lag is not None and lag >= 3600
    # Flow control, for every queue of the worker (0: none of its limits hold it back).
    assert value(samples, "delayq_throttled", queue="default", kind="") == 0
    assert value(samples, "delayq_group_held_messages", queue="slow") == 0
    assert value(samples, "delayq_blocked_groups", queue="other") == 0
    assert value(samples, "delayq_worker_up") == 1
    last_loop = value(samples, "delayq_worker_last_loop_timestamp_seconds")
    assert last_loop is not None and last_loop >= started
    info = [key for key in samples if key[0] == "delayq_worker_info"]
    assert len(info) == 1 and ("queues", "default,other,slow,chaos-slow") in info[0][1]
    # The attempt past its time limit was counted once, with its time.
    assert value(samples, "delayq_processing_seconds_count", queue="chaos-slow") == 2
    # The process's own metrics come along (the default registry).
    assert any(name.startswith("process_") for name, _ in samples)

    # The loop keeps turning while idle: liveness moves on.
    wait_for(
        lambda: (
            (s := scrape(port))
            and (value(s, "delayq_worker_last_loop_timestamp_seconds") or 0) > last_loop
        ),
        timeout=30,
        message="the loop timestamp to advance",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert "metrics at http://127.0.0.1:" in worker.output
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(port)


def test_a_taken_metrics_port_stops_the_command_with_a_clear_error(worker_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "django", "run_delayq", "--burst", "--metrics-port",
             str(port), "--metrics-address", "127.0.0.1"],
            cwd=ROOT, env=worker_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    assert f"CommandError: cannot serve metrics on 127.0.0.1:{port}" in done.stderr


@pytest.mark.parametrize("port", ["0", "70000", "http"])
def test_a_bad_metrics_port_is_refused(port):
    with pytest.raises(CommandError):
        call_command("run_delayq", "--burst", "--metrics-port", port)
