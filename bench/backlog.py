"""Drain of a backlog queued *before* the workers start (the other drain set-up).

    python -m bench.backlog [--system taskfleet] [--tasks 20000] [--workers 1] [--concurrency 10]

``bench.drain`` starts the workers first and submits while they listen. Here the backlog is
queued first, as after an outage or a deploy: taskfleet's through ``POST /tasks/batch`` (1,000 a
request, against a ``taskfleet api`` process stopped before the workers start), a peer's through
its own batch enqueue; then the workers start, and the rate is counted from the first start to
the last finish, from the system's own timestamps (start-up is not counted). Prints one JSON line.
``python -m bench.run --only drain-backlog`` runs it for taskfleet and pgqueuer, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import asyncpg
import httpx

from bench import processes
from bench.drain import POLL, wait_until_empty
from bench.enqueue import TOKEN, start_api
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import System, Window, all_systems, seed

BATCH = 1000


async def _submit_over_http(url: str, tasks: int) -> None:
    api, base = await start_api(url)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as client:
            left = tasks
            while left > 0:
                n = min(BATCH, left)
                body = {"tasks": [{"type": "demo.echo", "payload": {}}] * n}
                response = await client.post("/tasks/batch", json=body)
                if response.status_code != 201:
                    raise RuntimeError(f"POST /tasks/batch: {response.status_code}")
                left -= n
    finally:
        await processes.stop([api])


async def measure_backlog_drain(
    templates: Templates,
    system: System,
    *,
    tasks: int,
    workers: int,
    concurrency: int,
    timeout: float = 600.0,
) -> Window:
    async with templates.clone(system.template_key, system.install) as url:
        if system.name.startswith("taskfleet"):
            await _submit_over_http(url, tasks)
        else:
            await seed(system, url, tasks)
        fleet = await system.start_workers(url, workers, concurrency)
        try:
            conn = await asyncpg.connect(url)
            try:
                await wait_until_empty(system, conn, timeout)
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
        window = await measure_backlog_drain(
            templates,
            system,
            tasks=args.tasks,
            workers=args.workers,
            concurrency=args.concurrency,
        )
    finally:
        await templates.close()
    return {
        "bench": "drain-backlog",
        "system": system.name,
        "tasks": args.tasks,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "seconds": round(window.seconds, 3),
        "tasks_per_second": round(window.rate, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", default="taskfleet", choices=sorted(all_systems()))
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    print(json.dumps(asyncio.run(_main(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
