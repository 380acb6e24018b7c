"""Global rate limits and concurrency caps, claim by claim (``store.limits``).

Each test drives ``claim_limited`` directly on the test's clock, on every
database; ``tests/process/test_flow_control.py`` proves the same with real
workers and real time.
"""

from collections import Counter
from datetime import timedelta

import hypothesis
import pytest
from django.db import connection, connections
from django.utils import timezone
from hypothesis import strategies as st

from django_delayq import enqueue, enqueue_many
from django_delayq.flow import Scope, limits_of, parse_rate
from django_delayq.models import FlowStart, Message
from django_delayq.registry import registry
from django_delayq.store import claim as store_claim
from django_delayq.store import settle
from django_delayq.store.limits import claim_limited, starts_in_window
from django_delayq.worker import Worker, claimer, make_lanes
from django_delayq.worker.execute import Result
from tests.conftest import FakeClock, finishes_within

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=5)


def claim(scopes, limit=10, queue="default", **options):
    return claim_limited([queue], limit, scopes, worker="w", lease=LEASE, **options)


def test_a_rate_lets_at_most_its_count_start_in_a_period(fake_clock: FakeClock):
    enqueue_many("default", [{}] * 10)
    rate = Scope("default", rate=parse_rate("3/s"))
    first = claim([rate])
    assert len(first.claim.messages) == 3
    assert first.held_back
    start = first.claim.messages[0].last_attempt_time
    assert first.retry_at == start + timedelta(seconds=1)
    assert first.retry_in == timedelta(seconds=1)
    second = claim([rate])
    assert second.claim.messages == [] and second.held_back
    assert second.retry_at == start + timedelta(seconds=1)
    assert second.retry_in == timedelta(seconds=1)
    fake_clock.advance(0.25)
    assert claim([rate]).retry_in == timedelta(seconds=0.75)  # a wait, on the database's clock
    assert Message.objects.filter(status="pending", attempt_count=0).count() == 7
    fake_clock.advance(0.749)
    assert claim([rate]).claim.messages == []
    fake_clock.advance(0.002)
    assert len(claim([rate]).claim.messages) == 3


def test_the_window_slides_rather_than_resetting(fake_clock: FakeClock):
    enqueue_many("default", [{}] * 10)
    rate = Scope("default", rate=parse_rate("4/s"))
    assert len(claim([rate], limit=2).claim.messages) == 2  # t = 0
    fake_clock.advance(0.5)
    assert len(claim([rate]).claim.messages) == 2  # t = 0.5: 2 more, the window is full
    fake_clock.advance(0.6)
    # t = 1.1: the two of t = 0 have left the window, the two of t = 0.5 have not.
    got = claim([rate])
    assert len(got.claim.messages) == 2
    assert got.retry_at == fake_clock() - timedelta(seconds=0.6) + timedelta(seconds=1)
    assert got.retry_in == timedelta(seconds=0.4)


def test_starts_in_window_reads_the_window_and_changes_nothing(fake_clock: FakeClock):
    enqueue_many("default", [{}] * 5)
    rate = Scope("default", rate=parse_rate("3/s"))
    assert starts_in_window(rate) == 0  # never claimed: no flow row yet
    assert len(claim([rate]).claim.messages) == 3
    assert starts_in_window(rate) == 3
    fake_clock.advance(0.5)
    assert starts_in_window(rate) == 3
    fake_clock.advance(0.6)
    assert starts_in_window(rate) == 0
    assert FlowStart.objects.count() == 3  # nothing pruned by reading
    assert starts_in_window(Scope("default", cap=3)) == 0  # no rate: no window
    assert starts_in_window(Scope("default", "a-kind", rate=rate.rate)) == 0  # another scope


def test_a_claim_that_finds_fewer_than_the_room_is_not_held_back():
    enqueue_many("default", [{}] * 2)
    got = claim([Scope("default", rate=parse_rate("5/s"))])
    assert len(got.claim.messages) == 2 and not got.held_back and got.retry_at is None
    assert got.retry_in is None
    assert FlowStart.objects.count() == 2


