"""Fairness: does a saturated worker share its slots as the runtime config says? (taskfleet only:
pgqueuer and procrastinate have priorities, but no weighted groups and no strict-lane cap.)

Two runs, each on a fresh database with a runtime config version inserted before the worker
starts (``runtime_config_insert``, payload from ``normalise_runtime_config``) and the backlog
queued before it starts, one worker x 10 slots:

- weights: labelWeights {a: 5, b: 1}, defaultWeight 1; tasks evenly split over label a, label b
  and no label. Shares of the claims made while all three groups still had pending work (every
  claim statement before the one that took some group's last task), against 5/7, 1/7, 1/7.
- strict cap: maxStrictPercentage 30 (cap = ceil(10 x 30 / 100) = 3 of 10 slots); strict
  (priority 1) and normal tasks, all sleeping 20 ms so slots are really held. The strict share of
  claims, and of busy slot time, while both lanes had pending work, against cap/concurrency.
  And the rate with only strict work queued: the cap must limit it, not stall it.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import processes
from bench.drain import wait_until_empty
from bench.scratch import Templates
from bench.systems import Taskfleet, taskfleet_insert, taskfleet_insert_params
from taskfleet.shared import db, queries
from taskfleet.shared.policy.runtime_config import normalise_runtime_config

WEIGHTS = {"a": 5, "b": 1}
DEFAULT_WEIGHT = 1
STRICT_PERCENT = 30
CONCURRENCY = 10
#: The strict-lane runs use tasks that really hold their slot for a while.
SLEEP = {"seconds": 0.02}


@dataclass(frozen=True)
class Shares:
    observed: dict[str, float]
    expected: dict[str, float]
    claims: int
    extra: dict[str, Any]

    @property
    def max_abs_error(self) -> float:
        """Largest |observed - expected| share, in share points (0.01 = 1 point)."""
        return max(abs(self.observed[k] - v) for k, v in self.expected.items())

    @property
    def max_rel_error(self) -> float:
        """Largest |observed - expected| / expected."""
        return max(abs(self.observed[k] - v) / v for k, v in self.expected.items())


async def _insert_config(url: str, params: dict[str, Any]) -> None:
    config = normalise_runtime_config(params)
    conn = await db.connect(url)
    try:
        sql, args = queries.runtime_config_insert.positional(
            {"request_id": config.request_id, "payload": db.dumps(config.to_payload())}
        )
        await conn.execute(sql, *args)
    finally:
        await conn.close()


async def _with_worker(
    templates: Templates,
    config: dict[str, Any],
    batches: list[dict[str, Any]],
    query: str,
) -> list[asyncpg.Record]:
    system = Taskfleet()
    async with templates.clone(system.template_key, system.install) as url:
        await _insert_config(url, config)
        conn = await db.connect(url)
        try:
            for params in batches:
                await taskfleet_insert(conn, params)
        finally:
            await conn.close()
        fleet = await system.start_workers(url, 1, CONCURRENCY)
        try:
            conn = await asyncpg.connect(url)
            try:
                await wait_until_empty(system, conn, timeout=300)
                return list(await conn.fetch(query))
            finally:
                await conn.close()
        finally:
            await processes.stop(fleet)


def _group(labels: list[str]) -> str:
    configured = sorted(set(labels) & set(WEIGHTS))
    return configured[0] if configured else "default"


async def measure_weights(templates: Templates, *, tasks: int = 10_000) -> Shares:
    cycle = [["a"], ["b"], []]
    params = taskfleet_insert_params(tasks, labels=lambda i: cycle[i % 3])
    rows = await _with_worker(
        templates,
        {"labelWeights": WEIGHTS, "defaultWeight": DEFAULT_WEIGHT},
        [params],
        "SELECT labels, started_at FROM taskfleet.tasks"
        " WHERE type = 'demo.echo' ORDER BY started_at, id",
    )
    groups = [_group(list(r["labels"])) for r in rows]
    # The claim statement that took some group's last task: claims before it were all made
    # with every group backlogged.
    last_claim = {g: r["started_at"] for g, r in zip(groups, rows, strict=True)}
    cutoff = min(last_claim.values())
    window = [g for g, r in zip(groups, rows, strict=True) if r["started_at"] < cutoff]
    total_weight = sum(WEIGHTS.values()) + DEFAULT_WEIGHT
    expected = {g: w / total_weight for g, w in {**WEIGHTS, "default": DEFAULT_WEIGHT}.items()}
    n = len(window)
    observed = {g: (window.count(g) / n if n else 0.0) for g in expected}
    return Shares(observed, expected, n, {"tasks": tasks})


async def measure_strict(
    templates: Templates, *, strict_tasks: int = 900, normal_tasks: int = 2_100
) -> Shares:
    batches = [
        taskfleet_insert_params(normal_tasks, task_type="demo.sleep", payload=SLEEP),
        taskfleet_insert_params(strict_tasks, task_type="demo.sleep", payload=SLEEP, priority=1),
    ]
    rows = await _with_worker(
        templates,
        {"maxStrictPercentage": STRICT_PERCENT},
        batches,
        "SELECT priority > 0 AS strict, started_at, finished_at FROM taskfleet.tasks"
        " WHERE type = 'demo.sleep' ORDER BY started_at, id",
    )
    last_claim = {}
    for r in rows:
        last_claim[r["strict"]] = r["started_at"]
    cutoff = min(last_claim.values())
    window = [r for r in rows if r["started_at"] < cutoff]
    first = window[0]["started_at"] if window else cutoff
    claims = len(window)
    strict_claims = sum(1 for r in window if r["strict"])
    # Busy slot time inside the window, by lane (finished_at is when the outcome was written,
    # a little after the handler returned; the same for both lanes).
    busy = {True: 0.0, False: 0.0}
    for r in rows:
        start = max(r["started_at"], first)
        end = min(r["finished_at"], cutoff)
        if end > start:
            busy[r["strict"]] += (end - start).total_seconds()
    cap = -(-CONCURRENCY * STRICT_PERCENT // 100)
    expected = {"strict": cap / CONCURRENCY}
    observed = {"strict": strict_claims / claims if claims else 0.0}
    slot_share = busy[True] / (busy[True] + busy[False]) if any(busy.values()) else 0.0
    return Shares(
        observed,
        expected,
        claims,
        {
            "slot_time_share": slot_share,
            "cap": cap,
            "window_seconds": (cutoff - first).total_seconds(),
        },
    )


async def measure_strict_only(templates: Templates, *, tasks: int = 30) -> float:
    """Tasks/s with only strict work queued (cap 3 of 10, 20 ms each): the cap should still let
    3 run at a time, about cap / 20 ms = 150 tasks/s."""
    rows = await _with_worker(
        templates,
        {"maxStrictPercentage": STRICT_PERCENT},
        [taskfleet_insert_params(tasks, task_type="demo.sleep", payload=SLEEP, priority=1)],
        "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 AS s"
        " FROM taskfleet.tasks WHERE type = 'demo.sleep'",
    )
    seconds = float(rows[0]["s"] or 0.0)
    return tasks / seconds if seconds else 0.0


async def _wait_for_starts(conn: asyncpg.Connection, n: int, timeout: float = 300.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    query = "SELECT count(*) >= $1 FROM taskfleet.tasks WHERE started_at IS NOT NULL"
    while not await conn.fetchval(query, n):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"fewer than {n} starts after {timeout:g}s")
        await asyncio.sleep(0.1)


async def measure_fleet(
    templates: Templates, *, per_group: int = 20_000, window: int = 10_000
) -> Shares:
    """Three worker processes of 2, 5 and 10 slots draining a:3 / b:1 together: a's share of
    the first ``window`` starts fleet-wide (both groups have work all along), against 75%."""
    system = Taskfleet()
    weights = {"a": 3, "b": 1}
    async with templates.clone(system.template_key, system.install) as url:
        await _insert_config(url, {"labelWeights": weights})
        conn = await db.connect(url)
        try:
            cycle = [["a"], ["b"]]
            await taskfleet_insert(
                conn, taskfleet_insert_params(2 * per_group, labels=lambda i: cycle[i % 2])
            )
        finally:
            await conn.close()
        fleet: list[processes.Process] = []
        try:
            for i, slots in enumerate((2, 5, 10)):
                argv = [
                    sys.executable, "-m", "taskfleet.cli", "worker",
                    "--concurrency", str(slots), "--metrics-port", "0",
                    "--worker-id", f"fleet-{slots}",
                ]  # fmt: skip
                p = await processes.start(f"taskfleet-worker-{i}", argv, system.worker_env(url))
                p.discard_output()
                fleet.append(p)
            conn = await asyncpg.connect(url)
            try:
                await _wait_for_starts(conn, window)
                rows = await conn.fetch(
                    "SELECT labels[1] AS grp, worker_id FROM taskfleet.tasks"
                    " WHERE started_at IS NOT NULL ORDER BY started_at, id LIMIT $1",
                    window,
                )
            finally:
                await conn.close()
        finally:
            await processes.stop(fleet)
    n = len(rows)
    share_a = sum(1 for r in rows if r["grp"] == "a") / n
    per_worker = {
        w: sum(1 for r in rows if r["worker_id"] == w) for w in {r["worker_id"] for r in rows}
    }
    return Shares(
        {"a": share_a, "b": 1 - share_a}, {"a": 0.75, "b": 0.25}, n, {"per_worker": per_worker}
    )


async def measure_slot_time(templates: Templates, *, per_group: int = 400) -> Shares:
    """Weights share claims (starts), not slot time: a:1 / b:1, a's tasks sleep 10 ms, b's
    40 ms, one worker x 10. Starts split 50/50; busy slot time about 20/80."""
    rows = await _with_worker(
        templates,
        {"labelWeights": {"a": 1, "b": 1}},
        [
            taskfleet_insert_params(
                per_group, task_type="demo.sleep", payload={"seconds": 0.01}, labels=lambda i: ["a"]
            ),
            taskfleet_insert_params(
                per_group, task_type="demo.sleep", payload={"seconds": 0.04}, labels=lambda i: ["b"]
            ),
        ],
        "SELECT labels[1] AS grp, started_at, finished_at FROM taskfleet.tasks"
        " WHERE type = 'demo.sleep' ORDER BY started_at, id",
    )
    last = {}
    for r in rows:
        last[r["grp"]] = r["started_at"]
    cutoff = min(last.values())
    window = [r for r in rows if r["started_at"] < cutoff]
    first = window[0]["started_at"]
    starts_a = sum(1 for r in window if r["grp"] == "a") / len(window)
    busy = {"a": 0.0, "b": 0.0}
    for r in rows:
        start, end = max(r["started_at"], first), min(r["finished_at"], cutoff)
        if end > start:
            busy[r["grp"]] += (end - start).total_seconds()
    slot_a = busy["a"] / (busy["a"] + busy["b"])
    return Shares(
        {"a": starts_a, "b": 1 - starts_a},
        {"a": 0.5, "b": 0.5},
        len(window),
        {"slot_time_a": slot_a, "slot_time_b": 1 - slot_a},
    )
