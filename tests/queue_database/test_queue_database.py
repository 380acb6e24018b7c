"""The queue on its own database: DELAYQ["DATABASE"] = "queue" with DelayQRouter.

Run with DELAYQ_TEST_QUEUE_URL naming a second database (``scripts/dev.sh``'s
"queue on its own database" leg); skipped otherwise. The project's own
tables (users, sessions, the test app's ``Execution``) stay on ``default``.
"""

from __future__ import annotations

import io
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_delayq import enqueue, enqueue_many
from django_delayq.cron.install import install_schedules
from django_delayq.models import Message, QueueState, WorkerState
from django_delayq.routers import queue_alias
from tests.admin.message_pages import CHANGELIST, action_data, confirm_data, notes
from tests.conftest import wait_for
from tests.testapp.models import Execution

pytestmark = [
    pytest.mark.skipif(
        "queue" not in settings.DATABASES, reason="needs DELAYQ_TEST_QUEUE_URL (a second database)"
    ),
]
BOTH = ["default", "queue"]
both = pytest.mark.django_db(databases=BOTH)
both_committed = pytest.mark.django_db(databases=BOTH, transaction=True)


def on_queue(**lookups) -> bool:
    return Message.objects.using("queue").filter(**lookups).exists()


def committed_on_queue(pk: int) -> bool:
    """Whether another connection (another thread's) sees message ``pk``: it is committed."""
    seen: list[bool] = []

    def look() -> None:
        try:
            seen.append(Message.objects.using("queue").filter(pk=pk).exists())
        finally:
            connections.close_all()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(30)
    return seen == [True]


@both
def test_the_queue_alias_is_the_setting():
    assert queue_alias() == "queue"
    assert queue_alias(read=True) == "queue"
    assert queue_alias("default") == "default"


@both
def test_migrate_creates_the_tables_on_the_queue_database_only():
    queue_tables = set(connections["queue"].introspection.table_names())
    default_tables = set(connections["default"].introspection.table_names())
    for model in (Message, QueueState, WorkerState):
        assert model._meta.db_table in queue_tables
        assert model._meta.db_table not in default_tables
    # The router has no opinion on the project's own apps.
    assert Execution._meta.db_table in default_tables


@both
def test_enqueue_writes_on_the_queue_database():
    result = enqueue("default", {"n": 1}, key="k1")
    assert result.message._state.db == "queue"
    assert on_queue(pk=result.message.pk, key="k1")
    # The default manager follows the router: the admin and user code see it.
    assert Message.objects.filter(pk=result.message.pk).exists()
    results = enqueue_many("default", [{"n": 2}, {"n": 3}])
    assert all(on_queue(pk=r.message.pk) for r in results)


@both_committed
def test_enqueue_inside_a_default_transaction_commits_at_once_and_survives_its_rollback():
    """The documented loss: a business rollback on default does not take the message back."""
    with pytest.raises(RuntimeError), transaction.atomic(using="default"):
        Execution.objects.create(
            message_id=0, attempt=1, worker="w", queue="q", started=timezone.now()
        )
        pk = enqueue("default", {"n": 1}).message.pk
        # Already committed on the queue's connection, before default commits.
        assert committed_on_queue(pk)
        raise RuntimeError("business rollback")
    assert not Execution.objects.exists()
    assert on_queue(pk=pk)


@both_committed
def test_enqueue_inside_an_atomic_block_on_the_queue_alias_rolls_back_with_it():
    with pytest.raises(RuntimeError), transaction.atomic(using="queue"):
        pk = enqueue("default", {"n": 1}).message.pk
        assert not committed_on_queue(pk)
        raise RuntimeError("rollback")
    assert not on_queue(pk=pk)


@both_committed
def test_enqueue_on_commit_of_the_business_transaction_sends_nothing_for_a_rollback():
    def business(fail: bool, key: str) -> None:
        with transaction.atomic(using="default"):
            Execution.objects.create(
                message_id=0, attempt=1, worker="w", queue="q", started=timezone.now()
            )
            transaction.on_commit(lambda: enqueue("default", key=key), using="default")
            if fail:
                raise RuntimeError("business rollback")

    with pytest.raises(RuntimeError):
        business(True, "rolled-back")
    business(False, "committed")
    assert not on_queue(key="rolled-back")
    assert on_queue(key="committed")


