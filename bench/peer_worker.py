"""One worker process of a peer queue, with a no-op task, for the side-by-side benchmarks.

    python -m bench.peer_worker pgqueuer --dsn URL [--drain]
    python -m bench.peer_worker procrastinate --dsn URL [--drain] [--concurrency 10]

Each peer runs as its documented worker does, with its own defaults, and only what a benchmark
needs added: a no-op task, and ``--drain`` to exit once the queue is empty (pgqueuer's
``mode=drain``, procrastinate's ``wait=False``). Prints ``READY`` on stdout once the worker is
listening for notifications, so the harness can submit work knowing every worker will see it.
SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from datetime import timedelta
from typing import Any

from bench.stamps import stamp

#: The task every peer runs: does nothing.
NOOP = "noop"
#: procrastinate: the listening connection is recognised by this application_name prefix.
APP_NAME = "bench-peer"


def _ready() -> None:
    print("READY", flush=True)


async def run_pgqueuer(dsn: str, drain: bool) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    # As pgqueuer's quick start: one asyncpg connection, a QueueManager, run() with defaults
    # (batch_size 10, no per-worker concurrency cap, dequeue_timeout 30 s).
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(NOOP)
    async def noop(job: Any) -> None:
        stamp(job.id)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    mode = QueueExecutionMode.drain if drain else QueueExecutionMode.continuous
    run = asyncio.create_task(qm.run(mode=mode))

    async def announce() -> None:
        # A NOTIFY/LISTEN round trip through the worker's own listener: once it returns, the
        # worker is listening.
        while not run.done():
            try:
                await qm.listener_healthy(timeout=timedelta(seconds=0.5))
            except Exception:
                await asyncio.sleep(0.05)
                continue
            _ready()
            return

    announcer = asyncio.create_task(announce())
    try:
        await run
    finally:
        announcer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await announcer
        await conn.close()


async def run_procrastinate(dsn: str, drain: bool, concurrency: int, name: str) -> None:
    import psycopg
    from procrastinate import App, PsycopgConnector

    # procrastinate's connector and worker with their defaults (pool of 4 connections, LISTEN
    # on, polling 5 s); only the concurrency is set, as the benchmark asks.
    app = App(connector=PsycopgConnector(conninfo=dsn, kwargs={"application_name": name}))

    @app.task(name=NOOP, pass_context=True)
    async def noop(context: Any) -> None:
        stamp(context.job.id)

    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=concurrency, wait=not drain, name=name)
        )

        async def announce() -> None:
            # The worker LISTENs on a connection of its own: ready once that session has sent
            # its LISTEN.
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe:
                while not worker.done():
                    cur = await probe.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = %s AND query ILIKE 'LISTEN%%'",
                        (name,),
                    )
                    row = await cur.fetchone()
                    if row and row[0] > 0:
                        _ready()
                        return
                    await asyncio.sleep(0.05)

        announcer = asyncio.create_task(announce())
        try:
            await worker
        finally:
            announcer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await announcer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("system", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    parser.add_argument("--concurrency", type=int, default=10, help="procrastinate only")
    parser.add_argument("--name", default=APP_NAME)
    args = parser.parse_args()
    if args.system == "pgqueuer":
        # As pgqueuer's own CLI runs it: on uvloop when uvloop is installed (it is: taskfleet's
        # worker runs on it too), so both queues run on the same event loop.
        from pgqueuer.adapters.cli.cli import asyncio_run

        asyncio_run(run_pgqueuer(args.dsn, args.drain))
    else:
        asyncio.run(run_procrastinate(args.dsn, args.drain, args.concurrency, args.name))
    sys.exit(0)


if __name__ == "__main__":
    main()
