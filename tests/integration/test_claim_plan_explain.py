"""The claim statement stays an index scan over pending rows with a million-row backlog
(docs/reference.md#claiming): ``EXPLAIN`` of the real statement, prepared with real parameters."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from taskfleet.shared import queries as q
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY
from tests.integration.sql import (
    CLAIMABLE_TYPES,
    PLAN_MODES,
    Outcome,
    connected,
    ensure_grouping,
    explain_prepared,
    outcome_params,
    plan_as,
)

ROWS = 1_000_000

# One statement, shaped like a real backlog: the oldest 88% finished (completed, failed,
# cancelled), then a frontier of running and just-finished tasks, then the newest 10% pending
# across the control, strict and normal lanes (some delayed). Labels are spread the same way over
# finished and pending rows, so a label filter is not selective on its own.
SEED = f"""
INSERT INTO taskfleet.tasks
    (type, payload, status, priority, weight, labels, attempts, run_after, created_at,
     started_at, finished_at, worker_id, lease_expires_at, group_key)
SELECT 'demo.echo', '{{}}'::jsonb, s.status,
       CASE WHEN s.status = 'pending' AND g % 20000 = 0 THEN {CONTROL_PRIORITY}
            WHEN g % 10 = 3 THEN 1 + g % 7 ELSE 0 END,
       1 + g % 3,
       (ARRAY['{{}}', '{{a}}', '{{b,a}}', '{{c}}', '{{x}}', '{{b}}', '{{c,x}}'])[1 + g % 7]::text[],
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       now() - interval '1 day' + (CASE WHEN g % 97 = 0 THEN interval '2 days' ELSE '0' END),
       now() - interval '1 day' + g * interval '50 milliseconds',
       CASE WHEN s.status <> 'pending' THEN now() END,
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled') THEN now() END,
       CASE WHEN s.status = 'running' THEN 'w-' || g % 50 END,
       CASE WHEN s.status = 'running' THEN now() + interval '30 seconds' END,
       taskfleet.task_group_key(
           (ARRAY['{{}}', '{{a}}', '{{b,a}}', '{{c}}', '{{x}}', '{{b}}', '{{c,x}}'])
               [1 + g % 7]::text[],
           ARRAY['a', 'b', 'c'])
FROM generate_series(1, {ROWS}) AS g
CROSS JOIN LATERAL (
    SELECT CASE WHEN g > {ROWS} * 9 / 10 THEN 'pending'
                WHEN g > {ROWS} * 88 / 100 AND g % 2 = 0 THEN 'running'
                WHEN g % 10 = 5 THEN 'failed'
                WHEN g % 50 = 7 THEN 'cancelled'
                ELSE 'completed' END AS status
) AS s
"""


@pytest.fixture(scope="module")
def seeded_url(test_databases: Any) -> Iterator[str]:
    """One database seeded once for this module's EXPLAINs (read-only afterwards)."""
    url = test_databases.create()
    try:
        asyncio.run(_seed(url))
        yield url
    finally:
        test_databases.drop(url)


async def _seed(url: str) -> None:
    async with connected(url) as conn:
        # Bulk load without the secondary indexes, then build them from their own definitions:
        # the same schema, in a fraction of the time.
        indexes = await conn.fetch(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i "
            "WHERE i.schemaname = 'taskfleet' AND i.tablename = 'tasks' "
            "AND i.indexname <> 'tasks_pkey'"
        )
        assert {"tasks_claim_normal_idx", "tasks_claim_strict_idx"} <= {
            r["indexname"] for r in indexes
        }
        await ensure_grouping(conn, ["a", "b", "c"])  # the keys SEED writes
        await conn.execute("SET maintenance_work_mem = '256MB'")
        for row in indexes:
            await conn.execute(f"DROP INDEX taskfleet.{row['indexname']}")
        await conn.execute(SEED)
        for row in indexes:
            await conn.execute(row["indexdef"])
        await conn.execute("VACUUM ANALYZE taskfleet.tasks")
        counts = dict(
            await conn.fetch("SELECT status, count(*) FROM taskfleet.tasks GROUP BY status")
        )
        assert sum(counts.values()) == ROWS
        assert counts["pending"] == ROWS // 10


