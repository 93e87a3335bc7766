"""A claim says why a group (or the strict lane) came back short: rows held by another worker's
claim in flight (contended: ask again soon) or nothing ready (empty: dry until a hint)."""

from __future__ import annotations

from typing import Any

import asyncpg

from taskfleet.shared import queries as q
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE
from tests.integration.sql import (
    NewTask,
    connected,
    ensure_grouping,
    insert_tasks,
    outcome_params,
    run,
)


async def _claim(conn: asyncpg.Connection, **params: Any) -> list[asyncpg.Record]:
    return await run(
        conn,
        q.task_claim,
        **{
            **outcome_params([]),
            "control_limit": 0,
            "strict_limit": 0,
            "group_keys": [],
            "group_limits": [],
            "probe_strict": False,
            "probe_normal": False,
            "lease_ttl": 30.0,
            "tags": [],
            "paused_labels": [],
            "types": ["demo.echo", RUNTIME_CONFIG_TASK_TYPE],
            **params,
        },
    )


async def test_a_group_held_by_another_claim_is_contended_an_empty_one_is_not(
    conn: asyncpg.Connection, database_url: str
) -> None:
    await ensure_grouping(conn, ["a", "b"])
    await insert_tasks(conn, [NewTask(labels=["b"]) for _ in range(3)])
    await insert_tasks(conn, [NewTask(priority=5) for _ in range(2)])
    async with connected(database_url) as other:
        held = other.transaction()
        await held.start()
        try:
            # Another worker's claim, not committed yet: it holds b's rows and the strict rows.
            rows = await _claim(
                other, worker_id="w-other", strict_limit=2, group_keys=["b"], group_limits=[3]
            )
            assert sum(1 for r in rows if r["id"] is not None) == 5
            (row,) = await _claim(
                conn, worker_id="w-me", strict_limit=2, group_keys=["a", "b"], group_limits=[2, 2]
            )
            assert row["id"] is None  # nothing claimed
            assert list(row["contended_groups"]) == ["b"]  # a is empty, b is held
            assert row["strict_contended"] is True
        finally:
            await held.rollback()
    # Nobody holds them now: a full claim is not short, so nothing is contended.
    rows = await _claim(
        conn, worker_id="w-me", strict_limit=2, group_keys=["a", "b"], group_limits=[0, 3]
    )
    assert sum(1 for r in rows if r["id"] is not None) == 5
    assert list(rows[0]["contended_groups"]) == []
    assert rows[0]["strict_contended"] is False
    # Everything taken: short and empty, not contended.
    (row,) = await _claim(
        conn, worker_id="w-me", strict_limit=2, group_keys=["b"], group_limits=[3]
    )
    assert row["id"] is None
    assert list(row["contended_groups"]) == []
    assert row["strict_contended"] is False
