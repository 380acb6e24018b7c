"""run_delayq processes consuming a project's own model (``QueueFields``)."""

import signal
from collections import Counter

import pytest

from django_delayq.models import WorkerState
from tests.conftest import wait_for
from tests.testapp.models import Execution, Shipment

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def schedule(count: int, **fields) -> list[int]:
    Shipment.objects.bulk_create(Shipment(reference=f"s-{i}", **fields) for i in range(count))
    Shipment.objects.all().schedule()
    return list(Shipment.objects.values_list("pk", flat=True))


def test_three_processes_process_each_row_exactly_once(spawn_worker):
    workers = [
        spawn_worker("--queue", "shipments", "--concurrency", "2", "--batch-size", "5")
        for _ in range(3)
    ]
    # All three up (heartbeat recorded, signal handlers installed) before
    # the rows exist, so that each can take a share and each stops cleanly.
    pids = {w.pid for w in workers}
    wait_for(
        lambda: WorkerState.objects.filter(pid__in=pids).count() == 3,
        timeout=60,
        message="the three workers to start",
    )
    # Each row takes a little work (20 ms), so that one worker cannot drain
    # them all before the others claim: the rows really are shared.
    ids = schedule(300, sleep=0.02)
    wait_for(
        lambda: not Shipment.objects.exclude(status="succeeded").exists(),
        timeout=180,
        message="all 300 rows to succeed",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait() for w in workers] == [0, 0, 0]
    runs = Counter(Execution.objects.values_list("message_id", flat=True))
    assert set(runs) == set(ids)
    assert set(runs.values()) == {1}, "some row ran more than once"
    assert Shipment.objects.filter(attempt_count=1, shipped_at__isnull=False).count() == 300
    assert len(set(Execution.objects.values_list("worker", flat=True))) >= 2


def test_burst_worker_retries_and_exits(spawn_worker):
    (ok, flaky) = schedule(2)
    Shipment.objects.filter(pk=flaky).update(fail=1)
    # FixedDelay of 60 s (tests/settings.py): the retry is not due within the burst.
    worker = spawn_worker("--queue", "shipments", "--burst")
    assert worker.wait() == 0, worker.output
    assert Shipment.objects.get(pk=ok).status == "succeeded"
    row = Shipment.objects.get(pk=flaky)
    assert (row.status, row.attempt_count, row.lock_token) == ("pending", 1, None)
    assert "Boom: attempt 1 of shipment" in row.last_error


def test_sigkilled_workers_row_is_redelivered_after_the_lease(spawn_worker):
    (pk,) = schedule(1, sleep=60)
    victim = spawn_worker("--queue", "shipments")
    wait_for(lambda: Execution.objects.filter(message_id=pk).exists(), message="attempt 1")
    victim.signal(signal.SIGKILL)
    victim.wait()
    held = Shipment.objects.get(pk=pk)
    assert (held.status, held.attempt_count) == ("running", 1)
    # The second attempt must not sleep: the handler reads the row it was given.
    Shipment.objects.filter(pk=pk).update(sleep=0)
    rescuer = spawn_worker("--queue", "shipments")
    wait_for(
        lambda: Shipment.objects.get(pk=pk).status == "succeeded",
        timeout=30,  # the handler's lease is 5 s
        message="the redelivered row to succeed",
    )
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    row = Shipment.objects.get(pk=pk)
    assert row.attempt_count == 2 and row.is_redelivery
    attempts = sorted(Execution.objects.filter(message_id=pk).values_list("attempt", flat=True))
    assert attempts == [1, 2]


def test_sigterm_finishes_the_running_row_and_gives_back_the_rest(spawn_worker):
    ids = schedule(20)
    slow = ids[0]
    Shipment.objects.filter(pk=slow).update(sleep=1.5, priority=10)
    worker = spawn_worker("--queue", "shipments", "--concurrency", "1", "--batch-size", "10")
    wait_for(lambda: Execution.objects.filter(message_id=slow).exists(), message="the slow row")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    assert Shipment.objects.get(pk=slow).status == "succeeded"
    assert not Shipment.objects.filter(status="running").exists()
    # Claimed but never started: pending again, with the attempt given back.
    unstarted = Shipment.objects.filter(status="pending")
    assert unstarted.exists()
    assert set(unstarted.values_list("attempt_count", flat=True)) == {0}


def test_a_fan_in_of_rows_across_processes_releases_its_child_once_after_them(spawn_worker):
    """Rows as workflow parents (their stand-ins): 200 shipments shared by three
    processes, then one message after all of them, then a row after that message.
    The message runs once, after the last row's end; the row after it, once, after it."""
    from django_delayq import enqueue
    from django_delayq.models import Message

    workers = [
        spawn_worker("--queue", "shipments", "--queue", "steps", "--concurrency", "2")
        for _ in range(3)
    ]
    pids = {w.pid for w in workers}
    wait_for(
        lambda: WorkerState.objects.filter(pid__in=pids).count() == 3,
        timeout=60,
        message="the three workers to start",
    )
    Shipment.objects.bulk_create(Shipment(reference=f"p-{i}", sleep=0.01) for i in range(200))
    parents = list(Shipment.objects.order_by("pk"))
    last = Shipment.objects.create(reference="after the report")
    from django.db import transaction

    with transaction.atomic():
        Shipment.objects.filter(pk__in=[p.pk for p in parents]).schedule()
        report = enqueue("steps", {}, key="report", after=parents).message
        last.schedule(after=[report])
    wait_for(
        lambda: Shipment.objects.get(pk=last.pk).status == "succeeded",
        timeout=180,
        message="the row after the report to succeed",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait() for w in workers] == [0, 0, 0]
    report = Message.objects.get(pk=report.pk)
    assert report.status == "succeeded"
    runs = Execution.objects.filter(message_id=report.pk, queue="steps")
    assert runs.count() == 1, "the fan-in child ran more than once"
    last_parent = max(
        Execution.objects.filter(
            queue="shipments", message_id__in=[p.pk for p in parents]
        ).values_list("started", flat=True)
    )
    assert runs.get().started > last_parent
    row_runs = Execution.objects.filter(queue="shipments", message_id=last.pk)
    assert row_runs.count() == 1 and row_runs.get().started >= report.finished_at
