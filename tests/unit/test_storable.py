"""What Postgres can store (shared/storable.py): the checks the API and the worker share."""

from __future__ import annotations

import json

import pytest

from taskfleet.shared.storable import (
    UnstorableResult,
    cap_text,
    encode_result,
    escape_text,
    json_problem,
    text_problem,
)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("plain", None),
        ("ünïcödé ✓", None),
        ("a\x00b", "a NUL character (\\u0000)"),
        ("a\ud800b", "an unpaired surrogate"),
        ("\udfff", "an unpaired surrogate"),
        ("\\u0000 as six characters", None),
    ],
)
def test_text_problem(value: str, problem: str | None) -> None:
    assert text_problem(value) == problem


def test_escaped_text_is_storable_and_keeps_the_words() -> None:
    escaped = escape_text("bad \x00 byte and lone \udc80 here")
    assert escaped == "bad \\x00 byte and lone \\udc80 here"
    assert text_problem(escaped) is None
    assert escape_text("clean") == "clean"


def test_capped_text_keeps_both_ends_and_says_what_was_cut() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    capped = cap_text(text, 1000, head=100)
    assert capped.startswith("HEAD") and capped.endswith("TAIL")
    assert "[... 9008 characters cut ...]" in capped
    assert cap_text("short", 1000) == "short"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, "ok", {"b": None}]}, None),
        ({"text": "a\x00b"}, "$.text contains a NUL character (\\u0000)"),
        ([1, {"a": ["\ud800"]}], "$[1].a[0] contains an unpaired surrogate"),
        ({"k\x00": 1}, 'the key $["k\\u0000"] contains a NUL character (\\u0000)'),
        ({"with space": "\x00"}, '$["with space"] contains a NUL character (\\u0000)'),
    ],
)
def test_json_problem_names_the_first_bad_place(value: object, problem: str | None) -> None:
    assert json_problem(value) == problem


def test_json_problem_handles_any_depth() -> None:
    deep: object = "\x00"
    for _ in range(100_000):
        deep = [deep]
    found = json_problem(deep)
    assert found is not None and found.endswith("contains a NUL character (\\u0000)")


@pytest.mark.parametrize(
    ("result", "stored"),
    [(None, "null"), ({"a": 1, "b": [1, 2]}, '{"a":1,"b":[1,2]}'), ("ünï", '"ünï"'), (0, "0")],
)
def test_a_result_is_stored_as_compact_json(result: object, stored: str) -> None:
    assert encode_result(result) == stored
    assert json.loads(stored) == result


@pytest.mark.parametrize("result", [float("nan"), {"x": float("inf")}, object(), "a\u0000b"])
def test_a_result_postgres_cannot_store_is_refused_with_the_reason(result: object) -> None:
    with pytest.raises(UnstorableResult):
        encode_result(result)
