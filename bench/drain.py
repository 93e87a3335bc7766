"""Drain benchmark: N queued no-op tasks, W worker processes x C slots, tasks/s to empty.

    python -m bench.drain [--system taskfleet] [--tasks 20000] [--workers 1] [--concurrency 10]

For one system: a fresh scratch database, its workers started and listening, then N tasks in
one statement through the system's own batch path (so every worker is woken at once), and the
rate from the first start to the last finish, read from the system's own timestamps in the
database (process start-up is not counted). Prints one JSON line. ``python -m bench.run`` runs
this for every system, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import asyncpg

from bench import processes
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import System, Window, all_systems, seed

#: How often the harness looks whether the queue is empty (one cheap count per poll).
POLL = 0.1


async def wait_until_empty(system: System, conn: asyncpg.Connection, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await system.queue_left(conn) > 0:
        if loop.time() > deadline:
            raise TimeoutError(f"{system.name}: queue not empty after {timeout:g}s")
        await asyncio.sleep(POLL)


async def measure_drain(
    templates: Templates,
    system: System,
    *,
    tasks: int,
    workers: int,
    concurrency: int,
    timeout: float = 600.0,
) -> Window:
    async with templates.clone(system.template_key, system.install) as url:
        fleet = await system.start_workers(url, workers, concurrency)
        try:
            await seed(system, url, tasks)
            conn = await asyncpg.connect(url)
            try:
                await wait_until_empty(system, conn, timeout)
                # The last finish is written a moment after the row leaves the queue in some
                # systems (buffered logs): wait until every completion is recorded.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while (window := await system.drain_window(conn)).completed < tasks:
                    if loop.time() > deadline:
                        break
                    await asyncio.sleep(POLL)
            finally:
                await conn.close()
        finally:
            await processes.stop(fleet)
    if window.completed != tasks:
        raise RuntimeError(f"{system.name}: {window.completed} of {tasks} tasks completed")
    return window


async def _main(args: argparse.Namespace) -> dict[str, object]:
    system = all_systems()[args.system]
    templates = Templates(args.database_url)
    try:
        window = await measure_drain(
            templates,
            system,
            tasks=args.tasks,
            workers=args.workers,
            concurrency=args.concurrency,
            timeout=args.timeout,
        )
    finally:
        await templates.close()
    return {
        "bench": "drain",
        "system": system.name,
        "tasks": args.tasks,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "completed": window.completed,
        "seconds": round(window.seconds, 3),
        "tasks_per_second": round(window.rate, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", default="taskfleet", choices=sorted(all_systems()))
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    print(json.dumps(asyncio.run(_main(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
