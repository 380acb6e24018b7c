"""DelayQBackend for Django's Tasks framework, with in-process workers.

Real claims on the test database, the framework's own ``@task``/``enqueue``/
``get_result``; the worker processes of ``run_delayq`` are in
tests/process/test_tasks_processes.py.
"""

import logging
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction
from django.test import override_settings

from django_delayq import enqueue, operations
from django_delayq.backends import TASK_KIND, DelayQBackend, TaskCancelled, TaskLost
from django_delayq.exceptions import Discard
from django_delayq.models import Message
from django_delayq.store import claim
from tests.conftest import ROOT
from tests.json_values import JSON_VALUES, exact
from tests.testapp.models import Effect, Execution
from tests.testapp.tasks import (
    InvalidTask,
    TaskBoom,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    account_step,
    add,
    add_async,
    echo,
    explode,
    flaky,
    give_up,
    record,
    returns_a_set,
    send_email,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
    tenant_event,
)

TASKS_LOGGER = (
    "django.tasks" if task_backends.__module__.startswith("django.tasks") else "django_tasks"
)

pytestmark = pytest.mark.django_db(transaction=True)


class SignalLog(list):
    stored: dict


@pytest.fixture
def received():
    """Every task signal sent in this process, as (signal name, status, result)."""
    seen = SignalLog()
    stored = {}

    def receiver(name):
        def on_signal(sender, task_result, **kwargs):
            seen.append((name, sender, task_result.status, task_result))
            if name == "finished":
                # What get_result() reads while the receiver runs.
                stored[task_result.id] = task_backends[task_result.backend].get_result(
                    task_result.id
                )

        return on_signal

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    seen.stored = stored
    yield seen
    task_enqueued.disconnect(receivers["enqueued"])
    task_started.disconnect(receivers["started"])
    task_finished.disconnect(receivers["finished"])


# -- enqueue ------------------------------------------------------------------


def test_enqueue_writes_a_task_message_in_the_callers_transaction():
    with transaction.atomic():
        result = add.using(priority=7).enqueue(2, 3)
        message = Message.objects.get(pk=int(result.id))
    assert result.status == TaskResultStatus.READY
    assert (message.queue, message.kind, message.priority, message.status) == (
        "default",
        TASK_KIND,
        7,
        "pending",
    )
    assert message.payload["task"] == "tests.testapp.tasks.add"
    assert (message.payload["args"], message.payload["kwargs"]) == ([2, 3], {})
    assert message.max_attempts == 1
    fetched = add.get_result(result.id)
    assert (fetched.status, fetched.args, fetched.task.priority) == (
        TaskResultStatus.READY,
        [2, 3],
        7,
    )
    assert fetched.enqueued_at == message.created_at
    assert not fetched.is_finished and fetched.worker_ids == []
    with pytest.raises(ValueError, match="not finished"):
        fetched.return_value  # noqa: B018


def test_rolled_back_enqueue_leaves_no_message_and_sends_no_signal(received):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        lost = add.enqueue(1, 1)
        assert Message.objects.filter(pk=int(lost.id)).exists()
        raise Abort
    assert not Message.objects.filter(pk=int(lost.id)).exists()
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(lost.id)
    assert received == []

    with transaction.atomic():
        kept = add.enqueue(1, 2)
        assert received == [], "task_enqueued waits for the commit"
    assert [(name, r.id) for name, _, _, r in received] == [("enqueued", kept.id)]
    assert received[0][1] is DelayQBackend and received[0][2] == TaskResultStatus.READY


def test_bad_tasks_are_refused_before_anything_is_written():
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        add.using(queue_name="nope")
    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)
    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=datetime(2030, 1, 1))
    with pytest.raises(TypeError, match="JSON"):
        add.enqueue(object(), 1)
    assert not Message.objects.exists()


def test_get_result_only_finds_task_messages():
    plain = enqueue("default", {"n": 1}).message
    for result_id in ("not-a-number", "999999999", str(plain.pk)):
        with pytest.raises(TaskResultDoesNotExist):
            add.get_result(result_id)
    result = add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        explode.get_result(result.id)


# -- running ------------------------------------------------------------------