def test_a_cap_counts_live_leases_only(fake_clock: FakeClock):
    enqueue_many("default", [{}] * 6)
    cap = Scope("default", cap=2)
    got = claim([cap])
    assert len(got.claim.messages) == 2 and got.held_back and got.retry_at is None
    assert got.retry_in is None
    assert claim([cap]).claim.messages == []
    # One ends: its place is free.
    first = got.claim.messages[0]
    assert settle.ack([first.pk], got.claim.token) == 1
    assert len(claim([cap]).claim.messages) == 1
    # The leases of a crashed worker run out: their places are free.
    fake_clock.advance(LEASE.total_seconds() + 1)
    assert len(claim([cap]).claim.messages) == 2


def test_a_cap_counts_a_live_workers_message_whose_lease_lapsed(fake_clock: FakeClock):
    """A keeper that could not extend a lease (a producer held the row's lock, SQLite's
    write lock was taken) leaves its worker running the message: the claim does not
    take it back (``claimable_condition``), and the cap must not free its place either,
    or a second message of the scope runs beside it."""
    from django_delayq.models import WorkerState

    now = timezone.now()
    WorkerState.objects.create(
        name="w", host="h", pid=1, started_at=now, last_seen=now,
        alive_until=now + timedelta(days=1),
    )  # fmt: skip
    enqueue_many("default", [{}] * 3)
    cap = Scope("default", cap=1)
    assert len(claim([cap]).claim.messages) == 1
    fake_clock.advance(LEASE.total_seconds() + 1)
    assert claim([cap]).claim.messages == []  # its worker lives: still its place
    WorkerState.objects.filter(name="w").update(stopped_at=now)
    assert len(claim([cap]).claim.messages) == 1  # gone: the place is free


def test_a_kind_limit_limits_only_that_kind(fake_clock: FakeClock):
    enqueue_many("default", [{}] * 3, kind="slow")
    enqueue_many("default", [{}] * 3, kind="fast")
    slow = Scope("default", "slow", cap=1)
    got = claim([slow], kinds=(["slow"], True))
    assert [m.kind for m in got.claim.messages] == ["slow"]
    rest = store_claim.claim(["default"], 10, worker="w", lease=LEASE, kinds=(["slow"], False))
    assert sorted(m.kind for m in rest.messages) == ["fast"] * 3


def test_a_queue_limit_and_a_kind_limit_both_hold(fake_clock: FakeClock):
    enqueue_many("default", [{}] * 5, kind="a")
    queue = Scope("default", rate=parse_rate("3/m"))
    kind = Scope("default", "a", cap=5)
    assert len(claim([kind, queue], kinds=(["a"], True)).claim.messages) == 3


def test_groups_and_limits_together():
    enqueue_many("default", [{}] * 3, group="g")
    got = claim([Scope("default", rate=parse_rate("10/s"))])
    assert len(got.claim.messages) == 1  # the group runs one at a time


def test_limits_come_from_the_settings_and_the_handlers(settings):
    settings.DELAYQ = {
        **settings.DELAYQ,
        "QUEUES": {"default": {"RATE_LIMIT": "100/m", "GLOBAL_CONCURRENCY": 3}},
    }
    assert limits_of("default") == [Scope("default", "", parse_rate("100/m"), 3)]
    assert limits_of("other") == []
    lanes = make_lanes(["default", "other"], registry.all(), 8)
    limited = [lane for lane in lanes if lane.limits]
    assert [(lane.queues, lane.cap, lane.kinds) for lane in limited] == [(["default"], 3, None)]
    assert any(lane.queues == ["other"] and not lane.limits for lane in lanes)


def test_a_limited_kind_is_claimed_apart_from_the_rest_of_its_queue():
    assert limits_of("limited") == [
        Scope("limited", "", None, 2),
        Scope("limited", "webhook", parse_rate("5/s"), None),
    ]
    lanes = make_lanes(["limited"], registry.all(), 8)
    assert [(lane.cap, lane.limits, lane.kinds) for lane in lanes] == [
        (2, tuple(limits_of("limited")[::-1]), (frozenset({"webhook"}), True)),
        (2, (limits_of("limited")[0],), (frozenset({"webhook"}), False)),
    ]


