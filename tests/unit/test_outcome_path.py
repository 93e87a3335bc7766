"""Where a worker's outcomes are written (shared/policy/outcome_path.py)."""

from __future__ import annotations

import pytest

from taskfleet.shared.policy.outcome_path import outcomes_at_once


def test_a_lone_worker_writes_its_outcomes_at_once() -> None:
    assert outcomes_at_once(0) is True


@pytest.mark.parametrize("others", [1, 3, 19])
def test_in_a_fleet_the_claims_carry_them(others: int) -> None:
    assert outcomes_at_once(others) is False


def test_before_the_fleet_is_known_the_claims_carry_them() -> None:
    assert outcomes_at_once(None) is False


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        outcomes_at_once(-1)