def test_worker_runs_the_task_and_stores_its_return_value(run_worker):
    result = add.enqueue(2, 3)
    run_worker(["default"])
    done = add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.errors == []
    assert done.attempts == 1 and len(done.worker_ids) == 1
    assert done.started_at == done.last_attempted_at
    assert done.enqueued_at is not None and done.started_at <= done.finished_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert Message.objects.get(pk=int(result.id)).status == "succeeded"


@pytest.mark.parametrize("value", JSON_VALUES)
def test_task_arguments_and_return_values_keep_their_json_type(run_worker, value):
    result = echo.enqueue(value)
    run_worker(["default"])
    done = echo.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert exact(done.args[0]) == exact(value)
    assert Effect.objects.get(message_id=int(result.id)).value == exact(value)[1]
    assert exact(done.return_value) == exact(value)


def test_task_exception_is_a_failed_result_with_class_and_traceback(run_worker):
    result = explode.enqueue("the fuse was short")
    run_worker(["default"])
    failed = explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors
    assert error.exception_class is TaskBoom
    assert error.exception_class_path == "tests.testapp.tasks.TaskBoom"
    assert "the fuse was short" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        failed.return_value  # noqa: B018
    message = Message.objects.get(pk=int(result.id))
    assert message.status == "failed" and "TaskBoom: the fuse was short" in message.last_error


def test_a_failed_task_is_one_error_line_with_its_traceback(run_worker, caplog):
    # The framework logs every finished task from its own receiver; for a
    # failed one the worker's line (with delayq's fields) is the only one.
    caplog.set_level(logging.INFO, logger=TASKS_LOGGER)
    result = explode.enqueue("the fuse was short")
    run_worker(["default"])
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["django_delayq.worker"], [r.getMessage() for r in errors]
    [line] = errors
    assert f"message {result.id} " in line.getMessage()
    assert "TaskBoom: the fuse was short" in line.getMessage()
    assert line.exc_info is not None and line.exc_info[0] is TaskBoom
    assert "the fuse was short" in caplog.text and "Traceback" in caplog.text
    assert (line.message_id, line.queue, line.kind, line.attempt, line.outcome) == (
        int(result.id),
        "default",
        TASK_KIND,
        1,
        "failed",
    )
    # A task that succeeds is still the framework's to log (INFO), and so is
    # a discarded one (the worker logs a discard at INFO): one error line.
    ok = add.enqueue(1, 2)
    discarded = give_up.enqueue("no recipient")
    caplog.clear()
    run_worker(["default"])
    assert any(ok.id in r.getMessage() and "SUCCESSFUL" in r.getMessage() for r in caplog.records)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.levelno, r.name) for r in errors] == [(logging.ERROR, TASKS_LOGGER)]
    assert f"id={discarded.id} " in errors[0].getMessage()


