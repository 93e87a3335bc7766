"""NOTIFY payloads: parsed into a tagged union, never raising
(docs/reference.md#notify-channels)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskfleet.shared.protocol import (
    CHANNELS,
    CONFIG_ACK_CHANNEL,
    CONFIG_CHANNEL,
    CONTROL_HINT,
    ConfigAck,
    ConfigUpdated,
    Malformed,
    TaskReady,
    config_ack_payload,
    config_updated_payload,
    parse,
)
from taskfleet.shared.queries import TASK_READY_CHANNEL


def test_channel_names_are_the_spec_names() -> None:
    assert CONFIG_CHANNEL == "anclax_worker_runtime_config"
    assert CONFIG_ACK_CHANNEL == "anclax_worker_runtime_config_ack"
    assert TASK_READY_CHANNEL == "taskfleet_task_ready"
    assert set(CHANNELS) == {CONFIG_CHANNEL, CONFIG_ACK_CHANNEL, TASK_READY_CHANNEL}


def test_up_config_payload_is_the_spec_shape() -> None:
    assert json.loads(config_updated_payload("r1", 7)) == {
        "op": "up_config",
        "params": {"request_id": "r1", "version": 7},
    }


def test_ack_payload_is_the_spec_shape() -> None:
    assert json.loads(config_ack_payload("r1", "w-1", 7)) == {
        "op": "ack",
        "params": {"request_id": "r1", "worker_id": "w-1", "applied_version": 7},
    }


def test_up_config_parses() -> None:
    assert parse(CONFIG_CHANNEL, config_updated_payload("r1", 7)) == ConfigUpdated("r1", 7)
    raw = '{"op":"up_config","params":{"request_id":"R","version":12}}'
    assert parse(CONFIG_CHANNEL, raw) == ConfigUpdated("R", 12)


def test_ack_parses() -> None:
    assert parse(CONFIG_ACK_CHANNEL, config_ack_payload("r1", "w-1", 7)) == ConfigAck(
        "r1", "w-1", 7
    )
    raw = '{"op":"ack","params":{"request_id":"R","worker_id":"W","applied_version":3}}'
    assert parse(CONFIG_ACK_CHANNEL, raw) == ConfigAck("R", "W", 3)


def test_extra_fields_are_tolerated() -> None:
    raw = '{"op":"up_config","params":{"request_id":"R","version":2,"x":1},"extra":true}'
    assert parse(CONFIG_CHANNEL, raw) == ConfigUpdated("R", 2)


@pytest.mark.parametrize(
    ("payload", "lanes", "control"),
    [
        ("", None, False),  # no hint: any lane but control (always announced by name)
        (CONTROL_HINT, frozenset({"control"}), True),
        ("normal", frozenset({"normal"}), False),
        ("strict,normal", frozenset({"strict", "normal"}), False),
    ],
)
def test_task_ready_hint(payload: str, lanes: frozenset[str] | None, control: bool) -> None:
    message = parse(TASK_READY_CHANNEL, payload)
    assert message == TaskReady(lanes=lanes)
    assert isinstance(message, TaskReady) and message.control is control


@pytest.mark.parametrize(
    "lanes",
    [
        frozenset(c)
        for n in range(4)
        for c in itertools.combinations(("control", "strict", "normal"), n)
    ],
)
def test_every_hint_a_submission_writes_parses_to_its_lanes(lanes: frozenset[str]) -> None:
    """Written by wake_hint, read back (by the table of known hints) as the same lanes; spelled
    another way (spaces, another order), read by the general rule to the same answer."""
    from taskfleet.shared.protocol import wake_hint

    expected = TaskReady(lanes=lanes or None)
    assert parse(TASK_READY_CHANNEL, wake_hint(lanes)) == expected
    if lanes:
        assert parse(TASK_READY_CHANNEL, " , ".join(sorted(lanes, reverse=True))) == expected


@pytest.mark.parametrize("payload", ["x", "normal,bogus", "normal,", " ", '{"op":"x"}'])
def test_task_ready_garbage_is_malformed(payload: str) -> None:
    assert isinstance(parse(TASK_READY_CHANNEL, payload), Malformed)


def test_wake_hint_names_only_known_lanes_sorted() -> None:
    from taskfleet.shared.protocol import wake_hint

    assert wake_hint(["normal", "strict", "normal"]) == "normal,strict"
    assert wake_hint(["bogus"]) == ""
    assert parse(TASK_READY_CHANNEL, wake_hint(["strict"])) == TaskReady(frozenset({"strict"}))


def test_unknown_channel_is_malformed() -> None:
    message = parse("some_other_channel", config_updated_payload("r", 1))
    assert isinstance(message, Malformed)
    assert message.channel == "some_other_channel"


_UP = {"op": "up_config", "params": {"request_id": "r", "version": 1}}
_ACK = {"op": "ack", "params": {"request_id": "r", "worker_id": "w", "applied_version": 1}}


def _with(doc: dict[str, Any], **params: Any) -> str:
    merged = {**doc["params"], **params}
    return json.dumps({"op": doc["op"], "params": {k: v for k, v in merged.items() if v != ...}})


MALFORMED_CONFIG = [
    "",
    "not json",
    "{",
    "[]",
    "null",
    "42",
    '"up_config"',
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,
    '{"op":"up_config"}',
    '{"op":"up_config","params":[]}',
    '{"op":"up_config","params":"x"}',
    '{"params":{"request_id":"r","version":1}}',
    '{"op":"ack","params":{"request_id":"r","version":1}}',
    '{"op":"UP_CONFIG","params":{"request_id":"r","version":1}}',
    _with(_UP, version=...),
    _with(_UP, version=-1),
    _with(_UP, version="1"),
    _with(_UP, version=1.5),
    _with(_UP, version=True),
    _with(_UP, version=None),
    _with(_UP, request_id=...),
    _with(_UP, request_id=5),
    _with(_UP, request_id=None),
    _with(_UP, request_id=["r"]),
    '{"op":"up_config","params":{"request_id":"r","version":' + "9" * 5000 + "}}",
    '{"op":"up_config","params":{"request_id":"r","version":1e999}}',
    '{"op":"up_config","params":{"request_id":"r","version":NaN}}',
]


@pytest.mark.parametrize("payload", MALFORMED_CONFIG)
def test_malformed_config_payloads_are_reported_not_raised(payload: str) -> None:
    message = parse(CONFIG_CHANNEL, payload)
    assert isinstance(message, Malformed)
    assert message.channel == CONFIG_CHANNEL
    assert message.reason
    assert len(message.payload) <= 200
    assert payload.startswith(message.payload)


MALFORMED_ACK = [
    "",
    "not json",
    "[" * 100_000,
    '{"op":"ack","params":[]}',
    '{"op":"up_config","params":{"request_id":"r","worker_id":"w","applied_version":1}}',
    _with(_ACK, applied_version=...),
    _with(_ACK, applied_version=-1),
    _with(_ACK, applied_version="1"),
    _with(_ACK, applied_version=False),
    _with(_ACK, worker_id=...),
    _with(_ACK, worker_id=7),
    _with(_ACK, request_id=...),
    _with(_ACK, request_id=1),
    config_updated_payload("r", 1),
]


@pytest.mark.parametrize("payload", MALFORMED_ACK)
def test_malformed_ack_payloads_are_reported_not_raised(payload: str) -> None:
    message = parse(CONFIG_ACK_CHANNEL, payload)
    assert isinstance(message, Malformed)
    assert message.channel == CONFIG_ACK_CHANNEL
    assert len(message.payload) <= 200


channels = st.sampled_from([*CHANNELS, "elsewhere"])


def _check_message(channel: str, message: object) -> None:
    assert isinstance(message, TaskReady | ConfigUpdated | ConfigAck | Malformed)
    if channel == TASK_READY_CHANNEL:
        # A wake-up (empty, or lane names) or malformed garbage; never a config message.
        assert isinstance(message, TaskReady | Malformed)
    elif channel == "elsewhere":
        assert isinstance(message, Malformed)
    if isinstance(message, ConfigUpdated):
        assert channel == CONFIG_CHANNEL
        assert isinstance(message.request_id, str)
        assert isinstance(message.version, int) and message.version >= 0
    if isinstance(message, ConfigAck):
        assert channel == CONFIG_ACK_CHANNEL
        assert isinstance(message.worker_id, str)
        assert isinstance(message.applied_version, int) and message.applied_version >= 0
    if isinstance(message, Malformed):
        assert len(message.payload) <= 200


@settings(deadline=None, database=None, max_examples=200)
@given(channel=channels, payload=st.text())
def test_parse_never_raises_on_any_text(channel: str, payload: str) -> None:
    _check_message(channel, parse(channel, payload))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)


@settings(deadline=None, database=None, max_examples=100)
@given(
    channel=st.sampled_from([CONFIG_CHANNEL, CONFIG_ACK_CHANNEL]),
    op=st.one_of(st.sampled_from(["up_config", "ack"]), json_values),
    params=st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "request_id": st.one_of(st.text(max_size=10), json_values),
                "version": st.one_of(st.integers(), json_values),
                "worker_id": st.one_of(st.text(max_size=10), json_values),
                "applied_version": st.one_of(st.integers(), json_values),
            },
        ),
        json_values,
    ),
)
def test_parse_never_raises_on_json_shaped_payloads(
    channel: str, op: object, params: object
) -> None:
    payload = json.dumps({"op": op, "params": params})
    message = parse(channel, payload)
    _check_message(channel, message)
    if isinstance(message, ConfigUpdated):
        assert op == "up_config"
        assert isinstance(params, dict)
        assert message == ConfigUpdated(params["request_id"], params["version"])
    if isinstance(message, ConfigAck):
        assert op == "ack"
        assert isinstance(params, dict)
        assert message == ConfigAck(
            params["request_id"], params["worker_id"], params["applied_version"]
        )


#: Ids are text Postgres stores: no NUL, no lone surrogate (those parse as Malformed).
_ids = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))


@settings(deadline=None, database=None, max_examples=200)
@given(request_id=_ids, version=st.integers(0, 2**63 - 1), worker_id=_ids)
def test_builders_and_parser_round_trip(request_id: str, version: int, worker_id: str) -> None:
    assert parse(CONFIG_CHANNEL, config_updated_payload(request_id, version)) == ConfigUpdated(
        request_id, version
    )
    assert parse(
        CONFIG_ACK_CHANNEL, config_ack_payload(request_id, worker_id, version)
    ) == ConfigAck(request_id, worker_id, version)


def test_builder_payloads_fit_in_a_notify() -> None:
    # Payloads carry ids and versions only; NOTIFY is limited to 8000 bytes.
    rid = "r" * 200
    assert len(config_ack_payload(rid, "w" * 200, 2**63 - 1).encode()) < 8000
    assert len(config_updated_payload(rid, 2**63 - 1).encode()) < 8000


def test_ids_postgres_cannot_store_are_malformed() -> None:
    for bad in ("a\x00b", "\ud800"):
        assert isinstance(parse(CONFIG_CHANNEL, config_updated_payload(bad, 1)), Malformed)
        assert isinstance(parse(CONFIG_ACK_CHANNEL, config_ack_payload(bad, "w", 1)), Malformed)
        assert isinstance(parse(CONFIG_ACK_CHANNEL, config_ack_payload("r", bad, 1)), Malformed)
