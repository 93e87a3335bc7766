"""What a ``/metrics`` scrape of the API costs with an empty queue and with a deep backlog.

    python -m bench.metrics_cost [--pending 0,200000] [--repeat 15]

For each backlog size: a scratch database, migrated; ``--pending`` tasks inserted in one
statement (normal lane over three label groups, a fifth of them strict; plus as many finished
rows), ANALYZEd, two weighted labels configured, one alive worker row. Then it times, after one
warm-up each:

- ``scrape_refreshing``: a scrape that refreshes the snapshot (the worst case: the first scrape
  after ``SNAPSHOT_MAX_AGE``), through the real app in process (HTTP via ASGI);
- ``scrape_cached``: a scrape served from the snapshot;
- ``exact_scan_before``: the statements the gauges ran on every scrape before (a scan of every
  pending row by lane and group, and the unknown-type count), for comparison.

Prints one JSON line per size: median and max in milliseconds over ``--repeat`` runs. Drops
the databases at the end.
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
import httpx

from bench.scratch import DEFAULT_SERVER, PREFIX, admin, with_database
from taskfleet.api import metrics as api_metrics
from taskfleet.api.app import create_app
from taskfleet.shared.migrations import upgrade_async
from taskfleet.shared.settings import ApiSettings

SEED = """
INSERT INTO taskfleet.tasks (type, status, priority, labels, created_at, run_after, finished_at,
                             worker_id)
SELECT 'demo.echo', s.status,
       CASE WHEN s.status = 'pending' AND i % 5 = 0 THEN 1 + i % 9 ELSE 0 END,
       CASE i % 3 WHEN 0 THEN ARRAY['tenant-a'] WHEN 1 THEN ARRAY['tenant-b'] ELSE ARRAY['x'] END,
       now() - make_interval(secs => 3600.0 * (2 * $1 - i) / (2 * $1)),
       now() - make_interval(secs => 3600.0 * (2 * $1 - i) / (2 * $1)),
       CASE WHEN s.status = 'completed' THEN now() END,
       CASE WHEN s.status = 'completed' THEN 'w' END
FROM generate_series(1, 2 * $1::int) AS i,
LATERAL (SELECT CASE WHEN i % 2 = 0 THEN 'pending' ELSE 'completed' END AS status) AS s
"""

# The gauges' statements before this change, verbatim in effect: every pending row read.
EXACT_BEFORE = [
    """
    SELECT lane, grp, count(*) AS depth,
           CAST(COALESCE(EXTRACT(EPOCH FROM now() - min(GREATEST(created_at, run_after))
                                 FILTER (WHERE run_after <= now())), 0) AS float8)
    FROM (
        SELECT CASE WHEN t.priority >= 2147483647 THEN 'control'
                    WHEN t.priority > 0 THEN 'strict' ELSE 'normal' END AS lane,
               CASE WHEN t.priority = 0 THEN
                   CASE WHEN t.group_key = '' THEN 'default' ELSE t.group_key END END AS grp,
               t.run_after, t.created_at
        FROM taskfleet.tasks t WHERE t.status = 'pending'
    ) pending
    GROUP BY lane, grp
    """,
    """
    WITH known AS (
        SELECT COALESCE(array_agg(DISTINCT k), ARRAY[]::text[]) AS types
        FROM taskfleet.workers w, unnest(w.task_types) AS k
        WHERE w.status = 'online'
          AND w.last_heartbeat > now() - 3 * w.heartbeat_interval * interval '1 second'
    )
    SELECT 'unknown_type' AS reason, count(t.id) AS tasks
    FROM known LEFT JOIN taskfleet.tasks t
      ON t.status = 'pending' AND t.priority < 2147483647
     AND NOT (t.type = ANY(known.types))
    GROUP BY 1
    """,
]


async def timed(fn: Callable[[], Awaitable[Any]], repeat: int) -> dict[str, float]:
    await fn()  # warm-up: plans, caches, pool
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return {"median_ms": round(statistics.median(samples), 2), "max_ms": round(max(samples), 2)}


async def measure(pending: int, repeat: int) -> dict[str, Any]:
    name = f"{PREFIX}metrics_{uuid.uuid4().hex[:8]}"
    await admin(DEFAULT_SERVER, f'CREATE DATABASE "{name}"')
    url = with_database(DEFAULT_SERVER, name)
    try:
        await upgrade_async(url)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload) VALUES"
                ' (\'bench\', \'{"labelWeights": {"tenant-a": 5, "tenant-b": 1}}\')'
            )
            if pending:
                await conn.execute(SEED, pending)
            await conn.execute(
                "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, task_types)"
                " VALUES ('w', 'h', 1, 4, ARRAY['demo.echo'])"
            )
            await conn.execute("VACUUM ANALYZE taskfleet.tasks")
            app = create_app(ApiSettings(database_url=url, auth_disabled=True))
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://api"
                ) as client,
            ):

                async def scrape() -> None:
                    response = await client.get("/metrics")
                    assert response.status_code == 200, response.text
                    assert "taskfleet_api_database_up 1.0" in response.text

                result = {"pending": pending}
                # A snapshot older than its maximum age: every scrape refreshes.
                original = api_metrics.QueueGauges.refresh

                async def always(self: Any, database: Any) -> None:
                    self._read_at = None
                    await original(self, database)

                api_metrics.QueueGauges.refresh = always  # type: ignore[method-assign]
                try:
                    result["scrape_refreshing"] = await timed(scrape, repeat)
                finally:
                    api_metrics.QueueGauges.refresh = original  # type: ignore[method-assign]
                result["scrape_cached"] = await timed(scrape, repeat)
                depth = await client.get("/metrics")
                result["depth_normal_default"] = next(
                    line.split()[-1]
                    for line in depth.text.splitlines()
                    if line.startswith('taskfleet_queue_depth{group="default",lane="normal"}')
                )

            async def before() -> None:
                for statement in EXACT_BEFORE:
                    await conn.fetch(statement)

            result["exact_scan_before"] = await timed(before, repeat)
            result["exact_normal_default"] = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE status = 'pending'"
                " AND priority = 0 AND group_key = ''"
            )
        finally:
            await conn.close()
    finally:
        await admin(DEFAULT_SERVER, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result


async def main(sizes: list[int], repeat: int) -> None:
    for pending in sizes:
        print(json.dumps(await measure(pending, repeat)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", default="0,200000")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    asyncio.run(main([int(x) for x in args.pending.split(",")], args.repeat))
