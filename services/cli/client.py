"""Client commands of ``taskfleet`` (SPEC §3, §6, §7, §11): submit, config set/show, workers.

They talk to the HTTP API only, at ``TASKFLEET_URL`` with the bearer token ``TASKFLEET_TOKEN``
(or ``--url``/``--token``). The token goes into the ``Authorization`` header and nowhere else.

Exit codes: 0 success (a task created or completed; a config change converged or superseded),
1 a failed outcome or an API/connection error, 2 bad input caught before any request is sent.

``config set`` reads the NDJSON stream of ``PUT /runtime-config`` line by line as it arrives. The
stream is parsed by :func:`parse_config_event` into a tagged union and folded into an outcome by
:func:`consume_config_events`, both pure so the protocol handling is tested without a server.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from taskfleet.cli.main import app

DEFAULT_URL = "http://127.0.0.1:8000"
#: Seconds to open a connection or send a request; reads get their own, longer bound.
CONNECT_TIMEOUT = 10.0
#: Slack added to a server-side wait (``?timeout=``) before the client gives up reading. The
#: config stream sends a progress event at least every 15 s, so this also covers its gaps.
READ_SLACK = 30.0
#: Longest single ``GET /tasks/{id}/wait``; a longer ``--wait-timeout`` is several calls, so the
#: client never depends on how long the server lets one call block.
WAIT_CHUNK = 60.0
FINISHED_STATUSES = frozenset({"completed", "failed", "cancelled"})

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
# The PUT /runtime-config event stream (SPEC §7): parsed into a tagged union, folded purely.


@dataclass(frozen=True)
class Enqueued:
    task_id: int | str | None
    request_id: str | None


@dataclass(frozen=True)
class VersionWritten:
    version: int


@dataclass(frozen=True)
class FleetProgress:
    version: int | None
    alive_workers: int
    applied_workers: int
    lagging: tuple[str, ...]


@dataclass(frozen=True)
class Converged:
    version: int | None
    seconds: float | None


@dataclass(frozen=True)
class Superseded:
    version: int | None
    superseded_by: int | None


@dataclass(frozen=True)
class TimedOut:
    version: int | None
    lagging: tuple[str, ...]


@dataclass(frozen=True)
class Failed:
    error: str


@dataclass(frozen=True)
class BadLine:
    """A line that is not a known event: reported and skipped, never fatal."""

    line: str
    reason: str


FinalEvent = Converged | Superseded | TimedOut | Failed
ConfigEvent = Enqueued | VersionWritten | FleetProgress | FinalEvent | BadLine


@dataclass(frozen=True)
class ConfigOutcome:
    """How a config change ended, as far as the stream told: what to print and the exit code."""

    exit_code: int
    message: str
    final: FinalEvent | None
    request_id: str | None
    bad_lines: int


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _worker_ids(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(str(item) for item in value)


def parse_config_event(line: str) -> ConfigEvent | None:
    """Parse one NDJSON line; ``None`` for a blank (keep-alive) line. Never raises.

    Final events are read leniently (a missing number is ``None``): the outcome is what matters.
    """
    text = line.strip()
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return BadLine(text, f"not JSON: {exc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
        return BadLine(text, 'not an object with an "event" name')
    kind = doc["event"]
    version = _int(doc.get("version"))
    if kind == "enqueued":
        task_id = doc.get("task_id")
        request_id = doc.get("request_id")
        return Enqueued(
            task_id if isinstance(task_id, (int, str)) and not isinstance(task_id, bool) else None,
            request_id if isinstance(request_id, str) else None,
        )
    if kind == "version":
        if version is None:
            return BadLine(text, "version event without an integer version")
        return VersionWritten(version)
    if kind == "progress":
        alive, applied = _int(doc.get("alive_workers")), _int(doc.get("applied_workers"))
        lagging = _worker_ids(doc.get("lagging", []))
        if alive is None or applied is None or lagging is None:
            return BadLine(text, "progress event without integer counts and a lagging list")
        return FleetProgress(version, alive, applied, lagging)
    if kind == "converged":
        return Converged(version, _seconds(doc.get("seconds")))
    if kind == "superseded":
        return Superseded(version, _int(doc.get("superseded_by")))
    if kind == "timeout":
        return TimedOut(version, _worker_ids(doc.get("lagging")) or ())
    if kind == "failed":
        error = doc.get("error")
        return Failed(error if isinstance(error, str) and error else "no reason given")
    return BadLine(text, f"unknown event {kind!r}")


def consume_config_events(
    lines: Iterable[str], on_event: Callable[[ConfigEvent], None] | None = None
) -> ConfigOutcome:
    """Fold a config event stream into its outcome, calling ``on_event`` for each event.

    Stops at the first final event. converged and superseded exit 0 (the fleet runs this version
    or a newer one); timeout, failed, and a stream that ends without a final event exit 1.
    """
    request_id: str | None = None
    bad_lines = 0
    for line in lines:
        event = parse_config_event(line)
        if event is None:
            continue
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
        return 0, f"converged: {_version(event.version)} applied by every alive worker{took}"
    if isinstance(event, Superseded):
        newer = (
            f"version {event.superseded_by}" if event.superseded_by is not None else "a newer one"
        )
        return 0, f"superseded: {_version(event.version)} was replaced by {newer}"
    if isinstance(event, TimedOut):
        lagging = f"; lagging: {_short_list(event.lagging)}" if event.lagging else ""
        return 1, (
            f"timeout: {_version(event.version)} is not applied by every alive worker yet"
            f"{lagging} (the change goes on)"
        )
    return 1, f"failed: {event.error}"


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


def parse_payload(text: str) -> dict[str, Any]:
    """The ``--payload`` JSON object. Raises ``ValueError`` saying what is wrong."""
    try:
        value = json.loads(text)
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


def parse_label_weights(items: Iterable[str]) -> dict[str, int]:
    """All ``--weight`` options as the wire's ``labelWeights``; a repeated label: last wins."""
    return dict(parse_label_weight(item) for item in items)


