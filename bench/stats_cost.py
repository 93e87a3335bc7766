"""What ``GET /tasks/stats`` costs at depth, next to the exact counts it avoids.

    python -m bench.stats_cost --rows 1000000 [--pending-share 0.1] [--repeat 15]

Creates a scratch database, migrates it, inserts ``--rows`` tasks in one statement (finished
ones, of which 5 % failed and 2 % cancelled, spread over the last two hours; ``--pending-share``
of them pending, in both lanes and three label groups; a few running), ANALYZEs, configures two
weighted labels, then times ``read_stats`` (the route's whole work: its six statements on one
connection) and, for comparison, the exact queries it replaces: ``count(*) GROUP BY status``
and the full per-lane-and-group scan of the pending rows that ``/metrics`` ran before its
gauges were bounded. Prints
one JSON line: each figure's median and max in milliseconds over ``--repeat`` runs, after one
warm-up run. Drops the database at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.metrics_cost import EXACT_BEFORE
from bench.scratch import DEFAULT_SERVER, PREFIX, admin, with_database
from taskfleet.api.database import Database
from taskfleet.api.stats import read_stats
from taskfleet.shared.db import sqlalchemy_url
from taskfleet.shared.migrations import upgrade_async

SEED = """
INSERT INTO taskfleet.tasks (type, status, priority, labels, created_at, run_after, started_at,
                             finished_at, worker_id)
SELECT 'demo.echo', s.status,
       CASE WHEN s.status = 'pending' AND i % 5 = 0 THEN 1 + i % 9 ELSE 0 END,
       CASE i % 3 WHEN 0 THEN ARRAY['tenant-a'] WHEN 1 THEN ARRAY['tenant-b'] ELSE ARRAY['x'] END,
       s.created, s.created,
       CASE WHEN s.status <> 'pending' THEN s.created END,
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled')
            THEN s.created + interval '1 s' END,
       CASE WHEN s.status <> 'pending' THEN 'w' || i % 10 END
FROM generate_series(1, $1::int) AS i,
LATERAL (
    SELECT now() - make_interval(secs => 7200.0 * ($1 - i) / $1) AS created,
           CASE WHEN i <= $1 * $2::float8 THEN 'pending'
                WHEN i % 1000 = 0 THEN 'running'
                WHEN i % 20 = 0 THEN 'failed'
                WHEN i % 50 = 1 THEN 'cancelled'
                ELSE 'completed' END AS status
) AS s
"""
EXACT_BY_STATUS = "SELECT status, count(*) FROM taskfleet.tasks GROUP BY status"


async def timed(fn: Callable[[], Awaitable[Any]], repeat: int) -> dict[str, float]:
    await fn()  # warm-up: plans, caches
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return {"median_ms": round(statistics.median(samples), 2), "max_ms": round(max(samples), 2)}


async def main(rows: int, pending_share: float, repeat: int) -> dict[str, Any]:
    name = f"{PREFIX}stats_{uuid.uuid4().hex[:8]}"
    await admin(DEFAULT_SERVER, f'CREATE DATABASE "{name}"')
    url = with_database(DEFAULT_SERVER, name)
    try:
        await upgrade_async(url)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(SEED, rows, pending_share)
            await conn.execute(
                "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload) VALUES"
                ' (\'bench\', \'{"labelWeights": {"tenant-a": 5, "tenant-b": 1}}\')'
            )
            await conn.execute("VACUUM ANALYZE taskfleet.tasks")
            database = Database.create(sqlalchemy_url(url), pool_size=2)
            try:
                stats = await read_stats(database)
                result = {
                    "rows": rows,
                    "pending": int(rows * pending_share),
                    "stats_route": await timed(lambda: read_stats(database), repeat),
                    "exact_count_by_status": await timed(
                        lambda: conn.fetch(EXACT_BY_STATUS), repeat
                    ),
                    "full_pending_scan_by_lane_and_group": await timed(
                        lambda: conn.fetch(EXACT_BEFORE[0]), repeat
                    ),
                    "estimated": stats["estimated"],
                    "sample_complete": stats["sample_complete"],
                }
            finally:
                await database.dispose()
        finally:
            await conn.close()
    finally:
        await admin(DEFAULT_SERVER, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pending-share", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rows, args.pending_share, args.repeat))))
