"""Operator operations (``django_delayq.operations``) against the real database."""

import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayq import enqueue, enqueue_many, operations
from django_delayq.models import Message
from django_delayq.operations import OperationResult
from django_delayq.store import claim, settle
from tests.factories import MessageFactory
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


@pytest.fixture
def one_of_each(fake_clock):
    """One message in each category the operations tell apart."""
    now = fake_clock()
    token = uuid.uuid4()
    return {
        "pending_due": MessageFactory(key="pending_due", next_attempt_time=now - timedelta(1)),
        "pending_later": MessageFactory(
            key="pending_later", next_attempt_time=now + timedelta(hours=1)
        ),
        "running": MessageFactory(
            key="running",
            status="running",
            next_attempt_time=now + timedelta(seconds=60),
            lock_token=token,
            locked_by="host:1",
            attempt_count=1,
        ),
        "lease_expired": MessageFactory(
            key="lease_expired",
            status="running",
            next_attempt_time=now - timedelta(seconds=5),
            lock_token=uuid.uuid4(),
            locked_by="host:2",
            attempt_count=1,
        ),
        "succeeded": MessageFactory(
            key="succeeded", status="succeeded", next_attempt_time=None, finished_at=now
        ),
        "failed": MessageFactory(
            key="failed",
            status="failed",
            next_attempt_time=None,
            finished_at=now,
            attempt_count=5,
            last_error="Boom: no",
        ),
        "cancelled": MessageFactory(
            key="cancelled", status="cancelled", next_attempt_time=None, finished_at=now
        ),
    }


def fresh(message):
    return Message.objects.get(pk=message.pk)


def statements(ctx):
    """The statements of a capture, without transaction control."""
    return [
        q["sql"]
        for q in ctx.captured_queries
        if not q["sql"].upper().startswith(("SAVEPOINT", "RELEASE", "ROLLBACK", "BEGIN"))
    ]


# -- run now ----------------------------------------------------------------------------


def test_run_now_makes_scheduled_messages_due_and_leaves_due_ones_in_place(one_of_each, fake_clock):
    before_due = one_of_each["pending_due"].next_attempt_time
    result = operations.run_now(Message.objects.all())
    assert result.changed == 1
    assert fresh(one_of_each["pending_later"]).next_attempt_time == fake_clock()
    assert fresh(one_of_each["pending_due"]).next_attempt_time == before_due
    assert result.skipped == {
        "already due": 2,
        "running": 1,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
    }


# -- retry --------------------------------------------------------------------------------


def test_retry_failed_sends_failed_and_cancelled_back_with_more_attempts(one_of_each, fake_clock):
    result = operations.retry_failed(Message.objects.all(), extra_attempts=3)
    assert result == OperationResult(2, {"pending": 2, "running": 2, "succeeded": 1})
    failed = fresh(one_of_each["failed"])
    assert failed.status == "pending"
    assert failed.next_attempt_time == fake_clock()
    assert failed.max_attempts == 5 + 3
    assert failed.finished_at is None
    assert failed.last_error == "Boom: no"  # kept until the next attempt
    cancelled = fresh(one_of_each["cancelled"])
    assert cancelled.status == "pending" and cancelled.max_attempts == 3


def test_retried_messages_are_claimed_again(fake_clock):
    message = enqueue("default", {}).message
    Message.objects.filter(pk=message.pk).update(
        status="failed", next_attempt_time=None, attempt_count=5, finished_at=fake_clock()
    )
    operations.retry_failed(Message.objects.filter(pk=message.pk))
    claimed = claim.claim(["default"], 10, worker="w", lease=timedelta(seconds=30))
    assert [m.pk for m in claimed.messages] == [message.pk]
    assert claimed.messages[0].attempt_count == 6


@pytest.mark.parametrize("bad", [0, -1, 1001, True, "2", 1.5])
def test_retry_refuses_bad_extra_attempts(bad):
    with pytest.raises(ValueError, match="extra_attempts"):
        operations.retry_failed(Message.objects.all(), extra_attempts=bad)


# -- cancel ----------------------------------------------------------------------------------


def test_cancel_stops_waiting_messages_and_refuses_a_held_lease(one_of_each, fake_clock):
    running_token = one_of_each["running"].lock_token
    result = operations.cancel(Message.objects.all())
    assert result.changed == 3
    assert result.skipped == {"running": 1, "succeeded": 1, "failed": 1, "cancelled": 1}
    for name in ("pending_due", "pending_later", "lease_expired"):
        message = fresh(one_of_each[name])
        assert message.status == "cancelled"
        assert message.next_attempt_time is None
        assert message.finished_at == fake_clock()
        assert message.lock_token is None
    running = fresh(one_of_each["running"])
    assert running.status == "running" and running.lock_token == running_token


