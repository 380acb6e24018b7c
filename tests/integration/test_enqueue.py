"""Producing: outcomes, transactions, validation, batching."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayq import Outcome, enqueue, enqueue_many
from django_delayq.conf import MAX_DELAY
from django_delayq.exceptions import DuplicateMessage
from django_delayq.models import Message
from django_delayq.store import claim, leases, settle
from django_delayq.store.features import features
from tests.conftest import finishes_within
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db


def test_enqueue_creates_a_due_pending_message():
    before = timezone.now()
    result = enqueue("default", {"to": "a@example.com"}, key="welcome-42")
    assert result.outcome is Outcome.CREATED
    message = Message.objects.get()
    assert message == result.message
    assert message.payload == {"to": "a@example.com"}
    assert message.status == "pending"
    assert before <= message.next_attempt_time == message.scheduled_time <= timezone.now()
    assert message.attempt_count == 0


def test_same_key_is_ignored_by_default():
    enqueue("default", {"v": 1}, key="k")
    result = enqueue("default", {"v": 2}, key="k")
    assert result.outcome is Outcome.IGNORED
    assert result.message.payload == {"v": 1}
    assert Message.objects.get().payload == {"v": 1}


def test_same_key_in_another_queue_is_a_different_message():
    enqueue("default", {}, key="k")
    assert enqueue("other", {}, key="k").outcome is Outcome.CREATED


def test_update_replaces_payload_and_schedule():
    enqueue("default", {"v": 1}, key="k")
    later = timezone.now() + timedelta(hours=1)
    result = enqueue("default", {"v": 2}, key="k", run_at=later, priority=5, on_conflict="update")
    assert result.outcome is Outcome.UPDATED
    message = Message.objects.get()
    assert (message.payload, message.next_attempt_time, message.priority) == ({"v": 2}, later, 5)
    assert result.message.payload == {"v": 2}


def test_update_with_identical_content_is_ignored():
    at = timezone.now() + timedelta(minutes=5)
    enqueue("default", {"v": 1}, key="k", run_at=at)
    result = enqueue("default", {"v": 1}, key="k", run_at=at, on_conflict="update")
    assert result.outcome is Outcome.IGNORED


def test_update_revives_a_finished_message():
    message = MessageFactory(
        key="k",
        status="failed",
        attempt_count=5,
        last_error="x",
        next_attempt_time=None,
        finished_at=timezone.now(),
    )
    result = enqueue("default", {"v": 2}, key="k", on_conflict="update")
    assert result.outcome is Outcome.UPDATED
    message.refresh_from_db()
    assert (message.status, message.attempt_count, message.last_error) == ("pending", 0, "")
    assert message.finished_at is None


ENDINGS = {
    "ack": lambda pk, token: settle.ack([pk], token),
    "retry": lambda pk, token: settle.fail(
        pk, token, error="x", retry_at=None, retry_in=timedelta(seconds=30)
    ),
    "fail": lambda pk, token: settle.fail(pk, token, error="x", retry_at=None),
    "snooze": lambda pk, token: settle.snooze(
        pk, token, run_at=timedelta(seconds=30), max_attempts=9
    ),
    "release": lambda pk, token: leases.release([pk], token, started=True),
    "dead worker": lambda pk, token: sum(leases.release_workers(["w1"]).values()),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_update_of_a_running_message_waits_for_the_running_attempt(ending):
    enqueue("default", {"v": 1}, key="k", max_attempts=3)
    first = claim.claim(["default"], 1, worker="w1", lease=timedelta(minutes=1))
    lease_end = Message.objects.get(key="k").next_attempt_time
    result = enqueue("default", {"v": 2}, key="k", on_conflict="update")
    assert result.outcome is Outcome.UPDATED
    row = Message.objects.get(key="k")
    # The running attempt keeps its lease, and can still extend and settle it.
    assert (row.status, row.lock_token, row.next_attempt_time) == (
        "running",
        first.token,
        lease_end,
    )
    assert leases.extend([row.pk], first.token, timedelta(minutes=2)) == {row.pk}
    # The new version never runs beside it.
    assert claim.claim(["default"], 1, worker="w2", lease=timedelta(minutes=1)).messages == []
    # However the attempt ends, the new version is then due, from its first attempt.
    assert ENDINGS[ending](row.pk, first.token) == 1
    row.refresh_from_db()
    assert (row.status, row.attempt_count, row.payload, row.lock_token) == (
        "pending",
        0,
        {"v": 2},
        None,
    )
    assert row.finished_at is None
    second = claim.claim(["default"], 1, worker="w2", lease=timedelta(minutes=1))
    assert [(m.payload, m.attempt_count) for m in second.messages] == [({"v": 2}, 1)]


def test_update_of_a_running_message_whose_attempt_was_lost_runs_the_new_version(fake_clock):
    enqueue("default", {"v": 1}, key="k")
    claim.claim(["default"], 1, worker="w1", lease=timedelta(seconds=30))
    enqueue("default", {"v": 2}, key="k", on_conflict="update")
    fake_clock.advance(31)  # the worker died: its lease runs out
    again = claim.claim(["default"], 1, worker="w2", lease=timedelta(seconds=30))
    assert [(m.payload, m.attempt_count) for m in again.messages] == [({"v": 2}, 1)]


def test_error_raises_and_writes_nothing_new():
    enqueue("default", {}, key="k")
    with pytest.raises(DuplicateMessage, match="'k'"):
        enqueue_many("default", [{}, {}], keys=["new", "k"], on_conflict="error")
    assert list(Message.objects.values_list("key", flat=True)) == ["k"]


def test_error_inside_a_transaction_keeps_the_callers_work():
    with transaction.atomic():
        enqueue("default", {}, key="mine")
        enqueue("default", {}, key="k")
        with pytest.raises(DuplicateMessage):
            enqueue("default", {}, key="k", on_conflict="error")
        enqueue("default", {}, key="after")
    assert sorted(Message.objects.values_list("key", flat=True)) == ["after", "k", "mine"]


def test_rollback_removes_the_message():
    with transaction.atomic():
        enqueue("default", {}, key="gone")
        transaction.set_rollback(True)
    assert not Message.objects.filter(key="gone").exists()


def test_delay_and_run_at():
    now = timezone.now()
    delayed = enqueue("default", {}, delay=timedelta(minutes=10)).message
    assert timedelta(minutes=10) <= delayed.next_attempt_time - now < timedelta(minutes=11)
    seconds = enqueue("default", {}, delay=30).message
    assert timedelta(seconds=30) <= seconds.next_attempt_time - now < timedelta(seconds=90)
    at = now + timedelta(days=1)
    assert enqueue("default", {}, run_at=at).message.next_attempt_time == at


def test_enqueue_many_returns_results_in_order_with_duplicates():
    enqueue("default", {"old": True}, key="b")
    results = enqueue_many("default", [{"n": 1}, {"n": 2}, {"n": 3}], keys=["a", "b", "a"])
    assert [r.outcome for r in results] == [Outcome.CREATED, Outcome.IGNORED, Outcome.IGNORED]
    assert results[0].message.pk == results[2].message.pk
    assert results[1].message.payload == {"old": True}


def test_enqueue_many_update_keeps_the_last_duplicate():
    results = enqueue_many("default", [{"n": 1}, {"n": 2}], keys=["a", "a"], on_conflict="update")
    assert [r.outcome for r in results] == [Outcome.CREATED, Outcome.UPDATED]
    assert Message.objects.get(key="a").payload == {"n": 2}


def test_enqueue_many_without_keys_gives_unique_keys():
    results = enqueue_many("default", [{}] * 3)
    assert len({r.message.key for r in results}) == 3


def test_generated_keys_are_uuid7s_in_the_order_they_were_made(monkeypatch):
    """The key's unique index takes each new key at the end of its queue's range."""
    import time
    import uuid

    made = []
    for millis in (1_700_000_000_000, 1_700_000_000_001, 1_800_000_000_000):
        monkeypatch.setattr(time, "time_ns", lambda m=millis: m * 1_000_000)
        made += [r.message.key for r in enqueue_many("default", [{}] * 50)]
    assert len(set(made)) == len(made)
    parsed = [uuid.UUID(k) for k in made]
    assert {(u.version, u.variant) for u in parsed} == {(7, uuid.RFC_4122)}
    assert [k[:12] for k in made] == sorted(k[:12] for k in made)  # the time comes first
    assert int(made[-1][:12], 16) == 1_800_000_000_000


def test_enqueue_many_of_10000_takes_a_handful_of_round_trips():
    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many("default", [{"i": i} for i in range(10_000)])
    assert Message.objects.count() == 10_000
    assert all(r.outcome is Outcome.CREATED for r in results)
    assert len(queries) <= 12, [q["sql"][:80] for q in queries]


@pytest.mark.parametrize("on_conflict", ["ignore", "update"])
def test_one_message_and_a_batch_write_the_same_row(on_conflict):
    """A single message is written by an INSERT ... VALUES of its own, a batch from
    a JSON document's rows: every column must come out the same."""
    payload = {"text": "é ' \\ %s", "n": [1, 2.5, None, True], "nested": {"k": ""}}
    options = {"priority": 7, "max_attempts": 3, "delay": 60, "on_conflict": on_conflict}
    one = enqueue("default", payload, key="one", **options).message
    batch = enqueue_many("default", [payload, {}], keys=["many", "other"], **options)
    fields = [f.attname for f in Message._meta.concrete_fields]
    skipped = {"id", "key", "created_at", "updated_at", "next_attempt_time", "scheduled_time"}

    def stored(pk):
        row = Message.objects.filter(pk=pk).values(*fields).get()
        return {k: v for k, v in row.items() if k not in skipped}

    assert stored(one.pk) == stored(batch[0].message.pk)
    assert stored(one.pk)["payload"] == payload
    assert {f: getattr(one, f) for f in fields} == Message.objects.filter(pk=one.pk).values(
        *fields
    ).get()


