"""Drain benchmark: N queued no-op tasks, W worker processes x C slots, tasks/s to empty.

    python -m bench.drain --tasks 20000 --workers 1 --concurrency 10 [--database-url URL]

Creates a scratch database, migrates it, seeds the tasks in one statement, starts the worker
processes (`taskfleet worker`) and measures from the first claim to the last completion using
the database's own timestamps (min(started_at) .. max(finished_at)), so process start-up is not
counted. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import asyncpg

from shared import migrations
from tests.pg import with_database

DEFAULT_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(with_database(url, "postgres"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def run(args: argparse.Namespace) -> dict[str, object]:
    name = f"tf_bench_{uuid.uuid4().hex[:8]}"
    await _admin(args.database_url, f'CREATE DATABASE "{name}"')
    url = with_database(args.database_url, name)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await asyncio.to_thread(migrations.upgrade, url)
        conn = await asyncpg.connect(url)
        await conn.execute(
            "INSERT INTO taskfleet.tasks (type, payload) "
            "SELECT 'demo.echo', jsonb_build_object('value', g) FROM generate_series(1, $1) g",
            args.tasks,
        )
        await conn.execute("ANALYZE taskfleet.tasks")
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "TASKFLEET_LOG_LEVEL": "WARNING",
        }
        for i in range(args.workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "services.cli.main", "worker",
                        "--concurrency", str(args.concurrency),
                        "--metrics-port", "0", "--worker-id", f"bench-{i}",
                    ],
                    env=env,
                )
            )
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            left = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE status IN ('pending', 'running')"
            )
            if left == 0:
                break
            await asyncio.sleep(0.05)
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'completed') AS completed,"
            " EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) AS seconds"
            " FROM taskfleet.tasks"
        )
        await conn.close()
        seconds = float(row["seconds"] or 0)
        return {
            "bench": "drain",
            "system": "taskfleet",
            "tasks": args.tasks,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "completed": row["completed"],
            "seconds": round(seconds, 3),
            "tasks_per_second": round(row["completed"] / seconds, 1) if seconds else None,
        }
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        await _admin(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    print(json.dumps(asyncio.run(run(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
