"""Runtime-config validation and normalisation: every rule of docs/reference.md#parameters."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskfleet.shared.policy.runtime_config import (
    RuntimeConfig,
    RuntimeConfigError,
    config_from_payload,
    format_duration,
    normalise_runtime_config,
    parse_duration,
)


def _locs(params: Any, **kwargs: Any) -> set[tuple[str | int, ...]]:
    """The locations of every broken rule (the call must fail)."""
    with pytest.raises(RuntimeConfigError) as info:
        normalise_runtime_config(params, **kwargs)
    issues = info.value.issues
    assert issues, "a RuntimeConfigError must name at least one rule"
    assert all(issue.msg for issue in issues)
    return {issue.loc for issue in issues}


# --------------------------------------------------------------------------------------------
# maxStrictPercentage
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pct", [0, 1, 50, 99, 100])
def test_max_strict_percentage_accepts_integers_in_range(pct: int) -> None:
    assert normalise_runtime_config({"maxStrictPercentage": pct}).max_strict_percentage == pct


@pytest.mark.parametrize("pct", [True, False, 50.0, 0.5, "50", -1, 101, 1000, [50], {"v": 50}])
def test_max_strict_percentage_rejects_everything_else(pct: Any) -> None:
    assert _locs({"maxStrictPercentage": pct}) == {("maxStrictPercentage",)}


def test_put_without_max_strict_percentage_takes_the_fleet_default() -> None:
    config = normalise_runtime_config({}, default_max_strict_percentage=40)
    assert config.max_strict_percentage == 40
    assert normalise_runtime_config({}).max_strict_percentage == 100


def test_put_with_max_strict_percentage_ignores_the_fleet_default() -> None:
    config = normalise_runtime_config({"maxStrictPercentage": 0}, default_max_strict_percentage=40)
    assert config.max_strict_percentage == 0


# --------------------------------------------------------------------------------------------
# defaultWeight
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [1, 2, 1000])
def test_default_weight_accepts_positive_integers(weight: int) -> None:
    assert normalise_runtime_config({"defaultWeight": weight}).default_weight == weight


def test_default_weight_defaults_to_one() -> None:
    assert normalise_runtime_config({}).default_weight == 1


@pytest.mark.parametrize("weight", [0, -1, 1.5, 2.0, "2", True, [1]])
def test_default_weight_rejects_non_positive_or_non_integers(weight: Any) -> None:
    assert _locs({"defaultWeight": weight}) == {("defaultWeight",)}


# --------------------------------------------------------------------------------------------
# labels + weights
# --------------------------------------------------------------------------------------------


def test_labels_and_weights_become_a_label_weight_map() -> None:
    config = normalise_runtime_config({"labels": ["b", "a"], "weights": [2, 5]})
    assert dict(config.label_weights) == {"a": 5, "b": 2}
    assert config.group_weights() == {"a": 5, "b": 2, None: 1}


def test_duplicate_label_last_wins() -> None:
    config = normalise_runtime_config({"labels": ["a", "b", "a"], "weights": [1, 2, 7]})
    assert dict(config.label_weights) == {"a": 7, "b": 2}


def test_empty_labels_and_weights_clear_the_map() -> None:
    config = normalise_runtime_config({"labels": [], "weights": []})
    assert dict(config.label_weights) == {}


def test_labels_and_weights_must_have_equal_lengths() -> None:
    assert _locs({"labels": ["a", "b"], "weights": [1]}) == {("weights",)}
    assert _locs({"labels": ["a"], "weights": [1, 2]}) == {("weights",)}


def test_labels_without_weights_are_rejected() -> None:
    assert _locs({"labels": ["a"]}) == {("weights",)}
    assert _locs({"weights": [1]}) == {("labels",)}


@pytest.mark.parametrize("labels", ["a", {"a": 1}, 5])
def test_labels_must_be_a_list(labels: Any) -> None:
    assert ("labels",) in _locs({"labels": labels, "weights": [1]})


@pytest.mark.parametrize("label", ["", "   ", 5, None, ["a"], "x" * 129])
def test_labels_must_be_non_empty_strings(label: Any) -> None:
    assert _locs({"labels": ["ok", label], "weights": [1, 1]}) == {("labels", 1)}


def test_label_of_128_characters_is_accepted() -> None:
    config = normalise_runtime_config({"labels": ["x" * 128], "weights": [3]})
    assert dict(config.label_weights) == {"x" * 128: 3}


@pytest.mark.parametrize("weight", [0, -3, 1.5, "1", True, None])
def test_weights_must_be_integers_of_at_least_one(weight: Any) -> None:
    assert _locs({"labels": ["a", "b"], "weights": [1, weight]}) == {("weights", 1)}


def test_every_bad_label_and_weight_is_reported() -> None:
    locs = _locs({"labels": ["", "b", "  "], "weights": [1, 0, 2]})
    assert locs == {("labels", 0), ("weights", 1), ("labels", 2)}


# --------------------------------------------------------------------------------------------
# labelWeights
# --------------------------------------------------------------------------------------------


def test_label_weights_map_is_accepted_and_sorted() -> None:
    config = normalise_runtime_config({"labelWeights": {"b": 1, "a": 5}})
    assert list(config.label_weights.items()) == [("a", 5), ("b", 1)]


@pytest.mark.parametrize("weight", [0, -1, 2.5, "3", True, None])
def test_label_weights_values_follow_the_weight_rule(weight: Any) -> None:
    assert _locs({"labelWeights": {"a": 1, "b": weight}}) == {("labelWeights", "b")}


@pytest.mark.parametrize("label", ["", "  ", "x" * 129])
def test_label_weights_keys_follow_the_label_rule(label: str) -> None:
    assert _locs({"labelWeights": {"a": 1, label: 2}}) == {("labelWeights", label)}


def test_the_default_groups_name_cannot_be_weighted_as_a_label() -> None:
    # A label "default" with a weight made a second group named "default": the stats showed one
    # of the two, and the depth gauges of both wrote one series.
    assert _locs({"labelWeights": {"a": 1, "default": 5}}) == {("labelWeights", "default")}
    assert _locs({"labels": ["default"], "weights": [5]}) == {("labels", 0)}
    with pytest.raises(RuntimeConfigError) as info:
        normalise_runtime_config({"labelWeights": {"default": 5}})
    assert "defaultWeight" in info.value.issues[0].msg
    # Still a label like any other elsewhere: it can be paused or limited.
    config = normalise_runtime_config(
        {"pausedLabels": ["default"], "labelLimits": {"default": {"maxInFlight": 2}}}
    )
    assert list(config.paused_labels) == ["default"]


@pytest.mark.parametrize("mapping", [["a", 1], "a", 3])
def test_label_weights_must_be_an_object(mapping: Any) -> None:
    assert _locs({"labelWeights": mapping}) == {("labelWeights",)}


@pytest.mark.parametrize(
    "extra", [{"labels": ["a"], "weights": [1]}, {"labels": ["a"]}, {"weights": [1]}]
)
def test_label_weights_not_together_with_labels_or_weights(extra: dict[str, Any]) -> None:
    locs = _locs({"labelWeights": {"a": 1}, **extra})
    assert ("labelWeights",) in locs


# --------------------------------------------------------------------------------------------
# requestID
# --------------------------------------------------------------------------------------------


def test_request_id_is_generated_when_absent() -> None:
    first = normalise_runtime_config({})
    second = normalise_runtime_config({})
    assert first.request_id and second.request_id
    assert first.request_id != second.request_id
    uuid.UUID(first.request_id)  # a real UUID, not some placeholder


def test_request_id_is_kept_when_given() -> None:
    assert normalise_runtime_config({"requestID": "deploy-42"}).request_id == "deploy-42"


@pytest.mark.parametrize("request_id", ["", "   ", 5, ["x"], "r" * 201])
def test_request_id_must_be_a_non_empty_string(request_id: Any) -> None:
    assert _locs({"requestID": request_id}) == {("requestID",)}


# --------------------------------------------------------------------------------------------
# notifyInterval / listenTimeout
# --------------------------------------------------------------------------------------------


def test_duration_defaults() -> None:
    config = normalise_runtime_config({})
    assert config.notify_interval == 1.0
    assert config.listen_timeout == 2.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("250ms", 0.25),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        (" 3s ", 3.0),
    ],
)
def test_durations_parse_go_style(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    config = normalise_runtime_config({"notifyInterval": text, "listenTimeout": text})
    assert config.notify_interval == pytest.approx(seconds)
    assert config.listen_timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    "bad",
    ["", "  ", "1", "s", "soon", "-1s", "1 s", "1x", "1s2", "0s", "0ms", "1h1s", "1d", True, [1]],
)
@pytest.mark.parametrize("field", ["notifyInterval", "listenTimeout"])
def test_bad_durations_are_rejected(field: str, bad: Any) -> None:
    assert _locs({field: bad}) == {(field,)}
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_non_positive_or_non_finite_numbers_are_rejected(seconds: float) -> None:
    with pytest.raises(ValueError):
        parse_duration(seconds)


@pytest.mark.parametrize("tiny", ["0.0000000001s", "0.4ns", 1e-10, 1e-300])
def test_a_duration_under_a_nanosecond_is_rejected_not_stored_as_0s(tiny: object) -> None:
    with pytest.raises(ValueError, match="at least 1ns"):
        parse_duration(tiny)
    assert parse_duration("1ns") == pytest.approx(1e-9)
    assert format_duration(parse_duration("1ns")) == "1ns"


@pytest.mark.parametrize(
    ("seconds", "text"), [(1.0, "1s"), (0.25, "250ms"), (90.0, "90s"), (1.5, "1500ms")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


# --------------------------------------------------------------------------------------------
# The body as a whole
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["maxStrictPercent", "max_strict_percentage", "weight", ""])
def test_unknown_fields_are_rejected(field: str) -> None:
    assert _locs({field: 1}) == {(field,)}


@pytest.mark.parametrize("body", [[], "x", 5, None])
def test_body_must_be_an_object(body: Any) -> None:
    assert _locs(body) == {()}


def test_every_broken_field_is_reported_at_once() -> None:
    locs = _locs(
        {
            "maxStrictPercentage": 101,
            "defaultWeight": 0,
            "labelWeights": {"": 1, "x": 0, "ok": 2},
            "notifyInterval": "soon",
            "listenTimeout": "0s",
            "requestID": 5,
            "bogus": 1,
        }
    )
    assert locs == {
        ("bogus",),
        ("maxStrictPercentage",),
        ("defaultWeight",),
        ("labelWeights", ""),
        ("labelWeights", "x"),
        ("notifyInterval",),
        ("listenTimeout",),
        ("requestID",),
    }


def test_error_message_names_each_field() -> None:
    with pytest.raises(RuntimeConfigError) as info:
        normalise_runtime_config({"maxStrictPercentage": -1, "defaultWeight": 0})
    assert "maxStrictPercentage" in str(info.value)
    assert "defaultWeight" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_put_replaces_everything() -> None:
    config = normalise_runtime_config({"requestID": "r1"}, default_max_strict_percentage=70)
    assert config == RuntimeConfig(
        max_strict_percentage=70,
        default_weight=1,
        label_weights={},
        notify_interval=1.0,
        listen_timeout=2.0,
        request_id="r1",
    )


def test_patch_merges_into_the_base() -> None:
    base = normalise_runtime_config(
        {
            "maxStrictPercentage": 30,
            "defaultWeight": 2,
            "labelWeights": {"a": 4},
            "notifyInterval": "5s",
            "listenTimeout": "7s",
            "requestID": "base",
        }
    )
    patched = normalise_runtime_config(
        {"defaultWeight": 3}, base=base, default_max_strict_percentage=90
    )
    assert patched.max_strict_percentage == 30  # the base's, not the fleet default
    assert patched.default_weight == 3
    assert dict(patched.label_weights) == {"a": 4}
    assert patched.notify_interval == 5.0
    assert patched.listen_timeout == 7.0
    # A PATCH is a new request: it must not reuse the id of the version it patches.
    assert patched.request_id not in ("", "base")


def test_patch_replaces_the_weight_map_when_given() -> None:
    base = normalise_runtime_config({"labelWeights": {"a": 4, "b": 1}})
    patched = normalise_runtime_config({"labels": ["c"], "weights": [2]}, base=base)
    assert dict(patched.label_weights) == {"c": 2}
    assert patched.max_strict_percentage == base.max_strict_percentage


def test_patch_is_validated_too() -> None:
    base = normalise_runtime_config({})
    assert _locs({"maxStrictPercentage": 101}, base=base) == {("maxStrictPercentage",)}


def test_runtime_config_computes_cap_and_weights() -> None:
    config = normalise_runtime_config({"maxStrictPercentage": 25, "labelWeights": {"a": 5}})
    assert config.strict_cap(7) == 2
    assert config.strict_cap(4) == 1
    assert config.group_weights() == {"a": 5, None: 1}


# --------------------------------------------------------------------------------------------
# Stored payload round trip
# --------------------------------------------------------------------------------------------


def test_to_payload_uses_wire_names() -> None:
    config = normalise_runtime_config(
        {"labels": ["b", "a"], "weights": [1, 2], "notifyInterval": "1500ms", "requestID": "r"}
    )
    assert config.to_payload() == {
        "maxStrictPercentage": 100,
        "defaultWeight": 1,
        "labelWeights": {"a": 2, "b": 1},
        "notifyInterval": "1500ms",
        "listenTimeout": "2s",
        "requestID": "r",
        "pausedLabels": [],
        "pausedTypes": [],
        "pausedLanes": [],
        "labelLimits": {},
    }


def test_equal_configs_have_equal_payloads() -> None:
    one = normalise_runtime_config({"labelWeights": {"b": 1, "a": 2}, "requestID": "r"})
    two = normalise_runtime_config({"labels": ["a", "b"], "weights": [2, 1], "requestID": "r"})
    assert one.to_payload() == two.to_payload()


def test_stored_payload_reads_back() -> None:
    config = normalise_runtime_config(
        {
            "maxStrictPercentage": 25,
            "defaultWeight": 3,
            "labelWeights": {"a": 5, "b": 1},
            "notifyInterval": "250ms",
            "listenTimeout": "1m30s",
        }
    )
    assert config_from_payload(config.to_payload()) == config


def test_stored_payload_keeps_its_request_id() -> None:
    payload = normalise_runtime_config({"requestID": "r-7"}).to_payload()
    assert config_from_payload(payload).request_id == "r-7"


def test_default_config_reads_back() -> None:
    # The default config (what a worker runs before any version exists) has no request id;
    # its stored form must still read back ("a stored row is trusted").
    config = RuntimeConfig()
    assert config_from_payload(config.to_payload()) == config


@pytest.mark.parametrize("text", ["500us", "1500us", "100ns", "0.5ms"])
def test_sub_millisecond_durations_survive_the_round_trip(text: str) -> None:
    # Accepted by validation, so the stored form must read back to the same duration.
    config = normalise_runtime_config({"notifyInterval": text})
    restored = config_from_payload(config.to_payload())
    assert restored.notify_interval == pytest.approx(config.notify_interval, rel=1e-9)


#: What a label can be: any text Postgres can store (no NUL, no lone surrogate).
label_strategy = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
    min_size=1,
    max_size=20,
).filter(lambda s: bool(s.strip()))
millis_strategy = st.integers(1, 3_600_000)


@settings(deadline=None, database=None, max_examples=200)
@given(
    pct=st.integers(0, 100),
    default_weight=st.integers(1, 1_000_000),
    label_weights=st.dictionaries(label_strategy, st.integers(1, 1_000_000), max_size=10),
    notify_ms=millis_strategy,
    listen_ms=millis_strategy,
    request_id=st.one_of(st.none(), label_strategy),
)
def test_payload_round_trip_is_lossless(
    pct: int,
    default_weight: int,
    label_weights: dict[str, int],
    notify_ms: int,
    listen_ms: int,
    request_id: str | None,
) -> None:
    params: dict[str, Any] = {
        "maxStrictPercentage": pct,
        "defaultWeight": default_weight,
        "labelWeights": label_weights,
        "notifyInterval": f"{notify_ms}ms",
        "listenTimeout": f"{listen_ms}ms",
    }
    if request_id is not None:
        params["requestID"] = request_id
    config = normalise_runtime_config(params)
    payload = config.to_payload()
    restored = config_from_payload(payload)
    assert restored.to_payload() == payload
    assert restored.max_strict_percentage == pct
    assert restored.default_weight == default_weight
    assert dict(restored.label_weights) == label_weights
    assert restored.notify_interval == pytest.approx(notify_ms / 1000)
    assert restored.listen_timeout == pytest.approx(listen_ms / 1000)
    assert restored.request_id == config.request_id
    if request_id is not None:
        assert restored.request_id == request_id


@settings(deadline=None, database=None, max_examples=100)
@given(
    params=st.dictionaries(
        st.sampled_from(
            [
                "maxStrictPercentage",
                "defaultWeight",
                "labels",
                "weights",
                "labelWeights",
                "requestID",
                "notifyInterval",
                "listenTimeout",
                "other",
            ]
        ),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=3), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    )
)
def test_arbitrary_bodies_either_normalise_or_raise_the_config_error(
    params: dict[str, Any],
) -> None:
    try:
        config = normalise_runtime_config(params)
    except RuntimeConfigError as exc:
        assert exc.issues
        return
    assert 0 <= config.max_strict_percentage <= 100
    assert config.default_weight >= 1
    assert all(w >= 1 for w in config.label_weights.values())
    assert config.notify_interval > 0 and config.listen_timeout > 0
    assert config.request_id


@pytest.mark.parametrize("text", ["a\x00b", "\x00", "a\ud800", "\udfff"])
def test_text_postgres_cannot_store_is_refused_in_every_string_field(text: str) -> None:
    cases = {
        ("labels", 0): {"labels": [text], "weights": [1]},
        ("requestID",): {"requestID": text},
    }
    for loc, params in cases.items():
        with pytest.raises(RuntimeConfigError) as refused:
            normalise_runtime_config(params)
        assert [issue.loc for issue in refused.value.issues] == [loc]
        assert "must not contain" in refused.value.issues[0].msg
    with pytest.raises(RuntimeConfigError) as refused:
        normalise_runtime_config({"labelWeights": {text: 1}})
    (issue,) = refused.value.issues
    # The location names the label, escaped: an error body must be encodable.
    assert issue.loc[0] == "labelWeights" and isinstance(issue.loc[1], str)
    issue.loc[1].encode("utf-8")
    assert "\x00" not in issue.loc[1]


def test_a_patch_is_merged_into_the_latest_version_when_it_is_written() -> None:
    from taskfleet.shared.policy.runtime_config import patch_payload, resolve_update

    latest = normalise_runtime_config(
        {"maxStrictPercentage": 40, "labelWeights": {"a": 2}, "requestID": "v1"}
    ).to_payload()
    payload = patch_payload("v2", {"defaultWeight": 3, "requestID": "ignored-here"})
    assert payload == {"requestID": "v2", "patch": {"defaultWeight": 3}}
    merged = resolve_update(payload, latest=latest)
    assert (merged.max_strict_percentage, dict(merged.label_weights)) == (40, {"a": 2})
    assert (merged.default_weight, merged.request_id) == (3, "v2")
    # Before any version, the defaults are the base.
    first = resolve_update(payload, latest=None, default_max_strict_percentage=70)
    assert (first.max_strict_percentage, first.default_weight) == (70, 3)
    # A PUT's payload is the config itself.
    put = normalise_runtime_config({"defaultWeight": 5, "requestID": "p"}).to_payload()
    assert resolve_update(put, latest=latest).to_payload() == put
    with pytest.raises(RuntimeConfigError):
        resolve_update({"requestID": "x", "patch": {"defaultWeight": 0}}, latest=latest)
    with pytest.raises(RuntimeConfigError):
        resolve_update({"requestID": "x", "patch": []}, latest=latest)


# --------------------------------------------------------------------------------------------
# Scheduling controls: pause and fleet-wide label limits


def test_pauses_are_normalised_sorted_and_without_duplicates() -> None:
    config = normalise_runtime_config(
        {
            "pausedLabels": ["b", "a", "b"],
            "pausedTypes": ["demo.cpu"],
            "pausedLanes": ["strict", "normal", "strict"],
        }
    )
    assert config.paused_labels == ("a", "b")
    assert config.paused_types == ("demo.cpu",)
    assert config.paused_lanes == ("normal", "strict")
    assert config_from_payload(config.to_payload()) == config


@pytest.mark.parametrize(
    ("params", "loc", "rule"),
    [
        ({"pausedLanes": ["control"]}, ("pausedLanes", 0), "control lane can never be paused"),
        ({"pausedTypes": ["updateWorkerRuntimeConfig"]}, ("pausedTypes", 0), "never be paused"),
        ({"pausedLanes": ["fast"]}, ("pausedLanes", 0), "one of normal, strict"),
        ({"pausedLabels": "a"}, ("pausedLabels",), "must be a list"),
        ({"pausedLabels": ["a\x00"]}, ("pausedLabels", 0), "NUL"),
        ({"labelLimits": {"a": {}}}, ("labelLimits", "a"), "maxInFlight, ratePerSecond or both"),
        (
            {"labelLimits": {"a": {"maxInFlight": True}}},
            ("labelLimits", "a", "maxInFlight"),
            "integer",
        ),
        (
            {"labelLimits": {"a": {"ratePerSecond": float("nan")}}},
            ("labelLimits", "a", "ratePerSecond"),
            "from 0.000001",
        ),
        # 1 / rate overflowed the claim's float8 arithmetic: every claim failed.
        (
            {"labelLimits": {"a": {"ratePerSecond": 1e-320}}},
            ("labelLimits", "a", "ratePerSecond"),
            "from 0.000001",
        ),
        (
            {"labelLimits": {"a": {"ratePerSecond": 0.0000009}}},
            ("labelLimits", "a", "ratePerSecond"),
            "to 1000000",
        ),
        (
            {"labelLimits": {f"l{i}": {"maxInFlight": 1} for i in range(101)}},
            ("labelLimits",),
            "at most 100",
        ),
    ],
)
def test_every_control_rule_names_its_field(
    params: dict[str, Any], loc: tuple[str | int, ...], rule: str
) -> None:
    with pytest.raises(RuntimeConfigError) as info:
        normalise_runtime_config(params)
    assert any(i.loc == loc and rule in i.msg for i in info.value.issues), info.value.issues


def test_the_smallest_and_largest_rates_are_accepted() -> None:
    for rate in (0.000001, 1_000_000):
        config = normalise_runtime_config({"labelLimits": {"a": {"ratePerSecond": rate}}})
        assert config.to_payload()["labelLimits"] == {"a": {"ratePerSecond": float(rate)}}


def test_label_limits_round_trip_and_a_patch_keeps_what_it_does_not_name() -> None:
    config = normalise_runtime_config(
        {"labelLimits": {"b": {"ratePerSecond": 4}, "a": {"maxInFlight": 2}}, "pausedLabels": ["x"]}
    )
    assert config.to_payload()["labelLimits"] == {
        "a": {"maxInFlight": 2},
        "b": {"ratePerSecond": 4.0},
    }
    assert config_from_payload(config.to_payload()) == config
    patched = normalise_runtime_config({"pausedLabels": []}, base=config)
    assert patched.paused_labels == () and patched.label_limits == config.label_limits
