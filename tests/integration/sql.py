"""Running the named queries on raw asyncpg connections, as the worker's hot path does.

Tests seed and inspect rows with plain SQL (allowed in tests); everything under test goes through
``taskfleet.shared.queries``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from taskfleet.shared import db
from taskfleet.shared import queries as q
from taskfleet.shared.policy.groups import GroupKey
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.policy.runtime_config import normalise_runtime_config

LEASE_TTL = 30.0


async def run(conn: asyncpg.Connection, query: q.Query, **params: Any) -> list[asyncpg.Record]:
    if q.SYNCHRONOUS_COMMIT_PARAM in query.params:  # a server-side function's call
        params.setdefault(q.SYNCHRONOUS_COMMIT_PARAM, "on")
    sql, args = query.positional(params)
    return await conn.fetch(sql, *args)


@asynccontextmanager
async def connected(url: str, name: str = "taskfleet-test") -> AsyncIterator[asyncpg.Connection]:
    conn = await db.connect(url, application_name=name)
    try:
        yield conn
    finally:
        await conn.close()


@dataclass(frozen=True)
class NewTask:
    """One task to submit through ``task_insert_batch`` (defaults as the API's)."""

    type: str = "demo.echo"
    payload: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    weight: int = 1
    labels: Sequence[str] = ()
    max_attempts: int = 3
    delay: float | None = None
    timeout: float | None = None
    unique_key: str | None = None
    requires: Sequence[str] = ()


async def insert_tasks(conn: asyncpg.Connection, tasks: Iterable[NewTask]) -> list[int]:
    """Submit the tasks in one statement; their ids in submission order."""
    tasks = list(tasks)
    rows = await run(
        conn,
        q.task_insert_batch,
        types=[t.type for t in tasks],
        payloads=[db.dumps(t.payload) for t in tasks],
        priorities=[t.priority for t in tasks],
        weights=[t.weight for t in tasks],
        labels=[json.dumps(list(t.labels)) for t in tasks],
        max_attempts=[t.max_attempts for t in tasks],
        delays=[t.delay for t in tasks],
        run_ats=[None for _ in tasks],
        timeouts=[t.timeout for t in tasks],
        unique_keys=[t.unique_key for t in tasks],
        requires=[json.dumps(list(t.requires)) for t in tasks],
        wake_hint="",
    )
    assert [r["ord"] for r in rows] == list(range(1, len(tasks) + 1))
    assert not any(r["deduplicated"] for r in rows)
    return [r["id"] for r in rows]


async def insert_task(conn: asyncpg.Connection, task: NewTask | None = None) -> int:
    (task_id,) = await insert_tasks(conn, [task or NewTask()])
    return task_id


def control_task() -> NewTask:
    return NewTask(type="updateWorkerRuntimeConfig", priority=CONTROL_PRIORITY, max_attempts=1)


#: The task types the tests' workers claim (a worker claims only types it has handlers for).
CLAIMABLE_TYPES: tuple[str, ...] = (
    "demo.echo",
    "demo.sleep",
    "demo.fail",
    "demo.cpu",
    RUNTIME_CONFIG_TASK_TYPE,
)

Outcome = tuple[int, str]
"""(task id, status the attempt ended in: completed, failed, cancelled or pending = retry)."""


def outcome_params(
    outcomes: Sequence[Outcome],
    *,
    error: str | None = None,
    retry_in: float = 0.0,
    attempts: Sequence[int] | None = None,
) -> dict[str, list[Any]]:
    """The ``fin_*`` parameters shared by ``task_finish_batch`` and ``task_claim``. ``attempts``:
    the attempt each outcome is of (the fence); default 1 each."""
    return {
        "fin_ids": [i for i, _ in outcomes],
        "fin_attempts": list(attempts) if attempts is not None else [1] * len(outcomes),
        "fin_statuses": [s for _, s in outcomes],
        "fin_results": ['{"ok": true}' if s == "completed" else None for _, s in outcomes],
        "fin_errors": [None if s == "completed" else error for _, s in outcomes],
        "fin_retry_in": [retry_in for _ in outcomes],
    }


@dataclass(frozen=True)
class Claim:
    """What one ``task_claim`` round trip returned."""

    strict_waiting: bool
    normal_waiting: bool
    rows: list[asyncpg.Record]
    #: The outcomes carried by the claim that were written (the guard let them through).
    finished_ids: list[int]

    @property
    def ids(self) -> list[int]:
        return [r["id"] for r in self.rows]


async def ensure_grouping(conn: asyncpg.Connection, configured: Sequence[str]) -> None:
    """Make ``configured`` the configured label set, as the fleet does: a runtime-config version
    with those labels (weight 1), then every pending row re-grouped. A no-op when it already is
    (the default: no configured label)."""
    current = await conn.fetchval(
        "SELECT labels FROM taskfleet.task_groupings ORDER BY version DESC LIMIT 1"
    )
    if sorted(current) == sorted(set(configured)):
        return
    config = normalise_runtime_config({"labelWeights": dict.fromkeys(configured, 1)})
    await run(
        conn,
        q.runtime_config_insert,
        request_id=config.request_id,
        payload=db.dumps(config.to_payload()),
    )
    for _ in range(10_000):
        (step,) = await run(conn, q.task_regroup_step, batch=1000)
        if step["state"] == "settled":
            return
        if step["state"] != "regrouping":
            await asyncio.sleep(0.01)
    raise AssertionError("re-grouping did not settle")


#: The plan modes a claim is explained under: a worker forces the generic plan (see
#: taskfleet.shared.db.session_settings); the custom plan is what a claim gets without it.
PLAN_MODES = {"generic": "force_generic_plan", "custom": "force_custom_plan"}


async def plan_as(conn: asyncpg.Connection, mode: str) -> None:
    """Plan ``conn``'s statements as a worker's claim connection does (``generic``: the settings
    of db.session_settings(generic_plans=True)) or with a custom plan every time."""
    if mode == "generic":
        for name, value in db.session_settings(generic_plans=True).items():
            await conn.execute(f"SET {name} = '{value}'")
    else:
        await conn.execute(f"SET plan_cache_mode = {PLAN_MODES[mode]}")


async def explain_prepared(
    conn: asyncpg.Connection, options: str, sql: str, args: Sequence[Any]
) -> Any:
    """``EXPLAIN (options)`` of ``sql`` run as a prepared statement, as the worker runs it: the
    plan its plan cache chooses under the connection's ``plan_cache_mode``. (EXECUTE takes no
    protocol parameters: the arguments go as literals the server quotes.)"""
    await conn.execute(f"PREPARE explained AS {sql}")
    try:
        kinds = await conn.fetchval(
            "SELECT CAST(parameter_types AS text[]) FROM pg_prepared_statements"
            " WHERE name = 'explained'"
        )
        literals = [
            await conn.fetchval(f"SELECT quote_nullable(CAST($1 AS {kind}))", arg)
            for kind, arg in zip(kinds, args, strict=True)
        ]
        plan = await conn.fetchval(f"EXPLAIN ({options}) EXECUTE explained({', '.join(literals)})")
        if await conn.fetchval("SHOW plan_cache_mode") == "force_generic_plan":
            # A generic plan refers to the parameters themselves, not to their values.
            assert re.search(r"\$\d+", json.dumps(plan)), "not a generic plan"
        return plan
    finally:
        await conn.execute("DEALLOCATE explained")


async def claim(
    conn: asyncpg.Connection,
    *,
    worker_id: str = "w1",
    control: int = 0,
    strict: int = 0,
    groups: Sequence[tuple[GroupKey, int]] = (),
    configured: Sequence[str] = (),
    probe_strict: bool = False,
    probe_normal: bool = False,
    lease_ttl: float = LEASE_TTL,
    outcomes: Sequence[Outcome] = (),
    error: str | None = None,
    attempts: Sequence[int] | None = None,
    types: Sequence[str] = CLAIMABLE_TYPES,
    tags: Sequence[str] = (),
    paused_labels: Sequence[str] = (),
) -> Claim:
    await ensure_grouping(conn, configured)
    if attempts is None:
        attempts = await current_attempts(conn, [i for i, _ in outcomes])
    params = dict(
        **outcome_params(outcomes, error=error, attempts=attempts),
        control_limit=control,
        strict_limit=strict,
        group_keys=[g for g, _ in groups],
        group_limits=[n for _, n in groups],
        probe_strict=probe_strict,
        probe_normal=probe_normal,
        worker_id=worker_id,
        lease_ttl=lease_ttl,
        types=list(types),
        tags=sorted(tags),
        paused_labels=list(paused_labels),
    )
    rows = await run(conn, q.task_claim, **params)
    if rows and rows[0]["limits_active"]:
        # As the worker does: a label limit is active, claim with its accounting.
        assert all(r["id"] is None or r["priority"] == CONTROL_PRIORITY for r in rows)
        rows = await run(conn, q.task_claim_limited, **params)
    assert rows, "task_claim always returns at least one row"
    # The per-statement columns repeat on every row.
    waiting = {(r["strict_waiting"], r["normal_waiting"]) for r in rows}
    finished = {tuple(sorted(r["finished_ids"])) for r in rows}
    assert len(waiting) == len(finished) == 1
    strict_waiting, normal_waiting = waiting.pop()
    claimed = [r for r in rows if r["id"] is not None]
    assert len(claimed) == len(rows) or len(rows) == 1, "an empty claim is exactly one NULL row"
    return Claim(
        strict_waiting=strict_waiting,
        normal_waiting=normal_waiting,
        rows=claimed,
        finished_ids=list(finished.pop()),
    )


async def claim_ids(conn: asyncpg.Connection, **kwargs: Any) -> list[int]:
    return (await claim(conn, **kwargs)).ids


async def register_worker(
    conn: asyncpg.Connection,
    worker_id: str,
    concurrency: int = 4,
    tags: Sequence[str] = (),
    lease_ttl: float = LEASE_TTL,
) -> None:
    await run(
        conn,
        q.worker_register,
        id=worker_id,
        hostname="test-host",
        pid=1,
        concurrency=concurrency,
        heartbeat_interval=3.0,
        lease_ttl=lease_ttl,
        applied_config_version=0,
        metrics_port=None,
        task_types=[t for t in CLAIMABLE_TYPES if t != RUNTIME_CONFIG_TASK_TYPE],
        tags=sorted(tags),
    )


async def tick(
    conn: asyncpg.Connection,
    worker_id: str,
    *,
    held: Sequence[int] = (),
    held_attempts: Sequence[int] | None = None,
    sweep: bool = False,
    inflight: int = 0,
    strict_inflight: int = 0,
    applied_version: int = 0,
) -> list[tuple[str, int | None, str | None]]:
    """``worker_tick`` as (kind, id, status) tuples; ``held`` are the task ids this worker
    process runs (its heartbeat vouches only for those), each at its current attempt unless
    ``held_attempts`` says otherwise."""
    if held_attempts is None:
        held_attempts = await current_attempts(conn, held)
    rows = await run(
        conn,
        q.worker_tick,
        status="online",
        hostname="test-host",
        pid=1,
        inflight=inflight,
        strict_inflight=strict_inflight,
        applied_version=applied_version,
        held=list(held),
        held_attempts=list(held_attempts),
        worker_id=worker_id,
        sweep=sweep,
        sweep_lock_key=q.SWEEP_LOCK_KEY,
        prune_statuses=[],
        prune_keep=[],
        workers_keep=None,
        configs_kept=300,
    )
    return [(r["kind"], r["id"], r["status"]) for r in rows]


def of_kind(rows: Iterable[tuple[str, int | None, str | None]], kind: str) -> list[Any]:
    return [(i, s) for k, i, s in rows if k == kind]


async def finish(
    conn: asyncpg.Connection,
    worker_id: str,
    outcomes: Sequence[Outcome],
    *,
    error: str | None = None,
    retry_in: float = 0.0,
    attempts: Sequence[int] | None = None,
) -> list[Outcome]:
    """``task_finish_batch`` for (id, status) pairs, each of its current attempt unless
    ``attempts`` says otherwise; the rows it changed."""
    if attempts is None:
        attempts = await current_attempts(conn, [i for i, _ in outcomes])
    rows = await run(
        conn,
        q.task_finish_batch,
        **outcome_params(outcomes, error=error, retry_in=retry_in, attempts=attempts),
        worker_id=worker_id,
    )
    return sorted((r["id"], r["status"]) for r in rows)


async def current_attempts(conn: asyncpg.Connection, ids: Sequence[int]) -> list[int]:
    """Each task's attempts column now (the attempt a worker holding it runs)."""
    rows = await conn.fetch(
        "SELECT id, attempts FROM taskfleet.tasks WHERE id = ANY($1::bigint[])", list(ids)
    )
    by_id = {r["id"]: r["attempts"] for r in rows}
    return [by_id.get(i, 0) for i in ids]


async def expire_leases(conn: asyncpg.Connection, ids: Sequence[int]) -> None:
    """Expire the leases of these tasks on the database's clock (no sleeping): the lease the
    claim gave them is in the past, and so is the last heartbeat of the workers holding them (a
    running task's lease is its worker's heartbeat). A holder that ticks again vouches for the
    tasks it names once more."""
    await conn.execute(
        "UPDATE taskfleet.tasks SET lease_expires_at = now() - interval '1 second' "
        "WHERE id = ANY($1::bigint[])",
        list(ids),
    )
    await conn.execute(
        "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '1 hour' WHERE id IN "
        "(SELECT worker_id FROM taskfleet.tasks WHERE id = ANY($1::bigint[]))",
        list(ids),
    )


async def task_row(conn: asyncpg.Connection, task_id: int) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM taskfleet.tasks WHERE id = $1", task_id)
    assert row is not None
    return row


async def statuses(conn: asyncpg.Connection) -> dict[int, str]:
    rows = await conn.fetch("SELECT id, status FROM taskfleet.tasks")
    return {r["id"]: r["status"] for r in rows}