def test_a_running_message_is_refused_and_its_worker_can_still_ack_it():
    enqueue("default", {}, key="m")
    held = claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=60))
    result = operations.cancel(Message.objects.filter(key="m"))
    assert result == OperationResult(0, {"running": 1})
    assert settle.ack([held.messages[0].pk], held.token) == 1
    assert Message.objects.get(key="m").status == "succeeded"


def test_cancelling_an_expired_lease_fences_off_the_old_worker(fake_clock):
    enqueue("default", {}, key="m")
    held = claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=30))
    fake_clock.advance(31)
    assert operations.cancel(Message.objects.filter(key="m")).changed == 1
    assert settle.ack([held.messages[0].pk], held.token) == 0
    assert Message.objects.get(key="m").status == "cancelled"


def test_cancelled_messages_are_not_claimed():
    enqueue_many("default", [{}, {}], keys=["a", "b"])
    operations.cancel(Message.objects.filter(key="a"))
    claimed = claim.claim(["default"], 10, worker="w", lease=timedelta(seconds=30))
    assert [m.key for m in claimed.messages] == ["b"]


# -- reschedule -------------------------------------------------------------------------------


def test_reschedule_to_a_time_keeps_the_first_schedule(one_of_each, fake_clock):
    when = fake_clock() + timedelta(days=2)
    first = one_of_each["pending_due"].scheduled_time
    result = operations.reschedule(Message.objects.all(), run_at=when)
    assert result.changed == 3
    assert result.skipped == {"running": 1, "succeeded": 1, "failed": 1, "cancelled": 1}
    pending = fresh(one_of_each["pending_due"])
    assert pending.next_attempt_time == when and pending.scheduled_time == first
    expired = fresh(one_of_each["lease_expired"])
    assert expired.status == "pending" and expired.lock_token is None
    assert expired.next_attempt_time == when


def test_reschedule_by_delay(one_of_each, fake_clock):
    operations.reschedule(Message.objects.filter(key="pending_later"), delay=90)
    assert fresh(one_of_each["pending_later"]).next_attempt_time == fake_clock() + timedelta(
        seconds=90
    )


def test_rescheduled_message_waits_until_its_new_time(fake_clock):
    enqueue("default", {}, key="m")
    operations.reschedule(Message.objects.filter(key="m"), delay=timedelta(minutes=10))
    assert not claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=30)).messages
    fake_clock.advance(minutes=10)
    assert claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=30)).messages


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"run_at": datetime(2030, 1, 1)}, "naive"),
        ({"run_at": datetime(2030, 1, 1).astimezone(), "delay": 5}, "either"),
        ({"delay": -5}, "negative"),
    ],
)
def test_reschedule_validates_like_enqueue(kwargs, error):
    MessageFactory()
    with pytest.raises(ValueError, match=error):
        operations.reschedule(Message.objects.all(), **kwargs)


# -- reprioritise ------------------------------------------------------------------------------


def test_reprioritise_changes_what_may_still_run_without_touching_the_lease(one_of_each):
    token = one_of_each["running"].lock_token
    result = operations.reprioritise(Message.objects.all(), 7)
    assert result.changed == 4
    assert result.skipped == {"succeeded": 1, "failed": 1, "cancelled": 1}
    running = fresh(one_of_each["running"])
    assert running.priority == 7 and running.lock_token == token and running.status == "running"
    assert fresh(one_of_each["succeeded"]).priority == 0


def test_reprioritised_message_is_claimed_first():
    enqueue_many("default", [{}, {}], keys=["first", "second"])
    operations.reprioritise(Message.objects.filter(key="second"), 10)
    claimed = claim.claim(["default"], 1, worker="w", lease=timedelta(seconds=30))
    assert [m.key for m in claimed.messages] == ["second"]


@pytest.mark.parametrize(("priority", "exc"), [(40000, ValueError), (True, TypeError)])
def test_reprioritise_validates_the_priority(priority, exc):
    with pytest.raises(exc, match="priority"):
        operations.reprioritise(Message.objects.all(), priority)


# -- delete ----------------------------------------------------------------------------------


def test_delete_spares_held_messages_only(one_of_each):
    result = operations.delete(Message.objects.all())
    assert result == OperationResult(6, {"running": 1})
    assert list(Message.objects.values_list("key", flat=True)) == ["running"]


# -- common behaviour ----------------------------------------------------------------------


def test_dry_run_counts_without_changing(one_of_each):
    before = sorted(Message.objects.values_list("key", "status", "next_attempt_time"))
    for function, kwargs in [
        (operations.run_now, {}),
        (operations.retry_failed, {}),
        (operations.cancel, {}),
        (operations.reschedule, {"delay": 60}),
        (operations.reprioritise, {"priority": 3}),
        (operations.delete, {}),
    ]:
        dry = function(Message.objects.all(), dry_run=True, **kwargs)
        assert dry.total == 7
    assert sorted(Message.objects.values_list("key", "status", "next_attempt_time")) == before
    assert operations.cancel(Message.objects.all(), dry_run=True).changed == 3


