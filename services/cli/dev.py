"""``taskfleet dev``: the whole system on one machine, no Docker (docs/reference.md#cli).

An embedded Postgres when ``DATABASE_URL`` is unset, the migrations, then the API and N workers as
child processes. Ctrl-C or SIGTERM stops the children (SIGTERM, SIGKILL after the workers' drain
timeout plus 5 s), then the database, and exits 0. A child that dies on its own is reported and
everything is stopped, exit code 1.

The children get a process group of their own, so a Ctrl-C in the terminal reaches only this
supervisor, which stops them in order; on Linux they also get SIGTERM if the supervisor dies.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

import typer

from taskfleet.cli.console_link import console_url
from taskfleet.cli.main import app
from taskfleet.cli.settings_errors import load_settings
from taskfleet.shared.settings import ApiSettings, WorkerSettings

#: Extra time, past the workers' drain timeout, that the children get before SIGKILL.
KILL_GRACE_SECONDS = 5.0
#: How long the children get to answer on their health endpoints before the banner is printed.
READY_TIMEOUT_SECONDS = 60.0
_PLACEHOLDER_URL = "postgresql://localhost/settings-check"


def _say(message: str) -> None:
    try:
        typer.echo(f"taskfleet dev: {message}", err=True)
    except OSError:  # e.g. `taskfleet dev | tee log` and Ctrl-C killed tee: keep shutting down
        _silence_output()


def _silence_output() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


@dataclass
class Child:
    """One child process: the API or a worker."""

    name: str
    argv: list[str]
    health_url: str
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()


@dataclass
class StopRequest:
    """Set by SIGINT/SIGTERM: the first signal asks for an orderly stop, a second for SIGKILL."""

    signum: int | None = None
    count: int = 0
    previous: dict[int, object] = field(default_factory=dict)

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum

    @property
    def requested(self) -> bool:
        return self.count > 0

    @property
    def forced(self) -> bool:
        return self.count > 1


def taskfleet_command() -> list[str]:
    """How to run ``taskfleet`` with this interpreter: the console script installed beside it,
    else the CLI module (a checkout that is importable but not installed)."""
    script = Path(sys.executable).with_name("taskfleet")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "from taskfleet.cli.main import main; main()"]


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None

    def set_pdeathsig() -> None:  # runs in the child between fork and exec
        import ctypes

        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_pdeathsig


def _signal_group(child: Child, signum: int) -> None:
    if child.process is None:
        return
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(200 <= response.status < 300)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _display_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def stop_children(children: Sequence[Child], grace: float, stop: StopRequest) -> None:
    """SIGTERM every live child's process group, wait up to ``grace`` seconds (less if a second
    signal arrives), then SIGKILL whatever is left."""
    live = [c for c in children if c.process is not None and c.exited() is None]
    for child in live:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(c.exited() is None for c in live):
        if time.monotonic() >= deadline or stop.forced:
            break
        time.sleep(0.1)
    for child in live:
        if child.exited() is None:
            _say(f"{child.name} (pid {child.pid}) did not stop in time; killing it")
        # Also reaps anything the child started in its group.
        _signal_group(child, signal.SIGKILL)
        assert child.process is not None
        child.process.wait()


def supervise(
    children: Sequence[Child],
    env: dict[str, str],
    grace: float,
    stop: StopRequest,
    on_ready: Callable[[Sequence[Child]], None],
) -> int:
    """Start the children, wait until they answer (or READY_TIMEOUT_SECONDS), call ``on_ready``,
    then watch them until a signal (-> 0) or an unexpected exit (-> 1). Always stops them."""
    parent_pid = os.getpid()
    status = 0
    try:
        for child in children:
            if stop.requested:
                return 0
            child.process = subprocess.Popen(
                child.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                process_group=0,
                preexec_fn=_die_with_parent(parent_pid),
            )
            _say(f"started {child.name} (pid {child.pid}): {shlex.join(child.argv)}")

        announced = False
        ready_deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not stop.requested:
            for child in children:
                code = child.exited()
                if code is not None:
                    _say(f"{child.name} (pid {child.pid}) exited unexpectedly with code {code}")
                    status = 1
                    return status
            if not announced:
                for child in children:
                    if not child.ready:
                        child.ready = _answers(child.health_url)
                if all(c.ready for c in children) or time.monotonic() > ready_deadline:
                    on_ready(children)
                    announced = True
            time.sleep(0.2)
        name = signal.Signals(stop.signum).name if stop.signum else "signal"
        _say(f"{name} received; stopping")
        return 0
    finally:
        stop_children(children, grace, stop)
        _say("all processes stopped" if status == 0 else "stopped everything after the failure")


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
        mark = "" if child.ready else "   (not answering yet)"
        if child.name == "api":
            lines.append(f"  API       {api_base}{mark}")
            lines.append(f"  docs      {api_base}/docs")
            lines.append(f"  console   {console_url(api_base, _admin_token(tokens))}")
            lines.append(f"  metrics   {api_base}/metrics")
        else:
            metrics = child.health_url.rsplit("/", 1)[0] + "/metrics"
            lines.append(f"  {child.name:<9} {metrics}{mark}")
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
        _silence_output()


@app.command()
def dev(
    workers: int = typer.Option(
        2, min=0, envvar="TASKFLEET_WORKERS", help="Worker processes (metrics on 9100, 9101, ...)."
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

    external_url = os.environ.get("DATABASE_URL") or os.environ.get("TASKFLEET_DATABASE_URL")
    embedded = None
    try:
        if external_url:
            url = external_url
            database = f"{_without_password(url)} (DATABASE_URL)"
        else:
            from taskfleet.shared.embedded import default_datadir, start_embedded

            datadir = default_datadir()
            _say(f"starting the embedded Postgres (data in {datadir})")
            try:
                url, embedded = start_embedded(datadir, handle_sigterm=False)
            except Exception as exc:
                _say(f"could not start the embedded Postgres: {exc}")
                raise typer.Exit(1) from None
            database = f"embedded Postgres, psql '{url}'"
        if stop.requested:
            raise typer.Exit(0)

        _say("applying migrations")
        from taskfleet.shared import migrations

        try:
            migrations.upgrade(url)
        except Exception as exc:
            _say(f"migrations failed: {type(exc).__name__}: {exc}")
            raise typer.Exit(1) from None
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

        command = taskfleet_command()
        api_base = f"http://{_display_host(host)}:{port}"
        metrics_base = f"http://{_display_host(metrics_host)}"
        children = [
            Child(
                "api", [*command, "api", "--host", host, "--port", str(port)], f"{api_base}/healthz"
            )
        ]
        for i in range(workers):
            metrics_port = 9100 + i
            children.append(
                Child(
                    f"worker {i + 1}",
                    [*command, "worker", "--metrics-port", str(metrics_port)],
                    f"{metrics_base}:{metrics_port}/healthz",
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
            _say("embedded Postgres stopped")
    raise typer.Exit(status)
