"""The claim through its server-side function, as a worker behind a transaction-mode pooler runs
it (docs/operations.md#pgbouncer): used when installed, the statement itself when not.

The worker's pooled mode is exercised here straight against Postgres (the same protocol path; the
PgBouncer tests run it through a real pooler). Every claim behaviour test runs through both paths
(test_claim_query.py, test_claim_controls.py).
"""

from __future__ import annotations

import logging

import pytest

from taskfleet.shared import queries as q
from taskfleet.worker.database import Database
from taskfleet.worker.outcomes import finish_params
from tests.integration.sql import CLAIMABLE_TYPES, connected, insert_task


def claim_params() -> dict[str, object]:
    return dict(
        **finish_params([]),
        control_limit=0,
        strict_limit=0,
        group_keys=[""],
        group_limits=[5],
        probe_strict=False,
        probe_normal=False,
        worker_id="w1",
        lease_ttl=30.0,
        types=list(CLAIMABLE_TYPES),
        tags=[],
        paused_labels=[],
    )


async def test_a_pooled_claim_runs_the_function_and_falls_back_when_it_is_missing(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pooled = Database(database_url, "taskfleet-test", pooled=True)
    try:
        async with connected(database_url) as conn:
            first = await insert_task(conn)
            rows = await pooled.fetch(q.task_claim, **claim_params())
            assert [r["id"] for r in rows] == [first]
            assert "task_claim" in pooled.by_function

            await conn.execute(f"DROP FUNCTION {q.server_function_name(q.task_claim)}")
            second = await insert_task(conn)
            with caplog.at_level(logging.WARNING, logger="taskfleet.worker.database"):
                rows = await pooled.fetch(q.task_claim, **claim_params())
            assert [r["id"] for r in rows] == [second]
            assert "task_claim" not in pooled.by_function
            (warning,) = [r.getMessage() for r in caplog.records]
            assert "no server-side function" in warning and "migrate" in warning
            # Both claimed, each once, by the worker named in the claim.
            claimed = await conn.fetch(
                "SELECT id, status, worker_id FROM taskfleet.tasks ORDER BY id"
            )
            assert [tuple(r) for r in claimed] == [
                (first, "running", "w1"),
                (second, "running", "w1"),
            ]
    finally:
        await pooled.close()