@pytest.mark.parametrize(
    ("function", "kwargs", "verb"),
    [
        (operations.cancel, {}, "UPDATE"),
        (operations.reprioritise, {"priority": 2}, "UPDATE"),
        (operations.delete, {}, "DELETE"),
    ],
)
def test_operations_are_one_count_and_one_statement(function, kwargs, verb):
    enqueue_many("default", [{}] * 300)
    with CaptureQueriesContext(connection) as ctx:
        result = function(Message.objects.filter(queue="default"), **kwargs)
    assert result.changed == 300
    sql = statements(ctx)
    assert len(sql) == 2, sql
    assert sql[0].upper().startswith("SELECT") and "COUNT(" in sql[0].upper()
    assert sql[1].upper().startswith(verb)
    assert "payload" not in sql[0]  # no rows were loaded


def test_operations_that_make_messages_due_notify_on_postgresql(fake_clock):
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    enqueue("emails", {}, key="a", delay=600)
    enqueue("sms", {}, key="b", delay=600)
    with CaptureQueriesContext(connection) as ctx:
        operations.run_now(Message.objects.all())
    notified = [q["sql"] for q in ctx.captured_queries if "pg_notify" in q["sql"]]
    assert len(notified) == 2
    assert any('"emails"' in q for q in notified) and any('"sms"' in q for q in notified)


def test_rows_a_worker_changes_meanwhile_are_reported(one_of_each, fake_clock):
    def write_none(queryset, now):
        return 0

    result = operations._apply(
        Message.objects.all(), operations._WAITING, write_none, dry_run=False
    )
    assert result.changed == 0
    assert result.skipped["changed meanwhile"] == 3


def test_a_queryset_of_another_model_is_refused():
    with pytest.raises(TypeError, match="Message queryset"):
        operations.cancel(Execution.objects.all())


def test_result_text_lists_reasons():
    result = OperationResult(3, {"running": 2, "succeeded": 1})
    assert str(result) == "3 changed, 3 skipped (2 running, 1 succeeded)"
    assert result.total == 6


def test_applicable_operations_per_state(one_of_each):
    expected = {
        "pending_due": ["cancel", "reschedule", "reprioritise", "delete"],
        "pending_later": ["run_now", "cancel", "reschedule", "reprioritise", "delete"],
        "running": ["reprioritise"],
        "lease_expired": ["cancel", "reschedule", "reprioritise", "delete"],
        "succeeded": ["delete"],
        "failed": ["retry_failed", "delete"],
        "cancelled": ["retry_failed", "delete"],
    }
    for name, message in one_of_each.items():
        assert operations.applicable(message) == expected[name], name


@pytest.mark.django_db(transaction=True)
def test_retried_message_runs_and_succeeds_in_a_worker(run_worker):
    enqueue("default", {"fail": 1}, key="m", max_attempts=1)
    run_worker(["default"])
    assert Message.objects.get(key="m").status == "failed"
    operations.retry_failed(Message.objects.filter(key="m"))
    run_worker(["default"])
    message = Message.objects.get(key="m")
    assert message.status == "succeeded" and message.attempt_count == 2
    assert Execution.objects.filter(message_id=message.pk).count() == 2


@pytest.mark.django_db(transaction=True)
def test_operator_actions_judge_leases_by_the_database_clock(monkeypatch):
    # The web server's clock runs ten minutes ahead of the database's: a
    # lease of five minutes is still live, whatever this host believes.
    from django.utils import timezone

    from django_delayq import clock
    from tests.testapp.models import Shipment

    message = enqueue("default", {}).message
    claimed = claim.claim(["default"], 1, worker="w", lease=timedelta(minutes=5))
    shipment = Shipment.objects.create(reference="s")
    Shipment.objects.filter(pk=shipment.pk).schedule()
    held = claim.claim([], 1, worker="w", lease=timedelta(minutes=5), model=Shipment)
    ahead = timezone.now() + timedelta(minutes=10)
    monkeypatch.setattr(timezone, "now", lambda: ahead)
    assert not clock.is_overridden()  # only this host's clock moved

    selection = Message.objects.filter(pk=message.pk)
    for operation in (operations.cancel, operations.reschedule, operations.delete):
        result = operation(selection)
        assert (result.changed, result.skipped) == (0, {"running": 1}), operation.__name__
    row = Message.objects.get(pk=message.pk)
    assert operations.holds_lease(row)
    assert operations.applicable(row) == ["reprioritise"]
    assert (row.status, row.lock_token) == ("running", claimed.token)

    rows = Shipment.objects.filter(pk=shipment.pk)
    assert rows.schedule() == 0
    assert operations.cancel(rows).skipped == {"running": 1}
    assert Shipment.objects.get(pk=shipment.pk).lock_token == held.token
