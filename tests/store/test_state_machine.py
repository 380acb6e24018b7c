"""Property tests of the message state machine against the real database.

Hypothesis drives enqueue (ignore / update on conflict), claim, ack, fail
(retry or give up), snooze, release, lease extension, cancel, retry of
failed messages, a dead worker's release and the passing of time (lease
expiry) in any order. After every step each row must be in a possible state,
every call made with a lock token that no longer holds the message must
change nothing, and no version of a message may start before its due time
(an update of a running message waits for the attempt's end *and* its own
time, however the attempt ends: an outcome, a release, a lease that lapses).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_delayq import clock, enqueue, enqueue_many, operations
from django_delayq.models import Message
from django_delayq.store import claim as store_claim
from django_delayq.store import leases, settle
from tests.conftest import FakeClock

pytestmark = pytest.mark.django_db

KEYS = ("k0", "k1", "k2")
SETTLES = (
    "ack",
    "fail_retry",
    "fail_final",
    "snooze",
    "release_started",
    "release_unstarted",
    "extend",
)


def snapshot() -> dict[int, dict[str, Any]]:
    return {m.pk: m.as_dict() for m in Message.objects.all()}


class QueueMachine(RuleBasedStateMachine):
    clock: FakeClock  # set by the test, shared by every example

    def __init__(self) -> None:
        super().__init__()
        Message.objects.all().delete()
        self.clock.current = timezone.now()
        self.claims: list[tuple[uuid.UUID, list[int]]] = []
        # attempt_count may only go down by one, on release of an unstarted claim.
        self.attempts: dict[int, int] = {}

    @rule(
        key=st.sampled_from(KEYS),
        delay=st.sampled_from([0, 5, 120, 3600]),
        on_conflict=st.sampled_from(["ignore", "update"]),
        priority=st.integers(-1, 1),
        many=st.booleans(),
    )
    def enqueue(self, key: str, delay: int, on_conflict: str, priority: int, many: bool) -> None:
        before = {m["key"]: m for m in snapshot().values()}
        due = self.clock() + timedelta(seconds=delay)
        if many:  # a document of rows rather than one row's values
            (result,) = enqueue_many(
                "default",
                [{"key": key}],
                keys=[key],
                delay=delay,
                priority=priority,
                on_conflict=on_conflict,
            )
        else:
            result = enqueue(
                "default",
                {"key": key},
                key=key,
                delay=delay,
                priority=priority,
                on_conflict=on_conflict,
            )
        after = Message.objects.get(pk=result.message.pk).as_dict()
        old = before.get(key)
        if old is None:
            assert result.outcome == "created"
            assert after["status"] == "pending" and after["attempt_count"] == 0
        elif on_conflict == "ignore":
            assert result.outcome == "ignored" and after == old
        elif old["status"] == "running":
            # The new version never runs beside the old one: the running
            # attempt keeps its token and lease, and the new version waits
            # for it to end (superseded_at), and for its own due time.
            assert result.outcome == "updated"
            assert (after["status"], after["lock_token"]) == ("running", old["lock_token"])
            assert after["next_attempt_time"] == max(old["next_attempt_time"], due)
            assert after["attempt_count"] == old["attempt_count"]
            assert after["superseded_at"] is not None
            assert after["payload"] == {"key": key} and after["priority"] == priority
        elif old["status"] in Message.FINISHED_STATUSES and result.outcome == "updated":
            # A finished message is delivered again, from its first attempt.
            assert after["status"] == "pending" and after["attempt_count"] == 0
            self.attempts[after["id"]] = 0

    @rule(limit=st.integers(1, 3), lease=st.sampled_from([5, 30]))
    def claim(self, limit: int, lease: int) -> None:
        now = self.clock()
        before = snapshot()
        got = store_claim.claim(["default"], limit, worker="w", lease=timedelta(seconds=lease))
        ids = [m.pk for m in got.messages]
        due = {
            pk
            for pk, m in before.items()
            if m["status"] in ("pending", "running") and m["next_attempt_time"] <= now
        }
        assert set(ids) <= due, "claimed a message that was not due"
        assert len(ids) == min(limit, len(due))
        for message in got.messages:
            assert message.status == "running" and message.lock_token == got.token
            old = before[message.pk]
            if old["superseded_at"] is not None:
                assert old["scheduled_time"] <= now, "ran a newer version before its due time"
            # A newer version that waited (its lease ran out) starts at attempt 1.
            expected = 1 if old["superseded_at"] else old["attempt_count"] + 1
            assert message.attempt_count == expected
            assert message.superseded_at is None
            self.attempts[message.pk] = message.attempt_count
            assert message.next_attempt_time == now + timedelta(seconds=lease)
        if ids:
            self.claims.append((got.token, ids))

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), op=st.sampled_from(SETTLES), lease=st.sampled_from([5, 30]))
    def settle(self, data: st.DataObject, op: str, lease: int) -> None:
        token, ids = data.draw(st.sampled_from(self.claims))
        pk = data.draw(st.sampled_from(ids))
        if data.draw(st.booleans().map(lambda forged: forged and op != "extend")):
            token = uuid.uuid4()  # a token nobody was ever given
        before = Message.objects.get(pk=pk).as_dict()
        holds = before["status"] == "running" and before["lock_token"] == token
        changed = {
            "ack": lambda: settle.ack([pk], token),
            "fail_retry": lambda: settle.fail(
                pk, token, error="x", retry_at=None, retry_in=timedelta(seconds=3)
            ),
            "fail_final": lambda: settle.fail(pk, token, error="x", retry_at=None),
            "snooze": lambda: settle.snooze(
                pk, token, run_at=timedelta(seconds=2), max_attempts=before["attempt_count"] + 5
            ),
            "release_started": lambda: leases.release([pk], token, started=True),
            "release_unstarted": lambda: leases.release([pk], token, started=False),
            "extend": lambda: len(leases.extend([pk], token, timedelta(seconds=lease))),
        }[op]()
        after = Message.objects.get(pk=pk).as_dict()
        if not holds:
            assert changed == 0
            assert after == before, f"{op} with a stale token changed the message"
            return
        assert changed == 1
        if before["superseded_at"] and op != "extend":
            # A newer version waited: whatever the outcome, it is due now.
            assert (after["status"], after["attempt_count"]) == ("pending", 0)
            assert after["superseded_at"] is None and after["finished_at"] is None
            assert after["next_attempt_time"] == before["scheduled_time"]
            self.attempts[pk] = 0
            return
        expected = {
            "ack": "succeeded",
            "fail_retry": "pending",
            "fail_final": "failed",
            "snooze": "pending",
            "release_started": "pending",
            "release_unstarted": "pending",
            "extend": "running",
        }[op]
        assert after["status"] == expected
        if op == "release_unstarted":
            self.attempts[pk] = after["attempt_count"]

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        before = {m["key"]: m for m in snapshot().values()}.get(key)
        operations.cancel(Message.objects.filter(key=key))
        after = Message.objects.filter(key=key).values().first()
        if before is None:
            return
        assert after is not None
        if before["status"] == "running" and before["next_attempt_time"] > self.clock():
            assert after["status"] == "running", "cancelled a message under a valid lease"
        if before["status"] == "pending":
            assert after["status"] == "cancelled"

    @rule()
    def release_dead_worker(self) -> None:
        """The worker "w" was found dead: its running messages are handed back."""
        before = snapshot()
        leases.release_workers(["w"])
        for pk, after in snapshot().items():
            old = before[pk]
            if old["status"] != "running":
                assert after == old
            elif old["superseded_at"] is not None:
                expected = ("pending", old["scheduled_time"], 0)
                assert (after["status"], after["next_attempt_time"], after["attempt_count"]) == (
                    expected
                )
                self.attempts[pk] = 0
            else:
                assert (after["status"], after["next_attempt_time"]) == ("pending", self.clock())

    @rule(key=st.sampled_from(KEYS))
    def retry_failed(self, key: str) -> None:
        operations.retry_failed(Message.objects.filter(key=key))

    @rule(seconds=st.sampled_from([1, 4, 10, 40, 200]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @invariant()
    def every_row_is_possible(self) -> None:
        rows = list(Message.objects.all())
        assert len({m.key for m in rows}) == len(rows)
        for m in rows:
            where = f"{m.key}: {m.as_dict()}"
            assert m.status in Message.Status.values, where
            if m.superseded_at is not None:
                assert m.status == "running", where
                # Claimable (next_attempt_time) no sooner than the new version is due.
                assert m.next_attempt_time >= m.scheduled_time, where
            if m.status == "running":
                assert m.lock_token is not None and m.next_attempt_time is not None, where
                assert m.attempt_count >= 1 and m.locked_by == "w", where
                assert m.finished_at is None, where
            elif m.status == "pending":
                assert m.lock_token is None and m.next_attempt_time is not None, where
                assert m.finished_at is None, where
            else:
                assert m.lock_token is None and m.next_attempt_time is None, where
                assert m.finished_at is not None, where
            previous = self.attempts.get(m.pk, 0)
            assert m.attempt_count >= previous, f"attempt_count went backwards: {where}"
            self.attempts[m.pk] = m.attempt_count


def test_message_state_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClock(timezone.now())
    monkeypatch.setattr(clock, "now", fake)
    QueueMachine.clock = fake
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