@pytest.mark.process
@both_committed
def test_a_run_delayq_process_consumes_the_queue_database(spawn_worker):
    pks = [r.message.pk for r in enqueue_many("default", [{"n": i} for i in range(5)])]
    worker = spawn_worker("--burst", "--queue", "default")
    assert worker.wait(timeout=120) == 0, worker.output
    assert set(
        Message.objects.using("queue").filter(pk__in=pks).values_list("status", flat=True)
    ) == {"succeeded"}
    # The handlers' own writes went to default, where the router leaves them.
    assert set(Execution.objects.using("default").values_list("message_id", flat=True)) == set(pks)
    # The worker's heartbeat is on the queue database.
    assert WorkerState.objects.using("queue").exists()


@pytest.mark.process
@both_committed
def test_a_serving_run_delayq_process_wakes_for_messages_on_the_queue_database(spawn_worker):
    worker = spawn_worker("--queue", "default")
    pid = worker.pid
    wait_for(
        lambda: WorkerState.objects.using("queue").filter(pid=pid).exists(),
        timeout=60,
        message="the worker's heartbeat on the queue database",
    )
    pk = enqueue("default", {"n": 1}).message.pk
    wait_for(lambda: on_queue(pk=pk, status="succeeded"), timeout=60, message="the message to run")
    worker.stop()


@both
def test_run_delayq_refuses_an_unknown_database():
    with pytest.raises(CommandError, match="'nowhere' is not in DATABASES"):
        call_command("run_delayq", "--burst", "--database", "nowhere")


@both
def test_run_delayq_on_a_database_without_the_tables_says_to_migrate_it():
    # --database overrides DELAYQ["DATABASE"]; default was never migrated for the queue.
    with pytest.raises(
        CommandError, match=r"not on database 'default'.*migrate --database default"
    ):
        call_command("run_delayq", "--burst", "--database", "default")


@both
def test_the_admin_lists_and_retries_messages_of_the_queue_database(admin_client):
    failed = enqueue("default", {"n": 1}, key="to-retry").message
    Message.objects.using("queue").filter(pk=failed.pk).update(
        status="failed", finished_at=timezone.now(), next_attempt_time=None, attempt_count=5
    )
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    assert [m.pk for m in response.context["cl"].result_list] == [failed.pk]
    page = admin_client.post(CHANGELIST, action_data("retry_failed", [failed.pk]))
    assert "1 will change." in page.content.decode()
    response = admin_client.post(
        CHANGELIST, confirm_data("retry_failed", [failed.pk], extra_attempts="1")
    )
    assert notes(response) == ["Sent back to pending 1 message."]
    assert on_queue(pk=failed.pk, status="pending")


@both
def test_the_tasks_backend_enqueues_on_the_queue_database():
    tasks = pytest.importorskip("tests.testapp.tasks")
    from django_delayq.backends import TASK_KIND

    result = tasks.add.enqueue(2, 3)
    assert on_queue(pk=int(result.id), kind=TASK_KIND)
    assert tasks.add.get_result(result.id).args == [2, 3]


@both
def test_cron_installs_its_ticks_on_the_queue_database():
    with override_settings(
        DELAYQ={**settings.DELAYQ, "SCHEDULES": {"beat": {"every": 60, "queue": "ticks"}}}
    ):
        report = install_schedules()
    assert report.results and all(not r.error and r.created for r in report.results)
    assert Message.objects.using("queue").filter(queue="ticks", key__startswith="cron:").exists()


@both
def test_delayq_status_reads_the_queue_database():
    enqueue_many("reports", [{"n": i} for i in range(3)])
    out = io.StringIO()
    call_command("delayq_status", "--queue", "reports", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if "reports" in line)
    assert " 3 " in f" {line} "


@both
def test_the_delayq_fixture_runs_messages_of_the_queue_database(delayq):
    pk = enqueue("default", {"n": 1}, run_at=timezone.now() + timedelta(minutes=5)).message.pk
    delayq.assert_enqueued("default", count=1)
    delayq.advance(minutes=5)
    assert [a.message.pk for a in delayq.run_pending("default")] == [pk]
    assert on_queue(pk=pk, status="succeeded")
