"""HTTP submission against the database's own ceiling: is the API the bottleneck?

    python -m bench.http_submit [--tasks 4000] [--inflight 16] [--reps 3]
                                [--pooler none|transaction]

Per repetition, on fresh databases, back to back:
- **http**: ``POST /tasks`` one by one, ``--inflight`` requests in flight (each on its own
  keep-alive connection, from a minimal HTTP/1.1 client: httpx cost more CPU per request than
  the API), against one ``taskfleet api`` process (auth, validation, metrics, NOTIFY all on);
- **raw**: single-row ``INSERT`` + ``pg_notify`` transactions (one statement each, autocommit) over
  ``--inflight`` asyncpg connections on the same machine: what Postgres takes with no API at all.

The ratio http / raw is computed per repetition (target: >= 0.4). Prints one JSON line per
repetition; ``python -m bench.run --only http-submit`` prints the table.

``--pooler transaction``: the API reaches Postgres through a transaction-mode PgBouncer (Debian's
package, ``tests/pgbouncer.py``, ``default_pool_size`` 20) with
``TASKFLEET_DATABASE_POOLER=transaction`` and its LISTEN URL direct, as
docs/operations.md#pgbouncer deploys it; the raw path stays direct (what Postgres takes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import processes
from bench.enqueue import TOKEN, start_api
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import Taskfleet
from tests.pgbouncer import start as start_pgbouncer

#: PgBouncer's default_pool_size with --pooler transaction: above the API's pool (10).
PGBOUNCER_POOL = 20

RAW_INSERT = """
WITH inserted AS (
    INSERT INTO taskfleet.tasks (type, payload, labels) VALUES ($1, $2::jsonb, '{}')
    RETURNING id
)
SELECT inserted.id, pg_notify('taskfleet_task_ready', 'normal') FROM inserted
"""


@dataclass(frozen=True)
class SubmitRates:
    http: float
    raw: float
    #: CPU seconds the API process spent per request (user + system, from /proc): what one
    #: process can take at most is 1 / this, whatever else the machine is doing.
    api_cpu_per_request: float

    @property
    def ratio(self) -> float:
        return self.http / self.raw if self.raw else 0.0


async def _burst(submit: Any, lanes: int, n: int) -> float:
    remaining = n

    async def lane(i: int) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await submit(i)

    started = time.perf_counter()
    await asyncio.gather(*(lane(i) for i in range(lanes)))
    return n / (time.perf_counter() - started)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class KeepAliveClient:
    """A minimal HTTP/1.1 client on one keep-alive connection: the load generator must not be
    the bottleneck. httpx spent 3.9 ms of CPU per request here, more than the API itself (2.1
    ms): on two shared cores it capped the rate it was meant to measure. This one writes a
    prepared request and reads the status, the headers and a Content-Length body."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.head = (
            f"POST /tasks HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        )
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(f"{self.head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


BODY = json.dumps({"type": "demo.echo", "payload": {}}).encode()


async def measure_http(
    templates: Templates, *, tasks: int, inflight: int, pooler: str = "none"
) -> tuple[float, float]:
    """Requests/s, and API CPU seconds per request."""
    system = Taskfleet()
    async with templates.clone(system.template_key, system.install) as url:
        bouncer = None
        extra_env: dict[str, str] = {}
        if pooler == "transaction":
            bouncer = await asyncio.to_thread(start_pgbouncer, url, pool_size=PGBOUNCER_POOL)
            extra_env = {
                "DATABASE_URL": bouncer.url(url),
                "TASKFLEET_DATABASE_POOLER": "transaction",
                "TASKFLEET_LISTEN_DATABASE_URL": url,
            }
        try:
            return await _measure_api(url, extra_env, tasks=tasks, inflight=inflight)
        finally:
            if bouncer is not None:
                bouncer.stop()


async def _measure_api(
    url: str, extra_env: dict[str, str], *, tasks: int, inflight: int
) -> tuple[float, float]:
    api, base = await start_api(url, extra_env)
    host, _, port = base.removeprefix("http://").partition(":")
    clients = [KeepAliveClient(host, int(port), TOKEN) for _ in range(inflight)]
    try:

        async def one(i: int) -> None:
            status = await clients[i].post(BODY)
            if status != 201:
                raise RuntimeError(f"POST /tasks: {status}")

        await _burst(one, inflight, min(200, tasks))  # warm up
        cpu = process_cpu_seconds(api.proc.pid)
        rate = await _burst(one, inflight, tasks)
        return rate, (process_cpu_seconds(api.proc.pid) - cpu) / tasks
    finally:
        for client in clients:
            await client.close()
        await processes.stop([api])


async def measure_raw(templates: Templates, *, tasks: int, inflight: int) -> float:
    system = Taskfleet()
    async with templates.clone(system.template_key, system.install) as url:
        conns = [await asyncpg.connect(url) for _ in range(inflight)]
        try:
            statements = [await c.prepare(RAW_INSERT) for c in conns]

            async def one(i: int) -> None:
                await statements[i].fetchrow("demo.echo", "{}")

            await _burst(one, inflight, min(200, tasks))
            return await _burst(one, inflight, tasks)
        finally:
            for c in conns:
                await c.close()


async def measure(
    templates: Templates, *, tasks: int, inflight: int, rep: int, pooler: str = "none"
) -> SubmitRates:
    """One repetition: both paths back to back, in an order alternating with ``rep``."""
    if rep % 2 == 0:
        http, cpu = await measure_http(templates, tasks=tasks, inflight=inflight, pooler=pooler)
        raw = await measure_raw(templates, tasks=tasks, inflight=inflight)
    else:
        raw = await measure_raw(templates, tasks=tasks, inflight=inflight)
        http, cpu = await measure_http(templates, tasks=tasks, inflight=inflight, pooler=pooler)
    return SubmitRates(http, raw, cpu)


async def _main(args: argparse.Namespace) -> None:
    templates = Templates(args.database_url)
    try:
        for rep in range(args.reps):
            rates = await measure(
                templates, tasks=args.tasks, inflight=args.inflight, rep=rep, pooler=args.pooler
            )
            print(
                json.dumps(
                    {
                        "bench": "http-submit",
                        "pooler": args.pooler,
                        "rep": rep + 1,
                        "tasks": args.tasks,
                        "inflight": args.inflight,
                        "http_per_s": round(rates.http, 1),
                        "raw_per_s": round(rates.raw, 1),
                        "ratio": round(rates.ratio, 3),
                        "api_cpu_ms_per_request": round(rates.api_cpu_per_request * 1000, 3),
                        "load_average": [round(x, 2) for x in os.getloadavg()],
                    }
                ),
                flush=True,
            )
    finally:
        await templates.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    parser.add_argument(
        "--pooler",
        choices=("none", "transaction"),
        default="none",
        help="the API through a transaction-mode PgBouncer (the raw path stays direct)",
    )
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
