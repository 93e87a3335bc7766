"""WAL bytes and row versions written per task: a drain, and a fleet busy with long tasks.

    python -m bench.write_cost [--tasks 20000] [--long-tasks 100] [--window 60]

Runs on a private embedded Postgres (a server of its own in a temporary directory), so the WAL
it counts (``pg_current_wal_lsn()`` before and after) is this workload's alone, whatever else
the machine runs. Row versions are ``pg_stat_user_tables``' inserted, updated (of which HOT:
no index entry written) and deleted tuples of ``taskfleet.tasks`` and ``taskfleet.workers``.

- ``drain``: ``--tasks`` no-op tasks inserted in one statement (its WAL reported apart), then
  two ``taskfleet worker`` processes (concurrency 10, default timers) run them all.
- ``long``: two workers with ``--long-tasks`` slots between them all busy with tasks that sleep
  longer than the window; WAL and row versions over ``--window`` seconds of nothing but
  heartbeats and sweeps (per running task per minute).

Prints one JSON line per workload; each workload has a database of its own, dropped before the
next one starts. A checkpoint or an autovacuum inside a window adds WAL; each line says how many
checkpoints ran (``pg_stat_bgwriter`` / ``pg_stat_checkpointer``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench import processes
from bench.systems import taskfleet_insert, taskfleet_insert_params
from taskfleet.shared import db
from taskfleet.shared.embedded import start_embedded
from taskfleet.shared.migrations import upgrade_async

PATIENCE = 600.0

COUNTERS = """
SELECT relname, n_tup_ins AS ins, n_tup_upd AS upd, n_tup_hot_upd AS hot, n_tup_del AS del
FROM pg_stat_user_tables WHERE schemaname = 'taskfleet' AND relname IN ('tasks', 'workers')
"""


async def _checkpoints(conn: asyncpg.Connection) -> int:
    try:
        return int(
            await conn.fetchval("SELECT num_timed + num_requested FROM pg_stat_checkpointer")
        )
    except asyncpg.UndefinedTableError:
        return int(
            await conn.fetchval("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
        )


async def snapshot(conn: asyncpg.Connection) -> dict[str, Any]:
    # Other backends report their counters at most once a second; wait that out first.
    await asyncio.sleep(1.5)
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = await conn.fetch(COUNTERS)
    return {
        "lsn": await conn.fetchval("SELECT pg_current_wal_lsn()"),
        "tables": {r["relname"]: dict(r) for r in rows},
        "checkpoints": await _checkpoints(conn),
        "at": time.monotonic(),
    }


async def delta(
    conn: asyncpg.Connection, before: dict[str, Any], per: float | None = None, *, running: int = 0
) -> dict[str, Any]:
    """What was written since ``before``, also divided by ``per`` (tasks) or, for ``running``
    tasks, per running task per minute of the measured interval."""
    after = await snapshot(conn)
    if per is None:
        per = running * (after["at"] - before["at"]) / 60.0
    wal = await conn.fetchval("SELECT pg_wal_lsn_diff($1, $2)", after["lsn"], before["lsn"])
    out: dict[str, Any] = {
        "wal_bytes": int(wal),
        "wal_bytes_per": round(float(wal) / per, 1),
        "checkpoints": after["checkpoints"] - before["checkpoints"],
        "seconds": round(after["at"] - before["at"], 1),
    }
    for table in ("tasks", "workers"):
        a, b = after["tables"][table], before["tables"][table]
        d = {k: a[k] - b[k] for k in ("ins", "upd", "hot", "del")}
        out[table] = {**d, "versions_per": round((d["ins"] + d["upd"]) / per, 2)}
    return out


def worker_argv(i: int, concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "taskfleet.cli", "worker",
        "--concurrency", str(concurrency), "--metrics-port", "0", "--worker-id", f"bench-{i}",
    ]  # fmt: skip


async def start_workers(url: str, count: int, concurrency: int) -> list[processes.Process]:
    env = {"DATABASE_URL": url, "TASKFLEET_LOG_LEVEL": "WARNING"}
    started = []
    for i in range(count):
        p = await processes.start(f"worker-{i}", worker_argv(i, concurrency), env)
        p.discard_output()
        started.append(p)
    return started


async def wait_for(conn: asyncpg.Connection, sql: str, want: int) -> None:
    deadline = time.monotonic() + PATIENCE
    while int(await conn.fetchval(sql)) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(sql)
        await asyncio.sleep(0.2)


async def drain(url: str, tasks: int) -> dict[str, Any]:
    conn = await db.connect(url)
    try:
        before = await snapshot(conn)
        await taskfleet_insert(conn, taskfleet_insert_params(tasks))
        inserted = await delta(conn, before, tasks)
        before = await snapshot(conn)
        workers = await start_workers(url, 2, 10)
        try:
            await wait_for(
                conn, "SELECT count(*) FROM taskfleet.tasks WHERE status = 'completed'", tasks
            )
        finally:
            await processes.stop(workers)
        return {"workload": "drain", "tasks": tasks, "insert": inserted,
                "run": await delta(conn, before, tasks)}  # fmt: skip
    finally:
        await conn.close()


async def long_tasks(url: str, n: int, window: float) -> dict[str, Any]:
    conn = await db.connect(url)
    try:
        await taskfleet_insert(
            conn,
            taskfleet_insert_params(n, task_type="demo.sleep", payload={"seconds": window * 3}),
        )
        workers = await start_workers(url, 2, (n + 1) // 2)
        try:
            await wait_for(conn, "SELECT count(*) FROM taskfleet.tasks WHERE status = 'running'", n)
            # The claiming connections then sit idle, and an idle backend reports its counters
            # only every 10 s: let the claims' updates land before the window opens.
            await asyncio.sleep(11)
            before = await snapshot(conn)
            await asyncio.sleep(window)
            result = await delta(conn, before, running=n)
        finally:
            await processes.stop(workers)
        return {"workload": "long", "running": n, "window_seconds": window,
                "per": "running task per minute", "run": result}  # fmt: skip
    finally:
        await conn.close()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="tf-write-cost-") as tmp:
        url, server = start_embedded(Path(tmp) / "pg")
        try:
            for name, workload in (
                ("drain", lambda u: drain(u, args.tasks)),
                ("long", lambda u: long_tasks(u, args.long_tasks, args.window)),
            ):
                if args.only and name not in args.only.split(","):
                    continue
                dbname = f"write_{name}"
                admin = await asyncpg.connect(url)
                await admin.execute(f'CREATE DATABASE "{dbname}"')
                await admin.close()
                wurl = url.replace("/postgres?", f"/{dbname}?")
                await upgrade_async(wurl)
                print(json.dumps(await workload(wurl)), flush=True)
                # Gone before the next workload: its autovacuum would write WAL in that window.
                admin = await asyncpg.connect(url)
                await admin.execute(f'DROP DATABASE "{dbname}" WITH (FORCE)')
                await admin.close()
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--long-tasks", type=int, default=100)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--only", default="")
    asyncio.run(main(parser.parse_args()))