def test_a_single_message_is_one_insert_of_its_own_values():
    """Planned faster than a JSON document's rows with Django's default (text)
    statements (PostgreSQL, SQLite: MariaDB/MySQL insert and read back)."""
    if not features(connection).returning:
        pytest.skip("MariaDB/MySQL write new keys with INSERT IGNORE, then read them back")
    with CaptureQueriesContext(connection) as queries:
        enqueue("default", {"n": 1})
    (sql,) = [q["sql"] for q in queries if "INSERT" in q["sql"]]
    assert " VALUES (" in sql
    assert "json_each" not in sql and "jsonb_array_elements" not in sql


def test_using_targets_the_alias():
    result = enqueue("default", {}, using="default")
    assert result.message._state.db == "default"


def _bad(**kwargs):
    args = {"queue": "default", "payload": {}}
    args.update(kwargs)
    return args


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (_bad(key="x" * 256), ValueError, "over 255"),
        (_bad(key=""), ValueError, "must not be empty"),
        (_bad(key=5), TypeError, "key must be a str"),
        (_bad(queue=""), ValueError, "queue name must not be empty"),
        (_bad(queue="q" * 101), ValueError, "over 100"),
        (_bad(queue="has space"), ValueError, "may only hold"),
        (_bad(queue="emails\n"), ValueError, "may only hold"),
        (_bad(kind="sign\x00up"), ValueError, r"kind contains a NUL character \(\\x00\)"),
        (_bad(kind=5), TypeError, "kind must be a str"),
        (_bad(run_at=datetime(2030, 1, 1)), ValueError, "naive datetime"),
        (_bad(run_at=timezone.now(), delay=5), ValueError, "not both"),
        (_bad(delay=-1), ValueError, "must not be negative"),
        (_bad(delay=10**12), ValueError, "delay must be at most 365000 days"),
        (_bad(delay=timedelta.max), ValueError, "delay must be at most 365000 days"),
        (_bad(delay=10**15), ValueError, "delay: 1000000000000000 seconds is out of range"),
        (_bad(delay=float("inf")), ValueError, "delay: inf seconds is out of range"),
        (_bad(delay=float("nan")), ValueError, "delay: nan seconds is out of range"),
        (_bad(run_at=datetime.max.replace(tzinfo=UTC)), ValueError, "run_at .* is out of range"),
        (_bad(run_at=datetime.min.replace(tzinfo=UTC)), ValueError, "run_at .* is out of range"),
        (_bad(delay="soon"), TypeError, "timedelta or a number"),
        (_bad(priority=40000), ValueError, "out of range"),
        (_bad(priority=1.5), TypeError, "priority must be an int"),
        (_bad(on_conflict="replace"), ValueError, "on_conflict must be one of"),
        (_bad(payload={"at": timezone.now()}), TypeError, r"payload\['at'\] is of type datetime"),
        (_bad(payload={"s": {1, 2}}), TypeError, r"payload\['s'\] is of type set"),
        (_bad(payload={"s": "nul\x00"}), ValueError, "NUL"),
        (_bad(max_attempts=0), ValueError, "max_attempts"),
        (_bad(max_attempts=1_000_001), ValueError, "max_attempts must be an integer from 1 to"),
        (_bad(max_attempts=2**31), ValueError, "max_attempts must be an integer from 1 to"),
    ],
)
def test_bad_input_raises_early_and_writes_nothing(kwargs, error, match):
    with pytest.raises(error, match=match):
        enqueue(**kwargs)
    assert not Message.objects.exists()


