"""How close each queue is to its limits, and its held messages and blocked groups
(``flowstats.flow_stats``), driven through real claims and outcomes on every database."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_delayq import enqueue, enqueue_many
from django_delayq.flow import limits_of
from django_delayq.flowstats import QueueFlow, flow_stats
from django_delayq.models import Message
from django_delayq.store import claim as store_claim
from django_delayq.store import groups, settle
from django_delayq.store.limits import claim_limited
from tests.conftest import FakeClock

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=5)


def limit(settings, queue: str = "default", **options: object) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {queue: options}}


def claim(queue: str = "default", n: int = 10, **options: object):
    return claim_limited([queue], n, limits_of(queue), worker="w", lease=LEASE, **options)


def keep_in_window() -> None:
    """Move the starts a claim recorded an hour ahead: a 5/s window read after a
    slow second (a loaded machine) still holds them. What is read is the count."""
    from django_delayq import clock
    from django_delayq.models import FlowStart

    FlowStart.objects.update(started_at=clock.sql_now_plus(timedelta(hours=1)))


def flow_of(queue: str = "default") -> QueueFlow:
    found = {flow.queue: flow for flow in flow_stats([queue])}
    assert queue in found, f"{queue} not reported"
    return found[queue]


def fail(message: Message, token: object, *, retry: bool) -> None:
    retry_in = timedelta(hours=1) if retry else None
    assert settle.fail(message.pk, token, error="boom 42", retry_at=None, retry_in=retry_in) == 1  # type: ignore[arg-type]
    groups.release_groups([(message.queue, message.group)])


def test_a_full_rate_window_with_due_messages_is_throttled(settings, fake_clock: FakeClock):
    limit(settings, RATE_LIMIT="3/s")
    enqueue_many("default", [{}] * 5)
    assert len(claim().claim.messages) == 3
    (scope,) = flow_of().scopes
    assert (scope.started, scope.window_full, scope.throttled) == (3, True, True)
    assert scope.window_text == "3/3 per s" and scope.limits_text == "3/s"
    assert scope.running_text == "" and flow_of().throttled
    # The window slides past the starts: room again, not throttled.
    fake_clock.advance(1.001)
    (scope,) = flow_of().scopes
    assert (scope.started, scope.throttled) == (0, False)


def test_a_full_window_with_nothing_due_is_not_throttled(settings):
    limit(settings, RATE_LIMIT="2/m")
    enqueue_many("default", [{}] * 2)
    enqueue("default", {}, delay=3600)  # not due
    assert len(claim().claim.messages) == 2
    (scope,) = flow_of().scopes
    assert scope.window_full and not scope.throttled


def test_a_reached_cap_counts_its_running_messages(settings, fake_clock: FakeClock):
    limit(settings, GLOBAL_CONCURRENCY=2)
    enqueue_many("default", [{}] * 4)
    got = claim()
    assert len(got.claim.messages) == 2
    (scope,) = flow_of().scopes
    assert (scope.running, scope.at_cap, scope.throttled) == (2, True, True)
    assert scope.running_text == "2/2 running" and scope.limits_text == "2 at once"
    assert scope.window_text == ""
    assert settle.ack([got.claim.messages[0].pk], got.claim.token) == 1
    (scope,) = flow_of().scopes
    assert (scope.running, scope.throttled) == (1, False)
    # A crashed worker's lease runs out: it no longer counts.
    fake_clock.advance(LEASE.total_seconds() + 1)
    (scope,) = flow_of().scopes
    assert scope.running == 0


def test_a_cap_reports_what_the_claim_counts_a_live_workers_lapsed_lease_too(
    settings, fake_clock: FakeClock
):
    """The figures say what the cap does (``limits.kept_running``): a lease that
    lapsed under a live worker still holds its place until the worker is gone."""
    from django.utils import timezone

    from django_delayq.models import WorkerState

    now = timezone.now()
    WorkerState.objects.create(
        name="w", host="h", pid=1, started_at=now, last_seen=now,
        alive_until=now + timedelta(days=1),
    )  # fmt: skip
    limit(settings, GLOBAL_CONCURRENCY=1)
    enqueue_many("default", [{}] * 2)
    assert len(claim().claim.messages) == 1
    fake_clock.advance(LEASE.total_seconds() + 1)
    (scope,) = flow_of().scopes
    assert (scope.running, scope.at_cap, scope.throttled) == (1, True, True)
    assert claim().claim.messages == []
    WorkerState.objects.filter(name="w").update(stopped_at=now)
    (scope,) = flow_of().scopes
    assert (scope.running, scope.at_cap) == (0, False)


def test_a_kind_and_its_queue_are_reported_apart():
    # tests/testapp/handlers.py: "limited" runs at most 2 at once, its webhooks 5/s.
    enqueue_many("limited", [{}] * 3, kind="webhook")
    enqueue("limited", {}, kind="other")
    got = claim("limited", kinds=(["webhook"], True))
    keep_in_window()
    assert [m.kind for m in got.claim.messages] == ["webhook", "webhook"]  # the cap holds
    whole, webhook = flow_of("limited").scopes
    assert (whole.kind, whole.running, whole.throttled) == ("", 2, True)
    assert (webhook.kind, webhook.started, webhook.throttled) == ("webhook", 2, False)
    assert webhook.window_text == "2/5 per s"
    assert whole.limits_text == "2 at once" and webhook.limits_text == "5/s"


def test_held_messages_and_blocked_groups(settings):
    for group in ("g1", "g2", "g3"):
        enqueue_many("default", [{}] * 3, group=group, keys=[f"{group}-{i}" for i in range(3)])
    enqueue("default", {}, key="free")
    flow = flow_of()
    assert (flow.held, flow.blocked, flow.scopes) == (6, 0, ())
    heads = {
        m.group: m for m in store_claim.claim(["default"], 10, worker="w", lease=LEASE).messages
    }
    token = Message.objects.get(pk=heads["g1"].pk).lock_token
    fail(heads["g1"], token, retry=True)  # waits for its retry: g1 is blocked
    token = Message.objects.get(pk=heads["g2"].pk).lock_token
    fail(heads["g2"], token, retry=False)  # failed: g2 is blocked too
    flow = flow_of()
    assert (flow.held, flow.blocked, flow.blocked_groups) == (6, 2, ("g1", "g2"))
    # g3's head succeeds: its next message is let go, one fewer held.
    token = Message.objects.get(pk=heads["g3"].pk).lock_token
    assert settle.ack([heads["g3"].pk], token) == 1
    groups.release_groups([("default", "g3")])
    assert flow_of().held == 5
    # Where failures let the group go on, a failed head blocks nothing.
    limit(settings, GROUP_AFTER_FAILURE="continue")
    assert (flow_of().blocked, flow_of().blocked_groups) == (1, ("g1",))


def test_only_queues_with_limits_or_groups_in_use_are_reported():
    enqueue_many("default", [{}] * 3)
    enqueue_many("other", [{}] * 2, group="g")
    found = {flow.queue: flow for flow in flow_stats()}
    assert "default" not in found
    assert found["other"].held == 1 and not found["other"].limited
    # Limits are reported even while the queue is empty.
    assert found["limited"].limited and found["limited"].held == 0
    assert flow_stats([]) == []


def test_the_blocked_names_are_the_longest_blocked_first_and_capped(monkeypatch):
    from django_delayq import flowstats

    monkeypatch.setattr(flowstats, "BLOCKED_NAMES", 2)
    for group in ("z", "a", "m"):
        enqueue_many("default", [{}] * 2, group=group)
    got = store_claim.claim(["default"], 10, worker="w", lease=LEASE)
    for message in sorted(got.messages, key=lambda m: m.pk):
        fail(message, got.token, retry=True)
    flow = flow_of()
    assert (flow.blocked, flow.blocked_groups) == (3, ("z", "a"))


def test_a_bounded_number_of_statements_whatever_the_queues(settings):
    limit(settings, RATE_LIMIT="10/s", GLOBAL_CONCURRENCY=5)
    queues = [f"q{i}" for i in range(20)]
    for queue in queues:
        enqueue_many(queue, [{}] * 2, group="g")
    with CaptureQueriesContext(connection) as ctx:
        flows = flow_stats([*queues, "default"])
    assert len(flows) == 21
    # held, blocked, live leases, the one rate's window: not one per queue.
    assert len(ctx.captured_queries) <= 5, [q["sql"] for q in ctx.captured_queries]
