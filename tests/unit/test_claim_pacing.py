"""How the claim loop paces its claims (``worker/claimer.py``), without a database.

The sizes a claim asks for (one compiled statement each), when a notification
waits for others (``CLAIM_DELAY``), and how many executors a claim wakes
(``Book.add``). Times are given to the claimer, never slept: what the worker
does at a steady rate is measured by ``benchmarks/pickup.py`` and ``make bench``.
"""

import threading
from datetime import timedelta

import pytest

from django_delayq.conf import DEFAULTS
from django_delayq.worker.claimer import CLAIM_SIZES, HOLD_FOR, HOLD_MARGIN, Claimer, claim_size
from django_delayq.worker.inflight import Book, InFlight, Lane


def make_claimer(claim_delay: float) -> Claimer:
    return Claimer(
        Book([Lane(["default"], cap=4)]),
        name="w",
        queues=["default"],
        using="default",
        batch_size=None,
        poll_interval=5.0,
        claim_delay=claim_delay,
        default_lease=timedelta(minutes=5),
        leases={},
        time_limits={},
    )


def heard_every(claimer: Claimer, spacing: float, count: int) -> float:
    """A notification at 1000.0, then ``count`` more ``spacing`` apart; the last one's time."""
    now = 1000.0
    claimer.heard(now, 1)
    for _ in range(count):
        now += spacing
        claimer.heard(now, 1)
    return now


def test_a_claim_asks_for_a_whole_batch_or_a_size_from_the_short_list():
    # Every size a statement of its own: sizes following the handlers' moving
    # average compiled the claim again at almost every claim.
    assert claim_size(100, 100) == 100
    assert claim_size(250, 100) == 100
    assert claim_size(1, 100) == 1
    assert claim_size(5, 100) == 4
    assert claim_size(77, 100) == 64
    assert claim_size(99, 100) == 96
    assert {claim_size(n, 100) for n in range(1, 200)} <= {*CLAIM_SIZES, 100}


def test_adaptive_batches_come_from_the_short_list_too():
    claimer = make_claimer(0.01)
    (lane,) = claimer.book.lanes
    sizes = set()
    for seconds in (0.0013, 0.0014, 0.0017, 0.002, 0.0031, 0.005, 0.04, 1.0):
        lane.seconds_per_message = seconds
        sizes.add(claimer.batch_for(lane))
    assert sizes <= {*CLAIM_SIZES, claimer.batch_size, lane.cap}
    assert len(sizes) < 8


def test_an_idle_worker_claims_at_once():
    claimer = make_claimer(0.01)
    assert claimer.hold(1000.0) == 0.0


@pytest.mark.parametrize("claim_delay", [0.004, 0.006])
def test_a_sparse_stream_is_claimed_at_once(claim_delay):
    # 125 a second: messages 8 ms apart, none expected within the delay.
    claimer = make_claimer(claim_delay)
    now = 1000.0
    for _ in range(20):
        now += 0.008
        assert claimer.hold(now) == 0.0
        claimer.heard(now, 1)


def test_at_the_default_delay_200_a_second_are_claimed_two_by_two():
    # Messages 5 ms apart, one more within 6 ms: the median pickup stays
    # within 5 ms at that rate (docs: Performance, under a steady load).
    delay = DEFAULTS["CLAIM_DELAY"].total_seconds()
    claimer = make_claimer(delay)
    now = heard_every(claimer, 0.005, 10)
    assert claimer.hold(now + 0.001) == pytest.approx(delay)
    assert delay < 0.01


def test_a_dense_stream_waits_the_delay_for_the_next_ones():
    # 1,000 a second: ten within 10 ms.
    claimer = make_claimer(0.01)
    now = heard_every(claimer, 0.001, 5)
    assert claimer.hold(now + 0.001) == 0.01


def test_notifications_read_together_count_one_each():
    claimer = make_claimer(0.01)
    claimer.heard(1000.0, 1)
    claimer.heard(1000.009, 9)
    assert claimer.hold(1000.010) == 0.01