def _usage_error(option: str, message: str) -> NoReturn:
    raise typer.BadParameter(message, param_hint=f"'{option}'")


def _format_seconds(seconds: float) -> str:
    return f"{round(seconds, 3):g}"


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        _usage_error("--url", f"{url!r} must be an http:// or https:// URL (TASKFLEET_URL)")
    return url


# --------------------------------------------------------------------------------------------
# HTTP: one client per command; every API or connection error is one clear line and exit 1.


class ApiError(Exception):
    """The API answered with an error status; ``detail`` is its message, rendered."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {detail}")


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


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        detail = render_detail(response.json())
    except ValueError:
        detail = response.text.strip()[:500] or response.reason_phrase
    raise ApiError(response.status_code, detail)


def _json(response: httpx.Response) -> Any:
    _raise_for_status(response)
    try:
        return response.json()
    except ValueError:
        raise ApiError(response.status_code, "the response is not JSON") from None


def _json_object(response: httpx.Response) -> dict[str, Any]:
    doc = _json(response)
    if not isinstance(doc, dict):
        raise ApiError(response.status_code, f"expected a JSON object from {response.url.path}")
    return doc


def _http_client(url: str, token: str | None, read_timeout: float = READ_SLACK) -> httpx.Client:
    headers = {"User-Agent": "taskfleet-cli"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(
        base_url=_check_url(url),
        headers=headers,
        timeout=httpx.Timeout(CONNECT_TIMEOUT, read=read_timeout),
    )


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
            _fail(f"the API refused the request: HTTP {exc.status}: {exc.detail}{hint}")
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
    task_type: Annotated[str, typer.Argument(metavar="TYPE", help="Task type, e.g. demo.echo.")],
    payload: Annotated[str, typer.Option(help="Task payload, a JSON object.")] = "{}",
    priority: Annotated[
        int | None, typer.Option(min=0, help="Priority >= 0; higher runs first.")
    ] = None,
    weight: Annotated[
        int | None, typer.Option(min=1, help="Weight >= 1 within its label group.")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="A label; repeat for more.")
    ] = None,
    delay: Annotated[
        float | None, typer.Option(min=0, help="Seconds to wait before it may start.")
    ] = None,
    unique_key: Annotated[
        str | None, typer.Option(help="Deduplicate against unfinished tasks with this key.")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(min=1, help="Attempts before it fails.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds one attempt may run (> 0).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the task to finish.")] = False,
    wait_timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait (> 0).")] = 30.0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Submit a task (POST /tasks) and print its id and status; --wait for its result.

    Exit 0 when created (with --wait: completed), 1 when it failed, was cancelled or is not
    finished in time, 2 for bad options.
    """
    try:
        body: dict[str, Any] = {"type": task_type, "payload": parse_payload(payload)}
    except ValueError as exc:
        _usage_error("--payload", str(exc))
    if timeout is not None and not timeout > 0:
        _usage_error("--timeout", "must be greater than 0 seconds")
    if not wait_timeout > 0:
        _usage_error("--wait-timeout", "must be greater than 0 seconds")
    optional = {
        "priority": priority,
        "weight": weight,
        "labels": label or None,
        "delay_seconds": delay,
        "unique_key": unique_key,
        "max_attempts": max_attempts,
        "timeout_seconds": timeout,
    }
    body.update({k: v for k, v in optional.items() if v is not None})

    with _ReportApiErrors(url), _http_client(url, token, WAIT_CHUNK + READ_SLACK) as client:
        task = _json_object(client.post("/tasks", json=body))
        dedup = " (deduplicated: an unfinished task has this unique key)"
        typer.echo(
            f"task {task.get('id')} {task.get('type', task_type)}: {task.get('status')}"
            + (dedup if task.get("deduplicated") else "")
        )
        if not wait:
            return
        task = _wait_for_task(client, task.get("id"), wait_timeout)
    raise typer.Exit(_report_finished_task(task, wait_timeout))


