"""What one pruning statement costs: ``task_prune_batch`` deleting 2,000 finished tasks.

    python -m bench.prune_cost [--rows 220000] [--batches 50]

A scratch database with ``--rows`` tasks (a tenth pending, the rest completed two hours ago,
with small payloads and results), VACUUM ANALYZEd; then ``--batches`` pruning statements at a
retention of one hour, each deleting up to 2,000 rows per status, timed one by one. Prints one
JSON line: the batches run, the median and max in milliseconds, and the completed rows left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import asyncpg

from bench.scratch import DEFAULT_SERVER, PREFIX, admin, with_database
from taskfleet.shared import queries as q
from taskfleet.shared.migrations import upgrade_async
from taskfleet.worker.pruner import BATCH

SEED = """
INSERT INTO taskfleet.tasks (type, status, finished_at, worker_id, attempts, payload, result)
SELECT 'demo.echo', CASE WHEN i % 10 = 0 THEN 'pending' ELSE 'completed' END,
       CASE WHEN i % 10 = 0 THEN NULL
            ELSE now() - interval '2 hours' + make_interval(secs => i / 1000.0) END,
       'w', 1, '{"value": 1}', '{"value": 1}'
FROM generate_series(1, $1::int) AS i
"""


async def main(rows: int, batches: int) -> dict[str, object]:
    name = f"{PREFIX}prune_{uuid.uuid4().hex[:8]}"
    await admin(DEFAULT_SERVER, f'CREATE DATABASE "{name}"')
    url = with_database(DEFAULT_SERVER, name)
    try:
        await upgrade_async(url)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(SEED, rows)
            await conn.execute("VACUUM ANALYZE taskfleet.tasks")
            sql, args = q.task_prune_batch.positional(
                {
                    "lock_key": q.PRUNE_LOCK_KEY,
                    "statuses": ["completed", "failed", "cancelled"],
                    "keep": [3600.0] * 3,
                    "batch": BATCH,
                }
            )
            samples = []
            for _ in range(batches):
                start = time.perf_counter()
                deleted = sum(r["deleted"] for r in await conn.fetch(sql, *args))
                samples.append((time.perf_counter() - start) * 1000)
                if not deleted:
                    break
            left = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE status = 'completed'"
            )
        finally:
            await conn.close()
    finally:
        await admin(DEFAULT_SERVER, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return {
        "rows": rows,
        "batch": BATCH,
        "batches": len(samples),
        "median_ms": round(statistics.median(samples), 1),
        "max_ms": round(max(samples), 1),
        "completed_left": left,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=220_000)
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rows, args.batches))))
