"""``taskfleet schedules list|get|set|delete``: periodic tasks (docs/reference.md#cli).

Built on :class:`taskfleet.Client` like the other client commands: ``TASKFLEET_URL``,
``TASKFLEET_TOKEN`` (reading needs the submit role, ``set`` and ``delete`` admin), exit 1 for an
API or connection error, 2 for bad options caught before any request is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from taskfleet.cli.client import (
    DEFAULT_URL,
    TokenOption,
    UrlOption,
    _cell,
    _client,
    _ReportApiErrors,
    _usage_error,
    check_seconds,
    parse_payload,
)
from taskfleet.cli.main import app

schedules_app = typer.Typer(
    name="schedules",
    help="List, read, set or delete the periodic tasks (schedules).",
    no_args_is_help=True,
)
app.add_typer(schedules_app, name="schedules")


def _check_name(name: str) -> str:
    # The API's rule, checked here: a slash would be decoded into the path and answered 404.
    if "/" in name:
        raise typer.BadParameter("must not contain a slash", param_hint="'NAME'")
    return name


NameArgument = Annotated[
    str,
    typer.Argument(
        metavar="NAME",
        help="The schedule's name, for example report.daily.",
        callback=_check_name,
    ),
]


def timing(schedule: Mapping[str, Any]) -> str:
    """``every 30s``, or the cron expression with its zone (``0 6 * * * Europe/Berlin``)."""
    if schedule.get("every"):
        return f"every {schedule['every']}"
    zone = schedule.get("timezone")
    suffix = f" {zone}" if zone and zone != "UTC" else ""
    return f"{_cell(schedule.get('cron'))}{suffix}"


def _parse(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def relative(raw: object, now: datetime) -> str:
    """``in 4h59m`` or ``12s ago`` (against this machine's clock), ``-`` when unknown."""
    when = _parse(raw)
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return f"in {_span(delta)}" if delta >= 0 else f"{_span(delta)} ago"


def schedules_table(rows: Iterable[object], now: datetime, *, wide: bool = False) -> Table:
    """The schedules. Narrow (the default) fits 80 columns: name, type, timing, the next run
    and the last one relative to now. ``wide`` adds the exact times, labels, priority and the
    source (api or code)."""
    table = Table(title="schedules", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("schedule", overflow="fold")
    table.add_column("type", overflow="fold")
    table.add_column("when", overflow="fold")
    table.add_column("next", no_wrap=True)
    table.add_column("last", no_wrap=True)
    if wide:
        for name in ("next at", "last at", "labels", "priority", "source"):
            table.add_column(name, no_wrap=name != "labels")
    for schedule in rows:
        if not isinstance(schedule, dict):
            continue
        row = [
            _cell(schedule.get("name")),
            _cell(schedule.get("type")),
            timing(schedule),
            relative(schedule.get("next_run_at"), now),
            relative(schedule.get("last_run_at"), now),
        ]
        if wide:
            row += [
                _cell(schedule.get("next_run_at")),
                _cell(schedule.get("last_run_at")),
                ", ".join(schedule.get("labels") or []) or "-",
                _cell(schedule.get("priority")),
                _cell(schedule.get("source")),
            ]
        table.add_row(*row)
    return table


def schedule_detail(schedule: Mapping[str, Any]) -> Table:
    """One schedule, a field per line."""
    table = Table(title=f"schedule {schedule.get('name')}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key in (
        "type",
        "cron",
        "timezone",
        "every",
        "payload",
        "labels",
        "requires",
        "priority",
        "weight",
        "max_attempts",
        "timeout_seconds",
        "source",
        "next_run_at",
        "last_run_at",
        "last_task_id",
        "created_at",
        "updated_at",
    ):
        value = schedule.get(key)
        if key in ("cron", "timezone", "every") and value is None:
            continue
        table.add_row(key, _cell(value))
    return table


#: What ``--wide`` adds here (the workers command's option names the workers' columns).
ScheduleWideOption = Annotated[
    bool,
    typer.Option(
        "--wide/--narrow",
        help="Show every column (exact next and last times, labels, priority, source), wider "
        "than 80 columns.",
    ),
]


@schedules_app.command("list")
def schedules_list(
    wide: ScheduleWideOption = False, url: UrlOption = DEFAULT_URL, token: TokenOption = None
) -> None:
    """Show every schedule: its timing, when it runs next and when it last ran."""
    with _ReportApiErrors(url), _client(url, token) as client:
        rows = [s.model_dump(mode="json") for s in client.schedules()]
    Console().print(schedules_table(rows, datetime.now(UTC), wide=wide))


@schedules_app.command("get")
def schedules_get(
    name: NameArgument, url: UrlOption = DEFAULT_URL, token: TokenOption = None
) -> None:
    """Show one schedule, every field."""
    with _ReportApiErrors(url), _client(url, token) as client:
        schedule = client.schedule(name)
    Console().print(schedule_detail(schedule.model_dump(mode="json")))


@schedules_app.command("set")
def schedules_set(
    name: NameArgument,
    task_type: Annotated[
        str, typer.Option("--type", help="The task type it enqueues, for example demo.echo.")
    ],
    cron: Annotated[
        str | None,
        typer.Option(help="A cron expression, for example '0 6 * * *'. Not with --every."),
    ] = None,
    every: Annotated[
        str | None, typer.Option(help="A duration, for example 30s, 5m or 1h. Not with --cron.")
    ] = None,
    timezone: Annotated[
        str | None,
        typer.Option(help="The time zone of --cron, for example Europe/Berlin (default UTC)."),
    ] = None,
    payload: Annotated[str, typer.Option(help="The tasks' payload, a JSON object.")] = "{}",
    priority: Annotated[
        int | None,
        typer.Option(min=0, help="Priority 0 or more; above 0 the tasks are in the strict lane."),
    ] = None,
    weight: Annotated[
        int | None, typer.Option(min=1, help="Weight 1 or more; higher runs first in its group.")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="A label; repeat the option for more.")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(min=1, help="Attempts before a task fails for good.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds one attempt may run (more than 0).")
    ] = None,
    requires: Annotated[
        list[str] | None,
        typer.Option("--requires", help="A worker tag the tasks need; repeat for more."),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Create or replace a schedule (PUT /schedules/NAME) and show it.

    Exactly one of --cron and --every. Exit 0 when stored, 1 when the API refused it, 2 for
    bad options.
    """
    if (cron is None) == (every is None):
        _usage_error("--cron", "give exactly one of --cron and --every")
    if timezone is not None and cron is None:
        _usage_error("--timezone", "goes with --cron only")
    try:
        body = parse_payload(payload)
    except ValueError as exc:
        _usage_error("--payload", str(exc))
    check_seconds("--timeout", timeout)
    optional: dict[str, Any] = {
        "cron": cron,
        "every": every,
        "timezone": timezone,
        "priority": priority,
        "weight": weight,
        "labels": label or None,
        "max_attempts": max_attempts,
        "timeout_seconds": timeout,
        "requires": requires or None,
    }
    fields: Any = {k: v for k, v in optional.items() if v is not None}
    with _ReportApiErrors(url), _client(url, token) as client:
        schedule = client.set_schedule(name, task_type, body, **fields)
    Console().print(schedule_detail(schedule.model_dump(mode="json")))


@schedules_app.command("delete")
def schedules_delete(
    name: NameArgument, url: UrlOption = DEFAULT_URL, token: TokenOption = None
) -> None:
    """Delete a schedule; the tasks it already enqueued stay."""
    with _ReportApiErrors(url), _client(url, token) as client:
        client.delete_schedule(name)
    typer.echo(f"schedule {name} deleted")
