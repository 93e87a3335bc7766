"""Client commands of ``taskfleet``: submit, config set/show, workers (docs/reference.md#cli).

They are built on the Python client, :class:`taskfleet.Client`, against ``TASKFLEET_URL`` with
the bearer token ``TASKFLEET_TOKEN`` (or ``--url``/``--token``). The token goes into the
``Authorization`` header and nowhere else.

Exit codes: 0 success (a task created or completed; a config change converged or superseded),
1 a failed outcome or an API/connection error, 2 bad input caught before any request is sent.

``config set`` prints the events of the change as they arrive; if the stream drops, the client
re-attaches to the same request instead of making a new version. The events are folded into an
outcome by :func:`fold_config_events`, pure, so the protocol handling is tested without a server.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from taskfleet.cli.main import app
from taskfleet.client import Client
from taskfleet.config_change import ConfigStreamLost
from taskfleet.config_events import (
    BadLine,
    ConfigEvent,
    Converged,
    Enqueued,
    ExcludedWorker,
    Failed,
    FinalEvent,
    FleetProgress,
    Superseded,
    TimedOut,
    VersionWritten,
    parse_config_event,
)
from taskfleet.errors import ApiError, WaitTimeout
from taskfleet.models import Task

__all__ = [
    "BadLine",
    "ConfigEvent",
    "Converged",
    "Enqueued",
    "Failed",
    "FleetProgress",
    "Superseded",
    "TimedOut",
    "VersionWritten",
    "parse_config_event",
]

DEFAULT_URL = "http://127.0.0.1:8000"

config_app = typer.Typer(
    name="config",
    help="Read or change the fleet's runtime config (strict cap and label weights).",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")

UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="TASKFLEET_URL", help="Base URL of the taskfleet API."),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TASKFLEET_TOKEN",
        show_default=False,
        help="Bearer token (role submit, or admin for config and workers).",
    ),
]


# --------------------------------------------------------------------------------------------
# The config change's events, folded into an outcome (pure).


@dataclass(frozen=True)
class ConfigOutcome:
    """How a config change ended, as far as the stream told: what to print and the exit code."""

    exit_code: int
    message: str
    final: FinalEvent | None
    request_id: str | None
    bad_lines: int


def fold_config_events(
    events: Iterable[ConfigEvent], on_event: Callable[[ConfigEvent], None] | None = None
) -> ConfigOutcome:
    """Fold a change's events into its outcome, calling ``on_event`` for each event.

    Stops at the first final event. converged and superseded exit 0 (the fleet runs this version
    or a newer one); timeout, failed, and events that end without a final one exit 1.
    """
    request_id: str | None = None
    bad_lines = 0
    for event in events:
        if on_event is not None:
            on_event(event)
        if isinstance(event, BadLine):
            bad_lines += 1
        elif isinstance(event, Enqueued):
            request_id = event.request_id or request_id
        elif isinstance(event, (Converged, Superseded, TimedOut, Failed)):
            code, message = describe_outcome(event)
            return ConfigOutcome(code, message, event, request_id, bad_lines)
    hint = f" (request {request_id})" if request_id else ""
    return ConfigOutcome(
        1,
        "the stream ended before an outcome; the change may still converge: "
        f"see `taskfleet config show`{hint}",
        None,
        request_id,
        bad_lines,
    )


def consume_config_events(
    lines: Iterable[str], on_event: Callable[[ConfigEvent], None] | None = None
) -> ConfigOutcome:
    """:func:`fold_config_events` over NDJSON lines (blank keep-alive lines skipped)."""
    parsed = (parse_config_event(line) for line in lines)
    return fold_config_events((e for e in parsed if e is not None), on_event)


def _version(version: int | None) -> str:
    return f"version {version}" if version is not None else "the new version"


def _short_list(ids: Iterable[str], limit: int = 5) -> str:
    items = list(ids)
    shown = ", ".join(items[:limit])
    return shown + (f" +{len(items) - limit} more" if len(items) > limit else "")


def describe_outcome(event: FinalEvent) -> tuple[int, str]:
    """The exit code and the one-line message of a final event."""
    if isinstance(event, Converged):
        took = f" in {event.seconds:.2f}s" if event.seconds is not None else ""
        return 0, (
            f"converged: {_version(event.version)} applied by every alive worker{took}"
            f"{_left_out(event.excluded)}"
        )
    if isinstance(event, Superseded):
        newer = (
            f"version {event.superseded_by}" if event.superseded_by is not None else "a newer one"
        )
        return 0, f"superseded: {_version(event.version)} was replaced by {newer}"
    if isinstance(event, TimedOut):
        lagging = f"; lagging: {_short_list(event.lagging)}" if event.lagging else ""
        return 1, (
            f"timeout: {_version(event.version)} is not applied by every alive worker yet"
            f"{lagging}{_left_out(event.excluded)} (the change goes on)"
        )
    return 1, f"failed: {event.error}"


def _left_out(excluded: tuple[ExcludedWorker, ...]) -> str:
    """``; left out: m3 (heartbeat expired)``, or nothing."""
    if not excluded:
        return ""
    return "; left out: " + _short_list([f"{e.id} ({e.reason})" for e in excluded])


def progress_line(event: FleetProgress) -> str:
    """``version V: applied A/B workers, lagging: ...`` (the live line and the plain line)."""
    line = (
        f"{_version(event.version)}: applied {event.applied_workers}/{event.alive_workers} workers"
    )
    if event.alive_workers == 0:
        return line + " (no alive workers)"
    if event.lagging:
        line += f", lagging: {_short_list(event.lagging)}"
    return line


def describe_event(event: Enqueued | VersionWritten | FleetProgress) -> str:
    if isinstance(event, Enqueued):
        request = f" (request {event.request_id})" if event.request_id else ""
        task = f" {event.task_id}" if event.task_id is not None else ""
        return f"enqueued config task{task}{request}"
    if isinstance(event, VersionWritten):
        return f"version {event.version} written, waiting for the workers"
    return progress_line(event)


def _bad_line_warning(event: BadLine) -> str:
    return f"warning: skipped a bad line from the server ({event.reason}): {event.line[:200]}"


class PlainConfigDisplay:
    """One plain line per event, flushed at once (for pipes, logs and CI)."""

    def __enter__(self) -> PlainConfigDisplay:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def __call__(self, event: ConfigEvent) -> None:
        if isinstance(event, BadLine):
            typer.echo(_bad_line_warning(event), err=True)
        elif isinstance(event, (Enqueued, VersionWritten, FleetProgress)):
            typer.echo(describe_event(event))
        # Final events are printed once, as the outcome, by the command.


class LiveConfigDisplay:
    """One updating line with a bar of applied/alive workers (for a terminal)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> LiveConfigDisplay:
        self._progress.start()
        self._task = self._progress.add_task("sending the config change", total=None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def __call__(self, event: ConfigEvent) -> None:
        assert self._task is not None, "use LiveConfigDisplay as a context manager"
        if isinstance(event, BadLine):
            self._progress.console.print(Text(_bad_line_warning(event), style="yellow"))
        elif isinstance(event, FleetProgress):
            self._progress.update(
                self._task,
                description=progress_line(event),
                total=event.alive_workers,
                completed=event.applied_workers,
            )
        elif isinstance(event, (Enqueued, VersionWritten)):
            self._progress.update(self._task, description=describe_event(event))
        elif isinstance(event, (Converged, Superseded)):
            total = self._progress.tasks[0].total or 1
            self._progress.update(self._task, total=total, completed=total)


# --------------------------------------------------------------------------------------------
# Option parsing: bad input is a usage error (exit 2) naming the option; no request is sent.


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_payload(text: str) -> dict[str, Any]:
    """The ``--payload`` JSON object. Raises ``ValueError`` saying what is wrong."""
    try:
        # NaN and Infinity are Python's extension of JSON: the API refuses them, so here too.
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {type(value).__name__}: {text[:80]}")
    return value


def parse_label_weight(text: str) -> tuple[str, int]:
    """One ``--weight LABEL=N``: a non-empty label and an integer N >= 1."""
    label, sep, weight = text.rpartition("=")
    rule = "must be LABEL=N with a non-empty label and an integer N >= 1"
    if not sep or not label.strip():
        raise ValueError(f"{text!r} {rule}")
    try:
        value = int(weight.strip())
    except ValueError:
        raise ValueError(f"{text!r} {rule}") from None
    if value < 1:
        raise ValueError(f"{text!r} {rule}")
    return label, value


LIMIT_RULE = (
    "must be LABEL=in_flight:N,rate:R (either part or both): N an integer >= 1, R a number > 0"
)


def parse_label_limit(text: str) -> tuple[str, dict[str, float | int]]:
    """One ``--limit LABEL=in_flight:N,rate:R``, as the wire's ``maxInFlight`` and
    ``ratePerSecond``."""
    label, sep, spec = text.rpartition("=")
    if not sep or not label.strip() or not spec.strip():
        raise ValueError(f"{text!r} {LIMIT_RULE}")
    limit: dict[str, float | int] = {}
    for part in spec.split(","):
        name, colon, value = part.strip().partition(":")
        try:
            if colon and name == "in_flight" and "maxInFlight" not in limit:
                limit["maxInFlight"] = int(value)
                if limit["maxInFlight"] < 1:
                    raise ValueError
            elif colon and name == "rate" and "ratePerSecond" not in limit:
                limit["ratePerSecond"] = float(value)
                if not 0 < limit["ratePerSecond"] < float("inf"):
                    raise ValueError
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"{text!r} {LIMIT_RULE}") from None
    return label, limit