def test_the_farthest_due_times_accepted_are_stored_and_read_back(fake_clock):
    latest = datetime(9998, 12, 31, 23, 59, 59, tzinfo=UTC)
    earliest = datetime(1000, 1, 2, tzinfo=UTC)
    enqueue("default", {}, key="latest", run_at=latest)
    enqueue("default", {}, key="earliest", run_at=earliest)
    enqueue("default", {}, key="far", delay=MAX_DELAY)
    due = dict(Message.objects.values_list("key", "next_attempt_time"))
    assert due == {"latest": latest, "earliest": earliest, "far": fake_clock() + MAX_DELAY}


def test_bad_message_in_a_batch_names_its_index_and_writes_nothing():
    with pytest.raises(TypeError, match=r"message 2: payload\['x'\]"):
        enqueue_many("default", [{}, {}, {"x": object()}])
    assert not Message.objects.exists()


def test_a_payload_that_contains_itself_is_refused_promptly_and_writes_nothing():
    payload: dict = {"to": "a@example.com"}
    payload["self"] = payload
    with pytest.raises(ValueError, match=r"payload\['self'\] refers to payload, which contains"):
        finishes_within(10, lambda: enqueue("default", payload))
    assert not Message.objects.exists()


def test_payload_over_the_size_limit_is_refused(settings):
    settings.DELAYQ = {**settings.DELAYQ, "MAX_PAYLOAD_SIZE": 50}
    with pytest.raises(ValueError, match="MAX_PAYLOAD_SIZE"):
        enqueue("default", {"x": "y" * 100})
    assert not Message.objects.exists()


def test_unicode_and_nested_payload_round_trips():
    payload = {"name": "Zoë ✓", "nested": {"list": [1, 2.5, None, True, "é"]}, "big": 2**53}
    message = enqueue("default", payload).message
    message.refresh_from_db()
    assert message.payload == payload
