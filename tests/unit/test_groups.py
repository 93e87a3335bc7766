"""Normal-lane groups and the smooth weighted rotation (docs/reference.md#rotation)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskfleet.shared.policy.groups import (
    DEFAULT_GROUP,
    GroupKey,
    SmoothWeightedRoundRobin,
    group_for_labels,
    group_name,
    group_weights,
)

# --------------------------------------------------------------------------------------------
# group_for_labels
# --------------------------------------------------------------------------------------------


def test_task_with_several_weighted_labels_takes_the_smallest() -> None:
    assert group_for_labels(["zeta", "beta", "alpha"], {"zeta", "beta", "alpha"}) == "alpha"
    assert group_for_labels(["zeta", "beta"], {"zeta", "beta", "alpha"}) == "beta"


def test_group_order_is_by_code_point_not_locale() -> None:
    # Upper case sorts before lower case, and accented letters after "z", as in COLLATE "C".
    assert group_for_labels(["a", "B"], {"a", "B"}) == "B"
    assert group_for_labels(["z", "é"], {"z", "é"}) == "z"
    assert group_for_labels(["a-b", "a_b", "ab"], {"a-b", "a_b", "ab"}) == "a-b"
    assert group_for_labels(["ab", "a"], {"ab", "a"}) == "a"


def test_unconfigured_labels_are_ignored() -> None:
    # "a" is the smallest label of the task but not configured, so it decides nothing.
    assert group_for_labels(["a", "c", "b"], {"b", "c"}) == "b"


def test_no_configured_label_means_the_default_group() -> None:
    assert group_for_labels(["x", "y"], {"a", "b"}) is None
    assert group_for_labels([], {"a"}) is None
    assert group_for_labels(["a"], set()) is None


def test_configured_labels_may_be_any_iterable() -> None:
    assert group_for_labels(["b", "a"], ["a", "b"]) == "a"
    assert group_for_labels(["b", "a"], {"a": 5, "b": 1}) == "a"
    assert group_for_labels(iter(["b", "a"]), frozenset({"b"})) == "b"


labels_strategy = st.lists(st.text(min_size=1, max_size=6), max_size=8)


@settings(deadline=None, database=None, max_examples=150)
@given(labels=labels_strategy, configured=st.sets(st.text(min_size=1, max_size=6), max_size=8))
def test_every_task_belongs_to_exactly_one_group(labels: list[str], configured: set[str]) -> None:
    group = group_for_labels(labels, configured)
    matching = [label for label in labels if label in configured]
    if not matching:
        assert group is None
        return
    # Exactly one group: the configured label that no other matching label sorts before, with
    # the order being the code points (independent oracle: compare code point tuples).
    assert group in matching
    key = [ord(ch) for ch in group]
    assert all(key <= [ord(ch) for ch in other] for other in matching)
    # The claim query selects a task for group g when it carries g and no configured label
    # smaller than g: exactly one group accepts the task.
    accepting = [
        g for g in configured if g in labels and not any(c < g and c in labels for c in configured)
    ]
    assert accepting == [group]


def test_group_name_of_default_group() -> None:
    assert group_name(None) == DEFAULT_GROUP == "default"
    assert group_name("a") == "a"


def test_group_weights_adds_the_default_group() -> None:
    assert group_weights({"a": 5, "b": 1}, 2) == {"a": 5, "b": 1, None: 2}
    assert group_weights({}, 1) == {None: 1}


# --------------------------------------------------------------------------------------------
# SmoothWeightedRoundRobin
# --------------------------------------------------------------------------------------------


def _names(picks: list[GroupKey]) -> list[str]:
    return [group_name(g) for g in picks]


def test_golden_rotation_is_interleaved() -> None:
    rotation = SmoothWeightedRoundRobin({"a": 5, "b": 1, None: 1})
    first = [rotation.pick() for _ in range(7)]
    assert _names(first) == ["a", "a", "b", "a", "default", "a", "a"]


def test_golden_rotation_repeats_with_period_seven() -> None:
    rotation = SmoothWeightedRoundRobin({"a": 5, "b": 1, None: 1})
    picks = [rotation.pick() for _ in range(7 * 20)]
    golden = ["a", "a", "b", "a", "default", "a", "a"]
    for start in range(0, len(picks), 7):
        assert _names(picks[start : start + 7]) == golden


def test_golden_rotation_does_not_depend_on_mapping_order() -> None:
    rotation = SmoothWeightedRoundRobin({None: 1, "b": 1, "a": 5})
    assert _names([rotation.pick() for _ in range(7)]) == ["a", "a", "b", "a", "default", "a", "a"]
    assert rotation.groups == ("a", "b", None)


def test_take_counts_consecutive_picks() -> None:
    rotation = SmoothWeightedRoundRobin({"a": 5, "b": 1, None: 1})
    assert rotation.take(7) == {"a": 5, "b": 1, None: 1}
    # Split into rounds the quotas still follow the same sequence: a a | b a default | a a
    rotation = SmoothWeightedRoundRobin({"a": 5, "b": 1, None: 1})
    assert rotation.take(2) == {"a": 2}
    assert rotation.take(3) == {"b": 1, "a": 1, None: 1}
    assert rotation.take(2) == {"a": 2}
    assert rotation.take(0) == {}


def test_work_conserving_shares_in_proportion_among_groups_with_work() -> None:
    rotation = SmoothWeightedRoundRobin({"a": 3, "b": 1, None: 1})
    picks = [rotation.pick(["a", "b"]) for _ in range(4000)]
    counts = Counter(picks)
    assert counts == {"a": 3000, "b": 1000}
    longest = run = 0
    for group in picks:
        run = run + 1 if group == "a" else 0
        longest = max(longest, run)
    assert longest <= 3  # interleaved, never blocks of a's


def test_work_conserving_after_a_group_runs_dry_mid_rotation() -> None:
    # Default had work for a while, then ran dry: a and b keep their 3:1 share.
    rotation = SmoothWeightedRoundRobin({"a": 3, "b": 1, None: 1})
    rotation.take(3)
    counts = rotation.take(4000, ["a", "b"])
    assert set(counts) == {"a", "b"}
    assert abs(counts["a"] - 3000) <= 5
    assert abs(counts["b"] - 1000) <= 5
    assert counts["a"] + counts["b"] == 4000


def test_lone_eligible_group_gets_every_pick() -> None:
    rotation = SmoothWeightedRoundRobin({"a": 5, "b": 1, None: 1})
    assert [rotation.pick(["b"]) for _ in range(50)] == ["b"] * 50
    assert [rotation.pick([None]) for _ in range(50)] == [None] * 50


def test_unknown_eligible_groups_are_ignored() -> None:
    rotation = SmoothWeightedRoundRobin({"a": 1, None: 1})
    assert {rotation.pick(["a", "nope"]) for _ in range(10)} == {"a"}


def test_no_eligible_group_raises() -> None:
    rotation = SmoothWeightedRoundRobin({"a": 1, None: 1})
    with pytest.raises(LookupError):
        rotation.pick([])
    with pytest.raises(LookupError):
        rotation.pick(["unknown"])


@pytest.mark.parametrize("weight", [0, -1])
def test_weights_below_one_are_rejected(weight: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        SmoothWeightedRoundRobin({"a": 1, None: weight})


weights_strategy = st.dictionaries(
    st.one_of(st.none(), st.text(min_size=1, max_size=4)),
    st.integers(1, 30),
    min_size=1,
    max_size=8,
)


@settings(deadline=None, database=None, max_examples=150)
@given(weights=weights_strategy, periods=st.integers(1, 5))
def test_every_period_gives_each_group_exactly_its_weight(
    weights: dict[GroupKey, int], periods: int
) -> None:
    rotation = SmoothWeightedRoundRobin(weights)
    total = sum(weights.values())
    assert rotation.take(periods * total) == {g: periods * w for g, w in weights.items()}


@settings(deadline=None, database=None, max_examples=100)
@given(
    weights=weights_strategy,
    warmup=st.integers(0, 60),
    periods=st.integers(1, 20),
    data=st.data(),
)
def test_groups_with_work_share_in_proportion_after_others_run_dry(
    weights: dict[GroupKey, int], warmup: int, periods: int, data: st.DataObject
) -> None:
    rotation = SmoothWeightedRoundRobin(weights)
    rotation.take(warmup)
    keys = sorted(weights, key=lambda g: (g is None, g or ""))
    eligible = data.draw(st.lists(st.sampled_from(keys), min_size=1, unique=True))
    eligible_total = sum(weights[g] for g in eligible)
    counts = rotation.take(periods * eligible_total, eligible)
    assert set(counts) <= set(eligible)
    # Only eligible groups are picked, and the deviation from the exact share stays bounded
    # (scores frozen while a group was ineligible are bounded by the total weight).
    for group in eligible:
        assert abs(counts.get(group, 0) - periods * weights[group]) <= sum(weights.values())