def parse_label_limits(items: Iterable[str]) -> dict[str, dict[str, float | int]]:
    """All ``--limit`` options as the wire's ``labelLimits``; a repeated label: last wins."""
    return dict(parse_label_limit(item) for item in items)


def parse_label_weights(items: Iterable[str]) -> dict[str, int]:
    """All ``--weight`` options as the wire's ``labelWeights``; a repeated label: last wins."""
    return dict(parse_label_weight(item) for item in items)


def _usage_error(option: str, message: str) -> NoReturn:
    raise typer.BadParameter(message, param_hint=f"'{option}'")


def _format_seconds(seconds: float) -> str:
    return f"{round(seconds, 3):g}"


def check_seconds(option: str, value: float | None, *, zero: bool = False) -> None:
    """A usage error unless ``value`` (when given) is a finite number of seconds, > 0 (or >= 0
    with ``zero``)."""
    if value is None:
        return
    if not math.isfinite(value):
        _usage_error(option, "must be a finite number of seconds")
    if zero and value < 0:
        _usage_error(option, "must be 0 or more seconds")
    if not zero and not value > 0:
        _usage_error(option, "must be greater than 0 seconds")


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        _usage_error("--url", f"{url!r} must be an http:// or https:// URL (TASKFLEET_URL)")
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        _usage_error("--url", f"{url!r} is not a valid URL: {exc} (TASKFLEET_URL)")
    return url


