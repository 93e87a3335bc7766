"""A soak: tasks pushed through a fleet with retention at a few seconds, the table watched.

    python -m bench.soak [--tasks 2000000] [--max-seconds 540] [--workers 2] [--concurrency 10]
                         [--retention 5s] [--backlog 20000] [--sample 15]

On a private embedded Postgres (a server of its own in a temporary directory, default settings,
autovacuum on), ``--workers`` ``taskfleet worker`` processes run no-op tasks with every task
retention at ``--retention``; this process keeps about ``--backlog`` tasks pending (batches of
1,000 in one statement each) until ``--tasks`` were submitted or ``--max-seconds`` passed, then
lets the fleet drain. Every ``--sample`` seconds it prints one JSON line:

- ``submitted``, ``finished`` (submitted minus pending and running) and ``rate`` (finished per
  second over the interval), ``pruned`` (finished tasks no longer in the table);
- ``rows`` (live rows: pending + running + finished not yet pruned) and the sizes in MB of
  ``taskfleet.tasks`` (heap), its indexes and its TOAST, and ``dead`` (dead tuples, from
  ``pg_stat_user_tables``);
- ``claim_ms``: the median of 5 ``task_claim`` statements, each claiming one task as an extra
  worker (the task is then completed), timed from this process.

A last line sums the run up. The full size of the issue (2,000,000 tasks) takes about
``2000000 / rate`` seconds: run it with ``--max-seconds 0`` (no time bound) on a machine of
its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench import processes
from bench.systems import taskfleet_insert, taskfleet_insert_params
from taskfleet.shared import db, queries
from taskfleet.shared.embedded import start_embedded
from taskfleet.shared.migrations import upgrade_async

BATCH = 1000

SIZES = """
SELECT pg_relation_size('taskfleet.tasks') AS heap,
       pg_indexes_size('taskfleet.tasks') AS indexes,
       COALESCE((SELECT pg_total_relation_size(reltoastrelid) FROM pg_class
                 WHERE oid = 'taskfleet.tasks'::regclass AND reltoastrelid <> 0), 0) AS toast,
       (SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'taskfleet.tasks'::regclass)
           AS live,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'taskfleet.tasks'::regclass)
           AS dead,
       (SELECT count(*) FROM taskfleet.tasks) AS rows,
       (SELECT count(*) FROM taskfleet.tasks WHERE status IN ('pending', 'running')) AS unfinished
