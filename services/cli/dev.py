"""``taskfleet dev``: the whole system on one machine, no Docker (docs/reference.md#cli).

An embedded Postgres when ``DATABASE_URL`` is unset, the migrations, then the API and N workers as
child processes (:mod:`taskfleet.cli.supervisor`). Ctrl-C or SIGTERM stops the children (SIGTERM,
SIGKILL after the workers' drain timeout plus 5 s), then the database, and exits 0. A child that
dies on its own is reported and everything is stopped, exit code 1.

Before starting anything it checks what would make a part fail (:mod:`taskfleet.cli.dev_checks`):
the settings, the task modules, another ``taskfleet dev`` in the same folder, the ports, and the
database's connection limit (the embedded server is resized for the workers asked for; an
external one that is too small is refused). The "running" banner is printed only once every part
answers on its ``/readyz``; if one does not in time, everything is stopped, exit code 1.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

import typer

from taskfleet.cli.console_link import console_url
from taskfleet.cli.dev_checks import (
    CONNECTIONS_PER_WORKER,
    SPARE_CONNECTIONS,
    DevLock,
    check_ports,
    connection_limit,
    connections_needed,
)
from taskfleet.cli.errors import explained
from taskfleet.cli.main import GlobalOptions, app, import_path_from_current_directory
from taskfleet.cli.settings_errors import load_settings
from taskfleet.cli.supervisor import (
    Child,
    StopRequest,
    say,
    silence_output,
    supervise,
    taskfleet_command,
)
from taskfleet.shared.errors import ConfigurationError, OperatorError
from taskfleet.shared.registry import load_registry
from taskfleet.shared.settings import ApiSettings, WorkerSettings

#: Extra time, past the workers' drain timeout, that the children get before SIGKILL.
KILL_GRACE_SECONDS = 5.0
_PLACEHOLDER_URL = "postgresql://localhost/settings-check"


def _display_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _admin_token(tokens: dict[str, str] | None) -> str | None:
    return next((token for token, role in (tokens or {}).items() if role == "admin"), None)


def _banner(
    children: Sequence[Child],
    *,
    api_base: str,
    database: str,
    tokens: dict[str, str] | None,
    tokens_generated: bool,
) -> None:
    lines = ["", "taskfleet is running.", f"  database  {database}"]
    for child in children:
        if child.name == "api":
            lines.append(f"  API       {api_base}")
            lines.append(f"  docs      {api_base}/docs")
            lines.append(f"  console   {console_url(api_base, _admin_token(tokens))}")
            lines.append(f"  metrics   {api_base}/metrics")
        else:
            metrics = child.health_url.rsplit("/", 1)[0] + "/metrics"
            lines.append(f"  {child.name:<9} {metrics}")
    auth = ""
    if tokens is None:
        lines.append("  auth      off (--no-auth): anyone who reaches the port can do anything")
    else:
        by_role = {role: token for token, role in tokens.items()}
        origin = "generated for this run" if tokens_generated else "from TASKFLEET_API_TOKENS"
        lines.append(f"  tokens    ({origin})")
        for role in ("admin", "submit"):
            if role in by_role:
                lines.append(f"            {role}: {by_role[role]}")
        token = by_role.get("submit") or by_role["admin"]
        auth = f" -H 'Authorization: Bearer {token}'"
        admin = by_role.get("admin")
        if admin:
            lines += ["", "For the taskfleet client commands:"]
            lines.append(f"  export TASKFLEET_URL={api_base} TASKFLEET_TOKEN={admin}")
    body = '{"type": "demo.echo", "payload": {"value": "hello"}}'
    lines += [
        "",
        "Try it (submit a demo.echo task, then wait for its result):",
        f"  id=$(curl -sf -X POST {api_base}/tasks{auth} -H 'Content-Type: application/json' \\",
        f"       -d '{body}' | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"id\"])')",
        f'  curl -s "{api_base}/tasks/$id/wait?timeout=10"{auth}',
        "",
        "Ctrl-C stops everything.",
        "",
    ]
    try:
        typer.echo("\n".join(lines))
    except OSError:
        silence_output()


@app.command()
def dev(
    workers: int = typer.Option(
        2,
        min=0,
        envvar="TASKFLEET_WORKERS",
        help="Worker processes (metrics on 9100, 9101, ..., from TASKFLEET_METRICS_PORT).",
    ),
    port: int = typer.Option(8000, envvar="TASKFLEET_PORT", help="API port."),
    no_auth: bool = typer.Option(
        False,
        "--no-auth",
        envvar="TASKFLEET_AUTH_DISABLED",
        help="Run the API without authentication.",
    ),
) -> None:
    """Run everything on this machine: Postgres, migrations, the API and N workers.

    Starts an embedded Postgres unless DATABASE_URL is set. Ctrl-C or SIGTERM stops it all."""
    stop = StopRequest()
    stop.install()

    host = os.environ.get("TASKFLEET_HOST") or "127.0.0.1"
    metrics_host = os.environ.get("TASKFLEET_METRICS_HOST") or "127.0.0.1"
    tokens_raw = os.environ.get("TASKFLEET_API_TOKENS", "").strip()
    tokens_generated = not tokens_raw and not no_auth
    if tokens_generated:
        tokens_raw = f"admin:{secrets.token_urlsafe(18)},submit:{secrets.token_urlsafe(18)}"

    # Check every setting the children will read before starting anything.
    api_settings = load_settings(
        ApiSettings,
        {
            "database_url": _PLACEHOLDER_URL,
            "host": host,
            "port": port,
            "api_tokens": tokens_raw or None,
            "auth_disabled": no_auth,
        },
    )
    worker_settings = load_settings(
        WorkerSettings, {"database_url": _PLACEHOLDER_URL, "metrics_host": metrics_host}
    )
    grace = worker_settings.drain_timeout + KILL_GRACE_SECONDS
    import_path_from_current_directory()
    load_registry(worker_settings.task_modules)
    api_base = f"http://{_display_host(host)}:{port}"
    # TASKFLEET_METRICS_PORT (default 9100) is the first worker's; the others follow it.
    first_metrics_port = worker_settings.metrics_port or 9100
    metrics_ports = [first_metrics_port + i for i in range(workers)]

    from taskfleet.shared.embedded import default_datadir

    datadir = default_datadir()
    lock = DevLock(datadir.with_name(f"{datadir.name}.dev.lock"))
    lock.acquire(api_base)
    needed = connections_needed(workers, api_settings.db_pool_size)

    external_url = os.environ.get("DATABASE_URL") or os.environ.get("TASKFLEET_DATABASE_URL")
    embedded = None
    try:
        if external_url:
            url = external_url
            database = f"{_without_password(url)} (DATABASE_URL)"
            try:
                limit, usable = connection_limit(url)
            except Exception as exc:
                raise explained(exc, url) from exc
            if needed > usable:
                raise ConfigurationError(
                    f"--workers {workers} needs up to {needed} database connections (the API's "
                    f"pool of {api_settings.db_pool_size}, {CONNECTIONS_PER_WORKER} per worker, "
                    f"{SPARE_CONNECTIONS} spare) but the database at DATABASE_URL allows "
                    f"{usable} (max_connections {limit}): ask for fewer workers, or raise "
                    "max_connections"
                )
            check_ports(host, port, metrics_host, metrics_ports)
        else:
            from taskfleet.shared.embedded import restart_with_max_connections, start_embedded

            check_ports(host, port, metrics_host, metrics_ports)
            say(f"starting the embedded Postgres (data in {datadir})")
            try:
                url, embedded = start_embedded(datadir, handle_sigterm=False)
            except Exception as exc:
                raise OperatorError(f"could not start the embedded Postgres: {exc}") from exc
            limit, _ = connection_limit(url)
            if needed > limit:
                say(
                    f"raising the embedded Postgres' max_connections from {limit} to {needed} "
                    f"for {workers} workers (restarts it)"
                )
                url, embedded = restart_with_max_connections(embedded, needed, handle_sigterm=False)
            database = f"embedded Postgres, psql '{url}'"
        if stop.requested:
            raise typer.Exit(0)

        say("applying migrations")
        from taskfleet.shared import migrations

        try:
            migrations.upgrade(url)
        except Exception as exc:
            raise explained(exc, url) from exc
        if stop.requested:
            raise typer.Exit(0)

        env = dict(os.environ)
        env.pop("TASKFLEET_DATABASE_URL", None)  # it would win over DATABASE_URL
        env["DATABASE_URL"] = url
        env["TASKFLEET_METRICS_HOST"] = metrics_host
        env["PYTHONUNBUFFERED"] = "1"
        if tokens_raw:
            env["TASKFLEET_API_TOKENS"] = tokens_raw
        if no_auth:
            env["TASKFLEET_AUTH_DISABLED"] = "true"

        command = taskfleet_command() + (["--verbose"] if GlobalOptions.verbose else [])
        metrics_base = f"http://{_display_host(metrics_host)}"
        children = [
            Child(
                "api", [*command, "api", "--host", host, "--port", str(port)], f"{api_base}/readyz"
            )
        ]
        for i, metrics_port in enumerate(metrics_ports):
            children.append(
                Child(
                    f"worker {i + 1}",
                    [*command, "worker", "--metrics-port", str(metrics_port)],
                    f"{metrics_base}:{metrics_port}/readyz",
                )
            )

        def announce(ready: Sequence[Child]) -> None:
            _banner(
                ready,
                api_base=api_base,
                database=database,
                tokens=None if no_auth else api_settings.tokens(),
                tokens_generated=tokens_generated,
            )

        status = supervise(children, env, grace, stop, announce)
    finally:
        if embedded is not None:
            embedded.stop()
            say("embedded Postgres stopped")
        lock.release()
    raise typer.Exit(status)