def test_async_task_runs_and_aget_result_reads_it(run_worker):
    result = async_to_sync(add_async.aenqueue)(20, 22)
    assert Message.objects.get(pk=int(result.id)).payload["args"] == [20, 22]
    run_worker(["default"])
    done = async_to_sync(add_async.aget_result)(result.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    backend = task_backends["default"]
    assert async_to_sync(backend.aget_result)(result.id).return_value == 42
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(backend.aget_result)("999999999")


def test_an_async_task_runs_on_the_workers_event_loop(run_worker):
    from tests.testapp.tasks import where_async

    result = where_async.enqueue()
    run_worker(["default"])
    assert where_async.get_result(result.id).return_value == "delayq-async"


def test_context_and_queue_name_reach_the_task(run_worker):
    result = send_email.enqueue("a@example.com", subject="hi")
    assert Message.objects.get(pk=int(result.id)).queue == "emails"
    run_worker(["emails"])
    done = send_email.get_result(result.id)
    assert done.return_value == {"to": "a@example.com", "subject": "hi", "attempt": 1}
    assert Effect.objects.get().message_id == int(result.id)


def test_higher_priority_runs_first(run_worker):
    for tag, priority in [("low", -100), ("high", 100), ("middle", 0)]:
        record.using(priority=priority).enqueue(tag)
    run_worker(["default"], concurrency=1, batch_size=1)
    assert list(Effect.objects.order_by("pk").values_list("value", flat=True)) == [
        "high",
        "middle",
        "low",
    ]


def test_run_after_is_respected(run_worker, fake_clock):
    run_after = fake_clock() + timedelta(hours=1)
    result = add.using(run_after=run_after).enqueue(1, 1)
    assert add.get_result(result.id).task.run_after == run_after
    run_worker(["default"])
    assert add.get_result(result.id).status == TaskResultStatus.READY
    fake_clock.advance(hours=1, seconds=1)
    run_worker(["default"])
    done = add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.started_at >= run_after


def test_other_messages_of_a_task_queue_keep_their_handler(run_worker):
    plain = enqueue("default", {"n": 1}).message
    result = add.enqueue(1, 2)
    run_worker(["default"])
    assert Execution.objects.filter(message_id=plain.pk).count() == 1
    assert not Execution.objects.filter(message_id=int(result.id)).exists()
    assert add.get_result(result.id).return_value == 3


def test_max_attempts_option_retries_and_keeps_every_error(run_worker, fake_clock):
    result = flaky.enqueue()
    run_worker(["tasks-retry"])
    waiting = flaky.get_result(result.id)
    assert waiting.status == TaskResultStatus.READY
    assert [e.exception_class for e in waiting.errors] == [TaskBoom]
    fake_clock.advance(seconds=61)  # the suite's FixedDelay policy waits 60 s
    run_worker(["tasks-retry"])
    done = flaky.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (TaskResultStatus.SUCCESSFUL, 2, 2)
    assert "attempt 1 fails" in done.errors[0].traceback
    assert done.started_at < done.last_attempted_at


def test_discard_and_unstorable_return_values_fail_the_task(run_worker):
    discarded = give_up.enqueue("no recipient")
    unstorable = returns_a_set.enqueue()
    run_worker(["default"])
    failed = give_up.get_result(discarded.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[-1].exception_class is Discard
    bad = returns_a_set.get_result(unstorable.id)
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[-1].exception_class is TypeError


def test_cancelled_task_reads_as_failed_with_task_cancelled():
    result = add.enqueue(1, 2)
    operations.cancel(Message.objects.filter(pk=int(result.id)))
    cancelled = add.get_result(result.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in cancelled.errors] == [TaskCancelled]


def test_task_whose_worker_died_on_its_last_attempt_reads_as_task_lost(run_worker, fake_clock):
    result = add.enqueue(1, 2)
    # A worker claims it and dies: its lease runs out without an outcome.
    claimed = claim.claim(["default"], 1, worker="dead:1", lease=timedelta(seconds=30))
    assert [m.pk for m in claimed.messages] == [int(result.id)]
    assert add.get_result(result.id).status == TaskResultStatus.RUNNING
    assert add.get_result(result.id).worker_ids == ["dead:1"]
    fake_clock.advance(seconds=31)
    with_signals = []
    task_finished.connect(
        finished := lambda sender, task_result, **kw: with_signals.append(task_result)
    )
    try:
        run_worker(["default"])
    finally:
        task_finished.disconnect(finished)
    assert [(r.id, r.status) for r in with_signals] == [(result.id, TaskResultStatus.FAILED)]
    lost = add.get_result(result.id)
    assert lost.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in lost.errors] == [TaskLost]
    assert "without an outcome" in lost.errors[0].traceback


# -- signals ------------------------------------------------------------------


def test_task_signals_follow_the_task(run_worker, received):
    ok = add.enqueue(1, 2)
    bad = explode.enqueue("boom")
    run_worker(["default"], concurrency=1)
    by_task = {
        rid: [(name, status) for name, _, status, r in received if r.id == rid]
        for rid in (ok.id, bad.id)
    }
    assert by_task[ok.id] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    assert by_task[bad.id] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.FAILED),
    ]
    assert {sender for _, sender, _, _ in received} == {DelayQBackend}
    finished = {r.id: r for name, _, _, r in received if name == "finished"}
    assert finished[ok.id].return_value == 3
    assert finished[bad.id].errors[-1].exception_class is TaskBoom
    started = next(r for name, _, _, r in received if name == "started" and r.id == ok.id)
    assert started.attempts == 1 and started.started_at is not None
    # task_finished comes after the outcome's commit: get_result() agrees.
    assert received.stored[ok.id].status == TaskResultStatus.SUCCESSFUL
    assert received.stored[ok.id].return_value == 3
    assert received.stored[bad.id].status == TaskResultStatus.FAILED


