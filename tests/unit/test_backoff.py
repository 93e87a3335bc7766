"""Retry backoff (docs/reference.md#worker-runtime): exponential, capped, equal jitter,
deterministic with injected rand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskfleet.shared.policy.backoff import BackoffPolicy


def _ceiling(policy: BackoffPolicy, attempt: int) -> float:
    """``min(cap, base * factor**(attempt-1))`` without overflowing, computed in log space."""
    if policy.factor <= 1:
        return min(policy.cap, policy.base * policy.factor ** (attempt - 1))
    log_delay = math.log(policy.base) + (attempt - 1) * math.log(policy.factor)
    return policy.cap if log_delay >= math.log(policy.cap) else math.exp(log_delay)


def test_defaults_follow_the_spec() -> None:
    policy = BackoffPolicy()
    assert (policy.base, policy.factor, policy.cap) == (1.0, 2.0, 300.0)


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (8, 128.0), (9, 256.0), (10, 300.0), (11, 300.0)],
)
def test_default_delays_double_up_to_the_cap(attempt: int, ceiling: float) -> None:
    policy = BackoffPolicy()
    assert policy.delay(attempt, rand=lambda: 0.0) == ceiling / 2
    assert policy.delay(attempt, rand=lambda: 1.0) == ceiling
    assert policy.delay(attempt, rand=lambda: 0.5) == ceiling * 3 / 4


@pytest.mark.parametrize("attempt", [64, 65, 100, 1000, 10**6])
def test_cap_holds_for_huge_attempt_numbers(attempt: int) -> None:
    policy = BackoffPolicy()
    assert policy.delay(attempt, rand=lambda: 1.0) == 300.0
    assert policy.delay(attempt, rand=lambda: 0.0) == 150.0


def test_delay_never_exceeds_a_small_cap() -> None:
    policy = BackoffPolicy(base=5.0, factor=3.0, cap=7.0)
    assert [policy.delay(n, rand=lambda: 1.0) for n in (1, 2, 3)] == [5.0, 7.0, 7.0]


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempts_are_one_based(attempt: int) -> None:
    with pytest.raises(ValueError):
        BackoffPolicy().delay(attempt, rand=lambda: 0.0)


def test_default_rand_stays_within_bounds() -> None:
    policy = BackoffPolicy()
    for attempt in range(1, 12):
        ceiling = min(300.0, 2.0 ** (attempt - 1))
        for _ in range(50):
            assert ceiling / 2 <= policy.delay(attempt) <= ceiling


@settings(deadline=None, database=None, max_examples=300)
@given(
    attempt=st.integers(1, 1000),
    rand=st.floats(0.0, 1.0, exclude_max=True),
)
def test_default_delay_is_within_half_and_full_ceiling(attempt: int, rand: float) -> None:
    policy = BackoffPolicy()
    ceiling = min(300.0, 2.0 ** min(attempt - 1, 100))
    delay = policy.delay(attempt, rand=lambda: rand)
    assert ceiling / 2 <= delay <= ceiling


@settings(deadline=None, database=None, max_examples=300)
@given(
    base=st.floats(0.01, 10.0),
    factor=st.floats(1.0, 4.0),
    cap=st.floats(1.0, 3600.0),
    attempt=st.integers(1, 1000),
    rand=st.floats(0.0, 1.0),
)
def test_delay_follows_the_documented_formula(
    base: float, factor: float, cap: float, attempt: int, rand: float
) -> None:
    # The docstring's contract: d = min(cap, base * factor**(n-1)), jittered into [d/2, d].
    policy = BackoffPolicy(base=base, factor=factor, cap=cap)
    ceiling = _ceiling(policy, attempt)
    delay = policy.delay(attempt, rand=lambda: rand)
    assert delay == pytest.approx(ceiling / 2 + ceiling / 2 * rand, rel=1e-9)


def test_slowly_growing_backoff_keeps_growing_past_attempt_65() -> None:
    # factor 1.05: attempt 100 must wait min(300, 1.05**99) ~ 125 s (at most), not the
    # 1.05**64 ~ 22.7 s that clamping the exponent at 64 gives.
    policy = BackoffPolicy(base=1.0, factor=1.05, cap=300.0)
    assert policy.delay(100, rand=lambda: 1.0) == pytest.approx(1.05**99)
    assert policy.delay(100, rand=lambda: 1.0) > policy.delay(66, rand=lambda: 1.0)
