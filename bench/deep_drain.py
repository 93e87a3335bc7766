"""Deep drain: does the drain keep its pace to the end of a deep backlog?

    python -m bench.deep_drain [--tasks 1000000] [--vacuum-dead-rows 10000]

A fresh scratch database, one taskfleet worker (10 slots) listening, then N queued no-op tasks
in one statement; once the queue is empty, the rate of each tenth of the starts (in start order,
from the tasks' own ``started_at``) and the VACUUMs the worker ran. Without the worker's vacuum
(``--vacuum-dead-rows 0``) every claim walks the index entries of all the tasks claimed before
it, and the last tenths run several times slower than the first (docs/benchmarks.md, "The claim
index's dead head"). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import asyncpg

from bench import processes
from bench.drain import wait_until_empty
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import Taskfleet, seed

DECILES = """
SELECT tenth, count(*) AS n,
       EXTRACT(EPOCH FROM max(started_at) - min(started_at))::float8 AS seconds
FROM (SELECT started_at, ntile(10) OVER (ORDER BY started_at) AS tenth
      FROM taskfleet.tasks WHERE started_at IS NOT NULL
        AND type <> 'updateWorkerRuntimeConfig') AS s
GROUP BY tenth ORDER BY tenth
"""


class VacuumingTaskfleet(Taskfleet):
    def __init__(self, vacuum_dead_rows: int) -> None:
        super().__init__()
        self.vacuum_dead_rows = vacuum_dead_rows

    def worker_env(self, url: str) -> dict[str, str]:
        return {**super().worker_env(url), "TASKFLEET_VACUUM_DEAD_ROWS": str(self.vacuum_dead_rows)}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    system = VacuumingTaskfleet(args.vacuum_dead_rows)
    templates = Templates(args.database_url)
    try:
        async with templates.clone(system.template_key, system.install) as url:
            fleet = await system.start_workers(url, 1, args.concurrency)
            try:
                await seed(system, url, args.tasks)
                conn = await asyncpg.connect(url)
                try:
                    await wait_until_empty(system, conn, args.timeout)
                    tenths = await conn.fetch(DECILES)
                    window = await system.drain_window(conn)
                    vacuums = await conn.fetchval(
                        "SELECT vacuum_count FROM pg_stat_user_tables"
                        " WHERE relid = CAST('taskfleet.tasks' AS regclass)"
                    )
                finally:
                    await conn.close()
            finally:
                await processes.stop(fleet)
    finally:
        await templates.close()
    return {
        "bench": "deep_drain",
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "vacuum_dead_rows": args.vacuum_dead_rows,
        "vacuums": vacuums,
        "tasks_per_second": round(window.rate, 1),
        "tenths_per_second": [
            round(r["n"] / r["seconds"]) if r["seconds"] else None for r in tenths
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--vacuum-dead-rows", type=int, default=10_000, help="the worker's setting; 0: off"
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    print(json.dumps(asyncio.run(measure(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