def test_a_held_back_message_spends_no_attempt(fake_clock: FakeClock):
    enqueue("default", {}, key="a")
    enqueue("default", {}, key="b")
    rate = Scope("default", rate=parse_rate("1/h"))
    assert len(claim([rate]).claim.messages) == 1
    assert claim([rate]).claim.messages == []
    waiting = Message.objects.get(status="pending")
    assert (waiting.attempt_count, waiting.last_error) == (0, "")


def test_a_capped_lane_claims_again_as_soon_as_its_acknowledgements_commit(monkeypatch):
    # A finished message counts against the cap until its batched
    # acknowledgement commits (ACK_DELAY): the lane, woken by the handler's end,
    # may find no room yet, and must look again once the batch is in, not a
    # recheck interval later (it was 250 ms: 16 messages a second at a cap of 4).
    # Rechecks an hour apart: only the commit can wake the lane in time.
    monkeypatch.setattr(claimer, "CAP_RECHECK", timedelta(hours=1))
    enqueue_many("limited", [{}] * 20)
    worker = Worker(["limited"], concurrency=2, burst=True)
    stats = finishes_within(120, worker.run, lambda: describe_lanes(worker))
    assert stats[Result.SUCCEEDED] == 20


def test_a_message_that_ends_frees_the_place_of_every_lane_its_cap_held_back():
    # The queue's cap of 2 covers both lanes (the webhook kind's and the rest's).
    # The webhook lane found the cap full of the other lane's messages: held back
    # until its recheck. When one of those ends, the place it frees is the
    # webhook lane's too; waiting for the recheck kept `--burst` running with
    # every message done (an hour here; CAP_RECHECK otherwise).
    worker = Worker(["limited"], concurrency=2)
    webhook, rest = worker.book.lanes
    assert webhook.kinds == (frozenset({"webhook"}), True)
    claims = worker.claimer
    webhook.capped, webhook.wake_at = True, timezone.now() + timedelta(hours=1)
    claims._drained.update({id(webhook), id(rest)})
    assert claims.held_back() == [webhook]
    assert worker._wants(rest) > 0  # the claimer wakes: a lane may claim again
    assert (webhook.capped, webhook.wake_at) == (False, None)
    assert id(webhook) not in claims._drained
    assert claims.held_back() == []


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(data=st.data())
def test_whichever_lanes_a_cap_held_back_a_message_that_ends_lets_them_all_claim(data):
    # The class of the test above: any mix of capped and drained lanes, and a
    # message of any lane ending. Afterwards no lane waits for its recheck, and
    # the claimer wakes whenever a lane may claim again.
    worker = Worker(["limited", "default", "chaos"], concurrency=2)
    lanes, claims = worker.book.lanes, worker.claimer
    later = timezone.now() + timedelta(hours=1)
    for lane in lanes:
        capped = data.draw(st.booleans())
        lane.capped, lane.wake_at = capped, later if capped else None
        if capped or data.draw(st.booleans()):
            claims._drained.add(id(lane))
    ending = data.draw(st.sampled_from(lanes))
    others_capped = any(lane.capped for lane in lanes if lane is not ending)
    free_before = ending.capped or id(ending) not in claims._drained
    wakes = worker._wants(ending) > 0
    assert not any(lane.capped for lane in lanes)
    assert claims.held_back() == []
    assert wakes == (others_capped or free_before)