# The generic plan is the one a worker runs (taskfleet.shared.db.session_settings); the custom
# one what a claim gets on a connection without that setting. Neither may scan the backlog.
@pytest.fixture(params=sorted(PLAN_MODES))
async def conn(
    seeded_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[asyncpg.Connection]:
    async with connected(seeded_url) as conn:
        await plan_as(conn, request.param)
        yield conn


async def explain(
    conn: asyncpg.Connection,
    outcomes: list[Outcome] | None = None,
    query: q.Query = q.task_claim,
    document: bool = False,
    **params: Any,
) -> dict[str, Any]:
    """The planner's plan of ``task_claim`` (or ``query``), prepared with these parameters (not
    executed), under the connection's plan cache mode; ``document``: EXPLAIN's whole answer."""
    sql, args = query.positional(
        {
            **outcome_params(outcomes or [], error="boom"),
            "control_limit": 0,
            "strict_limit": 0,
            "group_keys": [],
            "group_limits": [],
            "probe_strict": False,
            "probe_normal": False,
            "worker_id": "w-explain",
            "lease_ttl": 30.0,
            "tags": [],
            "paused_labels": [],
            "types": list(CLAIMABLE_TYPES),
            **params,
        }
    )
    raw = await explain_prepared(conn, "FORMAT JSON", sql, args)
    (doc,) = json.loads(raw) if isinstance(raw, str) else raw
    return doc if document else doc["Plan"]


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def scans_of_tasks(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [
        (node["Node Type"], node.get("Index Name"))
        for node in nodes(plan)
        if node.get("Relation Name") == "tasks"
    ]


def assert_no_full_scans(plan: dict[str, Any]) -> None:
    scans = [node for node in nodes(plan) if node.get("Relation Name") == "tasks"]
    assert scans, "the plan reads taskfleet.tasks somewhere"
    # A sequential scan reads the whole backlog; a bitmap scan every finished row matching too.
    full = [
        f"{node['Node Type']} on tasks, filter {node.get('Filter') or node.get('Recheck Cond')}"
        for node in scans
        if node["Node Type"] == "Seq Scan" or node["Node Type"].startswith("Bitmap")
    ]
    assert full == []


async def test_normal_lane_claim_with_groups_uses_the_normal_claim_index(
    conn: asyncpg.Connection,
) -> None:
    # As the worker sends it: with the outcomes finished since its last claim.
    running = await conn.fetch(
        "SELECT id, worker_id FROM taskfleet.tasks WHERE status = 'running' LIMIT 3"
    )
    outcomes: list[Outcome] = [
        (running[0]["id"], "completed"),
        (running[1]["id"], "failed"),
        (running[2]["id"], "pending"),
    ]
    plan = await explain(
        conn,
        outcomes,
        worker_id=running[0]["worker_id"],
        control_limit=1,
        group_keys=["a", "b", "c", None],
        group_limits=[4, 2, 1, 1],
        probe_strict=True,
    )
    assert_no_full_scans(plan)
    indexes = {index for _, index in scans_of_tasks(plan)}
    assert "tasks_claim_normal_idx" in indexes
    # The control lane and the strict probe read the strict index, never the table.
    assert "tasks_claim_strict_idx" in indexes


async def test_the_claim_with_label_limits_uses_the_same_indexes(
    conn: asyncpg.Connection,
) -> None:
    plan = await explain(
        conn,
        query=q.task_claim_limited,
        control_limit=1,
        strict_limit=3,
        group_keys=["a", "x", None],
        group_limits=[5, 3, 2],
        probe_strict=True,
    )
    assert_no_full_scans(plan)
    assert {"tasks_claim_normal_idx", "tasks_claim_strict_idx"} <= {
        index for _, index in scans_of_tasks(plan)
    }


async def test_strict_claim_uses_the_strict_claim_index(conn: asyncpg.Connection) -> None:
    plan = await explain(conn, strict_limit=5)
    assert_no_full_scans(plan)
    assert "tasks_claim_strict_idx" in {index for _, index in scans_of_tasks(plan)}


async def test_strict_claim_probing_the_normal_lane_reads_the_normal_claim_index(
    conn: asyncpg.Connection,
) -> None:
    # Every slot went to the strict lane; the normal lane is only asked "is work waiting?".
    # The pending rows are the newest, so a sequential scan for the first one reads the whole
    # finished backlog first.
    plan = await explain(conn, strict_limit=5, probe_normal=True)
    assert_no_full_scans(plan)
    assert {"tasks_claim_normal_idx", "tasks_claim_strict_idx"} <= {
        index for _, index in scans_of_tasks(plan)
    }


async def test_full_claim_of_every_lane_uses_both_claim_indexes(
    conn: asyncpg.Connection,
) -> None:
    plan = await explain(
        conn,
        control_limit=1,
        strict_limit=3,
        group_keys=["a", "x", None],
        group_limits=[5, 3, 2],
    )
    assert_no_full_scans(plan)
    assert {"tasks_claim_normal_idx", "tasks_claim_strict_idx"} <= {
        index for _, index in scans_of_tasks(plan)
    }


async def test_the_planned_statement_claims_from_every_lane(conn: asyncpg.Connection) -> None:
    """The statement planned above works on this table (run in a transaction rolled back, so
    the other tests see the seed unchanged)."""
    sql, args = q.task_claim.positional(
        {
            **outcome_params([]),
            "control_limit": 1,
            "strict_limit": 3,
            "group_keys": ["a", "b", None],
            "group_limits": [4, 2, 2],
            "probe_strict": False,
            "probe_normal": False,
            "worker_id": "w-explain",
            "lease_ttl": 30.0,
            "tags": [],
            "paused_labels": [],
            "types": list(CLAIMABLE_TYPES),
        }
    )
    transaction = conn.transaction()
    await transaction.start()
    try:
        rows = await conn.fetch(sql, *args)
    finally:
        await transaction.rollback()
    assert len(rows) == 1 + 3 + 4 + 2 + 2
    assert sum(1 for r in rows if r["priority"] == CONTROL_PRIORITY) == 1
    assert sum(1 for r in rows if 0 < r["priority"] < CONTROL_PRIORITY) == 3


@pytest.mark.parametrize(
    "query",
    [q.task_claim, q.task_claim_steady, q.task_claim_normal, q.task_claim_limited],
    ids=lambda q: q.name,
)
async def test_a_generic_plan_built_on_an_empty_table_reads_no_table_through(
    database_url: str, query: q.Query
) -> None:
    # A worker's generic plan is built at its first claim, often on an empty table, and kept
    # until the next ANALYZE. Built so, the claim took its rows by a sequential scan of the
    # whole table, at every claim, however deep the backlog grew (a drain at a third of its
    # speed). The claim connection's settings allow no sequential scan.
    async with connected(database_url) as conn:
        await plan_as(conn, "generic")
        # Nor any JIT compilation: a plan that still needs a sequential scan (label_limits) carries
        # the cost that marks it disabled, and that cost would cross jit_above_cost.
        await conn.execute("SET jit_above_cost = 0")  # so that only the setting can prevent it
        doc = await explain(
            conn,
            document=True,
            outcomes=[(1, "completed")],
            query=query,
            control_limit=1,
            strict_limit=3,
            group_keys=["a", None],
            group_limits=[5, 2],
            probe_strict=True,
            probe_normal=True,
        )
    assert "JIT" not in doc
    plan = doc["Plan"]
    full = [
        f"{node['Node Type']} on {node['Relation Name']}"
        for node in nodes(plan)
        if node.get("Relation Name") == "tasks" and node["Node Type"] == "Seq Scan"
    ]
    assert full == []
    # The claimed rows by their key (a bitmap of at most one entry per claimed id is fine).
    assert "tasks_pkey" in {index for _, index in scans_of_tasks(plan)} | {
        node.get("Index Name") for node in nodes(plan)
    }