@pytest.mark.parametrize("spacing, waits", [(0.95, True), (1.05, False)])
def test_the_delay_is_worth_it_from_hold_for_messages_on(spacing, waits):
    claimer = make_claimer(0.012)
    gap = 0.012 / HOLD_FOR * spacing
    now = heard_every(claimer, gap, 5)
    assert claimer.hold(now + gap / 2) == (0.012 if waits else 0.0)


def test_after_a_quiet_spell_the_first_notification_is_claimed_at_once():
    claimer = make_claimer(0.01)
    now = 1000.0
    for _ in range(10):
        now += 0.001
        claimer.heard(now, 1)
    assert claimer.hold(now + 0.001) == 0.01
    assert claimer.hold(now + 60) == 0.0


def test_a_claim_that_found_work_counts_until_a_notification_is_heard():
    # A worker started on a backlog: what arrives right after its first
    # claim is part of a dense stream.
    claimer = make_claimer(0.025)
    claimer._worked_at = 1000.0
    assert claimer.hold(1000.001) == 0.025


@pytest.mark.parametrize("claim_delay", [0.0])
def test_no_claim_delay_never_waits(claim_delay):
    claimer = make_claimer(claim_delay)
    now = 1000.0
    for _ in range(10):
        now += 0.0001
        claimer.heard(now, 5)
    assert claimer.hold(now) == 0.0


class _CountingCondition(type(threading.Condition())):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.woken: list[int | str] = []

    def notify(self, n: int = 1) -> None:
        self.woken.append(n)
        super().notify(n)

    def notify_all(self) -> None:
        self.woken.append("all")
        super().notify_all()


def test_a_claim_wakes_one_executor_per_message_and_a_settlement_none():
    # With every idle executor woken by every claim and settlement, 16
    # executors cost more CPU than the claim itself.
    lane = Lane(["default"], cap=16)
    book = Book([lane])
    book.cond = _CountingCondition()

    class Row:
        def __init__(self, pk: int) -> None:
            self.pk = pk

    items = [InFlight(Row(pk), None, lane, timedelta(minutes=5)) for pk in (1, 2, 3)]  # type: ignore[arg-type]
    book.add(items)
    assert book.cond.woken == [3]
    taken = [book.take() for _ in items]
    for item in taken:
        assert item is not None
        book.handler_done(item, 0.001)
    book.settle([(item, "succeeded") for item in taken if item is not None], lambda lane: 0)
    assert book.cond.woken == [3]
    assert book.idle()


def test_a_lane_uncapped_by_an_executor_while_the_claimer_reads_the_next_due_time():
    """An executor that ends a message uncaps its lane (``wants``) from its own
    thread; one that does so while the claimer prepares its sleep must not stop
    the worker (the claimer read the lane as held back a moment before)."""
    from django_delayq import clock

    claimer = make_claimer(0.01)
    (lane,) = claimer.book.lanes
    lane.capped, lane.wake_at = True, clock.now() + timedelta(seconds=1)
    slept = []

    class Waker:
        def later(self, now, skip):
            return None

        def wait(self, timeout):
            slept.append(timeout)
            return True

    def next_due(skip):
        claimer.wants(lane)  # what an executor thread does as its message ends
        return None

    claimer.waker = Waker()  # type: ignore[assignment]
    claimer.next_due = next_due  # type: ignore[method-assign]
    claimer.idle_wait()
    assert slept == [claimer.poll_interval]  # no longer held: no hold's wake-up to wait for


def test_a_hold_lasts_as_long_as_the_messages_expected_take_to_come():
    # 9 ms apart within 25 ms: two more expected, waited for with a margin for
    # jitter, not for the rest of the delay after the second.
    claimer = make_claimer(0.025)
    now = heard_every(claimer, 0.009, 10)
    assert claimer.hold(now + 0.001) == pytest.approx(2 * 0.009 * HOLD_MARGIN)
    assert claimer.hold(now + 0.001) < 0.025
