"""The flow control gauges (``delayq_throttled``, ``delayq_group_held_messages``,
``delayq_blocked_groups``), sampled in process as a worker's metrics thread does."""

from datetime import timedelta

import pytest

from django_delayq import enqueue_many
from django_delayq.flow import limits_of
from django_delayq.store import claim, settle
from django_delayq.store.limits import claim_limited

pytest.importorskip("prometheus_client")
from prometheus_client import REGISTRY  # noqa: E402

from django_delayq.metrics import WorkerMetrics  # noqa: E402

pytestmark = pytest.mark.django_db

LEASE = timedelta(minutes=5)


def sampled(queues: list[str]) -> WorkerMetrics:
    metrics = WorkerMetrics(
        port=9, address="127.0.0.1", interval=timedelta(seconds=15), queues=queues, using="default"
    )
    metrics.sample()
    return metrics


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_throttled_by_queue_and_kind(settings, fake_clock):
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"default": {"GLOBAL_CONCURRENCY": 1}}}
    enqueue_many("default", [{}] * 2)
    enqueue_many("limited", [{}] * 7, kind="webhook")
    claim_limited(["default"], 10, limits_of("default"), worker="w", lease=LEASE)
    # "limited" (tests/testapp/handlers.py): at most 2 at once, its webhooks 5/s.
    claim_limited(
        ["limited"], 10, limits_of("limited"), worker="w", lease=LEASE, kinds=(["webhook"], True)
    )
    sampled(["default", "limited", "other"])
    assert gauge("delayq_throttled", queue="default", kind="") == 1
    assert gauge("delayq_throttled", queue="limited", kind="") == 1  # the cap of 2
    assert gauge("delayq_throttled", queue="limited", kind="webhook") == 0  # 2 of 5 a second
    assert gauge("delayq_throttled", queue="other", kind="") == 0  # no limit: 0, not absent
    # The leases run out (their worker crashed): nothing holds the queues back.
    fake_clock.advance(LEASE.total_seconds() + 1)
    sampled(["default", "limited"])
    assert gauge("delayq_throttled", queue="default", kind="") == 0
    assert gauge("delayq_throttled", queue="limited", kind="") == 0


def test_held_messages_and_blocked_groups_by_queue():
    for group in ("a", "b"):
        enqueue_many("other", [{}] * 3, group=group)
    heads = claim.claim(["other"], 10, worker="w", lease=LEASE)
    first = min(heads.messages, key=lambda m: m.pk)
    assert settle.fail(first.pk, heads.token, error="x: 1", retry_at=None) == 1
    sampled(["other", "default"])
    assert gauge("delayq_group_held_messages", queue="other") == 4
    assert gauge("delayq_blocked_groups", queue="other") == 1
    assert gauge("delayq_group_held_messages", queue="default") == 0
    assert gauge("delayq_blocked_groups", queue="default") == 0
