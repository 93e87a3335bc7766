"""What fleet-wide label limits cost a claim: the claim statement with limits off and on.

    python -m bench.limits [--tasks 40000] [--claims 1500] [--claimers 4] [--reps 3]

On a fresh database per run, ``--tasks`` pending normal-lane tasks, every other one labelled
(``hot``, or one of ``h0`` .. ``h9``; one in 20 for ``on-1-rare``), then the worker's hot path
as it runs it: one ``task_claim`` of 10 tasks at a time, each carrying the outcomes (completed)
of the previous one.
Scenarios, interleaved across repetitions so machine drift spreads over all of them:

- ``off``: no limit configured;
- ``on-1``: ``labelLimits {"hot": {maxInFlight: 1000000, ratePerSecond: 1000000}}``: a limit
  that never holds anything back, so the figure is its pure cost (lock, count, bucket);
- ``on-10``: ten such limits (``h0`` .. ``h9``): a claim locks up to ten limit rows;
- ``on-1-rare``: the ``on-1`` limit, with only one task in 20 labelled ``hot``: what a limit
  costs the claims of the other labels.

Two figures per scenario: one connection claiming ``--claims`` times (median and p95 claim
round trip, ms), and ``--claimers`` connections draining ``--tasks`` tasks at once (tasks/s):
the concurrent case is where claims meet on the limit rows (``SKIP LOCKED``: a claim that finds
a row held leaves that label for the next claim, it never waits).
Prints one JSON line per scenario and repetition.

    python -m bench.limits --plan

instead prints what the two claim statements cost the server alone, from ``EXPLAIN (ANALYZE,
SUMMARY)`` in a transaction rolled back (medians of 30, on the ``off`` seed): planning and
execution time of ``task_claim`` (the plain claim) and ``task_claim_limited`` (with the limits'
accounting), with nothing configured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import asyncpg

from bench.fairness import _insert_config
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import Taskfleet
from taskfleet.shared import db, queries
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE

BATCH = 10
UNLIMITED = {"maxInFlight": 1_000_000, "ratePerSecond": 1_000_000}
SCENARIOS: dict[str, dict[str, Any]] = {
    "off": {},
    "on-1": {"labelLimits": {"hot": UNLIMITED}},
    "on-10": {"labelLimits": {f"h{i}": UNLIMITED for i in range(10)}},
    "on-1-rare": {"labelLimits": {"hot": UNLIMITED}},
}


def _claim_params(worker_id: str, finished: list[int]) -> dict[str, Any]:
    return {
        "fin_ids": finished,
        "fin_attempts": [1] * len(finished),
        "fin_statuses": ["completed"] * len(finished),
        "fin_results": ['{"ok": true}'] * len(finished),
        "fin_errors": [None] * len(finished),
        "fin_retry_in": [0.0] * len(finished),
        "control_limit": 0,
        "strict_limit": 0,
        "group_keys": [None],
        "group_limits": [BATCH],
        "probe_strict": False,
        "probe_normal": False,
        "worker_id": worker_id,
        "lease_ttl": 30.0,
        "types": ["demo.echo", RUNTIME_CONFIG_TASK_TYPE],
        "tags": [],
        "paused_labels": [],
    }


async def _claim(
    conn: asyncpg.Connection, worker_id: str, finished: list[int], *, limited: bool
) -> list[int]:
    """One claim, with the limits' accounting when a limit is configured (as the worker does:
    ``task_claim_limited`` while its config has a limit, ``task_claim`` otherwise)."""
    query = queries.task_claim_limited if limited else queries.task_claim
    sql, args = query.positional(_claim_params(worker_id, finished))
    rows = await conn.fetch(sql, *args)
    return [r["id"] for r in rows if r["id"] is not None]


async def _seed(url: str, scenario: str, tasks: int) -> None:
    await _insert_config(url, SCENARIOS[scenario])
    conn = await db.connect(url)
    try:
        label = "'hot'" if scenario != "on-10" else "'h' || (g / 2 % 10)"
        every = 20 if scenario == "on-1-rare" else 2
        await conn.execute(
            "INSERT INTO taskfleet.tasks (type, labels, group_key)"
            f" SELECT 'demo.echo', CASE WHEN g % {every} = 0 THEN ARRAY[{label}] ELSE '{{}}' END,"
            f" '' FROM generate_series(1, {int(tasks)}) AS g"
        )
        await conn.execute("VACUUM ANALYZE taskfleet.tasks")
    finally:
        await conn.close()


async def _single(url: str, claims: int, limited: bool) -> dict[str, float]:
    conn = await db.connect(url)
    try:
        finished: list[int] = []
        times: list[float] = []
        for _ in range(claims):
            started = time.perf_counter()
            finished = await _claim(conn, "w-bench", finished, limited=limited)
            times.append(time.perf_counter() - started)
        times.sort()
        return {
            "claim_ms_median": round(statistics.median(times) * 1000, 3),
            "claim_ms_p95": round(times[int(len(times) * 0.95)] * 1000, 3),
        }
    finally:
        await conn.close()


async def _drain(url: str, claimers: int, limited: bool) -> dict[str, float]:
    conns = [await db.connect(url) for _ in range(claimers)]
    try:
        left = await conns[0].fetchval(
            "SELECT count(*) FROM taskfleet.tasks WHERE status = 'pending'"
        )

        async def claimer(index: int, conn: asyncpg.Connection) -> int:
            finished: list[int] = []
            done = empties = 0
            while empties < 3:
                got = await _claim(conn, f"w-drain-{index}", finished, limited=limited)
                done += len(finished)
                finished = got
                empties = 0 if got else empties + 1
            return done + len(finished)

        started = time.perf_counter()
        counts = await asyncio.gather(*(claimer(i, c) for i, c in enumerate(conns)))
        seconds = time.perf_counter() - started
        return {
            "drained": sum(counts),
            "pending_at_start": int(left),
            "drain_tasks_per_s": round(sum(counts) / seconds),
        }
    finally:
        for conn in conns:
            await conn.close()


async def measure(
    templates: Templates, scenario: str, tasks: int, claims: int, claimers: int
) -> dict[str, Any]:
    system = Taskfleet()
    result: dict[str, Any] = {"bench": "limits", "scenario": scenario, "tasks": tasks}
    async with templates.clone(system.template_key, system.install) as url:
        await _seed(url, scenario, tasks)
        limited = bool(SCENARIOS[scenario])
        result.update(await _single(url, claims, limited))
        result.update(await _drain(url, claimers, limited))
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


async def plan_costs(templates: Templates, tasks: int, runs: int = 30) -> list[dict[str, Any]]:
    system = Taskfleet()
    lines = []
    async with templates.clone(system.template_key, system.install) as url:
        await _seed(url, "off", tasks)
        conn = await db.connect(url)
        try:
            for query in (queries.task_claim, queries.task_claim_limited) * 2:
                sql, args = query.positional(_claim_params("w-plan", []))
                planning, execution = [], []
                for _ in range(runs):
                    transaction = conn.transaction()
                    await transaction.start()
                    try:
                        raw = await conn.fetchval(
                            f"EXPLAIN (ANALYZE, SUMMARY, FORMAT JSON) {sql}", *args
                        )
                    finally:
                        await transaction.rollback()
                    (doc,) = json.loads(raw) if isinstance(raw, str) else raw
                    planning.append(doc["Planning Time"])
                    execution.append(doc["Execution Time"])
                lines.append(
                    {
                        "bench": "limits-plan",
                        "statement": query.name,
                        "planning_ms_median": round(statistics.median(planning), 3),
                        "execution_ms_median": round(statistics.median(execution), 3),
                        "load_average": [round(x, 2) for x in os.getloadavg()],
                    }
                )
        finally:
            await conn.close()
    return lines


async def _main(args: argparse.Namespace) -> None:
    templates = Templates(args.database_url)
    if args.plan:
        try:
            for line in await plan_costs(templates, args.tasks):
                print(json.dumps(line), flush=True)
        finally:
            await templates.close()
        return
    try:
        for rep in range(args.reps):
            for scenario in SCENARIOS:
                line = await measure(templates, scenario, args.tasks, args.claims, args.claimers)
                line["rep"] = rep + 1
                print(json.dumps(line), flush=True)
    finally:
        await templates.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=40_000)
    parser.add_argument("--claims", type=int, default=1500)
    parser.add_argument("--claimers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--plan", action="store_true", help="the statements' server cost only")
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
