"""``audit.record``: a task type with a side effect, for exactly-once accounting in e2e tests.

Workers and the API load it with ``TASKFLEET_TASK_MODULES=tests.e2e.audit_tasks``. Each run of
the handler inserts ``(token, pid, now())`` into ``public.audit_runs`` (the test creates the table)
*before* it sleeps, so a run that a kill -9 interrupts still leaves its row: the rows per token
count the runs that started, and the test compares them with the task's attempts.

The handler opens its own connection per run (not a pool): a fault test kills or restarts the
server, and a fresh connection per run keeps a broken one from leaking into the next run.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from pydantic import Field

from taskfleet.shared.db import asyncpg_dsn
from taskfleet.shared.registry import TaskParams, task

AUDIT_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS public.audit_runs (
    token text NOT NULL,
    pid int NOT NULL,
    ran_at timestamptz NOT NULL
)
"""


class AuditParams(TaskParams):
    token: str = Field(min_length=1, max_length=200)
    seconds: float = Field(default=0.0, ge=0, le=3600)


@task("audit.record", params=AuditParams)
async def record(params: AuditParams) -> dict[str, Any]:
    conn = await asyncpg.connect(
        asyncpg_dsn(os.environ["DATABASE_URL"]),
        timeout=10,
        server_settings={"application_name": "taskfleet-e2e-audit"},
    )
    try:
        await conn.execute(
            "INSERT INTO public.audit_runs (token, pid, ran_at) VALUES ($1, $2, now())",
            params.token,
            os.getpid(),
        )
    finally:
        await conn.close()
    if params.seconds:
        await asyncio.sleep(params.seconds)
    return {"token": params.token, "pid": os.getpid()}


# ------------------------------------------------------------------------------------------------
# The test side: the table and the accounting (never called by the handler's processes).
# ------------------------------------------------------------------------------------------------

#: The module the fleet's processes load (TASKFLEET_TASK_MODULES).
AUDIT_MODULE_ENV = {"TASKFLEET_TASK_MODULES": "tests.e2e.audit_tasks"}


def audit_task(token: str, seconds: float = 0.0, **fields: Any) -> dict[str, Any]:
    """A task body for POST /tasks."""
    payload: dict[str, Any] = {"token": token}
    if seconds:
        payload["seconds"] = seconds
    return {"type": "audit.record", "payload": payload, **fields}


async def create_audit_table(conn: asyncpg.Connection) -> None:
    await conn.execute(AUDIT_TABLE_DDL)


@dataclass
class AuditReport:
    """Tasks submitted (by token) against the runs their handler recorded."""

    tasks: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    audit_rows: int = 0
    #: Runs that left a row but not the task's completion (rows beyond one per completed task).
    runs_without_completion: int = 0
    #: Tasks claimed more than once (attempts > 1): the only ones allowed more than one run.
    retried_tasks: int = 0
    #: Tasks with more than one recorded run.
    tasks_run_more_than_once: int = 0
    #: Broken rules, one line each; empty when every task ran exactly as accounted.
    violations: list[str] = field(default_factory=list)
    #: token -> pids of its runs, for tokens with more than one run.
    repeated: dict[str, list[int]] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"tasks={self.tasks} statuses={dict(self.statuses)} audit_rows={self.audit_rows} "
            f"runs_without_completion={self.runs_without_completion} "
            f"tasks_with_attempts_gt_1={self.retried_tasks} "
            f"tasks_run_more_than_once={self.tasks_run_more_than_once}"
        )


async def audit_accounting(conn: asyncpg.Connection, ids_by_token: dict[str, int]) -> AuditReport:
    """Check every submitted token against its task and its recorded runs.

    Rules: each token's task is completed; it has at least one run and at most ``attempts``
    runs (a run is an attempt that got as far as the handler's insert); the completing run is
    among them (the result's pid); no run was recorded for a token nobody submitted.
    """
    tasks = {
        row["id"]: row
        for row in await conn.fetch(
            "SELECT id, status, attempts, result::text AS result FROM taskfleet.tasks "
            "WHERE id = ANY($1::bigint[])",
            list(ids_by_token.values()),
        )
    }
    runs: dict[str, list[int]] = {}
    for row in await conn.fetch("SELECT token, pid FROM public.audit_runs ORDER BY ran_at"):
        runs.setdefault(row["token"], []).append(row["pid"])
    report = AuditReport(tasks=len(ids_by_token))
    report.audit_rows = sum(len(pids) for pids in runs.values())
    for token in sorted(set(runs) - set(ids_by_token)):
        report.violations.append(f"{token}: runs recorded for a token that was never submitted")
    for token, task_id in ids_by_token.items():
        row = tasks.get(task_id)
        if row is None:
            report.violations.append(f"{token}: task {task_id} is missing")
            continue
        report.statuses[row["status"]] += 1
        pids = runs.get(token, [])
        attempts = row["attempts"]
        if attempts > 1:
            report.retried_tasks += 1
        if len(pids) > 1:
            report.tasks_run_more_than_once += 1
            report.repeated[token] = pids
        if row["status"] != "completed":
            report.violations.append(f"{token}: task {task_id} is {row['status']}")
            continue
        report.runs_without_completion += max(0, len(pids) - 1)
        if not pids:
            report.violations.append(f"{token}: task {task_id} completed with no recorded run")
        if len(pids) > attempts:
            report.violations.append(
                f"{token}: task {task_id} ran {len(pids)} times in {attempts} attempt(s)"
            )
        result_pid = json.loads(row["result"] or "{}").get("pid")
        if result_pid not in pids:
            report.violations.append(
                f"{token}: task {task_id} completed by pid {result_pid}, not among runs {pids}"
            )
    return report
