"""Tasks enqueued through Django's Tasks framework, run by ``run_delayq`` processes."""

import signal
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_delayq.models import Message
from tests.conftest import wait_for
from tests.testapp.models import Effect
from tests.testapp.tasks import (
    TaskBoom,
    TaskResultStatus,
    add,
    explode,
    record,
    send_email,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_worker_process_runs_tasks_and_stores_results_and_errors(spawn_worker):
    ok = add.enqueue(2, 3)
    bad = explode.enqueue("no fuse")
    mail = send_email.enqueue("a@example.com", subject="welcome")
    with transaction.atomic():
        record.enqueue("rolled back")
        transaction.set_rollback(True)

    worker = spawn_worker("--burst", "--queue", "default", "--queue", "emails")
    assert worker.wait() == 0, worker.output

    done = add.get_result(ok.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert done.worker_ids == [f"{done.worker_ids[0].split(':')[0]}:{worker.pid}"]
    failed = explode.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is TaskBoom
    assert "no fuse" in failed.errors[0].traceback
    sent = send_email.get_result(mail.id)
    assert sent.return_value == {"to": "a@example.com", "subject": "welcome", "attempt": 1}
    # The rolled-back call never reached the queue, so nothing ran it.
    assert list(Effect.objects.values_list("value", flat=True)) == ["a@example.com"]
    # The framework's own receivers of task_started / task_finished ran in
    # the worker process (they log each task's state); a failed task is the
    # worker's one error line, with the traceback, instead of two.
    path = "tests.testapp.tasks"
    assert f"Task id={ok.id} path={path}.add state=RUNNING" in worker.output
    assert f"Task id={ok.id} path={path}.add state=SUCCESSFUL" in worker.output
    assert f"Task id={bad.id} path={path}.explode state=RUNNING" in worker.output
    assert f"Task id={bad.id} path={path}.explode state=FAILED" not in worker.output
    assert (
        f"message {bad.id} (default/{Message.objects.get(pk=int(bad.id)).key}) failed after "
        "1 attempt(s): tests.testapp.tasks.TaskBoom: no fuse\nTraceback" in worker.output
    )


def test_worker_process_waits_for_run_after(spawn_worker):
    run_after = timezone.now() + timedelta(seconds=2)
    soon = add.using(run_after=run_after).enqueue(1, 1)
    much_later = add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(3, 3)
    now = add.enqueue(2, 2)
    worker = spawn_worker("--queue", "default", env={"DELAYQ_TEST_POLL": "0.2"})
    wait_for(lambda: add.get_result(now.id).is_finished, message="the task due now to be run")
    wait_for(
        lambda: add.get_result(soon.id).is_finished,
        timeout=30,
        message="the task deferred by 2 s to be run",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    done = add.get_result(soon.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.started_at >= run_after
    waiting = add.get_result(much_later.id)
    assert (waiting.status, waiting.started_at, waiting.worker_ids) == (
        TaskResultStatus.READY,
        None,
        [],
    )


def test_worker_process_runs_higher_priority_first(spawn_worker):
    for tag, priority in [("low", -100), ("high", 100), ("low-ish", -1), ("middle", 0)]:
        record.using(priority=priority).enqueue(tag)
    worker = spawn_worker(
        "--burst", "--queue", "default", "--concurrency", "1", "--batch-size", "1"
    )
    assert worker.wait() == 0, worker.output
    assert list(Effect.objects.order_by("pk").values_list("value", flat=True)) == [
        "high",
        "middle",
        "low-ish",
        "low",
    ]
