"""The rules a schedule must satisfy (taskfleet.shared.schedules), without a database: each
broken rule is a 422 naming its field; the task fields obey the rules of a submitted task."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from taskfleet.shared.registry import TaskParams, TaskRegistry, load_registry
from taskfleet.shared.schedules import (
    ScheduleIn,
    check_schedule,
    check_schedule_name,
    code_schedules,
    schedule_params,
)
from taskfleet.shared.submission import Rejected

REGISTRY = load_registry([])


def refusal(body: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(Rejected) as refused:
        check_schedule(ScheduleIn.model_validate(body), REGISTRY, ("body",))
    assert refused.value.status_code == 422
    return refused.value.errors


def test_a_good_schedule_is_normalised_for_storage() -> None:
    submitted = check_schedule(
        ScheduleIn.model_validate(
            {"type": "demo.echo", "cron": " 0  6 * * * ", "payload": {"value": [1]}}
        ),
        REGISTRY,
        ("body",),
    )
    params = schedule_params("r", submitted, source="api", next_run_at=None)  # type: ignore[arg-type]
    assert params["cron"] == "0 6 * * *" and params["timezone"] == "UTC"
    assert params["every"] is None and params["payload"] == '{"value":[1]}'
    every = check_schedule(
        ScheduleIn.model_validate({"type": "demo.echo", "every": "90s"}), REGISTRY, ("body",)
    )
    assert every.timing.every == 90
    assert schedule_params("t", every, source="api", next_run_at=None)["timezone"] is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "loc", "type_"),
    [
        ({"type": "demo.echo"}, ["body", "cron"], "missing"),
        (
            {"type": "demo.echo", "cron": "* * * * *", "every": "1s"},
            ["body", "every"],
            "mutually_exclusive",
        ),
        ({"type": "demo.echo", "cron": "0 25 * * *"}, ["body", "cron"], "invalid_cron"),
        ({"type": "demo.echo", "every": "fortnightly"}, ["body", "every"], "invalid_duration"),
        (
            {"type": "demo.echo", "cron": "@daily", "timezone": "Moon/Base"},
            ["body", "timezone"],
            "invalid_timezone",
        ),
        (
            {"type": "demo.echo", "every": "1h", "timezone": "UTC"},
            ["body", "timezone"],
            "not_applicable",
        ),
        ({"type": "nope", "every": "1h"}, ["body", "type"], "unknown_task_type"),
        ({"type": "demo.sleep", "every": "1h"}, ["body", "payload", "seconds"], "missing"),
    ],
)
def test_each_broken_rule_names_its_field(body: dict[str, Any], loc: list[str], type_: str) -> None:
    errors = refusal(body)
    assert any(e["loc"] == loc and e["type"] == type_ for e in errors), errors


@pytest.mark.parametrize(
    "body",
    [
        {"type": "demo.echo", "every": "1h", "priority": 2147483647},
        {"type": "demo.echo", "every": "1h", "labels": ["x" * 129]},
        {"type": "demo.echo", "every": "1h", "max_attempts": 0},
        {"type": "demo.echo", "every": "1h", "timeout_seconds": 0},
        {"type": "demo.echo", "every": "1h", "priority": "1"},
        {"type": "demo.echo", "every": "1h", "unique_key": "k"},
        {"type": "demo.echo", "cron": "0 6 *\x00 * *"},
        {"type": "demo.echo", "cron": "x" * 201},
    ],
)
def test_the_envelope_rules_are_those_of_a_task(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ScheduleIn.model_validate(body)


@pytest.mark.parametrize(
    "name", ["", "a/b", "a\x00b", "a\x01b", "a\x7fb", "a\ufffdb", "a\ud800b", "x" * 201]
)
def test_bad_names(name: str) -> None:
    with pytest.raises(Rejected) as refused:
        check_schedule_name(name, ("path", "name"))
    assert refused.value.errors[0]["loc"] == ["path", "name"]


@pytest.mark.parametrize("name", ["report.daily", "a b", "rapport-été", "日報", "x" * 200])
def test_good_names(name: str) -> None:
    check_schedule_name(name, ("path", "name"))


class _Nothing(TaskParams):
    pass


def test_code_schedules_are_named_after_their_type() -> None:
    registry = TaskRegistry()

    @registry.task("b.tick", params=_Nothing, every="10s")
    async def tick(params: _Nothing) -> None:
        return None

    @registry.task("a.daily", params=_Nothing, schedule="0 6 * * *", timezone="Asia/Tokyo")
    def daily(params: _Nothing) -> None:
        return None

    @registry.task("c.plain", params=_Nothing)
    def plain(params: _Nothing) -> None:
        return None

    declared = code_schedules(registry)
    assert [name for name, _ in declared] == ["a.daily", "b.tick"]
    params = schedule_params(*declared[0], source="code", next_run_at=None)  # type: ignore[arg-type]
    assert (params["type"], params["cron"], params["timezone"]) == (
        "a.daily",
        "0 6 * * *",
        "Asia/Tokyo",
    )
    assert params["payload"] == "{}" and params["source"] == "code"


# A cron that parses but is longer than the API's 200 characters: every minute and hour listed.
_LONG_CRON = (
    ",".join(str(m) for m in range(60)) + " " + ",".join(str(h) for h in range(24)) + " * * *"
)


@pytest.mark.parametrize(
    ("name", "schedule", "words"),
    [
        # Accepted at import, then refused by the rules the worker declares it through: every
        # worker loading it retried for ever, fired no schedule, and could not be stopped.
        ("a.long", {"schedule": _LONG_CRON}, "schedule= must be 1 to 200 characters"),
        ("a.tz", {"schedule": "0 6 * * *", "timezone": "A" * 65}, "timezone= must be 1 to 64"),
        # Declared under a name the API refuses: not readable or deletable over HTTP.
        ("..", {"every": "1m"}, 'must not be "." or ".."'),
        ("a\x85b", {"every": "1m"}, "must not contain control characters"),
    ],
)
def test_a_code_schedule_the_api_would_refuse_fails_at_import(
    name: str, schedule: dict[str, str], words: str
) -> None:
    assert len(_LONG_CRON) > 200
    registry = TaskRegistry()
    with pytest.raises(ValueError, match=re.escape(words)):

        @registry.task(name, params=_Nothing, **schedule)
        def handler(params: _Nothing) -> None:
            return None
