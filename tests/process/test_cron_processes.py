"""Cron with real run_delayq processes: many installers, each tick delivered once."""

import json
import signal
from collections import Counter
from datetime import timedelta

import pytest

from django_delayq.cron.ticks import parse_key
from django_delayq.models import Message
from tests.conftest import wait_for
from tests.testapp.models import Execution

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

TICKS_WANTED = 5


def executed():
    """``(tick time, message id)`` of every execution so far, from the tick keys."""
    runs = list(Execution.objects.values_list("message_id", flat=True))
    keys = dict(Message.objects.filter(pk__in=runs).values_list("pk", "key"))
    return [(parse_key(keys[pk])[2], pk) for pk in runs]


def test_three_workers_started_at_once_deliver_every_tick_exactly_once(spawn_worker):
    # A generous grace: this test is about duplicates, and a tick a loaded CI
    # machine starts a few seconds late must not count as missed.
    schedules = {"every-2s": {"every": 2, "queue": "ticks", "grace": 60}}
    env = {
        "DELAYQ_TEST_SCHEDULES": json.dumps(schedules),
        "DELAYQ_TEST_POLL": "0.5",
        # Re-install every half second, so the three keep racing while ticks run.
        "DELAYQ_TEST_CRON_INSTALL_INTERVAL": "0.5",
    }
    workers = [spawn_worker("--queue", "ticks", env=env) for _ in range(3)]
    wait_for(
        lambda: len({t for t, _ in executed()}) >= TICKS_WANTED,
        timeout=90,
        message=f"{TICKS_WANTED} ticks to run",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait() for w in workers] == [0, 0, 0], [w.output for w in workers]

    runs = executed()
    per_message = Counter(pk for _, pk in runs)
    assert set(per_message.values()) == {1}, "a tick message ran more than once"
    times = sorted(t for t, _ in runs)
    assert len(times) == len(set(times)), "two messages for one tick time"
    first, last = times[0], times[-1]
    expected = [first + timedelta(seconds=2 * i) for i in range((last - first).seconds // 2 + 1)]
    assert times == expected, "a tick between the first and the last was not delivered"

    # Every installed tick up to the last one ran; none was created twice.
    installed = [parse_key(k)[2] for k in Message.objects.values_list("key", flat=True)]
    assert len(installed) == len(set(installed))
    assert sorted(t for t in installed if t <= last) == expected
    assert Message.objects.filter(status__in=["failed", "cancelled"]).count() == 0


def test_a_serving_worker_back_after_an_outage_runs_no_tick_past_its_grace(spawn_worker, settings):
    """Every worker was stopped for 35 s under an every=5 schedule (grace 5 s): the
    serving worker that comes back must not run the seven overdue ticks one after
    another, up to 30 s late. Its first maintenance round (which cancels missed
    ticks) runs on its own thread beside its first claims; whichever comes first, a
    tick that ran started within its grace, and the others were cancelled as
    missed."""
    from django_delayq import clock
    from django_delayq.cron.install import install_schedules

    schedules = {"fives": {"every": 5, "queue": "ticks"}}
    settings.DELAYQ = {**settings.DELAYQ, "SCHEDULES": schedules}
    stopped = clock.now() - timedelta(seconds=35)
    install_schedules(stopped)  # installed by the workers before they stopped
    back = clock.now()
    overdue = [
        m.pk
        for m in Message.objects.filter(key__startswith="cron:fives:")
        if parse_key(m.key)[2] <= back
    ]
    assert len(overdue) >= 7

    worker = spawn_worker("--queue", "ticks", env={"DELAYQ_TEST_SCHEDULES": json.dumps(schedules)})
    wait_for(
        lambda: (
            not Message.objects.filter(pk__in=overdue, status__in=["pending", "running"]).exists()
        ),
        timeout=60,
        message="the overdue ticks to be run or cancelled",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output

    ran = Message.objects.filter(pk__in=overdue, status="succeeded")
    late = {m.key: m.last_attempt_time - parse_key(m.key)[2] for m in ran}
    assert all(by <= timedelta(seconds=5) for by in late.values()), late
    missed = Message.objects.filter(pk__in=overdue, status="cancelled")
    assert missed.count() >= len(overdue) - 2
    assert all(m.last_error.startswith("Missed") for m in missed)
    assert "missed" in worker.output