def test_a_failing_finished_receiver_does_not_fail_the_task(run_worker):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_finished.connect(broken)
    try:
        result = add.enqueue(1, 2)
        run_worker(["default"])
    finally:
        task_finished.disconnect(broken)
    assert add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_retried_attempt_sends_started_but_finished_only_at_the_end(
    run_worker, fake_clock, received
):
    result = flaky.enqueue()
    run_worker(["tasks-retry"])
    fake_clock.advance(seconds=61)
    run_worker(["tasks-retry"])
    names = [name for name, _, _, r in received if r.id == result.id]
    assert names == ["enqueued", "started", "started", "finished"]


# -- ordered groups (OPTIONS["GROUP_BY"]) --------------------------------------


def _message(result) -> Message:
    return Message.objects.get(pk=int(result.id))


def test_group_by_puts_a_task_in_the_group_its_argument_names():
    # The suite's default backend groups account_step by "account" and
    # tenant_event by "tenant" (tests/settings.py).
    assert _message(account_step.enqueue(42, "open")).group == "42"  # str() of the value
    assert _message(account_step.enqueue(account="ann", step="open")).group == "ann"
    assert _message(account_step.enqueue("bob", step="open")).group == "bob"  # positional too
    assert _message(account_step.enqueue(None, "open")).group == ""  # None: no group
    assert _message(account_step.enqueue("", "open")).group == ""
    assert _message(tenant_event.enqueue("signup", tenant="t1", plan="pro")).group == "t1"
    assert _message(tenant_event.enqueue("signup", plan="pro")).group == ""  # not passed
    assert _message(add.enqueue(1, 2)).group == ""  # a task not listed: no group
    payload = _message(account_step.enqueue(7, "open")).payload
    assert (payload["args"], payload["kwargs"]) == ([7, "open"], {})  # the call is unchanged


def test_tasks_of_one_group_run_one_at_a_time_in_enqueue_order(run_worker):
    # Priorities would run "second" first; the group keeps the enqueue order.
    first = account_step.using(priority=-100).enqueue(1, "first")
    second = account_step.using(priority=100).enqueue(1, "second")
    other = account_step.enqueue(2, "other")
    assert _message(second).next_attempt_time is None  # held behind "first"
    assert _message(other).next_attempt_time is not None  # another group: due now
    run_worker(["default"], concurrency=4)
    ran = list(Effect.objects.order_by("pk").values_list("value", flat=True))
    assert sorted(ran) == ["1:first", "1:second", "2:other"]
    assert ran.index("1:first") < ran.index("1:second")
    for result in (first, second, other):
        assert account_step.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    started = account_step.get_result(second.id).started_at
    assert started >= account_step.get_result(first.id).finished_at


def test_a_failed_task_holds_the_rest_of_its_group(run_worker):
    failed = account_step.enqueue(3, "charge", fail=True)
    after = account_step.enqueue(3, "ship")
    free = account_step.enqueue(4, "ship")
    run_worker(["default"])
    assert account_step.get_result(failed.id).status == TaskResultStatus.FAILED
    assert account_step.get_result(after.id).status == TaskResultStatus.READY  # still waiting
    assert account_step.get_result(free.id).status == TaskResultStatus.SUCCESSFUL
    assert set(Effect.objects.values_list("value", flat=True)) == {"3:charge", "4:ship"}


def test_a_group_value_delayq_cannot_hold_is_refused_before_anything_is_written():
    with pytest.raises(ValueError, match="account_step: argument 'account': group is 201"):
        account_step.enqueue("x" * 201, "open")
    with pytest.raises(ValueError, match="NUL"):
        account_step.enqueue("a\x00b", "open")
    with pytest.raises(TypeError, match="account_step.*step"):
        account_step.enqueue(5)  # the group comes from the call: it must fit the function
    assert not Message.objects.exists()


def grouped_backend(group_by: object, queues: tuple[str, ...] = ("default",)) -> DelayQBackend:
    return DelayQBackend("grouped", {"QUEUES": list(queues), "OPTIONS": {"GROUP_BY": group_by}})


