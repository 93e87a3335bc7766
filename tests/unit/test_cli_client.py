"""The client's pure parts: the config event stream, option parsing, and usage errors (exit 2,
no request sent). No server: the wire is covered by tests/integration/test_cli_client.py."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from taskfleet.cli import client
from taskfleet.cli.client import (
    BadLine,
    ConfigEvent,
    Converged,
    Enqueued,
    Failed,
    FleetProgress,
    LiveConfigDisplay,
    Superseded,
    TimedOut,
    VersionWritten,
    consume_config_events,
    describe_outcome,
    heartbeat_age,
    parse_config_event,
    parse_label_limit,
    parse_label_limits,
    parse_label_weight,
    parse_label_weights,
    parse_payload,
    progress_line,
    render_detail,
)
from taskfleet.cli.main import load_commands
from taskfleet.config_events import ExcludedWorker

#: Every command registered (the schedules commands too).
app = load_commands()


def line(**event: Any) -> str:
    return json.dumps(event)


ENQUEUED = line(event="enqueued", task_id=41, request_id="r-1")
VERSION = line(event="version", version=7)
HALF = line(event="progress", version=7, alive_workers=2, applied_workers=1, lagging=["w-2"])


# ------------------------------------------------------------------------------------------
# parse_config_event


@pytest.mark.parametrize(
    ("raw", "event"),
    [
        (ENQUEUED, Enqueued(41, "r-1")),
        (VERSION, VersionWritten(7)),
        (HALF, FleetProgress(7, 2, 1, ("w-2",))),
        (line(event="converged", version=7, seconds=1.25), Converged(7, 1.25)),
        (line(event="superseded", version=7, superseded_by=9), Superseded(7, 9)),
        (line(event="timeout", version=7, lagging=["a", "b"]), TimedOut(7, ("a", "b"))),
        (line(event="failed", error="boom"), Failed("boom")),
        # Finals are read leniently: the outcome counts even when a number is missing.
        (line(event="converged"), Converged(None, None)),
        (line(event="failed"), Failed("no reason given")),
        ("  " + VERSION + "\r\n", VersionWritten(7)),
    ],
)
def test_parse_config_event_reads_every_event_of_the_spec(raw: str, event: ConfigEvent) -> None:
    assert parse_config_event(raw) == event


@pytest.mark.parametrize("raw", ["", "   ", "\n"])
def test_parse_config_event_skips_blank_keepalive_lines(raw: str) -> None:
    assert parse_config_event(raw) is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", 'not an object with an "event" name'),
        ('{"version": 7}', 'not an object with an "event" name'),
        ('{"event": 3}', 'not an object with an "event" name'),
        (line(event="mystery"), "unknown event 'mystery'"),
        (line(event="version"), "version event without an integer version"),
        (line(event="version", version="7"), "version event without an integer version"),
        (line(event="progress", version=7, alive_workers="2", applied_workers=1), "progress"),
        (line(event="progress", version=7, alive_workers=2, applied_workers=1, lagging="w"), "lag"),
    ],
)
def test_parse_config_event_reports_a_bad_line_instead_of_raising(raw: str, reason: str) -> None:
    event = parse_config_event(raw)
    assert isinstance(event, BadLine)
    assert reason in event.reason
    assert event.line == raw.strip()


# ------------------------------------------------------------------------------------------
# consume_config_events: events in -> outcome and exit code


def consume(*lines: str) -> tuple[client.ConfigOutcome, list[ConfigEvent]]:
    seen: list[ConfigEvent] = []
    return consume_config_events(lines, seen.append), seen


def test_converged_exits_0_and_events_are_reported_in_order() -> None:
    final = line(event="converged", version=7, seconds=0.5)
    outcome, seen = consume(ENQUEUED, VERSION, HALF, final)
    assert outcome.exit_code == 0
    assert outcome.final == Converged(7, 0.5)
    assert outcome.message == "converged: version 7 applied by every alive worker in 0.50s"
    assert outcome.request_id == "r-1"
    assert seen == [
        Enqueued(41, "r-1"),
        VersionWritten(7),
        FleetProgress(7, 2, 1, ("w-2",)),
        Converged(7, 0.5),
    ]


def test_superseded_exits_0_because_the_fleet_runs_a_newer_version() -> None:
    outcome, _ = consume(ENQUEUED, VERSION, line(event="superseded", version=7, superseded_by=8))
    assert outcome.exit_code == 0
    assert outcome.message == "superseded: version 7 was replaced by version 8"


def test_timeout_exits_1_and_names_the_lagging_workers() -> None:
    lagging = [f"w-{i}" for i in range(8)]
    outcome, _ = consume(ENQUEUED, line(event="timeout", version=7, lagging=lagging))
    assert outcome.exit_code == 1
    assert outcome.message == (
        "timeout: version 7 is not applied by every alive worker yet; "
        "lagging: w-0, w-1, w-2, w-3, w-4 +3 more (the change goes on)"
    )


def test_failed_exits_1_with_the_error() -> None:
    outcome, _ = consume(ENQUEUED, line(event="failed", error="database is gone"))
    assert outcome.exit_code == 1
    assert outcome.message == "failed: database is gone"


@pytest.mark.parametrize("lines", [(), (ENQUEUED,), (ENQUEUED, VERSION, HALF)])
def test_a_stream_without_a_final_event_exits_1(lines: tuple[str, ...]) -> None:
    outcome, _ = consume(*lines)
    assert outcome.exit_code == 1
    assert outcome.final is None
    assert outcome.message.startswith("the stream ended before an outcome")
    assert ("request r-1" in outcome.message) == bool(lines)


def test_a_malformed_line_is_reported_and_the_stream_goes_on() -> None:
    final = line(event="converged", version=7, seconds=1)
    outcome, seen = consume(ENQUEUED, "{oops", "", line(event="mystery"), VERSION, final)
    assert outcome.exit_code == 0
    assert outcome.bad_lines == 2
    assert [type(e) for e in seen] == [Enqueued, BadLine, BadLine, VersionWritten, Converged]


def test_consumption_stops_at_the_first_final_event() -> None:
    def lines() -> Iterator[str]:
        yield line(event="superseded", version=7, superseded_by=8)
        raise AssertionError("read past the final event")

    outcome = consume_config_events(lines())
    assert outcome.final == Superseded(7, 8)


def test_progress_line_is_the_one_updating_line() -> None:
    assert progress_line(FleetProgress(7, 3, 2, ("w-3",))) == (
        "version 7: applied 2/3 workers, lagging: w-3"
    )
    assert progress_line(FleetProgress(7, 3, 3, ())) == "version 7: applied 3/3 workers"
    assert progress_line(FleetProgress(7, 0, 0, ())) == (
        "version 7: applied 0/0 workers (no alive workers)"
    )


def test_live_display_draws_the_progress_line_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with LiveConfigDisplay(console) as display:
        display(Enqueued(41, "r-1"))
        display(BadLine("{oops", "not JSON"))
        display(FleetProgress(7, 3, 2, ("w-[3]",)))  # brackets are text, not rich markup
    text = out.getvalue()
    assert "version 7: applied 2/3 workers, lagging: w-[3]" in text
    assert "skipped a bad line from the server (not JSON): {oops" in text


# ------------------------------------------------------------------------------------------
# option parsing


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("tenant-a=5", ("tenant-a", 5)), ("a=b=2", ("a=b", 2)), ("x= 3", ("x", 3))],
)
def test_parse_label_weight(raw: str, parsed: tuple[str, int]) -> None:
    assert parse_label_weight(raw) == parsed


@pytest.mark.parametrize("raw", ["abc", "=3", " =3", "a=0", "a=-1", "a=x", "a=", "a=1.5"])
def test_parse_label_weight_states_the_rule(raw: str) -> None:
    with pytest.raises(ValueError, match=r"must be LABEL=N with a non-empty label and .* N >= 1"):
        parse_label_weight(raw)


def test_a_repeated_label_weight_last_wins() -> None:
    assert parse_label_weights(["a=1", "b=2", "a=3"]) == {"a": 3, "b": 2}


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("hot=in_flight:5", ("hot", {"maxInFlight": 5})),
        ("hot=rate:2.5", ("hot", {"ratePerSecond": 2.5})),
        ("a=b=in_flight:1, rate:4", ("a=b", {"maxInFlight": 1, "ratePerSecond": 4.0})),
    ],
)
def test_parse_label_limit(raw: str, parsed: tuple[str, dict[str, float]]) -> None:
    assert parse_label_limit(raw) == parsed


@pytest.mark.parametrize(
    "raw",
    [
        "hot",
        "=in_flight:1",
        "hot=",
        "hot=in_flight:0",
        "hot=rate:0",
        "hot=rate:-1",
        "hot=x:1",
        "hot=in_flight:1.5",
        "hot=in_flight:1,in_flight:2",
        "hot=rate:inf",
        "hot=rate",
    ],
)
def test_parse_label_limit_states_the_rule(raw: str) -> None:
    with pytest.raises(ValueError, match=r"must be LABEL=in_flight:N,rate:R"):
        parse_label_limit(raw)


def test_a_repeated_label_limit_last_wins() -> None:
    assert parse_label_limits(["a=rate:1", "a=in_flight:2"]) == {"a": {"maxInFlight": 2}}


def test_parse_payload() -> None:
    assert parse_payload('{"value": [1, 2]}') == {"value": [1, 2]}
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_payload("{value: 1}")
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        parse_payload("[1]")


def test_render_detail_names_the_field_and_the_rule() -> None:
    fastapi = {"detail": [{"loc": ["body", "labelWeights", "x"], "msg": "must be >= 1"}]}
    assert render_detail(fastapi) == "labelWeights.x: must be >= 1"
    assert render_detail({"detail": "task 3 is already finished"}) == "task 3 is already finished"
    assert render_detail({"error": "odd"}) == '{"error": "odd"}'


def test_heartbeat_age() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    beat = {"last_heartbeat": (now - timedelta(seconds=2.5)).isoformat()}
    assert heartbeat_age(beat, now) == "2.5s"
    assert heartbeat_age({"last_heartbeat": (now - timedelta(seconds=125)).isoformat()}, now) == (
        "2m05s"
    )
    assert heartbeat_age({"last_heartbeat": "2026-01-01T09:30:00Z"}, now) == "2h30m"
    assert heartbeat_age({}, now) == "-"


# ------------------------------------------------------------------------------------------
# usage errors: exit 2, naming the option, and no request sent


@pytest.fixture
def no_requests(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    sent: list[httpx.Request] = []

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        sent.append(request)
        raise AssertionError(f"a request was sent: {request.method} {request.url}")

    monkeypatch.setattr(httpx.Client, "send", send)
    return sent


@pytest.mark.parametrize(
    ("args", "option", "rule"),
    [
        (["submit", "demo.echo", "--payload", "{bad"], "'--payload'", "not valid JSON"),
        (["submit", "demo.echo", "--payload", '"text"'], "'--payload'", "must be a JSON object"),
        (["submit", "demo.echo", "--timeout", "0"], "'--timeout'", "greater than 0"),
        (["submit", "demo.echo", "--priority", "-1"], "'--priority'", ""),
        (["submit", "demo.echo", "--url", "localhost:8000"], "'--url'", "http:// or https://"),
        (["config", "set", "--weight", "abc"], "'--weight'", "LABEL=N"),
        (["config", "set", "--weight", "a=1", "--weight", "b=0"], "'--weight'", "N >= 1"),
        (["config", "set", "--max-strict-percentage", "101"], "'--max-strict-percentage'", ""),
        (["config", "set", "--default-weight", "0"], "'--default-weight'", ""),
        (["config", "set", "--timeout", "-5"], "'--timeout'", "greater than 0"),
        # Each of these was an "unexpected" error and exit 1 (config set had sent its PUT).
        (["submit", "demo.echo", "--delay", "inf"], "'--delay'", "finite"),
        (["submit", "demo.echo", "--timeout", "nan"], "'--timeout'", "finite"),
        (["submit", "demo.echo", "--payload", '{"a": NaN}'], "'--payload'", "NaN"),
        (["config", "set", "--timeout", "inf"], "'--timeout'", "finite"),
        (["submit", "demo.echo", "--url", "http://host:notaport"], "'--url'", "not a valid URL"),
        (
            ["schedules", "set", "x", "--type", "demo.echo", "--every", "5m", "--timeout", "inf"],
            "'--timeout'",
            "finite",
        ),
        (["schedules", "set", "a/b", "--type", "demo.echo", "--every", "1h"], "'NAME'", "slash"),
        (["schedules", "get", "a/b"], "'NAME'", "slash"),
    ],
)
def test_bad_options_are_usage_errors_before_any_request(
    no_requests: list[httpx.Request], args: list[str], option: str, rule: str
) -> None:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.replace("│", " ").split())
    assert f"Invalid value for {option}" in message
    assert rule in message
    assert no_requests == []


def test_a_token_that_is_not_ascii_is_a_usage_error(no_requests: list[httpx.Request]) -> None:
    result = CliRunner().invoke(
        app, ["workers"], env={"TASKFLEET_TOKEN": "tökén", "COLUMNS": "300"}
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--token'" in " ".join(result.output.replace("│", " ").split())
    assert no_requests == []


def test_help_never_shows_the_token() -> None:
    secret = "s3cret-token-from-the-environment"
    for args in (["submit", "--help"], ["config", "set", "--help"], ["workers", "--help"]):
        result = CliRunner().invoke(app, args, env={"TASKFLEET_TOKEN": secret})
        assert result.exit_code == 0
        assert "TASKFLEET_TOKEN" in result.output
        assert secret not in result.output


def test_the_workers_left_out_are_parsed_and_named_in_the_outcome() -> None:
    left_out = [{"id": "m3", "reason": "heartbeat expired"}, "junk"]
    event = parse_config_event(line(event="converged", version=7, seconds=1.5, excluded=left_out))
    assert event == Converged(7, 1.5, (ExcludedWorker("m3", "heartbeat expired"),))
    assert isinstance(event, Converged)
    assert describe_outcome(event) == (
        0,
        "converged: version 7 applied by every alive worker in 1.50s; "
        "left out: m3 (heartbeat expired)",
    )


def test_schedule_detail_shows_the_tags_a_schedule_requires() -> None:
    from taskfleet.cli.schedules import schedule_detail

    table = schedule_detail({"name": "rq", "type": "demo.echo", "requires": ["gpu"]})
    rows = dict(zip(table.columns[0]._cells, table.columns[1]._cells, strict=True))
    assert "requires" in rows and "gpu" in str(rows["requires"])
