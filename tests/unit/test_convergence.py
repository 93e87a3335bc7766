"""The one rule that decides a config change's outcome (shared/policy/convergence.py)."""

from __future__ import annotations

from taskfleet.shared.policy.convergence import (
    NO_ALIVE_WORKER,
    Converged,
    FleetView,
    Superseded,
    TimedOut,
    decide,
)


def test_a_newer_version_supersedes_even_when_workers_lag() -> None:
    view = FleetView(version=3, latest=4, alive_workers=2, lagging=["w1"])
    assert decide(view) == Superseded(version=3, superseded_by=4)
    assert decide(view, deadline_passed=True) == Superseded(version=3, superseded_by=4)


def test_no_lagging_alive_worker_is_converged_with_the_rounded_time() -> None:
    view = FleetView(
        version=3, latest=3, alive_workers=2, lagging=[], seconds_since_insert=0.1234567
    )
    assert decide(view) == Converged(version=3, seconds=0.123457, alive_workers=2)


def test_a_lagging_alive_worker_keeps_the_change_in_progress_until_the_deadline() -> None:
    view = FleetView(version=3, latest=3, alive_workers=2, lagging=["w2"])
    assert decide(view) is None
    assert decide(view, deadline_passed=True) == TimedOut(3, ("w2",), 2, None)


def test_no_alive_worker_is_not_convergence() -> None:
    view = FleetView(version=3, latest=3, alive_workers=0, lagging=[])
    assert decide(view) is None
    timed_out = decide(view, deadline_passed=True)
    assert timed_out == TimedOut(3, (), 0, NO_ALIVE_WORKER)
