"""Seeding task rows straight into Postgres, with every column a test may want to fix.

The bulk-action and statistics tests need tasks in every state, of several ages, lanes and
groups; inserting them as rows (rather than running them through a fleet) makes the truth known
up front, so the API's answers can be compared with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import asyncpg

FINISHED = ("completed", "failed", "cancelled")


@dataclass
class Seed:
    """One task row. Times are offsets in seconds from the database's now() (negative: past)."""

    status: str = "pending"
    type: str = "demo.echo"
    priority: int = 0
    labels: list[str] = field(default_factory=list)
    created: float = -60.0
    run_after: float | None = None  # default: created
    finished: float | None = None  # default for a finished status: now
    unique_key: str | None = None
    id: int = 0  # set by seed()

    @property
    def lane(self) -> str:
        if self.priority >= 2_147_483_647:
            return "control"
        return "strict" if self.priority > 0 else "normal"


async def seed(conn: asyncpg.Connection, tasks: list[Seed]) -> list[Seed]:
    """Insert the tasks in order (ids ascending) and set their ids."""
    for task in tasks:
        finished = task.finished if task.finished is not None else 0.0
        task.id = await conn.fetchval(
            """
            INSERT INTO taskfleet.tasks
                (type, payload, status, priority, labels, created_at, run_after, started_at,
                 finished_at, worker_id, attempts, last_error, unique_key)
            VALUES ($1, $2::jsonb, $3, $4, $5,
                    now() + make_interval(secs => $6),
                    now() + make_interval(secs => $7),
                    CASE WHEN $3 <> 'pending' THEN now() + make_interval(secs => $6) END,
                    CASE WHEN $3 = ANY($8::text[]) THEN now() + make_interval(secs => $9) END,
                    CASE WHEN $3 <> 'pending' THEN 'w-seed' END,
                    CASE WHEN $3 = 'pending' THEN 0 ELSE 1 END,
                    CASE WHEN $3 = 'failed' THEN 'boom' END,
                    $10)
            RETURNING id
            """,
            task.type,
            json.dumps({}),
            task.status,
            task.priority,
            task.labels,
            task.created,
            task.run_after if task.run_after is not None else task.created,
            list(FINISHED),
            finished,
            task.unique_key,
        )
    return tasks


async def statuses(conn: asyncpg.Connection) -> dict[int, tuple[str, bool]]:
    """id -> (status, cancel_requested) of every task."""
    rows = await conn.fetch("SELECT id, status, cancel_requested FROM taskfleet.tasks")
    return {r["id"]: (r["status"], r["cancel_requested"]) for r in rows}


async def set_config(conn: asyncpg.Connection, payload: dict[str, Any]) -> int:
    """Write a runtime config version directly (as the update task would); its version."""
    version: int = await conn.fetchval(
        "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)"
        " VALUES (gen_random_uuid()::text, $1::jsonb) RETURNING version",
        json.dumps(payload),
    )
    return version