def describe_lanes(worker: Worker) -> str:
    """What the claimer knows of its lanes (a hang of this test was seen, rarely)."""
    claims = worker.claimer
    lines = [
        f"freed {claims._freed}, acks {claims._acks} (seen {claims._acks_seen}), "
        f"due now {claims._due_now}, held {len(worker.book._held)}"
    ]
    for lane in worker.book.lanes:
        lines.append(
            f"lane {lane.queues}: running {lane.running}/{lane.cap}, queued {len(lane.queued)}, "
            f"capped {lane.capped}, wake_at {lane.wake_at}, "
            f"drained {id(lane) in claims._drained}"
        )
    rows = Message.objects.filter(queue="limited").values_list("status", flat=True)
    lines.append(f"rows: {sorted(Counter(rows).items())}")
    return "\n".join(lines)


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="one writer at a time anyway")
def test_workers_claiming_at_the_same_instant_never_overshoot():
    import threading

    enqueue_many("default", [{}] * 100)
    rate = Scope("default", rate=parse_rate("7/m"), cap=5)
    barrier = threading.Barrier(8)
    counts = []

    def one():
        try:
            barrier.wait(10)
            counts.append(len(claim([rate], limit=4).claim.messages))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(counts) == 5  # the cap (5) is tighter than the rate (7)
    assert Message.objects.filter(status="running").count() == 5


def test_a_lane_whose_hold_ended_during_a_cut_short_sleep_claims_at_once(settings):
    # A poke (an acknowledgement's commit) can end the sleep just before a
    # rate's hold ends; at the next sleep the hold is over and the lane is no
    # longer "held back", yet still marked drained. It must claim at once, not
    # sleep to the next notification or poll (here an hour): with a rate of
    # 20/s that was a whole period's starts lost now and then.
    from django_delayq.worker import Worker
    from django_delayq.worker.wakeup import Waker

    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 3600}
    worker = Worker(["limited"], concurrency=2, using="default")
    claims = worker.claimer
    claims.waker = Waker("default", ["limited"], listen=False, poll_interval=3600)
    lane = next(lane for lane in claims.book.lanes if lane.limits)
    lane.wake_at = timezone.now() - timedelta(milliseconds=1)
    claims._drained.add(id(lane))

    def wait() -> None:
        try:
            claims.idle_wait()
        finally:
            connections.close_all()  # this thread's own connection

    finishes_within(60, wait)
    claims.waker.close()
    assert claims.wants(lane)


def test_a_place_freed_while_the_capped_lane_claims_is_claimed_at_once(settings, monkeypatch):
    # A message of a capped lane ends, and its outcome commits, while the
    # claimer's claim of that lane is running: the claim saw the cap full and
    # the end's "the lane wants more" came before the claimer marked the lane
    # capped. The end must not be lost: the lane claims the freed place at
    # once, not after CAP_RECHECK (here an hour; seen as a burst worker hung
    # for two minutes on a loaded machine).
    from django_delayq.worker import Worker
    from django_delayq.worker.wakeup import Waker

    settings.DELAYQ = {**settings.DELAYQ, "POLL_INTERVAL": 3600}
    monkeypatch.setattr(claimer, "CAP_RECHECK", timedelta(hours=1))
    enqueue_many("limited", [{}] * 3)
    worker = Worker(["limited"], concurrency=2, using="default")
    claims = worker.claimer
    claims.waker = Waker("default", ["limited"], listen=False, poll_interval=3600)
    (lane,) = [lane for lane in claims.book.lanes if lane.kinds == (frozenset({"webhook"}), False)]
    other = claim_limited(["limited"], 2, lane.limits, worker="other", lease=LEASE).claim
    assert len(other.messages) == 2  # the cap of 2 is full, held by another worker

    real = claimer.limits.claim_limited

    def claim_then_one_ends(*args, **kwargs):
        result = real(*args, **kwargs)
        if kwargs["kinds"] != lane.kinds:
            return result  # the queue's other lane (its webhooks)
        assert result.held_back and not result.claim.messages
        # Meanwhile, on an executor's thread: an outcome commits and the
        # book asks whether the lane wants more, then pokes the claimer.
        Message.objects.filter(pk=other.messages[0].pk).update(status="succeeded")
        claims.wants(lane)
        claims.waker.poke()
        return result

    monkeypatch.setattr(claimer.limits, "claim_limited", claim_then_one_ends)
    assert claims.claim_round() == 0
    monkeypatch.setattr(claimer.limits, "claim_limited", real)

    def wait() -> None:
        try:
            claims.idle_wait()
        finally:
            connections.close_all()  # this thread's own connection

    finishes_within(60, wait)
    claims.waker.close()
    assert claims.claim_round() == 1


