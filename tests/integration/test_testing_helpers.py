"""django_delayq.testing and the ``delayq`` fixture, used as a project's tests would."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase
from django.utils import timezone

from django_delayq import clock, enqueue, handler
from django_delayq.models import Message
from django_delayq.queues import pause_queue
from django_delayq.registry import registry
from django_delayq.testing import DelayQ, assert_enqueued, enqueued, run_pending
from tests.testapp.handlers import Boom
from tests.testapp.models import Effect, Execution


@pytest.fixture
def chain_handler() -> Iterator[None]:
    """A handler that enqueues a follow-up message (due now) while it runs."""

    @handler("helpers-chain")
    def chain(message: Message) -> None:
        step = message.payload["step"]
        if step < message.payload["until"]:
            enqueue(
                "helpers-chain",
                {"step": step + 1, "until": message.payload["until"]},
                key=f"step-{step + 1}",
            )

    yield
    registry.unregister("helpers-chain")


def test_run_pending_runs_what_is_due_and_reports_how_it_ended(delayq):
    ok = enqueue("default", {}, key="ok").message
    enqueue("default", {"fail": 1}, key="flaky")
    enqueue("default", {"discard": "bad input"}, key="bad")
    enqueue("default", {"retry_in": 120}, key="snooze")
    enqueue("default", {}, key="later", delay=timedelta(hours=1))

    attempts = delayq.run_pending("default")

    assert {a.key: a.result for a in attempts} == {
        "ok": "succeeded",
        "flaky": "retrying",
        "bad": "discarded",
        "snooze": "snoozed",
    }
    by_key = {a.key: a for a in attempts}
    assert by_key["ok"].message.pk == ok.pk
    assert by_key["ok"].message.status == "succeeded" and by_key["ok"].exception is None
    assert isinstance(by_key["flaky"].exception, Boom)
    assert by_key["flaky"].message.status == "pending"
    assert by_key["flaky"].message.last_error.startswith("tests.testapp.handlers.Boom")
    assert by_key["bad"].message.status == "failed"
    # The handlers really ran, in this thread, on this test's transaction.
    assert Execution.objects.filter(message_id=ok.pk).count() == 1
    assert Message.objects.get(key="later").status == "pending"


def test_advance_makes_delayed_and_retried_messages_due(delayq):
    enqueue("default", {}, key="later", delay=timedelta(hours=1))
    enqueue("default", {"fail": 1}, key="flaky")  # the suite retries after 60 s
    assert [a.key for a in delayq.run_pending("default")] == ["flaky"]

    delayq.advance(seconds=30)
    assert delayq.run_pending("default") == []

    before = delayq.now()
    after = delayq.advance(seconds=30)
    assert after - before >= timedelta(seconds=30)
    [retry] = delayq.run_pending("default")
    assert (retry.key, retry.result, retry.message.attempt_count) == ("flaky", "succeeded", 2)

    delayq.advance(minutes=59)
    [late] = delayq.run_pending("default")
    assert (late.key, late.result) == ("later", "succeeded")


def test_run_at_from_the_code_under_test_lines_up_with_the_clock(delayq):
    # Code under test computes run_at from Django's clock, not the queue's.
    enqueue("default", {}, key="tomorrow", run_at=timezone.now() + timedelta(days=1))
    delayq.advance(hours=23)
    assert delayq.run_pending() == []
    delayq.advance(hours=1)
    assert [a.key for a in delayq.run_pending()] == ["tomorrow"]


def test_run_pending_runs_messages_the_handlers_enqueue(delayq, chain_handler):
    enqueue("helpers-chain", {"step": 1, "until": 4}, key="step-1")
    attempts = delayq.run_pending("helpers-chain")
    assert [a.key for a in attempts] == ["step-1", "step-2", "step-3", "step-4"]
    assert {a.result for a in attempts} == {"succeeded"}


def test_run_pending_stops_a_runaway_at_its_limit(delayq, chain_handler):
    enqueue("helpers-chain", {"step": 1, "until": 100}, key="step-1")
    with pytest.raises(RuntimeError, match="ran 5 messages and more are still due"):
        delayq.run_pending("helpers-chain", limit=5)


def test_run_all_moves_the_clock_through_every_retry(delayq):
    enqueue("other", {"fail": 9}, key="doomed")  # "other": max_attempts=2
    enqueue("default", {}, key="next-week", delay=timedelta(days=7))
    attempts = delayq.run_all()
    assert [(a.key, a.result) for a in attempts] == [
        ("doomed", "retrying"),
        ("doomed", "failed"),
        ("next-week", "succeeded"),
    ]
    assert delayq.now() - timezone.now() >= timedelta(days=7) - timedelta(minutes=1)


def test_paused_queues_are_skipped_like_a_worker_skips_them(delayq):
    enqueue("default", {}, key="held")
    pause_queue("default")
    assert delayq.run_pending("default") == []
    delayq.assert_enqueued("default", key="held")


def test_an_unknown_queue_is_refused(delayq):
    with pytest.raises(ImproperlyConfigured, match="no handler is registered"):
        delayq.run_pending("nobody-listens")


def test_assert_enqueued_matches_and_explains_a_miss(delayq):
    enqueue("emails-test", {"to": "a@example.com"}, key="welcome-1", kind="welcome")
    enqueue("emails-test", {"to": "b@example.com"}, key="welcome-2", kind="welcome")

    [found] = delayq.assert_enqueued("emails-test", key="welcome-1")
    assert found.payload == {"to": "a@example.com"}
    delayq.assert_enqueued("emails-test", payload={"to": "b@example.com"})
    delayq.assert_enqueued("emails-test", kind="welcome", count=2)
    delayq.assert_not_enqueued("emails-test", key="welcome-3")
    assert [m.key for m in delayq.enqueued("emails-test")] == ["welcome-1", "welcome-2"]

    with pytest.raises(AssertionError) as miss:
        delayq.assert_enqueued("emails-test", payload={"to": "c@example.com"})
    text = str(miss.value)
    assert "payload={'to': 'c@example.com'}" in text
    assert "emails-test/welcome-1" in text and "emails-test/welcome-2" in text
    with pytest.raises(AssertionError, match="expected 3 pending"):
        delayq.assert_enqueued("emails-test", count=3)
    with pytest.raises(AssertionError, match="expected 0 pending"):
        delayq.assert_not_enqueued("emails-test", key="welcome-2")


def test_finished_messages_are_no_longer_enqueued(delayq):
    enqueue("default", {}, key="done")
    delayq.run_pending("default")
    delayq.assert_not_enqueued("default", key="done")


def test_the_clock_is_restored_after_the_helper(db):
    assert not clock.is_overridden()
    with DelayQ() as helper:
        assert clock.is_overridden()
        helper.advance(3600)
        assert helper.now() - timezone.now() >= timedelta(seconds=3599)
    assert not clock.is_overridden()
    with pytest.raises(ValueError, match="only moves forward"), DelayQ() as helper:
        helper.advance(-1)
    with pytest.raises(RuntimeError, match="use it as a context manager"):
        DelayQ().advance(60)


def test_atomic_handlers_write_inside_the_test_transaction(delayq):
    message = enqueue("atomic", {"value": "x"}).message
    [attempt] = delayq.run_pending("atomic")
    assert attempt.result == "succeeded"
    assert Effect.objects.get(message_id=message.pk).value == "x"


@pytest.mark.django_db(transaction=True)
def test_the_fixture_works_with_a_transactional_test(delayq):
    enqueue("default", {}, key="committed")
    [attempt] = delayq.run_pending()
    assert attempt.result == "succeeded"
    assert Message.objects.get(key="committed").status == "succeeded"


def test_module_functions_work_without_the_fixture(db):
    enqueue("default", {"n": 1}, key="plain")
    assert [m.key for m in enqueued("default")] == ["plain"]
    assert_enqueued("default", payload={"n": 1})
    [attempt] = run_pending(["default", "other"])
    assert attempt.result == "succeeded"


class UnittestStyleTests(TestCase):
    """The helper in a Django TestCase, without pytest fixtures."""

    def setUp(self) -> None:
        self.delayq = self.enterContext(DelayQ())

    def test_delayed_message_runs_after_advance(self) -> None:
        enqueue("default", {}, key="tc", delay=60)
        self.assertEqual(self.delayq.run_pending("default"), [])
        self.delayq.advance(60)
        [attempt] = self.delayq.run_pending("default")
        self.assertEqual(attempt.result, "succeeded")


@pytest.mark.django_db
def test_run_all_runs_the_retries_of_queue_rows_too(delayq):
    from tests.testapp.models import Shipment

    shipment = Shipment.objects.create(reference="twice", fail=1)
    shipment.schedule()
    attempts = delayq.run_all("shipments")
    shipment.refresh_from_db()
    assert [a.result for a in attempts] == ["retrying", "succeeded"]
    assert shipment.status == "succeeded" and shipment.attempt_count == 2
