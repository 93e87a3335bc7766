"""Enqueue benchmark: N no-op tasks one by one (K in flight), then N in batches, per path.

Paths: taskfleet over HTTP (``taskfleet api``: ``POST /tasks``, ``POST /tasks/batch``),
taskfleet's Python path (the named query ``task_insert_batch`` on asyncpg connections),
pgqueuer (``Queries.enqueue``, lists for a batch) and procrastinate (``defer_async``,
``batch_defer_async``). Each path gets a fresh database per repetition; no workers run. The
rate is tasks over the wall time of the whole burst, as a client sees it.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench import processes
from bench.scratch import Templates
from bench.systems import Pgqueuer, Procrastinate, Submitter, System, Taskfleet

TOKEN = "bench-submit-token"


@dataclass(frozen=True)
class EnqueueRates:
    single: float
    batch: float


class HttpSubmitter:
    """taskfleet's HTTP API, sharing one client (keep-alive connections, K in flight)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def one(self) -> None:
        response = await self.client.post("/tasks", json={"type": "demo.echo", "payload": {}})
        if response.status_code != 201:
            raise RuntimeError(f"POST /tasks: {response.status_code} {response.text[:200]}")

    async def many(self, n: int) -> None:
        body = {"tasks": [{"type": "demo.echo", "payload": {}}] * n}
        response = await self.client.post("/tasks/batch", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"POST /tasks/batch: {response.status_code} {response.text[:200]}")

    async def close(self) -> None:
        return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_api(
    url: str, extra_env: dict[str, str] | None = None
) -> tuple[processes.Process, str]:
    """``taskfleet api`` on a free port, as deployed (one uvicorn process); returns its URL.
    ``extra_env``: more settings (they win over the defaults here)."""
    port = _free_port()
    argv = [sys.executable, "-m", "taskfleet.cli", "api", "--host", "127.0.0.1"]
    env = {
        "DATABASE_URL": url,
        "TASKFLEET_API_TOKENS": f"submit:{TOKEN}",
        "TASKFLEET_LOG_LEVEL": "WARNING",
        **(extra_env or {}),
    }
    api = await processes.start("taskfleet-api", [*argv, "--port", str(port)], env)
    api.discard_output()
    base = f"http://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + processes.PATIENCE
    async with httpx.AsyncClient(base_url=base) as client:
        while True:
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return api, base
            except httpx.TransportError:
                pass
            if not api.running or loop.time() > deadline:
                tail = api.log_tail()
                await processes.stop([api])
                raise RuntimeError(f"taskfleet api did not become ready:\n{tail}")
            await asyncio.sleep(0.1)


async def _burst_one_by_one(submitters: list[Submitter], n: int) -> float:
    remaining = n

    async def lane(submitter: Submitter) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await submitter.one()

    started = time.perf_counter()
    await asyncio.gather(*(lane(s) for s in submitters))
    return n / (time.perf_counter() - started)


async def _burst_batched(submitter: Submitter, n: int, batch: int) -> float:
    started = time.perf_counter()
    left = n
    while left > 0:
        await submitter.many(min(batch, left))
        left -= batch
    return n / (time.perf_counter() - started)


async def _measure(
    submitters: list[Submitter], single_tasks: int, batch_tasks: int, batch: int
) -> EnqueueRates:
    single = await _burst_one_by_one(submitters, single_tasks)
    batched = await _burst_batched(submitters[0], batch_tasks, batch)
    return EnqueueRates(single, batched)


async def measure_enqueue(
    templates: Templates, path: str, *, tasks: int, batch_tasks: int, inflight: int, batch: int
) -> EnqueueRates:
    """One repetition of one path: ``tasks`` one by one, then ``batch_tasks`` in batches."""
    systems: dict[str, System] = {
        "taskfleet-http": Taskfleet(),
        "taskfleet-python": Taskfleet(),
        "pgqueuer": Pgqueuer(),
        "procrastinate": Procrastinate(),
    }
    system = systems[path]
    async with templates.clone(system.template_key, system.install) as url:
        if path == "taskfleet-http":
            api, base = await start_api(url)
            try:
                limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
                headers: dict[str, Any] = {"Authorization": f"Bearer {TOKEN}"}
                async with httpx.AsyncClient(
                    base_url=base, limits=limits, headers=headers, timeout=60
                ) as client:
                    submitter = HttpSubmitter(client)
                    return await _measure([submitter] * inflight, tasks, batch_tasks, batch)
            finally:
                await processes.stop([api])
        submitters = await system.submitters(url, inflight)
        try:
            return await _measure(submitters, tasks, batch_tasks, batch)
        finally:
            for s in submitters:
                await s.close()


PATHS = ("taskfleet-http", "taskfleet-python", "pgqueuer", "procrastinate")