"""


def claim_params() -> dict[str, Any]:
    return {
        "fin_ids": [], "fin_attempts": [], "fin_statuses": [], "fin_results": [],
        "fin_errors": [], "fin_retry_in": [],
        "control_limit": 0, "strict_limit": 0, "group_keys": [""], "group_limits": [1],
        "probe_strict": False, "probe_normal": False, "worker_id": "soak-probe",
        "lease_ttl": 30.0, "types": ["demo.echo"], "paused_labels": [], "tags": [],
    }  # fmt: skip


async def claim_ms(conn: asyncpg.Connection) -> float | None:
    """Median duration of 5 claims of one task each (each then completed)."""
    sql, args = queries.task_claim.positional(claim_params())
    fin_sql, _ = queries.task_finish_batch.positional({**claim_params(), "fin_ids": [0]})
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        rows = await conn.fetch(sql, *args)
        samples.append((time.perf_counter() - start) * 1000)
        claimed = [r for r in rows if r["id"] is not None]
        if claimed:
            params = {
                "fin_ids": [r["id"] for r in claimed],
                "fin_attempts": [r["attempts"] for r in claimed],
                "fin_statuses": ["completed"] * len(claimed),
                "fin_results": ['{"ok": true}'] * len(claimed),
                "fin_errors": [None] * len(claimed),
                "fin_retry_in": [0.0] * len(claimed),
                "worker_id": "soak-probe",
            }
            await conn.fetch(fin_sql, *queries.task_finish_batch.positional(params)[1])
    return round(statistics.median(samples), 2) if samples else None


async def producer(url: str, total: int, backlog: int, stop_at: float, state: dict[str, Any]):
    conn = await db.connect(url)
    try:
        params = taskfleet_insert_params(BATCH)
        while state["submitted"] < total and (stop_at <= 0 or time.monotonic() < stop_at):
            pending = await conn.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks WHERE status = 'pending'"
                " LIMIT $1) AS capped",
                backlog,
            )
            if pending >= backlog - BATCH:
                await asyncio.sleep(0.05)
                continue
            await taskfleet_insert(conn, params)
            state["submitted"] += BATCH
    finally:
        await conn.close()
        state["producing"] = False


def worker_argv(i: int, concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "taskfleet.cli", "worker",
        "--concurrency", str(concurrency), "--metrics-port", "0", "--worker-id", f"soak-{i}",
    ]  # fmt: skip


async def run(args: argparse.Namespace, url: str) -> None:
    await upgrade_async(url)
    env = {
        "DATABASE_URL": url,
        "TASKFLEET_LOG_LEVEL": "WARNING",
        "TASKFLEET_RETENTION_COMPLETED": args.retention,
        "TASKFLEET_RETENTION_FAILED": args.retention,
        "TASKFLEET_RETENTION_CANCELLED": args.retention,
    }
    workers = []
    for i in range(args.workers):
        p = await processes.start(f"soak-{i}", worker_argv(i, args.concurrency), env)
        p.discard_output()
        workers.append(p)
    conn = await db.connect(url)
    state: dict[str, Any] = {"submitted": 0, "producing": True}
    started = time.monotonic()
    stop_at = started + args.max_seconds if args.max_seconds > 0 else 0.0
    produce = asyncio.create_task(producer(url, args.tasks, args.backlog, stop_at, state))
    samples: list[dict[str, Any]] = []
    last_finished, last_at = 0, started
    try:
        while True:
            await asyncio.sleep(args.sample)
            if produce.done() and produce.exception():
                raise produce.exception()  # type: ignore[misc]
            sizes = await conn.fetchrow(SIZES)
            now = time.monotonic()
            finished = state["submitted"] - int(sizes["unfinished"])
            sample = {
                "t": round(now - started),
                "submitted": state["submitted"],
                "finished": finished,
                "rate": round((finished - last_finished) / (now - last_at)),
                "pruned": finished - (int(sizes["rows"]) - int(sizes["unfinished"])),
                "rows": int(sizes["rows"]),
                "heap_mb": round(sizes["heap"] / 2**20, 1),
                "indexes_mb": round(sizes["indexes"] / 2**20, 1),
                "toast_mb": round(sizes["toast"] / 2**20, 1),
                "dead": int(sizes["dead"] or 0),
                "claim_ms": await claim_ms(conn),
                "workers_alive": sum(p.running for p in workers),
            }
            samples.append(sample)
            print(json.dumps(sample), flush=True)
            last_finished, last_at = finished, now
            if not state["producing"] and int(sizes["unfinished"]) == 0:
                break
    finally:
        produce.cancel()
        await processes.stop(workers)
        await conn.close()
    busy = [s for s in samples if s["rate"] > 0]
    print(
        json.dumps(
            {
                "summary": True,
                "tasks": state["submitted"],
                "seconds": round(time.monotonic() - started),
                "rate_median": statistics.median(s["rate"] for s in busy) if busy else 0,
                "heap_mb_max": max(s["heap_mb"] for s in samples),
                "indexes_mb_max": max(s["indexes_mb"] for s in samples),
                "rows_max": max(s["rows"] for s in samples),
                "claim_ms_median": statistics.median(
                    s["claim_ms"] for s in samples if s["claim_ms"] is not None
                ),
            }
        ),
        flush=True,
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="tf-soak-") as tmp:
        url, server = start_embedded(Path(tmp) / "pg")
        try:
            admin = await asyncpg.connect(url)
            await admin.execute('CREATE DATABASE "soak"')
            await admin.close()
            await run(args, url.replace("/postgres?", "/soak?"))
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2_000_000)
    parser.add_argument("--max-seconds", type=float, default=540.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--retention", default="5s")
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--sample", type=float, default=15.0)
    asyncio.run(main(parser.parse_args()))
