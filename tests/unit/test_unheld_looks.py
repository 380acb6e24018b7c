"""When the keeper looks for rows running under its worker's name that its book does
not hold (``worker/keeper.py`` ``Looks``), without a database.

Every database error asks for a look once the leases given before it could
have lapsed. A MariaDB adversary run left a lost claim's rows running for
32 s under a 2 s lease: each later error put the look off again. Times are
given, never slept; the hand-back itself is tested against the databases in
``tests/integration/test_seams.py``.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from django_delayq.worker.keeper import Looks

DELAY = 2.7  # a lease of 2 s and an extension interval of 0.7 s
TICK = 0.05  # the keeper's turn


def test_errors_more_often_than_a_lease_do_not_put_the_look_off():
    looks = Looks()
    now = 1000.0
    looks.ask(now + DELAY)
    looked = []
    # An error every half second for a minute, and a keeper turn every tick.
    while now < 1060.0:
        now += TICK
        if round(now / TICK) % 10 == 0:
            looks.ask(now + DELAY)
        if looks.take(now):
            looked.append(now)
    assert looked and looked[0] <= 1000.0 + DELAY + TICK
    # One look per delay or so while the errors last, not one per error.
    gaps = [b - a for a, b in zip(looked, looked[1:], strict=False)]
    assert max(gaps) <= DELAY + 0.5 + TICK
    assert len(looked) <= 60 / (DELAY - 0.5 - TICK) + 1


def test_a_look_that_could_not_be_made_comes_soon_and_keeps_the_later_one():
    looks = Looks()
    looks.ask(10.0)
    looks.ask(12.0)
    assert looks.take(10.0)  # the look at 10 fails (a claim on its way, a locked database)
    looks.soon(10.5)
    assert not looks.take(10.4)
    assert looks.take(10.5)
    assert not looks.take(11.9)
    assert looks.take(12.0)
    assert not looks.take(100.0)


@settings(max_examples=300, deadline=None)
@given(
    errors=st.lists(st.floats(min_value=0.0, max_value=60.0), max_size=40),
    delay=st.floats(min_value=0.1, max_value=10.0),
)
def test_every_look_asked_for_comes_no_earlier_than_asked_and_within_one_more_delay(errors, delay):
    """The keeper turns every tick; each error at ``t`` asks for a look at ``t + delay``.
    Each is answered by a look in ``[t + delay, t + 2 delay + tick]``."""
    looks = Looks()
    pending = sorted(errors)
    asked: list[float] = []
    looked: list[float] = []
    now = 0.0
    while now < 60.0 + 3 * delay:
        while pending and pending[0] <= now:
            pending.pop(0)
            asked.append(now + delay)
            looks.ask(now + delay)
        if looks.take(now):
            looked.append(now)
        now += TICK
    for at in asked:
        assert any(at <= t <= at + delay + 2 * TICK + 1e-9 for t in looked), (at, looked)
    for t in looked:
        assert any(at <= t for at in asked)  # no look that nothing asked for