def _wait_for_task(client: httpx.Client, task_id: object, wait_timeout: float) -> dict[str, Any]:
    """The task once it is finished, or as it is when ``wait_timeout`` seconds have passed."""
    deadline = time.monotonic() + wait_timeout
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        chunk = min(remaining, WAIT_CHUNK)
        params = {"timeout": _format_seconds(chunk)}
        task = _json_object(client.get(f"/tasks/{task_id}/wait", params=params))
        if task.get("status") in FINISHED_STATUSES or remaining <= WAIT_CHUNK:
            return task


def _report_finished_task(task: Mapping[str, Any], waited: float) -> int:
    status = task.get("status")
    name = f"task {task.get('id')}"
    if status == "completed":
        typer.echo(f"{name} completed")
        typer.echo(f"result: {json.dumps(task.get('result'))}")
        return 0
    if status == "failed":
        attempts = task.get("attempts")
        after = f" after {attempts} attempt{'s' if attempts != 1 else ''}" if attempts else ""
        typer.echo(f"{name} failed{after}: {task.get('last_error') or 'no error recorded'}")
        return 1
    if status == "cancelled":
        error = task.get("last_error")
        typer.echo(f"{name} cancelled" + (f": {error}" if error else ""))
        return 1
    typer.echo(f"{name} is still {status} after waiting {_format_seconds(waited)}s")
    return 1


