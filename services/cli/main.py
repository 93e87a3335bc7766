"""The ``taskfleet`` command (docs/reference.md#cli)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="taskfleet",
    help="A Postgres-backed task system: control plane, workers, and a client.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def api(
    host: str = typer.Option(None, help="Bind address (default 0.0.0.0, TASKFLEET_HOST)."),
    port: int = typer.Option(None, help="Port (default 8000, TASKFLEET_PORT)."),
) -> None:
    """Run the HTTP control plane (uvicorn, one process)."""
    from taskfleet.api.server import serve
    from taskfleet.cli.settings_errors import load_settings
    from taskfleet.shared.settings import ApiSettings

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings(ApiSettings, overrides)
    serve(settings)


@app.command()
def worker(
    concurrency: int = typer.Option(None, help="Task slots (default 10)."),
    metrics_port: int = typer.Option(None, help="Port of /metrics and health (default 9100)."),
    worker_id: str = typer.Option(None, help="Worker id (default hostname-pid-random)."),
) -> None:
    """Run one worker process: claims and runs tasks until SIGTERM/SIGINT, then drains."""
    from taskfleet.cli.settings_errors import load_settings
    from taskfleet.shared.settings import WorkerSettings
    from taskfleet.worker.main import run_worker_process

    overrides = {
        k: v
        for k, v in {
            "concurrency": concurrency,
            "metrics_port": metrics_port,
            "worker_id": worker_id,
        }.items()
        if v is not None
    }
    settings = load_settings(WorkerSettings, overrides)
    raise typer.Exit(run_worker_process(settings))


@app.command()
def migrate() -> None:
    """Apply the database migrations (alembic upgrade head, under an advisory lock)."""
    from taskfleet.cli.settings_errors import load_settings
    from taskfleet.shared import migrations
    from taskfleet.shared.settings import CommonSettings

    settings = load_settings(CommonSettings, {})
    migrations.upgrade(settings.database_url)
    typer.echo(f"schema at {migrations.head_revision()}")


def main() -> None:
    # Client and dev commands register themselves on import.
    from taskfleet.cli import client, dev  # noqa: F401

    app()
