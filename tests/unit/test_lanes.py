"""Lanes and the strict cap (docs/reference.md#strict-cap)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, Lane, lane_for_priority, strict_cap


def _exact_cap(concurrency: int, pct: int) -> int:
    """The formula of docs/reference.md#strict-cap, computed with exact fractions (no float, no
    floor-division trick)."""
    if pct <= 0:
        return 0
    if pct >= 100:
        return concurrency
    return math.ceil(Fraction(concurrency * pct, 100))


@pytest.mark.parametrize(
    ("concurrency", "pct", "cap"),
    [
        (7, 0, 0),
        (7, 1, 1),
        (7, 24, 2),
        (7, 25, 2),
        (7, 26, 2),
        (7, 50, 4),
        (7, 99, 7),
        (7, 100, 7),
        (10, 20, 2),
        (10, 21, 3),
        (10, 25, 3),
        (4, 25, 1),
    ],
)
def test_strict_cap_matches_the_spec_table(concurrency: int, pct: int, cap: int) -> None:
    assert strict_cap(concurrency, pct) == cap


@pytest.mark.parametrize("pct", [-1, -50, -(10**9)])
def test_negative_percentage_gives_no_strict_slot(pct: int) -> None:
    assert strict_cap(7, pct) == 0


@pytest.mark.parametrize("pct", [101, 150, 10**9])
def test_percentage_above_100_gives_every_slot(pct: int) -> None:
    assert strict_cap(7, pct) == 7


def test_zero_concurrency_has_no_strict_slot() -> None:
    assert strict_cap(0, 50) == 0
    assert strict_cap(0, 100) == 0


def test_strict_cap_is_exact_for_every_small_fleet() -> None:
    # Exhaustive over the realistic range: no float rounding may move a boundary.
    for concurrency in range(1, 501):
        for pct in range(101):
            assert strict_cap(concurrency, pct) == _exact_cap(concurrency, pct), (concurrency, pct)


@settings(deadline=None, database=None, max_examples=500)
@given(concurrency=st.integers(1, 500), pct=st.integers(0, 100))
def test_strict_cap_is_the_ceiling_of_the_exact_share(concurrency: int, pct: int) -> None:
    cap = strict_cap(concurrency, pct)
    assert cap == math.ceil(Fraction(concurrency * pct, 100))
    assert 0 <= cap <= concurrency


@settings(deadline=None, database=None, max_examples=300)
@given(concurrency=st.integers(1, 500), pct=st.integers(0, 99))
def test_strict_cap_is_monotonic_in_the_percentage(concurrency: int, pct: int) -> None:
    assert strict_cap(concurrency, pct) <= strict_cap(concurrency, pct + 1)


def test_strict_cap_is_monotonic_in_the_percentage_everywhere() -> None:
    for concurrency in range(1, 501):
        caps = [strict_cap(concurrency, pct) for pct in range(-1, 102)]
        assert caps == sorted(caps), concurrency
        assert caps[0] == 0
        assert caps[-1] == concurrency


@pytest.mark.parametrize(
    ("priority", "lane"),
    [
        (CONTROL_PRIORITY, Lane.CONTROL),
        (CONTROL_PRIORITY - 1, Lane.STRICT),
        (1, Lane.STRICT),
        (100, Lane.STRICT),
        (0, Lane.NORMAL),
    ],
)
def test_lane_for_priority(priority: int, lane: Lane) -> None:
    assert lane_for_priority(priority) is lane


def test_control_priority_is_the_largest_postgres_int() -> None:
    assert CONTROL_PRIORITY == 2**31 - 1 == 2147483647