@pytest.mark.parametrize(
    ("group_by", "problem"),
    [
        (["tests.testapp.tasks.account_step"], "must be a dict of task paths"),
        ({"tests.testapp.tasks.account_step": 1}, "the argument name must be a str"),
        ({"tests.testapp.tasks.account_step": ""}, "the argument name must be a str"),
        ({1: "account"}, "task paths must be str"),
        ({"tests.testapp.tasks.nope": "account"}, "cannot be imported"),
        ({"tests.testapp.tasks.TaskBoom": "account"}, "is not a task"),
        ({"tests.testapp.tasks.Effect": "account"}, "is not a task"),
        (
            {"tests.integration.test_tasks_backend.account_step": "account"},
            "is the task defined as 'tests.testapp.tasks.account_step'",
        ),
        ({"tests.testapp.tasks.account_step": "customer"}, "takes no argument 'customer'"),
        ({"tests.testapp.tasks.account_step": "context"}, "takes no argument 'context'"),
        ({"tests.testapp.tasks.tenant_event": "fields"}, "takes no argument 'fields'"),
    ],
)
def test_checks_name_a_bad_group_by_option(group_by, problem):
    errors = grouped_backend(group_by).check()
    assert [e.id for e in errors] == ["django_delayq.E043"], [e.msg for e in errors]
    assert errors[0].msg.startswith("TASKS['grouped']['OPTIONS']['GROUP_BY']")
    assert problem in errors[0].msg


def test_a_backend_with_a_malformed_group_by_refuses_to_enqueue():
    backend = grouped_backend({"tests.testapp.tasks.add": 3})
    with pytest.raises(ImproperlyConfigured, match=r"\['GROUP_BY'\].*argument name must be a str"):
        backend.enqueue(add, (1, 2), {})
    assert not Message.objects.exists()
    fine = grouped_backend({"tests.testapp.tasks.account_step": "account"})
    assert fine.check() == [] and task_backends["default"].check() == []
    assert fine.group_of(account_step, (9, "x"), {}) == "9"
    assert fine.group_of(add, (1, 2), {}) == ""


# -- configuration ------------------------------------------------------------


def test_backend_flags():
    backend = task_backends["default"]
    assert isinstance(backend, DelayQBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_checks_name_bad_backend_configuration():
    backend = DelayQBackend(
        "broken",
        {"QUEUES": ["ok", "not a queue"], "OPTIONS": {"MAX_ATTEMPTS": 0, "RETRIES": 3}},
    )
    errors = backend.check()
    assert sorted(e.id for e in errors) == [
        "django_delayq.E041",
        "django_delayq.E042",
        "django_delayq.E042",
    ]
    text = " ".join(e.msg for e in errors)
    assert "'not a queue'" in text and "'RETRIES'" in text and "MAX_ATTEMPTS" in text
    assert [e.id for e in DelayQBackend("empty", {"QUEUES": []}).check()] == ["django_delayq.E041"]
    assert task_backends["default"].check() == []
    too_many = DelayQBackend("many", {"QUEUES": ["ok"], "OPTIONS": {"MAX_ATTEMPTS": 1_000_001}})
    assert [e.id for e in too_many.check()] == ["django_delayq.E042"]


def test_manage_py_check_fails_on_a_bad_tasks_setting():
    bad = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend", "QUEUES": ["a b"]}}
    with override_settings(TASKS=bad), pytest.raises(SystemCheckError, match="E041"):
        call_command("check")


def test_enqueue_refuses_queue_names_delayq_cannot_hold():
    # A backend without QUEUES lets the framework accept any name; delayq's
    # own rules still apply, at enqueue time.
    backend = DelayQBackend("loose", {"QUEUES": []})
    bad = add.using()
    object.__setattr__(bad, "queue_name", "not a queue")
    with pytest.raises(InvalidTask, match="may only hold"):
        backend.validate_task(bad)


NO_APP_SETTINGS = """
    import importlib.util

    SECRET_KEY = "not-secret"
    USE_TZ = True
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
    TASKS = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend", "QUEUES": ["default"]}}
    if importlib.util.find_spec("django.tasks"):
        # Django 6 registers the framework's checks when django.tasks is
        # imported, as a project's code that defines tasks does.
        import django.tasks  # noqa: F401
    else:
        INSTALLED_APPS.append("django_tasks")
"""


def test_check_reports_e040_when_django_delayq_is_not_installed(tmp_path):
    (tmp_path / "no_delayq_settings.py").write_text(textwrap.dedent(NO_APP_SETTINGS))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "no_delayq_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "django_delayq.E040" in done.stderr
    assert "TASKS['default'] uses DelayQBackend but django_delayq is not installed" in done.stderr
