"""The one rule that decides a config change's outcome (shared/policy/convergence.py)."""

from __future__ import annotations

from taskfleet.shared.policy.convergence import (
    DRAINING,
    HEARTBEAT_EXPIRED,
    NO_ALIVE_WORKER,
    OFFLINE,
    Converged,
    Excluded,
    FleetView,
    Superseded,
    TimedOut,
    decide,
    exclusion_reason,
    next_check_seconds,
    view_from_row,
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


def test_workers_left_out_are_carried_into_the_outcome() -> None:
    left_out = (Excluded("m3", HEARTBEAT_EXPIRED),)
    view = FleetView(version=3, latest=3, alive_workers=2, lagging=[], excluded=left_out)
    assert decide(view) == Converged(3, None, 2, left_out)
    lagging = FleetView(version=3, latest=3, alive_workers=2, lagging=["w1"], excluded=left_out)
    assert decide(lagging, deadline_passed=True) == TimedOut(3, ("w1",), 2, None, left_out)


def test_the_reason_a_worker_is_left_out_follows_its_status() -> None:
    assert exclusion_reason("online") == HEARTBEAT_EXPIRED == "heartbeat expired"
    assert exclusion_reason("draining") == DRAINING
    assert exclusion_reason("offline") == OFFLINE


def test_the_view_is_read_from_the_convergence_row() -> None:
    row = {
        "latest": 4,
        "alive_workers": 2,
        "applied_workers": 1,
        "lagging": ["w2"],
        "lagging_expire_in": 0.25,
        "excluded": ["m3", "m4"],
        "excluded_statuses": ["online", "draining"],
        "seconds_since_insert": 1.5,
    }
    assert view_from_row(4, row) == FleetView(
        version=4,
        latest=4,
        alive_workers=2,
        applied_workers=1,
        lagging=("w2",),
        seconds_since_insert=1.5,
        excluded=(Excluded("m3", HEARTBEAT_EXPIRED), Excluded("m4", DRAINING)),
        lagging_expire_in=0.25,
    )


def test_the_update_task_looks_again_when_the_first_lagging_heartbeat_expires() -> None:
    # Not only after listenTimeout: an expiry sends no message.
    assert next_check_seconds(listen_timeout=2, until_notify=1, lagging_expire_in=0.3) == 0.31
    # Never longer than listenTimeout or the next re-notification.
    assert next_check_seconds(listen_timeout=2, until_notify=1, lagging_expire_in=None) == 1
    assert next_check_seconds(listen_timeout=0.5, until_notify=1, lagging_expire_in=9) == 0.5
    # Already expired (a check raced it): at once, and never a busy loop.
    assert next_check_seconds(listen_timeout=2, until_notify=1, lagging_expire_in=-1) == 0.01
    assert next_check_seconds(listen_timeout=2, until_notify=-1, lagging_expire_in=None) == 0.005
