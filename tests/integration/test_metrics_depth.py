"""The unknown-type count of ``/metrics`` (``taskfleet_tasks_unrunnable{reason="unknown_type"}``)
reads a bounded number of buffers whatever the table holds: a type the fleet no longer runs,
with many finished rows kept by retention, next to a deep backlog of a type it runs (it walked
one or the other in full: 136 ms a scrape at 1,000,000 rows)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from taskfleet.shared import queries as q
from tests.integration.sql import connected, explain_prepared, register_worker

FINISHED = 200_000
#: A deep backlog of a type the fleet runs: counting pending rows by status alone is no way out.
BACKLOG = 100_000
#: Buffers one scrape's count may read here: measured 10-20 (a probe per pending type and the
#: alive workers' rows). Walking the finished rows reads thousands.
MAX_BUFFERS = 100


async def unrunnable(conn: asyncpg.Connection) -> tuple[dict[str, int], int]:
    """The counts by reason, and the buffers the statement read (EXPLAIN ANALYZE, BUFFERS, as
    a prepared statement)."""
    sql, args = q.metrics_unrunnable.positional({"limit": 10_001})
    rows = await conn.fetch(sql, *args)
    raw = await explain_prepared(conn, "ANALYZE, BUFFERS, FORMAT JSON", sql, args)
    (doc,) = json.loads(raw) if isinstance(raw, str) else raw
    plan: dict[str, Any] = doc["Plan"]
    buffers = int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    return {r["reason"]: int(r["tasks"]) for r in rows}, buffers


async def test_a_retired_types_history_costs_the_count_nothing(database_url: str) -> None:
    async with connected(database_url) as conn:
        await conn.execute(
            "INSERT INTO taskfleet.tasks (type, status, attempts, finished_at)"
            " SELECT 'retired.kind', 'completed', 1, now() FROM generate_series(1, $1)",
            FINISHED,
        )
        await conn.execute(
            "INSERT INTO taskfleet.tasks (type) SELECT 'demo.echo' FROM generate_series(1, $1)",
            BACKLOG,
        )
        await conn.execute("VACUUM ANALYZE taskfleet.tasks")
        # Registered after the set-up, which took longer than the lease on a loaded CI machine
        # (the worker then counted as gone, and every pending task as of an unknown type).
        await register_worker(conn, "w1")  # alive, has handlers for the demo types only
        counts, buffers = await unrunnable(conn)
        assert counts == {"unknown_type": 0, "missing_tags": 0}
        assert buffers <= MAX_BUFFERS, buffers

        # Pending tasks of unknown types are still counted, each type to the limit.
        await conn.execute(
            "INSERT INTO taskfleet.tasks (type) SELECT 'retired.kind' FROM generate_series(1, 3)"
            " UNION ALL SELECT 'other.kind' FROM generate_series(1, 2)"
        )
        counts, buffers = await unrunnable(conn)
        assert counts == {"unknown_type": 5, "missing_tags": 0}
        assert buffers <= MAX_BUFFERS, buffers
