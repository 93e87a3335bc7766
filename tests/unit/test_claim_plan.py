"""Claim planning: lane order, strict cap, control slot, dry lanes and group shares
(docs/reference.md#scheduling)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskfleet.shared.policy.claim_plan import ClaimPlan, ClaimPlanner
from taskfleet.shared.policy.groups import GroupKey
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, Lane, strict_cap
from taskfleet.shared.policy.runtime_config import RuntimeConfig, normalise_runtime_config


def _config(pct: int = 100, label_weights: dict[str, int] | None = None, default: int = 1):
    return RuntimeConfig(
        max_strict_percentage=pct, default_weight=default, label_weights=label_weights or {}
    )


def _claimed_all(plan: ClaimPlan) -> dict[tuple[Lane, GroupKey], int]:
    """What a claim returns when every lane and group had enough work."""
    claimed: dict[tuple[Lane, GroupKey], int] = {}
    if plan.control:
        claimed[(Lane.CONTROL, None)] = plan.control
    if plan.strict:
        claimed[(Lane.STRICT, None)] = plan.strict
    for group, n in plan.groups:
        claimed[(Lane.NORMAL, group)] = n
    return claimed


# --------------------------------------------------------------------------------------------
# ClaimPlan
# --------------------------------------------------------------------------------------------


def test_claim_plan_totals() -> None:
    plan = ClaimPlan(control=1, strict=2, groups=(("a", 3), (None, 1)))
    assert plan.normal == 4
    assert plan.total == 7
    assert plan.group_keys == ["a", None]
    assert plan.group_limits == [3, 1]
    assert ClaimPlan().total == 0


# --------------------------------------------------------------------------------------------
# Strict cap
# --------------------------------------------------------------------------------------------


def test_strict_lane_is_filled_first_up_to_the_cap() -> None:
    planner = ClaimPlanner(10, _config(pct=50))
    assert planner.strict_cap == 5
    plan = planner.plan(free_slots=10, strict_inflight=0, control_free=False)
    assert plan.strict == 5
    assert plan.normal == 5
    assert plan.total == 10
    assert not plan.probe_strict


def test_strict_slots_left_are_the_cap_minus_strict_in_flight() -> None:
    planner = ClaimPlanner(10, _config(pct=50))
    plan = planner.plan(free_slots=7, strict_inflight=3, control_free=False)
    assert plan.strict == 2
    assert plan.normal == 5


def test_strict_is_limited_by_the_free_slots() -> None:
    planner = ClaimPlanner(10, _config(pct=50))
    plan = planner.plan(free_slots=1, strict_inflight=0, control_free=False)
    assert plan.strict == 1
    assert plan.normal == 0


def test_full_strict_cap_probes_for_waiting_strict_work() -> None:
    planner = ClaimPlanner(10, _config(pct=50))
    plan = planner.plan(free_slots=5, strict_inflight=5, control_free=False)
    assert plan.strict == 0
    assert plan.normal == 5
    assert plan.probe_strict


def test_lowered_cap_below_in_flight_claims_no_strict_work() -> None:
    planner = ClaimPlanner(10, _config(pct=80))
    planner.apply(_config(pct=20))
    plan = planner.plan(free_slots=2, strict_inflight=8, control_free=False)
    assert plan.strict == 0
    assert plan.normal == 2
    assert plan.probe_strict


def test_zero_percent_never_plans_strict_work() -> None:
    planner = ClaimPlanner(4, _config(pct=0))
    plan = planner.plan(free_slots=4, strict_inflight=0, control_free=False)
    assert plan.strict == 0
    assert plan.normal == 4
    assert plan.probe_strict


def test_no_free_slot_plans_nothing_regular() -> None:
    planner = ClaimPlanner(4, _config(pct=50))
    plan = planner.plan(free_slots=0, strict_inflight=0, control_free=False)
    assert plan.total == 0
    assert not plan.probe_strict
    assert planner.plan(free_slots=-3, strict_inflight=0, control_free=False).total == 0


@settings(deadline=None, database=None, max_examples=400)
@given(
    concurrency=st.integers(1, 64),
    pct=st.integers(0, 100),
    data=st.data(),
    control_free=st.booleans(),
)
def test_plan_respects_the_strict_cap(
    concurrency: int, pct: int, data: st.DataObject, control_free: bool
) -> None:
    free = data.draw(st.integers(0, concurrency))
    inflight = data.draw(st.integers(0, concurrency - free))
    planner = ClaimPlanner(concurrency, _config(pct=pct, label_weights={"a": 2, "b": 1}))
    plan = planner.plan(free_slots=free, strict_inflight=inflight, control_free=control_free)
    cap = strict_cap(concurrency, pct)
    room = max(0, cap - inflight)
    assert plan.strict == min(free, room)
    assert plan.strict + inflight <= max(cap, inflight)
    assert plan.normal == free - plan.strict
    assert plan.control == (1 if control_free else 0)
    assert plan.probe_strict == (free > 0 and room == 0)
    assert all(n > 0 for _, n in plan.groups)


# --------------------------------------------------------------------------------------------
# Control slot
# --------------------------------------------------------------------------------------------


def test_control_slot_is_claimed_only_when_free() -> None:
    planner = ClaimPlanner(4, _config())
    assert planner.plan(free_slots=4, strict_inflight=0, control_free=True).control == 1
    assert planner.plan(free_slots=4, strict_inflight=0, control_free=False).control == 0


def test_control_slot_is_outside_the_strict_cap_and_the_regular_slots() -> None:
    # maxStrictPercentage 0 and a fully busy worker must not block a config change.
    planner = ClaimPlanner(4, _config(pct=0))
    plan = planner.plan(free_slots=0, strict_inflight=0, control_free=True)
    assert plan.control == 1
    assert plan.strict == 0 and plan.normal == 0


def test_dry_control_lane_is_skipped_until_reset() -> None:
    planner = ClaimPlanner(4, _config())
    plan = planner.plan(free_slots=4, strict_inflight=0, control_free=True)
    assert planner.control_possible()
    planner.observe(plan, {})
    assert not planner.control_possible()
    assert planner.plan(free_slots=4, strict_inflight=0, control_free=True).control == 0
    planner.reset_dry()
    assert planner.control_possible()
    assert planner.plan(free_slots=4, strict_inflight=0, control_free=True).control == 1


# --------------------------------------------------------------------------------------------
# Dry lanes and groups: work-conserving
# --------------------------------------------------------------------------------------------


def test_strict_shortfall_gives_its_slots_to_the_normal_lane() -> None:
    planner = ClaimPlanner(10, _config(pct=50))
    plan = planner.plan(free_slots=10, strict_inflight=0, control_free=False)
    assert plan.strict == 5
    planner.observe(plan, {**_claimed_all(plan), (Lane.STRICT, None): 2})
    nxt = planner.plan(free_slots=3, strict_inflight=2, control_free=False)
    assert nxt.strict == 0
    assert nxt.normal == 3
    planner.reset_dry()
    again = planner.plan(free_slots=3, strict_inflight=2, control_free=False)
    assert again.strict == 3


def test_group_shortfall_gives_its_slots_to_the_other_groups() -> None:
    planner = ClaimPlanner(7, _config(pct=0, label_weights={"a": 5, "b": 1}))
    plan = planner.plan(free_slots=7, strict_inflight=0, control_free=False)
    assert dict(plan.groups) == {"a": 5, "b": 1, None: 1}
    planner.observe(plan, {(Lane.NORMAL, "a"): 5, (Lane.NORMAL, None): 1})  # b came back empty
    nxt = planner.plan(free_slots=7, strict_inflight=0, control_free=False)
    assert "b" not in nxt.group_keys
    assert nxt.normal == 7
    assert set(nxt.group_keys) == {"a", None}


def test_reset_dry_brings_groups_back() -> None:
    planner = ClaimPlanner(7, _config(pct=0, label_weights={"a": 5, "b": 1}))
    plan = planner.plan(free_slots=7, strict_inflight=0, control_free=False)
    planner.observe(plan, {(Lane.NORMAL, "a"): 5})
    assert planner.plan(free_slots=7, strict_inflight=0, control_free=False).group_keys == ["a"]
    planner.reset_dry()
    keys = set()
    for _ in range(7):
        p = planner.plan(free_slots=1, strict_inflight=0, control_free=False)
        planner.observe(p, _claimed_all(p))  # the rotation moves by what claims got
        keys.update(p.group_keys)
    assert keys == {"a", "b", None}


def test_every_group_dry_plans_no_normal_work() -> None:
    planner = ClaimPlanner(7, _config(pct=0, label_weights={"a": 5, "b": 1}))
    plan = planner.plan(free_slots=7, strict_inflight=0, control_free=False)
    planner.observe(plan, {})
    empty = planner.plan(free_slots=7, strict_inflight=0, control_free=False)
    assert empty.groups == ()
    assert empty.normal == 0


def test_full_claim_marks_nothing_dry() -> None:
    planner = ClaimPlanner(7, _config(pct=50, label_weights={"a": 5, "b": 1}))
    plan = planner.plan(free_slots=7, strict_inflight=0, control_free=True)
    planner.observe(plan, _claimed_all(plan))
    assert planner.control_possible()
    nxt = planner.plan(free_slots=7, strict_inflight=0, control_free=True)
    assert nxt.control == 1
    assert nxt.strict == 4
    assert nxt.normal == 3


# --------------------------------------------------------------------------------------------
# apply()
# --------------------------------------------------------------------------------------------


def test_apply_recomputes_cap_and_rotation_and_resets_dry() -> None:
    planner = ClaimPlanner(10, _config(pct=100))
    assert planner.strict_cap == 10
    plan = planner.plan(free_slots=10, strict_inflight=0, control_free=True)
    planner.observe(plan, {})
    planner.apply(normalise_runtime_config({"maxStrictPercentage": 21, "labelWeights": {"x": 2}}))
    assert planner.strict_cap == 3
    assert planner.configured_labels == ["x"]
    plan = planner.plan(free_slots=10, strict_inflight=0, control_free=True)
    assert plan.control == 1
    assert plan.strict == 3
    assert set(plan.group_keys) == {"x", None}
    assert dict(plan.groups) == {"x": 5, None: 2}


def test_default_config_gives_every_slot_to_strict() -> None:
    planner = ClaimPlanner(3)
    assert planner.strict_cap == 3
    assert planner.configured_labels == []
    plan = planner.plan(free_slots=3, strict_inflight=0, control_free=False)
    assert plan.strict == 3


# --------------------------------------------------------------------------------------------
# Proportional quotas under saturation
# --------------------------------------------------------------------------------------------

WEIGHTS = {"a": 5, "b": 1, None: 1}


def _saturated_counts(rounds: list[int]) -> list[Counter[GroupKey]]:
    planner = ClaimPlanner(7, _config(pct=0, label_weights={"a": 5, "b": 1}))
    totals: Counter[GroupKey] = Counter()
    history = []
    for free in rounds:
        plan = planner.plan(free_slots=free, strict_inflight=0, control_free=False)
        assert plan.normal == free
        planner.observe(plan, _claimed_all(plan))
        totals.update(dict(plan.groups))
        history.append(Counter(totals))
    return history


def test_saturated_full_rounds_match_the_weights_exactly() -> None:
    history = _saturated_counts([7] * 100)
    for n, counts in enumerate(history, start=1):
        assert counts == {"a": 5 * n, "b": n, None: n}


@settings(deadline=None, database=None, max_examples=200)
@given(rounds=st.lists(st.integers(1, 7), min_size=1, max_size=200))
def test_saturated_multi_claims_stay_proportional(rounds: list[int]) -> None:
    history = _saturated_counts(rounds)
    picked = 0
    for free, counts in zip(rounds, history, strict=True):
        picked += free
        assert sum(counts.values()) == picked
        for group, weight in WEIGHTS.items():
            # Within one pick of the exact share at every point, exact at whole periods.
            assert abs(counts[group] * 7 - picked * weight) < 7
            if picked % 7 == 0:
                assert counts[group] * 7 == picked * weight


def test_saturated_with_strict_work_shares_the_rest_by_weight() -> None:
    planner = ClaimPlanner(10, _config(pct=30, label_weights={"a": 5, "b": 1}))
    totals: Counter[GroupKey] = Counter()
    strict_total = 0
    for _ in range(70):
        plan = planner.plan(free_slots=10, strict_inflight=0, control_free=False)
        planner.observe(plan, _claimed_all(plan))
        strict_total += plan.strict
        totals.update(dict(plan.groups))
    assert strict_total == 70 * 3
    assert totals == {"a": 350, "b": 70, None: 70}


# --------------------------------------------------------------------------------------------
# classify()
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "labels", "expected"),
    [
        (CONTROL_PRIORITY, ["a"], (Lane.CONTROL, None)),
        (2147483647, [], (Lane.CONTROL, None)),
        (1, ["a"], (Lane.STRICT, None)),
        (99, ["b", "a"], (Lane.STRICT, None)),
        (0, ["b", "a", "zzz"], (Lane.NORMAL, "a")),
        (0, ["b"], (Lane.NORMAL, "b")),
        (0, ["zzz", "A"], (Lane.NORMAL, None)),
        (0, [], (Lane.NORMAL, None)),
    ],
)
def test_classify(priority: int, labels: list[str], expected: tuple[Lane, GroupKey]) -> None:
    planner = ClaimPlanner(4, _config(label_weights={"a": 5, "b": 1}))
    assert planner.classify(priority, labels) == expected


def test_classify_follows_the_applied_config() -> None:
    planner = ClaimPlanner(4, _config(label_weights={"a": 5, "b": 1}))
    planner.apply(_config(label_weights={"b": 1}))
    assert planner.classify(0, ["a", "b"]) == (Lane.NORMAL, "b")


# --------------------------------------------------------------------------------------------
# Honest accounting: charged for what a claim got; contention is not dryness
# --------------------------------------------------------------------------------------------


def _run_with_losses(
    rounds: int, lose_every: dict[GroupKey, int], *, report_contention: bool
) -> Counter[GroupKey]:
    """A saturated worker whose claims for some groups lose every n-th row to another worker
    (SKIP LOCKED); the claim says so (``contended``) when ``report_contention``."""
    planner = ClaimPlanner(10, _config(pct=0, label_weights={"a": 3, "b": 1}))
    got_total: Counter[GroupKey] = Counter()
    asks: Counter[GroupKey] = Counter()
    for r in range(rounds):
        plan = planner.plan(free_slots=1 + r % 10, strict_inflight=0, control_free=False)
        claimed: dict[tuple[Lane, GroupKey], int] = {}
        short = []
        for group, n in plan.groups:
            got = 0
            for _ in range(n):
                asks[group] += 1
                every = lose_every.get(group)
                if every and asks[group] % every == 0:
                    continue  # another worker held this row
                got += 1
            claimed[(Lane.NORMAL, group)] = got
            if got < n:
                short.append(group)
        planner.observe(plan, claimed, contended=short if report_contention else ())
        got_total.update({g: n for (_, g), n in claimed.items()})
        if not report_contention:
            planner.reset_dry()  # as a wake-up would: every group has work
    return got_total


def test_a_group_losing_races_still_gets_its_weight_share() -> None:
    # Group a loses 2 of every 5 rows it asks for; it is charged for what it got, owed the rest.
    got = _run_with_losses(3000, {"a": 5, None: 7}, report_contention=True)
    total = sum(got.values())
    assert abs(got["a"] / total - 3 / 5) < 0.01
    assert abs(got["b"] / total - 1 / 5) < 0.01
    assert abs(got[None] / total - 1 / 5) < 0.01


def test_charging_for_what_was_asked_would_lose_the_share() -> None:
    """The same run, charged for what was asked (the old accounting): a falls well short. Shows
    the test above can fail."""
    planner = ClaimPlanner(10, _config(pct=0, label_weights={"a": 3, "b": 1}))
    got_total: Counter[GroupKey] = Counter()
    for r in range(3000):
        plan = planner.plan(free_slots=1 + r % 10, strict_inflight=0, control_free=False)
        full = _claimed_all(plan)
        planner.observe(plan, full, contended=plan.group_keys)
        for (_, group), n in full.items():
            got_total[group] += n - (n * 2 // 5 if group == "a" else 0)
    total = sum(got_total.values())
    assert got_total["a"] / total < 0.55


def test_a_contended_shortfall_does_not_mark_the_group_dry() -> None:
    planner = ClaimPlanner(4, _config(pct=0, label_weights={"a": 1, "b": 1}))
    plan = planner.plan(free_slots=4, strict_inflight=0, control_free=False)
    assert dict(plan.groups) == {"a": 2, "b": 1, None: 1}
    # b got nothing but its rows were held by another worker; default is really empty.
    planner.observe(plan, {(Lane.NORMAL, "a"): 2}, contended=["b"])
    nxt = planner.plan(free_slots=2, strict_inflight=0, control_free=False)
    assert "b" in nxt.group_keys
    assert None not in nxt.group_keys


def test_a_contended_strict_shortfall_keeps_the_strict_lane() -> None:
    planner = ClaimPlanner(10, _config(pct=50))
    plan = planner.plan(free_slots=10, strict_inflight=0, control_free=False)
    assert plan.strict == 5
    planner.observe(plan, {(Lane.STRICT, None): 2, (Lane.NORMAL, None): 5}, strict_contended=True)
    assert planner.plan(free_slots=3, strict_inflight=2, control_free=False).strict == 3
    planner.observe(plan, {(Lane.STRICT, None): 2, (Lane.NORMAL, None): 5})
    assert planner.plan(free_slots=3, strict_inflight=2, control_free=False).strict == 0


def test_an_untrusted_shortfall_charges_but_marks_nothing_dry() -> None:
    planner = ClaimPlanner(4, _config(pct=0, label_weights={"a": 1}))
    plan = planner.plan(free_slots=4, strict_inflight=0, control_free=False)
    planner.observe(plan, {}, shortfall_trusted=False)  # new work was announced meanwhile
    assert planner.plan(free_slots=4, strict_inflight=0, control_free=False).groups == plan.groups


def test_an_empty_configured_group_is_not_asked_again_until_a_hint() -> None:
    planner = ClaimPlanner(10, _config(pct=0, label_weights={"a": 1, "empty": 1}))
    plan = planner.plan(free_slots=10, strict_inflight=0, control_free=False)
    assert "empty" in plan.group_keys
    claimed = {(Lane.NORMAL, g): n for g, n in plan.groups if g != "empty"}
    planner.observe(plan, claimed)
    for r in range(200):
        p = planner.plan(free_slots=1 + r % 10, strict_inflight=0, control_free=False)
        assert "empty" not in p.group_keys
        planner.observe(p, _claimed_all(p))
    planner.reset_dry(["normal"])
    assert "empty" in planner.plan(free_slots=10, strict_inflight=0, control_free=False).group_keys


def test_a_claimed_task_is_charged_to_the_group_key_it_was_claimed_under() -> None:
    planner = ClaimPlanner(4, _config(label_weights={"a": 1, "b": 1}))
    assert planner.classify(0, ["b", "a"], "b") == (Lane.NORMAL, "b")  # not yet re-grouped
    assert planner.classify(0, ["a"], "") == (Lane.NORMAL, None)
    assert planner.classify(0, ["b", "a"]) == (Lane.NORMAL, "a")
    assert planner.classify(5, ["a"], "a") == (Lane.STRICT, None)


# --------------------------------------------------------------------------------------------
# Pause (runtime config pausedLabels, pausedTypes, pausedLanes)


def test_a_paused_strict_lane_gives_every_slot_to_the_normal_lane_and_is_not_probed() -> None:
    planner = ClaimPlanner(
        concurrency=4, config=normalise_runtime_config({"pausedLanes": ["strict"]})
    )
    plan = planner.plan(free_slots=4, strict_inflight=0, control_free=True)
    assert (plan.control, plan.strict, plan.normal) == (1, 0, 4)
    assert not plan.probe_strict


def test_a_paused_normal_lane_plans_no_normal_work_and_no_probe() -> None:
    planner = ClaimPlanner(
        concurrency=4,
        config=normalise_runtime_config({"pausedLanes": ["normal"], "maxStrictPercentage": 50}),
    )
    plan = planner.plan(free_slots=4, strict_inflight=0, control_free=False)
    assert (plan.strict, plan.normal, plan.probe_normal) == (2, 0, False)


def test_a_group_whose_label_is_paused_gets_no_quota() -> None:
    config = normalise_runtime_config({"labelWeights": {"a": 3, "b": 1}, "pausedLabels": ["a"]})
    planner = ClaimPlanner(concurrency=4, config=config)
    plan = planner.plan(free_slots=4, strict_inflight=4, control_free=False)
    assert "a" not in plan.group_keys and plan.normal == 4
    assert planner.paused_labels == ["a"]


def test_paused_types_are_left_out_of_the_claim_but_the_control_type_never() -> None:
    planner = ClaimPlanner(
        concurrency=4, config=normalise_runtime_config({"pausedTypes": ["demo.cpu"]})
    )
    assert planner.claim_types(["demo.cpu", "demo.echo", "updateWorkerRuntimeConfig"]) == [
        "demo.echo",
        "updateWorkerRuntimeConfig",
    ]


def test_resuming_brings_everything_back() -> None:
    planner = ClaimPlanner(
        concurrency=2, config=normalise_runtime_config({"pausedLanes": ["strict", "normal"]})
    )
    assert planner.plan(free_slots=2, strict_inflight=0, control_free=False).total == 0
    planner.apply(normalise_runtime_config({}))
    assert planner.plan(free_slots=2, strict_inflight=0, control_free=False).strict == 2


# --------------------------------------------------------------------------------------------
# Probes: a claim expected to get all it asks leaves them out
# --------------------------------------------------------------------------------------------


def _normal_plan(planner: ClaimPlanner, free: int = 10) -> ClaimPlan:
    return planner.plan(free_slots=free, strict_inflight=0, control_free=False)


def _steady(label_weights: dict[str, int] | None = None, concurrency: int = 10) -> ClaimPlanner:
    """A planner whose last claim got all it asked of the normal lane (the strict lane, asked
    first, came back empty and is dry)."""
    planner = ClaimPlanner(concurrency, _config(label_weights=label_weights))
    first = _normal_plan(planner, concurrency)
    assert first.probes and first.strict == concurrency
    planner.observe(first, {})
    second = _normal_plan(planner, concurrency)
    assert second.probes and second.strict == 0  # the last claim came back short
    planner.observe(second, _claimed_all(second))
    return planner


def test_a_claim_probes_until_one_got_all_it_asked() -> None:
    planner = _steady({"a": 1})
    steady = _normal_plan(planner)
    assert not steady.probes
    assert steady.normal == 10
    planner.observe(steady, _claimed_all(steady))
    assert not _normal_plan(planner).probes


def test_a_steady_claim_that_came_back_short_makes_nothing_dry_and_the_next_one_probes() -> None:
    planner = _steady({"a": 1})
    steady = _normal_plan(planner)
    assert not steady.probes and "a" in steady.group_keys
    short = _claimed_all(steady)
    short[(Lane.NORMAL, "a")] = 0  # a came back empty-handed: empty, or held by another worker?
    planner.observe(steady, short)
    again = _normal_plan(planner)
    assert again.probes
    assert "a" in again.group_keys  # not dry: nobody asked why it was short
    # With the probes the database says "empty" (not contended): now a is dry.
    answered = _claimed_all(again)
    answered[(Lane.NORMAL, "a")] = 0
    planner.observe(again, answered)
    assert "a" not in _normal_plan(planner).group_keys


def test_a_short_steady_claim_leaves_the_group_owed_as_a_contended_one_would() -> None:
    # The rotation is charged as for a contended shortfall: a keeps earning its weight.
    def next_groups(planner: ClaimPlanner, *, probes: bool) -> list[tuple[GroupKey, int]]:
        plan = _normal_plan(planner, free=4)
        if probes:
            plan = replace(plan, probes=True)
        assert plan.probes is probes
        claimed = _claimed_all(plan)
        claimed[(Lane.NORMAL, "a")] = 0
        planner.observe(plan, claimed, contended=["a"] if probes else ())
        return list(_normal_plan(planner, free=4).groups)

    assert next_groups(_steady({"a": 1}, 4), probes=False) == next_groups(
        _steady({"a": 1}, 4), probes=True
    )


def test_the_strict_lane_short_in_a_steady_claim_is_not_dry() -> None:
    planner = ClaimPlanner(10, _config(pct=50))
    first = _normal_plan(planner)
    assert (first.strict, first.normal, first.probes) == (5, 5, True)
    planner.observe(first, _claimed_all(first))
    steady = _normal_plan(planner)
    assert (steady.strict, steady.normal, steady.probes) == (5, 5, False)
    short = _claimed_all(steady)
    short[(Lane.STRICT, None)] = 2
    planner.observe(steady, short)
    again = planner.plan(free_slots=3, strict_inflight=2, control_free=False)
    assert again.strict == 3 and again.probes


def test_control_lane_and_lane_probes_always_come_with_the_probes() -> None:
    planner = _steady()
    assert not _normal_plan(planner).probes
    # The control slot asked for (after a wake-up): probes.
    assert planner.plan(free_slots=10, strict_inflight=0, control_free=True).probes
    # The strict cap full: the strict lane is probed, and the claim has every probe.
    capped = ClaimPlanner(10, _config(pct=50))
    plan = _normal_plan(capped)
    capped.observe(plan, _claimed_all(plan))
    full_cap = capped.plan(free_slots=5, strict_inflight=5, control_free=False)
    assert full_cap.probe_strict and full_cap.probes
    # Every slot to the strict lane: the normal lane is asked whether it waits.
    strict_only = ClaimPlanner(10, _config(pct=100, label_weights={"a": 1}))
    plan = _normal_plan(strict_only)
    strict_only.observe(plan, _claimed_all(plan))
    asks = _normal_plan(strict_only)
    assert asks.probe_normal and asks.probes


def test_a_new_config_starts_with_the_probes_again() -> None:
    planner = _steady()
    assert not _normal_plan(planner).probes
    planner.apply(_config(label_weights={"b": 2}))
    planner.reset_dry()
    assert _normal_plan(planner).probes
