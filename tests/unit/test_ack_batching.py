"""How long a batch of acknowledgements waits for company (``worker/acks.py``),
without a database: times are given to the settler, never slept. What it saves
under a steady load is measured by ``python -m benchmarks.systems.delayq cpu``."""

import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest

from django_delayq.models import Message
from django_delayq.worker import acks
from django_delayq.worker.acks import DENSE_COMPANY, DENSE_FILL, DENSE_STRETCH, Settler
from django_delayq.worker.inflight import InFlight, Lane

DELAY = 0.005
STRETCHED = DELAY * DENSE_STRETCH


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(acks, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def settler() -> Settler:
    return Settler("default", max_delay=DELAY, settled=lambda done: None)


def success(pk: int = 1, lane: Lane | None = None, **fields) -> InFlight:
    row = Message(pk=pk, queue="default", **fields)
    return InFlight(row, uuid.uuid4(), lane or Lane(["default"], 4), timedelta(minutes=1))


def stream(s: Settler, clock: Clock, spacing: float, count: int) -> None:
    """``count`` successes ``spacing`` apart, each batch committed as it closes."""
    for pk in range(count):
        clock.now += spacing
        closes = s.closes_at
        if closes is not None and closes <= clock.now:
            s._successes.clear()  # what the thread's flush does
        s.add(success(pk), 0.001)


def test_a_sparse_stream_is_committed_within_the_delay(clock):
    # 50 a second: 20 ms apart, fewer than DENSE_COMPANY in the longer wait.
    s = settler()
    stream(s, clock, 0.02, 10)
    assert s.window(clock.now) == DELAY


def test_a_dense_stream_waits_longer_for_more_in_one_statement(clock):
    # 200 a second: 5 ms apart, ten expected within 50 ms.
    s = settler()
    stream(s, clock, 0.005, 10)
    assert s.window(clock.now) == STRETCHED
    s._successes.clear()
    s.add(success(99), 0.001)
    assert s.closes_at == pytest.approx(clock.now + STRETCHED)


@pytest.mark.parametrize("spacing, stretched", [(0.95, True), (1.05, False)])
def test_the_longer_wait_pays_from_dense_company_on(clock, spacing, stretched):
    s = settler()
    stream(s, clock, STRETCHED / DENSE_COMPANY * spacing, 10)
    assert s.window(clock.now) == (STRETCHED if stretched else DELAY)


def test_after_a_quiet_spell_the_first_success_waits_the_delay_only(clock):
    s = settler()
    stream(s, clock, 0.001, 10)
    assert s.window(clock.now) == STRETCHED
    clock.now += 60
    assert s.window(clock.now) == DELAY


@pytest.mark.parametrize(
    "waited_for",
    [
        {"group": "order-7"},
        {"has_children": True},
        {"lane": Lane(["default"], 4, limits=(object(),))},  # type: ignore[arg-type]
    ],
    ids=["its group's next", "a workflow's children", "a place under a global limit"],
)
def test_a_success_something_waits_for_closes_the_batch_within_the_delay(clock, waited_for):
    s = settler()
    stream(s, clock, 0.005, 10)
    s._successes.clear()
    s.add(success(100), 0.001)
    assert s.closes_at == pytest.approx(clock.now + STRETCHED)
    clock.now += 0.01
    s.add(success(101, **waited_for), 0.001)
    assert s.closes_at == pytest.approx(clock.now + DELAY)
    # A later plain success does not put it back.
    clock.now += 0.001
    s.add(success(102), 0.001)
    assert s.closes_at == pytest.approx(clock.now - 0.001 + DELAY)


def test_a_dense_batch_that_fills_within_the_delay_closes_at_the_delay(clock):
    # A backlog run fast: the longer wait would gain nothing, and the finished
    # messages it kept would count in what the lane may hold (its claims).
    s = settler()
    stream(s, clock, 0.001, 10)
    s._successes.clear()
    first = clock.now + 0.0001
    for pk in range(DENSE_FILL):
        clock.now += 0.0001
        s.add(success(200 + pk), 0.001)
        if pk < DENSE_FILL - 1:
            assert s.closes_at == pytest.approx(first + STRETCHED)
    assert s.closes_at == pytest.approx(first + DELAY)


def test_a_producer_that_waits_for_each_result_gets_it_within_the_delay(clock):
    # Dense successes, but each message sent only once the last one's result
    # is in (wait(), a Tasks result): nothing new comes while the batch
    # waits, so it waits ACK_DELAY only, not the longer time.
    heard = [clock.now]
    s = Settler("default", max_delay=DELAY, settled=lambda done: None, activity=lambda: heard[0])
    stream(s, clock, 0.005, 10)
    s._successes.clear()
    clock.now += 0.001
    s.add(success(300), 0.001)
    assert s.closes_at == pytest.approx(clock.now + DELAY)
    # A message heard of meanwhile: an open stream, the batch waits on.
    clock.now += 0.002
    heard[0] = clock.now
    assert s.closes_at == pytest.approx(clock.now - 0.002 + STRETCHED)