@pytest.mark.parametrize("offset", [-30, 30])
def test_a_rate_limited_lane_waits_one_period_whatever_the_hosts_clock_says(
    settings, fake_clock: FakeClock, monkeypatch, offset
):
    """The lane's wake-up compared the database's time of the next start with this
    host's clock: a host 30 s behind held the lane 31 s instead of 1 s, one 30 s
    ahead took the time as past and claimed again at once, every millisecond."""
    from types import SimpleNamespace

    from django_delayq.worker import Worker

    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"default": {"RATE_LIMIT": "2/s"}}}
    enqueue_many("default", [{}] * 5)
    host = SimpleNamespace(now=lambda: fake_clock() + timedelta(seconds=offset))
    monkeypatch.setattr(claimer, "clock", host)  # the database keeps the test's clock
    claims = Worker(["default"], concurrency=4, batch_size=4, using="default").claimer
    (lane,) = [lane for lane in claims.book.lanes if lane.limits]

    assert claims.claim_round() == 2  # the rate's whole allowance
    assert claims.held_back() == [lane]
    assert lane.wake_at - host.now() == timedelta(seconds=1)

    fake_clock.advance(0.999)
    assert claims.held_back() == [lane]
    fake_clock.advance(0.001)  # the first starts leave the window
    assert claims.held_back() == []
    claims.undrain()
    assert claims.claim_round() == 2


@hypothesis.settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
    ],
)
@hypothesis.given(
    offset=st.floats(-3600, 3600),
    rate=st.sampled_from(["1/s", "3/s", "2/m"]),
    later=st.floats(0, 0.99),  # of a period: when the next claim comes
)
def test_a_lanes_hold_is_the_databases_wait_on_any_host_clock(
    settings, fake_clock: FakeClock, monkeypatch, offset, rate, later
):
    """Whatever this host's clock says, a lane held back by a rate is held, on that
    clock, exactly as long as the database says the window stays full."""
    from types import SimpleNamespace

    from django_delayq.worker import Worker

    Message.objects.all().delete()
    FlowStart.objects.all().delete()
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"default": {"RATE_LIMIT": rate}}}
    parsed = parse_rate(rate)
    enqueue_many("default", [{}] * (2 * parsed.count + 1))
    host = SimpleNamespace(now=lambda: fake_clock() + timedelta(seconds=offset))
    monkeypatch.setattr(claimer, "clock", host)
    claims = Worker(["default"], concurrency=8, batch_size=8, using="default").claimer
    (lane,) = [lane for lane in claims.book.lanes if lane.limits]

    assert claims.claim_round() == parsed.count
    start = fake_clock()
    fake_clock.advance(later * parsed.period.total_seconds())
    claims.undrain()
    claims._drained.discard(id(lane))
    assert claims.claim_round() == 0  # the window is still full
    assert lane.wake_at - host.now() == start + parsed.period - fake_clock()


@pytest.mark.xfail(
    strict=True,
    reason="known: enqueue(on_conflict='update') of a running message writes the new "
    "version's kind at once (the running attempt then counts under that kind's cap); "
    "keeping the attempt's kind until it ends needs a column for the waiting version's",
)
def test_an_update_of_a_running_message_keeps_it_under_its_kinds_cap(fake_clock):
    for key in ("first", "second"):
        enqueue("orders", {}, key=key, kind="export")
    cap = Scope("orders", "export", cap=1)

    def claim():
        return claim_limited(
            ["orders"], 5, [cap], worker="w", lease=timedelta(seconds=30), kinds=(["export"], True)
        ).claim.messages

    (running,) = claim()
    enqueue("orders", {"v": 2}, key=running.key, kind="report", on_conflict="update")
    assert claim() == []
