"""Runtime-config convergence benchmark: sequential ``PUT /runtime-config`` across N workers.

    python -m bench.convergence --workers 1 3 10 [--updates 50] [--concurrency 4]
    python -m bench.convergence --workers 10 --notify-lost [--poll-interval 5]

For each worker count: creates a scratch database, migrates it, starts ``taskfleet api`` and N
``taskfleet worker`` processes (production default timers), then sends the updates one after
the other (``Accept: application/json``, so each PUT returns once the outcome is known) and
drops the database at the end. Issue target: p50 <= 100 ms, p99 <= 500 ms over 50 updates
across 10 workers; with notifications lost (``--notify-lost``: workers run with
``TASKFLEET_LISTEN_ENABLED=false``, 5 updates by default) <= poll interval + 1 s.

Figures, each as p50/p95/p99/max in seconds (nearest rank: with 50 samples p99 is the maximum):
- ``seconds``: the converged outcome's own figure, the database's time from the version insert
  to convergence (the target's measure);
- ``writer_seconds``: the same, as the update task measured it (its result);
- ``wall``: the client's wall time of the whole PUT (enqueue, claim, write, apply, report);
and, to show where the time goes, per update:
- ``queue``: the update task's enqueue -> claim (tasks.created_at -> started_at);
- ``write``: claim -> version insert (tasks.started_at -> worker_runtime_configs.created_at);
- ``notify_to_ack``: the benchmark's own LISTEN sees the writer's ``up_config`` NOTIFY, then
  the slowest worker's ACK (each worker ACKs in the statement that records its applied version);
- ``report``: the client's wall time minus (queue + write + seconds): the API's polling and
  the HTTP round trip.

Prints one JSON line per worker count (``--per-update`` adds one line per update). The machine's
load shows in the figures: run it on a quiet machine for numbers to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
import uuid
from collections import defaultdict
from typing import Any

import asyncpg
import httpx

from taskfleet.shared import migrations
from tests.e2e.fleet import Fleet, wait_http
from tests.pg import with_database

DEFAULT_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
CONFIG_CHANNEL = "anclax_worker_runtime_config"
ACK_CHANNEL = "anclax_worker_runtime_config_ack"
UPDATE_TASK_TYPE = "updateWorkerRuntimeConfig"

#: The documented defaults (docs/reference.md#environment), so the figures are those of an untuned
#: deployment; the e2e harness would otherwise apply its short test timers.
DEFAULT_TIMERS = {
    "TASKFLEET_POLL_INTERVAL": "2",
    "TASKFLEET_HEARTBEAT_INTERVAL": "3",
    "TASKFLEET_LEASE_TTL": "30",
    "TASKFLEET_SWEEP_INTERVAL": "5",
    "TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL": "5",
    "TASKFLEET_DRAIN_TIMEOUT": "20",
    "TASKFLEET_LOG_LEVEL": "WARNING",
}


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(with_database(url, "postgres"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def percentiles(values: list[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p95/p99 and the maximum, in seconds rounded to 0.1 ms."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)], 4)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99), "max": round(ordered[-1], 4)}


class NotifyClock:
    """The benchmark's own LISTEN: when each version's ``up_config`` first arrived, and when
    each worker's ACK for it arrived (this process's monotonic clock)."""

    def __init__(self) -> None:
        self.notified: dict[int, float] = {}
        self.acks: dict[int, dict[str, float]] = defaultdict(dict)

    def on_config(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        now = time.monotonic()
        try:
            version = int(json.loads(payload)["params"]["version"])
        except (ValueError, KeyError, TypeError):
            return
        self.notified.setdefault(version, now)

    def on_ack(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        now = time.monotonic()
        try:
            params = json.loads(payload)["params"]
            version, worker = int(params["applied_version"]), str(params["worker_id"])
        except (ValueError, KeyError, TypeError):
            return
        self.acks[version].setdefault(worker, now)

    def slowest_ack(self, version: int) -> float | None:
        start = self.notified.get(version)
        acks = self.acks.get(version)
        if start is None or not acks:
            return None
        return max(acks.values()) - start


async def wait_alive(client: httpx.AsyncClient, workers: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        rows = (await client.get("/workers")).json()["workers"]
        if sum(1 for w in rows if w["alive"]) >= workers:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {rows} alive after {timeout}s")
        await asyncio.sleep(0.1)


async def run_one(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    name = f"tf_bench_{uuid.uuid4().hex[:8]}"
    await _admin(args.database_url, f'CREATE DATABASE "{name}"')
    url = with_database(args.database_url, name)
    env = dict(DEFAULT_TIMERS)
    if args.notify_lost:
        env["TASKFLEET_LISTEN_ENABLED"] = "false"
        env["TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL"] = f"{args.poll_interval:g}"
    updates = args.updates if args.updates is not None else (5 if args.notify_lost else 50)
    fleet = Fleet(url, env=env)
    listen: asyncpg.Connection | None = None
    try:
        await asyncio.to_thread(migrations.upgrade, url)
        await fleet.start_api()
        procs = [
            await fleet.start_worker(f"bench-{i}", concurrency=args.concurrency, wait_ready=False)
            for i in range(workers)
        ]
        await asyncio.gather(
            *(wait_http(f"http://127.0.0.1:{p.port}/readyz", p, timeout=120) for p in procs)
        )
        clock = NotifyClock()
        listen = await asyncpg.connect(url)
        await listen.add_listener(CONFIG_CHANNEL, clock.on_config)
        await listen.add_listener(ACK_CHANNEL, clock.on_ack)

        samples: list[dict[str, Any]] = []
        async with fleet.client(timeout=args.timeout + 30) as client:
            await wait_alive(client, workers)
            for i in range(updates):
                body = {
                    "maxStrictPercentage": (i * 37) % 101,
                    "labelWeights": {"a": 1 + i % 5, "b": 1},
                    "requestID": f"bench-{name}-{i}",
                }
                started = time.monotonic()
                response = await client.put(
                    "/runtime-config",
                    json=body,
                    params={"timeout": args.timeout},
                    headers={"Accept": "application/json"},
                )
                wall = time.monotonic() - started
                response.raise_for_status()
                doc = response.json()
                samples.append(
                    {
                        "update": i,
                        "request_id": body["requestID"],
                        "outcome": doc.get("outcome"),
                        "version": doc.get("version"),
                        "seconds": doc.get("seconds"),
                        "wall": wall,
                    }
                )

        # The update tasks' own timestamps and results (they finish just after the API saw
        # convergence in the database: wait for the last one).
        conn = await asyncpg.connect(url)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                unfinished = await conn.fetchval(
                    "SELECT count(*) FROM taskfleet.tasks WHERE type = $1 "
                    "AND status IN ('pending', 'running')",
                    UPDATE_TASK_TYPE,
                )
                if unfinished == 0:
                    break
                await asyncio.sleep(0.05)
            rows = await conn.fetch(
                """
                SELECT t.payload ->> 'requestID' AS request_id, t.worker_id,
                       CAST(t.result ->> 'seconds' AS float8) AS writer_seconds,
                       EXTRACT(EPOCH FROM t.started_at - t.created_at)::float8 AS queue,
                       EXTRACT(EPOCH FROM c.created_at - t.started_at)::float8 AS write
                FROM taskfleet.tasks t
                JOIN taskfleet.worker_runtime_configs c
                  ON c.request_id = t.payload ->> 'requestID'
                WHERE t.type = $1
                """,
                UPDATE_TASK_TYPE,
            )
        finally:
            await conn.close()
        by_request = {r["request_id"]: r for r in rows}
        for sample in samples:
            row = by_request.get(sample["request_id"])
            sample["writer_seconds"] = row["writer_seconds"] if row else None
            sample["queue"] = row["queue"] if row else None
            sample["write"] = row["write"] if row else None
            sample["update_worker"] = row["worker_id"] if row else None
            version = sample["version"]
            sample["notify_to_ack"] = (
                clock.slowest_ack(version) if isinstance(version, int) else None
            )
            parts = (sample["queue"], sample["write"], sample["seconds"])
            sample["report"] = (
                sample["wall"] - sum(parts) if all(p is not None for p in parts) else None
            )
            if args.per_update:
                print(json.dumps({"bench": "convergence-update", "workers": workers, **sample}))

        def figures(key: str) -> dict[str, float | None]:
            return percentiles([s[key] for s in samples if isinstance(s[key], int | float)])

        outcomes: dict[str, int] = defaultdict(int)
        for sample in samples:
            outcomes[str(sample["outcome"])] += 1
        return {
            "bench": "convergence",
            "workers": workers,
            "concurrency": args.concurrency,
            "notify_lost": args.notify_lost,
            "runtime_config_poll_interval": float(env["TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL"]),
            "updates": updates,
            "outcomes": dict(outcomes),
            "seconds": figures("seconds"),
            "writer_seconds": figures("writer_seconds"),
            "wall": figures("wall"),
            "queue": figures("queue"),
            "write": figures("write"),
            "notify_to_ack": figures("notify_to_ack"),
            "report": figures("report"),
        }
    finally:
        if listen is not None:
            await listen.close()
        await fleet.stop()
        await _admin(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def run(args: argparse.Namespace) -> None:
    for workers in args.workers:
        print(json.dumps(await run_one(args, workers)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[10], help="worker counts to run (default 10)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="slots per worker")
    parser.add_argument(
        "--updates", type=int, default=None, help="updates per run (default 50, 5 --notify-lost)"
    )
    parser.add_argument(
        "--notify-lost", action="store_true", help="workers run with LISTEN disabled"
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        help="TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL with --notify-lost (default 5)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="each PUT's ?timeout=")
    parser.add_argument("--per-update", action="store_true", help="also print every update")
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