@config_app.command("set")
def config_set(
    max_strict_percentage: Annotated[
        int | None,
        typer.Option(min=0, max=100, help="Percent of a worker's slots the strict lane may use."),
    ] = None,
    default_weight: Annotated[
        int | None, typer.Option(min=1, help="Weight of labels without their own weight.")
    ] = None,
    weight: Annotated[
        list[str] | None,
        typer.Option("--weight", metavar="LABEL=N", help="A label's weight N >= 1; repeatable."),
    ] = None,
    request_id: Annotated[
        str | None, typer.Option(help="Idempotency key: one request id is one version.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for convergence (> 0).")] = 60.0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Replace the runtime config (PUT /runtime-config) and follow it until the fleet has it.

    Omitted fields take their defaults (no --weight means no weighted labels). Exit 0 when
    converged or superseded, 1 on timeout, failure or a lost stream, 2 for bad options.
    """
    try:
        label_weights = parse_label_weights(weight or [])
    except ValueError as exc:
        _usage_error("--weight", str(exc))
    if not timeout > 0:
        _usage_error("--timeout", "must be greater than 0 seconds")
    body: dict[str, Any] = {}
    if max_strict_percentage is not None:
        body["maxStrictPercentage"] = max_strict_percentage
    if default_weight is not None:
        body["defaultWeight"] = default_weight
    if label_weights:
        body["labelWeights"] = label_weights
    # Always a request id: one request id is one version, so after a dropped stream the command
    # re-attaches to its own change instead of making a new one.
    body["requestID"] = request_id if request_id is not None else str(uuid.uuid4())

    console = Console()
    display: PlainConfigDisplay | LiveConfigDisplay = (
        LiveConfigDisplay(console) if console.is_terminal else PlainConfigDisplay()
    )
    lost: list[str] = []
    outcome: ConfigOutcome | None = None
    deadline = time.monotonic() + timeout
    try:
        with (
            _ReportApiErrors(url),
            _http_client(url, token, timeout + READ_SLACK) as client,
            display,
        ):
            outcome = _follow_config_change(client, body, timeout, lost, display)
            pause = REATTACH_FIRST_PAUSE
            # No final event means the stream was cut (at its own timeout the API says so with
            # a timeout event): follow the same change again while there is time.
            while outcome.final is None and time.monotonic() + pause < deadline:
                time.sleep(pause)
                pause = min(pause * 2, REATTACH_MAX_PAUSE)
                lost.clear()
                outcome = _reattach_config_change(
                    client, body, deadline - time.monotonic(), lost, display
                )
    except KeyboardInterrupt:
        _fail("interrupted; the config change goes on: see `taskfleet config show`")
    assert outcome is not None
    if lost and outcome.final is None:
        Console(stderr=True).print(Text(f"connection lost: {lost[0]}", style="red"), soft_wrap=True)
    style = "green" if outcome.exit_code == 0 else "bold red"
    console.print(Text(outcome.message, style=style), soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


#: Pauses between attempts to re-attach to a change after its stream was lost (seconds).
REATTACH_FIRST_PAUSE = 0.5
REATTACH_MAX_PAUSE = 5.0


def _follow_config_change(
    client: httpx.Client,
    body: dict[str, Any],
    timeout: float,
    lost: list[str],
    on_event: Callable[[ConfigEvent], None],
    *,
    reattach: bool = False,
) -> ConfigOutcome:
    """PUT the change (or, with ``reattach``, watch its request) and fold its event stream. A
    connection that fails or breaks is noted in ``lost``; an API error raises ApiError."""
    if reattach:
        method, path, json_body = "GET", request_location(body["requestID"]), None
        params = {"watch": "true", "timeout": _format_seconds(timeout)}
    else:
        method, path, json_body = "PUT", "/runtime-config", body
        params = {"timeout": _format_seconds(timeout)}
    try:
        with client.stream(
            method,
            path,
            params=params,
            json=json_body,
            headers={"Accept": "application/x-ndjson"},
        ) as response:
            if not response.is_success:
                response.read()
                _raise_for_status(response)
            return consume_config_events(_lines_until_lost(response, lost), on_event)
    except httpx.TransportError as exc:
        if not reattach and not lost and isinstance(exc, httpx.ConnectError):
            raise  # the API was never reached: one clear error, not a retry loop
        lost.append(f"{type(exc).__name__}: {exc}")
        return consume_config_events([], None)


def _reattach_config_change(
    client: httpx.Client,
    body: dict[str, Any],
    timeout: float,
    lost: list[str],
    display: Callable[[ConfigEvent], None],
) -> ConfigOutcome:
    """Follow the change again after its stream was lost (an API restart, a proxy timeout):
    its request's events, or, if the API never recorded the request, the same PUT again (the
    request id makes it one version however often it is sent)."""

    def show(event: ConfigEvent) -> None:
        if not isinstance(event, Enqueued):  # the re-attached stream starts over
            display(event)

    try:
        return _follow_config_change(client, body, timeout, lost, show, reattach=True)
    except ApiError as exc:
        if exc.status != 404:
            raise
        return _follow_config_change(client, body, timeout, lost, show)


def request_location(request_id: str) -> str:
    return f"/runtime-config/requests/{quote(request_id, safe='')}"


def _lines_until_lost(response: httpx.Response, lost: list[str]) -> Iterator[str]:
    """The response's lines as they arrive; a broken connection ends them (noted in ``lost``),
    so it is reported like any stream that ends without an outcome."""
    try:
        yield from response.iter_lines()
    except httpx.TransportError as exc:
        lost.append(f"{type(exc).__name__}: {exc}")


@config_app.command("show")
def config_show(url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Show the latest runtime config and the version each alive worker has applied."""
    with _ReportApiErrors(url), _http_client(url, token) as client:
        doc = _json_object(client.get("/runtime-config"))
    Console().print(*runtime_config_tables(doc))


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


@app.command()
def workers(url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Show every registered worker: status, liveness, load and applied config version."""
    with _ReportApiErrors(url), _http_client(url, token) as client:
        doc = _json(client.get("/workers"))
    rows = doc.get("workers") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        _fail("unexpected /workers response: no list of workers")
    Console().print(workers_table(rows, datetime.now(UTC)))


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


def workers_table(rows: Iterable[object], now: datetime) -> Table:
    table = Table(title="workers")
    table.add_column("id", no_wrap=True)
    table.add_column("status")
    table.add_column("alive")
    for name in ("concurrency", "inflight", "strict inflight", "applied version", "last heartbeat"):
        table.add_column(name, justify="right")
    for worker in rows:
        if not isinstance(worker, dict):
            continue
        alive = worker.get("alive")
        table.add_row(
            _cell(worker.get("id")),
            _cell(worker.get("status")),
            Text("yes", style="green") if alive else Text("no", style="red"),
            _cell(worker.get("concurrency")),
            _cell(worker.get("inflight")),
            _cell(worker.get("strict_inflight")),
            _cell(worker.get("applied_config_version")),
            heartbeat_age(worker, now),
        )
    return table
