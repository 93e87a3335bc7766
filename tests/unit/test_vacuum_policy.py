"""When a busy worker vacuums the tasks table: the rule, without any I/O."""

from __future__ import annotations

import pytest

from taskfleet.shared.policy.vacuum import VacuumPolicy


def test_due_once_the_dead_rows_reach_the_floor_on_a_small_table() -> None:
    policy = VacuumPolicy(min_dead_rows=10_000, dead_fraction=0.05)
    assert not policy.due(dead=9_999, live=20_000, vacuum_running=False)
    assert policy.due(dead=10_000, live=20_000, vacuum_running=False)


def test_a_large_table_waits_for_its_share_of_dead_rows() -> None:
    # Every vacuum reads each index whole: a table of 1,000,000 rows waits for 50,000 dead.
    policy = VacuumPolicy(min_dead_rows=10_000, dead_fraction=0.05)
    assert policy.threshold(1_000_000) == 50_000
    assert not policy.due(dead=49_999, live=1_000_000, vacuum_running=False)
    assert policy.due(dead=50_000, live=1_000_000, vacuum_running=False)


def test_never_while_another_vacuum_of_the_table_runs() -> None:
    policy = VacuumPolicy()
    assert not policy.due(dead=10**9, live=0, vacuum_running=True)


def test_zero_leaves_the_table_to_autovacuum() -> None:
    policy = VacuumPolicy(min_dead_rows=0)
    assert not policy.enabled
    assert not policy.due(dead=10**9, live=0, vacuum_running=False)


def test_statistics_that_are_off_say_nothing_is_due() -> None:
    # A negative live estimate (never seen, but the server's counters are estimates) is no rows.
    assert VacuumPolicy(min_dead_rows=100).threshold(-5) == 100


@pytest.mark.parametrize(
    "kwargs",
    [{"min_dead_rows": -1}, {"dead_fraction": -0.1}, {"dead_fraction": 1.5}, {"check_every": 0}],
)
def test_nonsense_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        VacuumPolicy(**kwargs)  # type: ignore[arg-type]
