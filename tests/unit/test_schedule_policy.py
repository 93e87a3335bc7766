"""When a schedule's slots fall (taskfleet.shared.policy.schedules): cron in a time zone across
daylight-saving changes, every, catch-up, with the clock injected (no I/O, no sleeping)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskfleet.shared.policy.schedules import (
    FirePlan,
    ScheduleError,
    Timing,
    fire_plan,
    latest_slot,
    next_slot,
    parse_every,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def cron(expr: str, timezone: str | None = None) -> Timing:
    return Timing.parse(cron=expr, every=None, timezone=timezone)


def every(text: str) -> Timing:
    return Timing.parse(cron=None, every=text, timezone=None)


def run_fleet(timing: Timing, start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """A fleet whose clock reads ``start``, ``start + step``, ... ``end``: at each reading it
    fires the schedule when due, as the workers do. The slots it enqueued."""
    due = next_slot(timing, start)
    fired: list[datetime] = []
    now = start
    while now <= end:
        plan = fire_plan(timing, due, now)
        if plan is not None:
            fired.append(plan.slot)
            due = plan.next_run_at
        now += step
    return fired


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1), ("30s", 30), ("5m", 300), ("1h", 3600), ("1h30m", 5400), ("2d", 172800)],
)
def test_every_durations(text: str, seconds: int) -> None:
    assert parse_every(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "1", "1 h", "1.5h", "h", "-1s", "1w", "367d", "1S"])
def test_bad_every_durations(text: str) -> None:
    with pytest.raises(ScheduleError):
        parse_every(text)


@pytest.mark.parametrize(
    "expr", ["* * * * *", "0 6 * * 1-5", "*/15 9-17 * * *", "0 0 1 1 *", "30 0 6 * * *", "@daily"]
)
def test_good_cron_expressions(expr: str) -> None:
    cron(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",
        "60 * * * *",
        "* 24 * * *",
        "0 0 31 2 *",
        "a b c d e",
        "@often",
        "0 0 0 1 1 * 2030",
    ],
)
def test_bad_cron_expressions(expr: str) -> None:
    with pytest.raises(ScheduleError):
        cron(expr)


def test_unknown_time_zone() -> None:
    with pytest.raises(ScheduleError):
        cron("0 6 * * *", "Europe/Atlantis")
    with pytest.raises(ScheduleError):
        cron("0 6 * * *", "../../etc/passwd")


@pytest.mark.parametrize("name", ["localtime", "posixrules", "Factory", "right/UTC", "posix/UTC"])
def test_a_zone_name_that_depends_on_the_machine_is_refused(name: str) -> None:
    # Loadable here, so accepted: localtime is each machine's own setting, and a worker image
    # without the file marked the schedule broken.
    with pytest.raises(ScheduleError, match="depends on the machine"):
        cron("0 6 * * *", name)


def test_exactly_one_of_cron_and_every() -> None:
    with pytest.raises(ScheduleError):
        Timing.parse(cron=None, every=None, timezone=None)
    with pytest.raises(ScheduleError):
        Timing.parse(cron="* * * * *", every="1m", timezone=None)


def test_every_slots_are_multiples_since_the_epoch() -> None:
    assert next_slot(every("1h"), utc(2026, 5, 1, 10, 20)) == utc(2026, 5, 1, 11)
    assert next_slot(every("1h"), utc(2026, 5, 1, 11)) == utc(2026, 5, 1, 12)
    assert latest_slot(every("1h"), utc(2026, 5, 1, 11)) == utc(2026, 5, 1, 11)
    assert next_slot(every("1s"), utc(2026, 5, 1, 0, 0, 0) + timedelta(microseconds=10)) == utc(
        2026, 5, 1, 0, 0, 1
    )


def test_daily_local_time_follows_the_zone_across_the_spring_change() -> None:
    # Berlin moves from UTC+1 to UTC+2 on 2026-03-29: 06:00 local is 05:00Z, then 04:00Z.
    fired = run_fleet(
        cron("0 6 * * *", "Europe/Berlin"),
        utc(2026, 3, 27, 12),
        utc(2026, 3, 31, 12),
        timedelta(minutes=1),
    )
    assert fired == [
        utc(2026, 3, 28, 5),
        utc(2026, 3, 29, 4),
        utc(2026, 3, 30, 4),
        utc(2026, 3, 31, 4),
    ]


def test_a_time_skipped_by_the_spring_change_runs_once_right_after_the_gap() -> None:
    # 02:30 does not exist in Berlin on 2026-03-29 (02:00 -> 03:00): it runs at 03:00 CEST.
    fired = run_fleet(
        cron("30 2 * * *", "Europe/Berlin"),
        utc(2026, 3, 27, 12),
        utc(2026, 3, 30, 12),
        timedelta(minutes=1),
    )
    assert fired == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]


def test_a_time_repeated_by_the_autumn_change_runs_once() -> None:
    # 01:30 happens twice in New York on 2026-11-01 (EDT, then EST): one run, the first.
    timing = cron("30 1 * * *", "America/New_York")
    fired = run_fleet(timing, utc(2026, 10, 31, 0), utc(2026, 11, 2, 12), timedelta(minutes=1))
    assert fired == [utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]
    # At the second 01:30 (06:30Z), the schedule fired an hour ago is not due again.
    assert next_slot(timing, utc(2026, 11, 1, 5, 30)) == utc(2026, 11, 2, 6, 30)
    assert fire_plan(timing, utc(2026, 11, 2, 6, 30), utc(2026, 11, 1, 6, 35)) is None


@pytest.mark.parametrize(
    ("expr", "zone", "inside", "after_it"),
    [
        # 02:30 Berlin is 00:30Z (CEST), then 01:30Z (CET) on 2025-10-26.
        ("30 2 * * *", "Europe/Berlin", utc(2025, 10, 26, 1, 10), utc(2025, 10, 27, 1, 30)),
        # 01:30 New York is 05:30Z (EDT), then 06:30Z (EST) on 2026-11-01.
        ("30 1 * * *", "America/New_York", utc(2026, 11, 1, 6, 10), utc(2026, 11, 2, 6, 30)),
        # 01:15 ran in the first pass (05:15Z); the next is 02:15 EST.
        ("15 1-3 * * *", "America/New_York", utc(2026, 11, 1, 6, 5), utc(2026, 11, 1, 7, 15)),
    ],
)
def test_inside_the_repeated_hour_the_next_slot_is_later_never_earlier(
    expr: str, zone: str, inside: datetime, after_it: datetime
) -> None:
    # From inside the second pass, cronsim answered the first pass's slot, an hour earlier:
    # fire_plan set next_run_at to the slot it had just fired, and every worker looked again at
    # once, in a loop, until the clock passed the minute (up to an hour).
    timing = cron(expr, zone)
    assert next_slot(timing, inside) == after_it
    assert latest_slot(timing, inside) <= inside
    plan = fire_plan(timing, inside - timedelta(minutes=5), inside)
    assert plan is not None
    assert plan.next_run_at > inside >= plan.slot


def test_sub_hourly_cron_follows_the_real_clock_across_the_autumn_change() -> None:
    # Every half hour of real time, through the repeated hour (8 runs in 4 hours).
    fired = run_fleet(
        cron("*/30 * * * *", "America/New_York"),
        utc(2026, 11, 1, 4, 50),
        utc(2026, 11, 1, 8, 50),
        timedelta(seconds=20),
    )
    assert fired == [utc(2026, 11, 1, 5) + timedelta(minutes=30 * i) for i in range(8)]


def test_a_downtime_over_many_slots_gives_one_catch_up_run() -> None:
    timing = cron("*/5 * * * *")
    plan = fire_plan(timing, utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 10, 52, 30))
    assert plan == FirePlan(
        slot=utc(2026, 6, 1, 10, 50), next_run_at=utc(2026, 6, 1, 10, 55), skipped=10
    )
    # The clock stops just past a slot: that slot, the next after it.
    assert fire_plan(timing, utc(2026, 6, 1, 10, 5), utc(2026, 6, 1, 10, 5)) == FirePlan(
        slot=utc(2026, 6, 1, 10, 5), next_run_at=utc(2026, 6, 1, 10, 10), skipped=0
    )
    assert fire_plan(timing, utc(2026, 6, 1, 10, 5), utc(2026, 6, 1, 10, 4, 59)) is None


def test_a_fleet_that_looks_rarely_still_fires_each_slot_at_most_once() -> None:
    # Looking every 7 s at an every-second schedule: one run per look, never two per slot.
    fired = run_fleet(every("1s"), utc(2026, 1, 1), utc(2026, 1, 1, 0, 1), timedelta(seconds=7))
    assert len(fired) == len(set(fired)) == 8
    assert fired == sorted(fired)


def test_six_field_cron_has_a_leading_seconds_field() -> None:
    timing = cron("*/10 * * * * *")
    assert next_slot(timing, utc(2026, 1, 1, 0, 0, 3)) == utc(2026, 1, 1, 0, 0, 10)
