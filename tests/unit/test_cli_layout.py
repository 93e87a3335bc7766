"""The CLI as a person reads it: tables that fit 80 columns with whole headers, plain boolean
flags, and help text in whole sentences."""

from __future__ import annotations

import io
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import click
import typer
from rich.console import Console

import taskfleet.cli.client  # noqa: F401  (registers the client commands on the app)
from taskfleet.cli.client import workers_table
from taskfleet.cli.main import app

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def worker(n: int, **fields: object) -> dict[str, object]:
    return {
        # As long as the default ids are: hostname-pid-random.
        "id": f"build-runner-0{n}.internal-48213-9f3a2c",
        "hostname": f"build-runner-0{n}.internal",
        "pid": 48213,
        "concurrency": 1000,
        "status": "online",
        "alive": True,
        "inflight": 1000,
        "strict_inflight": 250,
        "applied_config_version": 12345,
        "started_at": (NOW - timedelta(days=3)).isoformat(),
        "last_heartbeat": (NOW - timedelta(hours=3, minutes=5)).isoformat(),
        "metrics_port": 9100,
        **fields,
    }


def render(width: int, **options: bool) -> list[str]:
    out = io.StringIO()
    rows = [
        worker(1),
        worker(2, status="online", alive=False),
        worker(3, status="draining", alive=False),
    ]
    Console(file=out, width=width, color_system=None).print(workers_table(rows, NOW, **options))
    return out.getvalue().splitlines()


def test_workers_fits_80_columns_and_abbreviates_nothing() -> None:
    lines = render(80)
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "…" not in text
    header = next(line for line in lines if "state" in line).split()
    assert header == ["worker", "state", "busy", "strict", "config", "heartbeat"]
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("build-runner-01"))
    first = lines[at].split()
    # The id is too long for its share of 80 columns: it folds onto the next line, whole.
    assert first[0] + lines[at + 1].strip() == "build-runner-01.internal-48213-9f3a2c"
    assert first[1:] == ["online", "1000/1000", "250", "12345", "3h05m", "ago"]
    states = [line.split()[1] for line in lines if line.lstrip().startswith("build-runner")]
    assert states == ["online", "lost", "draining"]


def test_workers_wide_adds_host_pid_start_and_metrics_port() -> None:
    lines = render(200, wide=True)
    header = next(line for line in lines if "state" in line)
    for name in ("host", "pid", "started", "metrics port"):
        assert name in header
    assert "build-runner-01.internal " in next(
        line for line in lines if line.lstrip().startswith("build-runner-01")
    )


def _commands(group: click.Command, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in getattr(group, "commands", {}).items():
        found.append((prefix + name, command))
        found.extend(_commands(command, f"{prefix}{name} "))
    return found


def test_boolean_options_are_plain_flags_and_help_is_whole_sentences() -> None:
    import taskfleet.cli.dev  # noqa: F401  (registers `dev`)

    commands = _commands(typer.main.get_command(app))
    assert {"submit", "workers", "config set", "config show", "api", "worker"} <= dict(
        commands
    ).keys()
    for name, command in commands:
        assert command.help, name
        first_line = command.help.strip().splitlines()[0]
        assert first_line[0].isupper() and first_line.endswith("."), (name, first_line)
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            assert param.help, (name, param.name)
            assert param.help[0].isupper() and param.help.endswith("."), (name, param.help)
            if param.is_bool_flag or param.type is click.BOOL:
                assert param.is_flag, (name, param.name)  # never `--wait <bool>`


def test_schedules_fit_80_columns_and_abbreviate_nothing() -> None:
    from taskfleet.cli.schedules import schedules_table

    rows = [
        {
            "name": "reports.finance.quarterly-close-summary",
            "type": "reports.finance.generate-quarterly-summary",
            "cron": "*/15 9-17 * * 1-5",
            "timezone": "America/Argentina/Buenos_Aires",
            "every": None,
            "next_run_at": (NOW + timedelta(hours=3, minutes=5)).isoformat(),
            "last_run_at": (NOW - timedelta(days=12)).isoformat(),
        },
        {
            "name": "tick",
            "type": "demo.echo",
            "cron": None,
            "every": "1s",
            "timezone": None,
            "next_run_at": NOW.isoformat(),
            "last_run_at": None,
        },
    ]
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(schedules_table(rows, NOW))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "…" not in text
    header = next(line for line in lines if "schedule" in line and "type" in line).split()
    assert header == ["schedule", "type", "when", "next", "last"]
    assert "in 3h05m" in text and "12d00h ago" in text and "every 1s" in text
    # Long names fold onto further lines, whole: every character is there, in order.
    first = [
        line.split()[0]
        for line in lines[lines.index(next(x for x in lines if "─" in x)) + 1 :]
        if line.strip()
    ]
    assert "".join(first[:3]) == "reports.finance.quarterly-close-summary"


def test_the_command_order_does_not_depend_on_what_was_imported_first() -> None:
    # A command is registered when its module is imported: a process that imported `dev` before
    # `client` (a test did) listed `dev` first, and the generated reference no longer matched.
    # Each order in its own interpreter, as the test run's module cache would mix them.
    program = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "from taskfleet.cli.main import load_commands\n"
        "app = load_commands()\n"
        "print([c.callback.__name__ for c in app.registered_commands])\n"
        "print([g.name for g in app.registered_groups])\n"
    )

    def order(*first: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", program, *first], capture_output=True, text=True, check=True
        )
        return done.stdout

    entry_point = order()
    assert "'dev'" in entry_point and "'submit'" in entry_point
    assert entry_point.index("'submit'") < entry_point.index("'dev'")  # client's, then dev's
    assert order("taskfleet.cli.dev") == entry_point
    assert order("taskfleet.cli.schedules", "taskfleet.cli.dev") == entry_point
