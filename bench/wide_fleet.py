"""A wide fleet on one Postgres: 20 ``taskfleet worker`` processes and 2 ``taskfleet api``
replicas, directly and through a transaction-mode PgBouncer.

    python -m bench.wide_fleet [--workers 20] [--apis 2] [--concurrency 4] [--changes 20]
                               [--pickups 50] [--tasks 10000] [--idle-window 30]
                               [--pooler none transaction] [--database-url URL | --embedded]

For each mode (``none``: every process on Postgres; ``transaction``: ``DATABASE_URL`` on a
PgBouncer started for the run, ``TASKFLEET_LISTEN_DATABASE_URL`` on Postgres,
``TASKFLEET_DATABASE_POOLER=transaction``), on a scratch database, with the documented default
timers, in this order:

1. **idle transactions per second**: ``pg_stat_database.xact_commit + xact_rollback`` of the
   scratch database over ``--idle-window`` seconds, starting 12 s after the fleet last changed
   (read from another database, so the reads do not count), with the APIs alone (the
   baseline), then with one idle worker, then with all of them; the workers' figures are net of
   the baseline. Every statement an idle worker sends is its own transaction (through the
   pooler too: ``BEGIN; SET LOCAL``, the statement, ``COMMIT``), so this counts its statements;
   backends flush these counters up to about 10 s late, which the settle time and a long
   window absorb;
2. **connections**: ``pg_stat_activity`` rows of the scratch database by ``application_name``,
   idle, and the peak seen (sampled every 0.2 s) during the phases below;
3. **pickup latency**: ``--pickups`` single ``POST /tasks``, one at a time, alternating API
   replicas, each waited for: ``started_at - created_at`` (the database's clock);
4. **config convergence**: ``--changes`` ``PUT /runtime-config`` (``Accept: application/json``,
   returns with the outcome), one at a time, alternating replicas: the client's wall time;
5. **drain**: ``--tasks`` ``demo.echo`` tasks in batches of 1,000 through both replicas, then the
   rate from the first ``started_at`` to the last ``finished_at``.

``--embedded`` runs on an embedded Postgres of its own with ``max_connections`` 300 (20 workers
hold 80 connections directly; the default ``max_connections`` of 100 would not do, and a shared
server's other users would be refused). Prints one JSON line per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from typing import Any

import asyncpg
import httpx

from bench.convergence import DEFAULT_TIMERS, percentiles
from taskfleet.shared import migrations
from tests.e2e.fleet import ADMIN_TOKEN, Fleet, Proc, wait_http
from tests.pg import with_database
from tests.pgbouncer import PgBouncer
from tests.pgbouncer import start as start_pgbouncer

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Seconds between a change of the fleet and an idle window: an idle backend flushes its
#: statistics up to 10 s late (PGSTAT_IDLE_INTERVAL), so start-up statements would otherwise
#: land in the window.
SETTLE = 12.0


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(with_database(url, "postgres"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


class Watcher:
    """Reads the scratch database's counters from the ``postgres`` database."""

    def __init__(self, conn: asyncpg.Connection, database: str) -> None:
        self.conn = conn
        self.database = database
        self.peak = 0
        self.peak_by_app: dict[str, int] = {}
        self._sampler: asyncio.Task[None] | None = None

    async def transactions(self) -> int:
        value = await self.conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
            self.database,
        )
        return int(value)

    async def connections(self) -> dict[str, int]:
        rows = await self.conn.fetch(
            "SELECT application_name, count(*) AS n FROM pg_stat_activity "
            "WHERE datname = $1 GROUP BY 1",
            self.database,
        )
        return {str(r["application_name"]) or "(none)": int(r["n"]) for r in rows}

    async def idle_rate(self, window: float) -> float:
        # Stats are flushed by each backend at most once a second: start and end the window a
        # little after the counters moved, and take a long window.
        before = await self.transactions()
        started = time.monotonic()
        await asyncio.sleep(window)
        after = await self.transactions()
        return (after - before) / (time.monotonic() - started)

    def start_sampling(self) -> None:
        async def sample() -> None:
            while True:
                by_app = await self.connections()
                total = sum(by_app.values())
                if total > self.peak:
                    self.peak, self.peak_by_app = total, by_app
                await asyncio.sleep(0.2)

        self._sampler = asyncio.create_task(sample())

    async def stop_sampling(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler


def _clients(apis: list[Proc], timeout: float) -> list[httpx.AsyncClient]:
    return [
        httpx.AsyncClient(
            base_url=api.url,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=timeout,
        )
        for api in apis
    ]


async def _start_workers(fleet: Fleet, ids: list[str], concurrency: int) -> None:
    procs = [await fleet.start_worker(w, concurrency=concurrency, wait_ready=False) for w in ids]
    await asyncio.gather(
        *(wait_http(f"http://127.0.0.1:{p.port}/readyz", p, timeout=180) for p in procs)
    )


async def _pickups(
    clients: list[httpx.AsyncClient], conn: asyncpg.Connection, n: int
) -> list[float]:
    seconds = []
    for i in range(n):
        response = await clients[i % len(clients)].post(
            "/tasks", json={"type": "demo.echo", "payload": {"value": i}}
        )
        response.raise_for_status()
        task_id = int(response.json()["id"])
        deadline = time.monotonic() + 60
        while True:
            row = await conn.fetchrow(
                "SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 AS pickup, status "
                "FROM taskfleet.tasks WHERE id = $1",
                task_id,
            )
            if row is not None and row["status"] == "completed":
                seconds.append(float(row["pickup"]))
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {task_id} not completed in 60 s")
            await asyncio.sleep(0.005)
    return seconds


async def _changes(
    clients: list[httpx.AsyncClient], n: int, tag: str
) -> tuple[list[float], Counter[str]]:
    walls: list[float] = []
    outcomes: Counter[str] = Counter()
    for i in range(n):
        body = {
            "maxStrictPercentage": (i * 37) % 101,
            "labelWeights": {"a": 1 + i % 5, "b": 1},
            "requestID": f"wide-{tag}-{i}",
        }
        started = time.monotonic()
        response = await clients[i % len(clients)].put(
            "/runtime-config",
            json=body,
            params={"timeout": 60},
            headers={"Accept": "application/json"},
        )
        walls.append(time.monotonic() - started)
        response.raise_for_status()
        outcomes[str(response.json().get("outcome"))] += 1
    return walls, outcomes


async def _drain(
    clients: list[httpx.AsyncClient], conn: asyncpg.Connection, n: int
) -> dict[str, float]:
    batches = [
        [{"type": "demo.echo", "payload": {"value": i}} for i in range(start, min(n, start + 1000))]
        for start in range(0, n, 1000)
    ]
    first_id = int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM taskfleet.tasks"))
    started = time.monotonic()

    async def send(index: int, tasks: list[dict[str, Any]]) -> None:
        response = await clients[index % len(clients)].post("/tasks/batch", json={"tasks": tasks})
        response.raise_for_status()

    await asyncio.gather(*(send(i, b) for i, b in enumerate(batches)))
    submitted = time.monotonic() - started
    deadline = time.monotonic() + 600
    while await conn.fetchval(
        "SELECT count(*) FROM taskfleet.tasks WHERE type = 'demo.echo' "
        "AND status IN ('pending', 'running')"
    ):
        if time.monotonic() > deadline:
            raise TimeoutError("drain not finished in 600 s")
        await asyncio.sleep(0.1)
    row = await conn.fetchrow(
        "SELECT count(*) AS n, EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 AS s "
        "FROM taskfleet.tasks WHERE type = 'demo.echo' AND id > $1",
        first_id,
    )
    return {
        "tasks": int(row["n"]),
        "seconds": round(float(row["s"]), 3),
        "tasks_per_second": round(int(row["n"]) / float(row["s"]), 1),
        "submit_seconds": round(submitted, 3),
    }


async def run_mode(args: argparse.Namespace, server: str, pooler: str) -> dict[str, Any]:
    name = f"tf_bench_{uuid.uuid4().hex[:8]}"
    await _admin(server, f'CREATE DATABASE "{name}"')
    url = with_database(server, name)
    bouncer: PgBouncer | None = None
    env = dict(DEFAULT_TIMERS)
    if pooler == "transaction":
        bouncer = await asyncio.to_thread(start_pgbouncer, server, pool_size=args.pgbouncer_pool)
        env.update(
            {
                "DATABASE_URL": bouncer.url(url),
                "TASKFLEET_LISTEN_DATABASE_URL": url,
                "TASKFLEET_DATABASE_POOLER": "transaction",
            }
        )
    fleet = Fleet(url, env=env)
    watch_conn = await asyncpg.connect(with_database(server, "postgres"))
    watcher = Watcher(watch_conn, name)
    clients: list[httpx.AsyncClient] = []
    result: dict[str, Any] = {
        "bench": "wide-fleet",
        "pooler": pooler,
        "workers": args.workers,
        "apis": args.apis,
        "concurrency": args.concurrency,
    }
    try:
        await asyncio.to_thread(migrations.upgrade, url)
        apis = [await fleet.start_api() for _ in range(args.apis)]
        clients = _clients(apis, timeout=120)
        await asyncio.sleep(SETTLE)
        baseline = await watcher.idle_rate(args.idle_window)
        await _start_workers(fleet, ["wide-0"], args.concurrency)
        await asyncio.sleep(SETTLE)
        one = await watcher.idle_rate(args.idle_window) - baseline
        await _start_workers(fleet, [f"wide-{i}" for i in range(1, args.workers)], args.concurrency)
        await asyncio.sleep(SETTLE)
        many = await watcher.idle_rate(args.idle_window) - baseline
        result["idle_transactions_per_second"] = {
            "apis_only": round(baseline, 2),
            "one_worker": round(one, 2),
            f"{args.workers}_workers": round(many, 2),
            "ratio": round(many / one, 2) if one > 0 else None,
        }
        idle_connections = await watcher.connections()
        result["connections_idle"] = {
            "total": sum(idle_connections.values()),
            "by_application": idle_connections,
        }
        if bouncer is not None:
            result["pgbouncer_clients"] = len(
                [c for c in await bouncer.admin("SHOW CLIENTS") if c["database"] == name]
            )
        watcher.start_sampling()
        conn = await asyncpg.connect(url)
        try:
            pickups = await _pickups(clients, conn, args.pickups)
            result["pickup_seconds"] = percentiles(pickups)
            walls, outcomes = await _changes(clients, args.changes, name)
            result["convergence_wall_seconds"] = percentiles(walls)
            result["convergence_outcomes"] = dict(outcomes)
            result["drain"] = await _drain(clients, conn, args.tasks)
        finally:
            await conn.close()
        await watcher.stop_sampling()
        result["connections_peak"] = {"total": watcher.peak, "by_application": watcher.peak_by_app}
        return result
    finally:
        await watcher.stop_sampling()
        for client in clients:
            await client.aclose()
        await fleet.stop()
        await watch_conn.close()
        if bouncer is not None:
            bouncer.stop()
        await _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def run(args: argparse.Namespace, server: str) -> None:
    for pooler in args.pooler:
        print(json.dumps(await run_mode(args, server, pooler)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--apis", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4, help="slots per worker")
    parser.add_argument("--changes", type=int, default=20, help="config changes")
    parser.add_argument("--pickups", type=int, default=50, help="single tasks, one at a time")
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks drained")
    parser.add_argument("--idle-window", type=float, default=30.0, help="seconds per idle count")
    parser.add_argument(
        "--pooler", nargs="+", default=["none", "transaction"], choices=["none", "transaction"]
    )
    parser.add_argument(
        "--pgbouncer-pool", type=int, default=20, help="PgBouncer's default_pool_size"
    )
    parser.add_argument("--database-url", default=None, help=f"default {DEFAULT_SERVER}")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="an embedded Postgres of its own, max_connections 300",
    )
    args = parser.parse_args()
    if args.embedded:
        from taskfleet.shared.embedded import (
            default_datadir,
            restart_with_max_connections,
            start_embedded,
        )

        server, handle = start_embedded(default_datadir("pg-bench"))
        server, handle = restart_with_max_connections(handle, 300)
        try:
            asyncio.run(run(args, server))
        finally:
            handle.stop()
    else:
        asyncio.run(run(args, args.database_url or DEFAULT_SERVER))


if __name__ == "__main__":
    main()
