from datetime import timedelta

import pytest

from django_delayq.conf import MAX_DELAY
from django_delayq.exceptions import Retry
from django_delayq.retry import ExponentialBackoff, FixedDelay, NoRetry, resolve_policy


def test_backoff_grows_and_is_capped_without_jitter():
    policy = ExponentialBackoff(base=1, factor=2, cap=10, jitter=False)
    delays = [policy.next_delay(n, Exception()).total_seconds() for n in range(1, 7)]
    assert delays == [1, 2, 4, 8, 10, 10]


def test_backoff_stays_capped_at_the_highest_attempt_numbers():
    # factor ** attempt overflows a float past attempt 1,024 (factor 2);
    # max_attempts goes up to MAX_ATTEMPTS_LIMIT.
    policy = ExponentialBackoff(base=1, factor=2, cap=10, jitter=False)
    assert policy.next_delay(1_025, Exception()) == timedelta(seconds=10)
    assert policy.next_delay(1_000_000, Exception()) == timedelta(seconds=10)


def test_jitter_keeps_delay_between_half_and_full():
    policy = ExponentialBackoff(base=8, factor=2, cap=1000, jitter=True)
    for attempt in range(1, 5):
        full = 8 * 2 ** (attempt - 1)
        for _ in range(50):
            delay = policy.next_delay(attempt, Exception()).total_seconds()
            assert full / 2 <= delay <= full


def test_jitter_spreads_delays():
    policy = ExponentialBackoff(base=60)
    assert len({policy.next_delay(3, Exception()) for _ in range(20)}) > 1


def test_fixed_and_no_retry():
    assert FixedDelay(5).next_delay(9, Exception()) == timedelta(seconds=5)
    assert NoRetry().next_delay(1, Exception()) is None


def test_resolve_policy_accepts_path_class_and_instance():
    assert isinstance(resolve_policy("django_delayq.retry.NoRetry"), NoRetry)
    assert isinstance(resolve_policy(FixedDelay), FixedDelay)
    policy = FixedDelay(3)
    assert resolve_policy(policy) is policy


def test_resolve_policy_rejects_non_policies():
    with pytest.raises(TypeError, match="not a retry policy"):
        resolve_policy(object())


def test_backoff_rejects_bad_parameters():
    with pytest.raises(ValueError):
        ExponentialBackoff(base=0)
    with pytest.raises(ValueError):
        ExponentialBackoff(factor=0.5)


@pytest.mark.parametrize(
    ("delay", "words"),
    [
        (10**12, "Retry delay must be at most 365000 days"),
        (timedelta.max, "Retry delay must be at most 365000 days"),
        (10**15, "Retry delay: 1000000000000000 seconds is out of range"),
        (float("inf"), "Retry delay: inf seconds is out of range"),
        (-1, "Retry delay must not be negative"),
    ],
)
def test_retry_refuses_a_delay_no_database_could_store(delay, words):
    with pytest.raises(ValueError, match=words):
        Retry(delay=delay)
    assert Retry(delay=MAX_DELAY).delay == MAX_DELAY