def _check_token(token: str | None) -> str | None:
    if token is not None and not token.isascii():
        # It travels in an HTTP header: ASCII only.
        _usage_error("--token", "must be ASCII text (TASKFLEET_TOKEN)")
    return token


# --------------------------------------------------------------------------------------------
# The API: one taskfleet.Client per command; every API or connection error is one clear line
# and exit 1.


def render_detail(body: object) -> str:
    """The API's error body as text: FastAPI's ``detail`` (a string or a list of field errors)."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict) and "msg" in item:
                loc = [str(p) for p in item.get("loc", []) if p not in ("body", "query")]
                parts.append(f"{'.'.join(loc)}: {item['msg']}" if loc else str(item["msg"]))
            else:
                parts.append(json.dumps(item))
        return "; ".join(parts)
    return json.dumps(detail)


def _api_message(exc: ApiError) -> str:
    if exc.errors:
        return render_detail(exc.errors)
    return exc.message


def _client(url: str, token: str | None) -> Client:
    return Client(_check_url(url), token=_check_token(token))


def _fail(message: str) -> NoReturn:
    Console(stderr=True).print(Text(f"error: {message}", style="bold red"), soft_wrap=True)
    raise typer.Exit(1)


class _ReportApiErrors:
    """Turn API and connection errors into one message and exit 1, never a traceback."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, ApiError):
            hint = " (set TASKFLEET_TOKEN or --token)" if exc.status == 401 else ""
            _fail(f"the API refused the request: HTTP {exc.status}: {_api_message(exc)}{hint}")
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            _fail(
                f"cannot connect to the taskfleet API at {self.url}: {exc} (TASKFLEET_URL, --url)"
            )
        if isinstance(exc, httpx.TransportError):
            _fail(f"the request to {self.url} failed: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------------------------
# Commands.


@app.command()
def submit(
    task_type: Annotated[
        str, typer.Argument(metavar="TYPE", help="The task type, for example demo.echo.")
    ],
    payload: Annotated[str, typer.Option(help="The task's payload, a JSON object.")] = "{}",
    priority: Annotated[
        int | None,
        typer.Option(min=0, help="Priority 0 or more; above 0 the task is in the strict lane."),
    ] = None,
    weight: Annotated[
        int | None, typer.Option(min=1, help="Weight 1 or more; higher runs first in its group.")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="A label; repeat the option for more.")
    ] = None,
    delay: Annotated[
        float | None, typer.Option(min=0, help="Seconds to wait before the task may start.")
    ] = None,
    unique_key: Annotated[
        str | None,
        typer.Option(help="While a task with this key is unfinished, return it instead."),
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(min=1, help="Attempts before the task fails for good.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds one attempt may run (more than 0).")
    ] = None,
    requires: Annotated[
        list[str] | None,
        typer.Option(
            "--requires",
            metavar="TAG",
            help="A worker tag the task needs (only workers with every one run it); repeatable.",
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait for the task to finish, or do not.")
    ] = False,
    wait_timeout: Annotated[
        float, typer.Option(help="Seconds to wait with --wait (more than 0).")
    ] = 30.0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Submit a task (POST /tasks) and print its id and status; with --wait, its result.

    Exit 0 when created (with --wait: completed), 1 when it failed, was cancelled or is not
    finished in time, 2 for bad options.
    """
    try:
        body = parse_payload(payload)
    except ValueError as exc:
        _usage_error("--payload", str(exc))
    check_seconds("--timeout", timeout)
    check_seconds("--wait-timeout", wait_timeout)
    check_seconds("--delay", delay, zero=True)
    optional: dict[str, Any] = {
        "priority": priority,
        "weight": weight,
        "labels": label or None,
        "delay_seconds": delay,
        "unique_key": unique_key,
        "max_attempts": max_attempts,
        "timeout_seconds": timeout,
        "requires": requires or None,
    }
    fields: Any = {k: v for k, v in optional.items() if v is not None}

    with _ReportApiErrors(url), _client(url, token) as client:
        task = client.submit(task_type, body, **fields)
        dedup = " (deduplicated: an unfinished task has this unique key)"
        typer.echo(
            f"task {task.id} {task.type}: {task.status}" + (dedup if task.deduplicated else "")
        )
        if not wait:
            return
        try:
            task = client.wait(task.id, timeout=wait_timeout)
        except WaitTimeout as exc:
            task = exc.task
    raise typer.Exit(_report_finished_task(task, wait_timeout))


def _report_finished_task(task: Task, waited: float) -> int:
    name = f"task {task.id}"
    if task.status == "completed":
        typer.echo(f"{name} completed")
        typer.echo(f"result: {json.dumps(task.result)}")
        return 0
    if task.status == "failed":
        attempts = task.attempts
        after = f" after {attempts} attempt{'s' if attempts != 1 else ''}" if attempts else ""
        typer.echo(f"{name} failed{after}: {task.last_error or 'no error recorded'}")
        return 1
    if task.status == "cancelled":
        typer.echo(f"{name} cancelled" + (f": {task.last_error}" if task.last_error else ""))
        return 1
    typer.echo(f"{name} is still {task.status} after waiting {_format_seconds(waited)}s")
    return 1


@config_app.command("set")
def config_set(
    max_strict_percentage: Annotated[
        int | None,
        typer.Option(
            min=0, max=100, help="The percentage of a worker's slots the strict lane may use."
        ),
    ] = None,
    default_weight: Annotated[
        int | None, typer.Option(min=1, help="The weight of labels without their own weight.")
    ] = None,
    weight: Annotated[
        list[str] | None,
        typer.Option(
            "--weight", metavar="LABEL=N", help="A label's weight N (1 or more); repeatable."
        ),
    ] = None,
    pause_label: Annotated[
        list[str] | None,
        typer.Option(
            "--pause-label", metavar="LABEL", help="Pause tasks carrying LABEL; repeatable."
        ),
    ] = None,
    pause_type: Annotated[
        list[str] | None,
        typer.Option("--pause-type", metavar="TYPE", help="Pause tasks of TYPE; repeatable."),
    ] = None,
    pause_lane: Annotated[
        list[str] | None,
        typer.Option(
            "--pause-lane",
            metavar="LANE",
            help="Pause a whole lane: strict or normal (never control); repeatable.",
        ),
    ] = None,
    limit: Annotated[
        list[str] | None,
        typer.Option(
            "--limit",
            metavar="LABEL=in_flight:N,rate:R",
            help="A fleet-wide limit on LABEL: N running at most, R starts per second; repeatable.",
        ),
    ] = None,
    patch: Annotated[
        bool,
        typer.Option(
            "--patch",
            help="Change only the fields given (PATCH) instead of replacing the whole config.",
        ),
    ] = False,
    resume_all: Annotated[
        bool,
        typer.Option(
            "--resume-all",
            help="Resume everything paused (empty pausedLabels, pausedTypes, pausedLanes); with "
            "--patch the rest of the config stays.",
        ),
    ] = False,
    clear_limits: Annotated[
        bool,
        typer.Option("--clear-limits", help="Remove every label limit (empty labelLimits)."),
    ] = False,
    request_id: Annotated[
        str | None,
        typer.Option(help="An idempotency key: one request id is one version (default: new)."),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for convergence (more than 0).")
    ] = 60.0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Replace the runtime config (PUT /runtime-config) and follow it until the fleet has it.

    Omitted fields take their defaults (no --weight means no weighted labels, no --pause-*
    means nothing paused, no --limit means no limit); with --patch only the given fields
    change. Exit 0 when converged or superseded, 1 on timeout, failure or a lost stream, 2 for
    bad options.
    """
    try:
        label_weights = parse_label_weights(weight or [])
    except ValueError as exc:
        _usage_error("--weight", str(exc))
    try:
        label_limits = parse_label_limits(limit or [])
    except ValueError as exc:
        _usage_error("--limit", str(exc))
    if resume_all and (pause_label or pause_type or pause_lane):
        _usage_error("--resume-all", "not together with --pause-label, --pause-type, --pause-lane")
    if clear_limits and limit:
        _usage_error("--clear-limits", "not together with --limit")
    check_seconds("--timeout", timeout)
    fields: dict[str, Any] = {
        "max_strict_percentage": max_strict_percentage,
        "default_weight": default_weight,
        "label_weights": label_weights or None,
        "paused_labels": [] if resume_all else (pause_label or None),
        "paused_types": [] if resume_all else (pause_type or None),
        "paused_lanes": [] if resume_all else (pause_lane or None),
        "label_limits": {} if clear_limits else (label_limits or None),
    }

    console = Console()
    display: PlainConfigDisplay | LiveConfigDisplay = (
        LiveConfigDisplay(console) if console.is_terminal else PlainConfigDisplay()
    )
    lost: list[str] = []
    outcome: ConfigOutcome | None = None
    try:
        with _ReportApiErrors(url), _client(url, token) as client:
            change = client.change_config(
                patch=patch, timeout=timeout, request_id=request_id, **fields
            )
            with display:
                outcome = fold_config_events(_events_until_lost(change, lost), display)
    except KeyboardInterrupt:
        _fail("interrupted; the config change goes on: see `taskfleet config show`")
    assert outcome is not None
    if lost and outcome.final is None:
        Console(stderr=True).print(Text(f"connection lost: {lost[0]}", style="red"), soft_wrap=True)
    style = "green" if outcome.exit_code == 0 else "bold red"
    console.print(Text(outcome.message, style=style), soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


def _events_until_lost(change: Iterable[ConfigEvent], lost: list[str]) -> Iterable[ConfigEvent]:
    """The change's events; a stream the client could not re-attach to ends them (noted in
    ``lost``), so it is reported like any stream that ends without an outcome."""
    try:
        yield from change
    except ConfigStreamLost as exc:
        lost.append(str(exc))


@config_app.command("show")
def config_show(url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Show the latest runtime config and the version each alive worker has applied."""
    with _ReportApiErrors(url), _client(url, token) as client:
        config = client.config()
    Console().print(*runtime_config_tables(config.model_dump(mode="json")))


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def runtime_config_tables(doc: Mapping[str, Any]) -> tuple[Table, Table]:
    """The config (version and parameters) and the alive workers' applied versions."""
    stored = doc.get("payload")
    payload: Mapping[str, Any] = stored if isinstance(stored, dict) else doc
    version = doc.get("version")
    config = Table(title="runtime config", show_header=False)
    config.add_column("field", style="bold")
    config.add_column("value")
    no_version = version is None or version == 0
    config.add_row("version", "none yet (fleet defaults)" if no_version else str(version))
    for key in ("maxStrictPercentage", "defaultWeight"):
        config.add_row(key, _cell(payload.get(key)))
    weights = payload.get("labelWeights")
    if isinstance(weights, dict) and weights:
        config.add_row("labelWeights", ", ".join(f"{k}={v}" for k, v in weights.items()))
    else:
        config.add_row("labelWeights", "(none)")
    for key in ("notifyInterval", "listenTimeout", "requestID"):
        if payload.get(key) is not None:
            config.add_row(key, str(payload[key]))
    if doc.get("created_at") is not None:
        config.add_row("created_at", str(doc["created_at"]))

    workers = Table(title="alive workers")
    workers.add_column("worker", no_wrap=True)
    workers.add_column("applied version", justify="right")
    workers.add_column("up to date")
    rows = doc.get("workers")
    for worker in rows if isinstance(rows, list) else []:
        if not isinstance(worker, dict):
            continue
        applied = worker.get("applied_config_version")
        current = worker.get("up_to_date")
        if not isinstance(current, bool):
            current = isinstance(applied, int) and isinstance(version, int) and applied >= version
        workers.add_row(
            _cell(worker.get("id")),
            _cell(applied),
            Text("yes", style="green") if current else Text("no", style="yellow"),
        )
    return config, workers


WideOption = Annotated[
    bool,
    typer.Option(
        "--wide/--narrow",
        help="Show every column (host, pid, start time, metrics port), wider than 80 columns.",
    ),
]


@app.command()
def workers(
    wide: WideOption = False, url: UrlOption = DEFAULT_URL, token: TokenOption = None
) -> None:
    """Show every registered worker: its state, load, applied config version and heartbeat."""
    with _ReportApiErrors(url), _client(url, token) as client:
        rows = [w.model_dump(mode="json") for w in client.workers()]
    Console().print(workers_table(rows, datetime.now(UTC), wide=wide))


def heartbeat_age(worker: Mapping[str, Any], now: datetime) -> str:
    """How long ago the worker last heartbeated, e.g. ``2.1s``; ``-`` when unknown.

    Measured against this machine's clock, so it is as exact as the two clocks agree.
    """
    raw = worker.get("last_heartbeat")
    if not isinstance(raw, str):
        return "-"
    try:
        beat = datetime.fromisoformat(raw)
    except ValueError:
        return raw
    if beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)
    seconds = max(0.0, (now - beat).total_seconds())
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _ago(age: str) -> str:
    return age if age == "-" else f"{age} ago"


def worker_state(worker: Mapping[str, Any]) -> Text:
    """``online`` (alive), ``lost`` (online but its heartbeat is overdue), or its status."""
    status = _cell(worker.get("status"))
    if worker.get("alive"):
        return Text("online", style="green")
    if status == "online":
        return Text("lost", style="red")
    return Text(status, style="yellow" if status == "draining" else "dim")


def workers_table(rows: Iterable[object], now: datetime, *, wide: bool = False) -> Table:
    """The fleet. Narrow (the default) fits 80 columns with whole headers: ``busy`` is running
    tasks out of slots, ``strict`` the strict-lane share of them, ``config`` the applied
    version. ``wide`` adds the host, pid, start time, metrics port and tags."""
    table = Table(title="workers", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    # A long id folds onto a second line rather than lose its end: nothing is cut short.
    table.add_column("worker", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("busy", justify="right", no_wrap=True)
    table.add_column("strict", justify="right", no_wrap=True)
    table.add_column("config", justify="right", no_wrap=True)
    table.add_column("heartbeat", justify="right", no_wrap=True)
    if wide:
        for name in ("host", "pid", "started", "metrics port", "tags"):
            table.add_column(name, no_wrap=True)
    for worker in rows:
        if not isinstance(worker, dict):
            continue
        row: list[str | Text] = [
            _cell(worker.get("id")),
            worker_state(worker),
            f"{_cell(worker.get('inflight'))}/{_cell(worker.get('concurrency'))}",
            _cell(worker.get("strict_inflight")),
            _cell(worker.get("applied_config_version")),
            _ago(heartbeat_age(worker, now)),
        ]
        if wide:
            row += [
                _cell(worker.get("hostname")),
                _cell(worker.get("pid")),
                _cell(worker.get("started_at")),
                _cell(worker.get("metrics_port")),
                ",".join(worker.get("tags") or []) or "-",
            ]
        table.add_row(*row)
    return table
