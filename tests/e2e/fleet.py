"""Real processes for end-to-end tests: ``taskfleet api`` under uvicorn and ``taskfleet worker``.

Every process gets its own ephemeral port, short timers, and its output in a log file that a
failing test prints. Nothing here sleeps for a fixed time: waits poll a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from taskfleet.shared.db import asyncpg_dsn
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "admin-e2e-token-0001"
SUBMIT_TOKEN = "submit-e2e-token-0001"

#: Short timers so faults resolve in seconds; lease_ttl > 2 x heartbeat (settings rule).
FAST_TIMERS = {
    "TASKFLEET_POLL_INTERVAL": "0.5",
    "TASKFLEET_HEARTBEAT_INTERVAL": "0.5",
    "TASKFLEET_LEASE_TTL": "3",
    "TASKFLEET_SWEEP_INTERVAL": "0.5",
    "TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL": "1",
    "TASKFLEET_DRAIN_TIMEOUT": "5",
}


def taskfleet_command() -> list[str]:
    return [sys.executable, "-m", "taskfleet.cli"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the API, or a worker's /metrics and health port."""
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Fleet:
    """An API and workers against one database. Use as an async context manager."""

    database_url: str
    env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tf-e2e-")))
    api: Proc | None = None
    #: The processes' working directory (a user's project folder); default the repository.
    cwd: Path = REPO

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
        env.update(
            {
                "DATABASE_URL": self.database_url,
                "TASKFLEET_API_TOKENS": f"admin:{ADMIN_TOKEN},submit:{SUBMIT_TOKEN}",
                "TASKFLEET_LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
                **FAST_TIMERS,
                **self.env,
                **(extra or {}),
            }
        )
        return env

    def _spawn(self, name: str, args: list[str], port: int, env: dict[str, str]) -> Proc:
        log_path = self.workdir / f"{name}.log"
        log_file = log_path.open("wb")
        popen = subprocess.Popen(
            [*taskfleet_command(), *args],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.cwd,
        )
        log_file.close()
        proc = Proc(name, popen, log_path, port)
        self.procs.append(proc)
        return proc

    async def start_api(
        self, extra_env: dict[str, str] | None = None, *, wait_ready: bool = True
    ) -> Proc:
        """Start ``taskfleet api``; wait for /readyz (or, without ``wait_ready``, /healthz)."""
        port = free_port()
        proc = self._spawn(
            "api",
            ["api", "--host", "127.0.0.1", "--port", str(port)],
            port,
            self._env(extra_env),
        )
        self.api = proc
        probe = "readyz" if wait_ready else "healthz"
        await wait_http(f"http://127.0.0.1:{port}/{probe}", proc)
        return proc

    async def start_worker(
        self,
        worker_id: str,
        *,
        concurrency: int = 4,
        extra_env: dict[str, str] | None = None,
        wait_ready: bool = True,
    ) -> Proc:
        port = free_port()
        proc = self._spawn(
            worker_id,
            [
                "worker",
                "--concurrency",
                str(concurrency),
                "--metrics-port",
                str(port),
                "--worker-id",
                worker_id,
            ],
            port,
            self._env({"TASKFLEET_METRICS_HOST": "127.0.0.1", **(extra_env or {})}),
        )
        if wait_ready:
            await wait_http(f"http://127.0.0.1:{port}/readyz", proc)
        return proc

    async def start_workers(
        self,
        *worker_ids: str,
        concurrency: int = 4,
        extra_env: dict[str, str] | None = None,
    ) -> list[Proc]:
        """Start several workers at once (their start-ups overlap); each is ready on return."""
        return list(
            await asyncio.gather(
                *(
                    self.start_worker(w, concurrency=concurrency, extra_env=extra_env)
                    for w in worker_ids
                )
            )
        )

    def proc(self, name: str) -> Proc:
        """The process started under ``name`` (``api`` or a worker id), the latest one."""
        for proc in reversed(self.procs):
            if proc.name == name:
                return proc
        raise KeyError(name)

    @property
    def api_url(self) -> str:
        assert self.api is not None, "start_api() first"
        return f"http://127.0.0.1:{self.api.port}"

    def client(self, token: str = ADMIN_TOKEN, timeout: float = 30.0) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            # Under uvicorn's 5 s keep-alive: a test that waits longer between two requests
            # (a metrics snapshot is up to 5 s old) never reuses a connection being closed.
            limits=httpx.Limits(keepalive_expiry=2.0),
        )

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(asyncpg_dsn(self.database_url))

    async def stop(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                await asyncio.to_thread(proc.wait, 10)

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} (exit {p.popen.poll()})\n{p.log()}" for p in self.procs)

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.stop()
        if exc is not None:
            print(self.logs()[-20000:])


async def wait_http(url: str, proc: Proc | None = None, timeout: float = 90.0) -> None:
    """Until GET url answers 200 (the process's /readyz)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited early:\n{proc.log()[-5000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                log = proc.log()[-5000:] if proc else ""
                raise TimeoutError(f"{url} not ready after {timeout}s\n{log}")
            await asyncio.sleep(0.05)


async def eventually(
    check: Callable[[], Awaitable[Any]], *, timeout: float = 30.0, interval: float = 0.05
) -> Any:
    """Poll ``check`` until it returns a truthy value; that value is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


async def scrape_metric(url: str, name: str, **labels: str) -> float | None:
    """The sum of the samples of metric ``name`` (a sample name as exposed, e.g. a counter's
    ``..._total``) at ``url`` (a /metrics endpoint) whose labels include ``labels``; None when
    no such sample is exposed."""
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(url)
    response.raise_for_status()
    found: float | None = None
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                found = (found or 0.0) + sample.value
    return found


#: Task statuses a task never leaves.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


async def task_rows(conn: asyncpg.Connection, ids: list[int]) -> dict[int, dict[str, Any]]:
    """The rows of tasks ``ids`` (read from the database, the truth), by id; ``payload`` and
    ``result`` decoded from JSON."""
    rows = await conn.fetch(
        "SELECT id, type, payload::text, status, attempts, max_attempts, worker_id, "
        "result::text, last_error, started_at, finished_at "
        "FROM taskfleet.tasks WHERE id = ANY($1::bigint[])",
        ids,
    )
    decoded: dict[int, dict[str, Any]] = {}
    for row in rows:
        item = dict(row)
        for key in ("payload", "result"):
            item[key] = json.loads(item[key]) if item[key] is not None else None
        decoded[row["id"]] = item
    return decoded


async def wait_tasks_terminal(
    conn: asyncpg.Connection, ids: list[int], *, timeout: float = 60.0
) -> dict[int, dict[str, Any]]:
    """Until every task in ``ids`` is completed, failed or cancelled; their rows by id. On
    timeout the error counts the statuses it last saw."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await task_rows(conn, ids)
        if len(rows) == len(set(ids)) and all(
            r["status"] in TERMINAL_STATUSES for r in rows.values()
        ):
            return rows
        if time.monotonic() > deadline:
            counts: dict[str, int] = {}
            for row in rows.values():
                counts[row["status"]] = counts.get(row["status"], 0) + 1
            missing = len(set(ids)) - len(rows)
            raise TimeoutError(f"tasks not terminal within {timeout}s: {counts}, {missing} missing")
        await asyncio.sleep(0.2)
