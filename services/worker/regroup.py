"""Re-grouping pending tasks after the configured label set changed.

A task's normal-lane group is stored with it (``tasks.group_key``), computed under the grouping
in force when it was written. When a runtime-config version changes the *set* of configured
labels, the database records a new grouping (a trigger on ``worker_runtime_configs``) and the
pending rows a changed label can move are re-grouped by ``taskfleet.task_regroup_step()``, in
bounded steps (each its own short transaction, ``FOR UPDATE SKIP LOCKED``, so claims never wait
on it): it first waits for the transactions that were open when it saw the change (an insert in
one of them may have read the old set), then walks only the groups a changed label can move rows
out of, writing only the rows whose group changes.

Who runs it: the worker that wrote the version (the config update task starts it right after
writing the version; it goes on in the background of that worker after the task has reported
its outcome), until nothing is left, its time budget is spent or the worker stops; and every
lease sweep, a bounded batch
as the safety net (inserts that raced with the change, a writer that died). Until a row is
re-grouped it is claimed under its old key, i.e. in the group it was in before the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg

from taskfleet.shared import db, queries

log = logging.getLogger("taskfleet.worker.regroup")

#: Rows per batch: short transactions, few rows held from claims at a time.
BATCH = 2000
#: How long the config writer keeps at it before leaving the rest to the sweeps.
BUDGET_SECONDS = 60.0
#: Between steps that found nothing to do yet (older transactions open, another stepper).
PAUSE = 0.05


async def regroup_pending(
    conn: asyncpg.Connection,
    *,
    batch: int = BATCH,
    budget: float = BUDGET_SECONDS,
    pause: float = PAUSE,
) -> tuple[int, int, str]:
    """Step the re-grouping until it is settled or ``budget`` seconds have passed, pausing while
    it waits for older transactions or another session steps. Returns (rows walked, rows whose
    group changed, last state)."""
    sql, args = queries.task_regroup_step.positional({"batch": batch})
    deadline = time.monotonic() + budget
    scanned = moved = 0
    state = "settled"
    while True:
        row = await conn.fetchrow(sql, *args, timeout=30)
        state = row["state"]
        scanned += int(row["scanned"])
        moved += int(row["moved"])
        if state == "settled" or time.monotonic() >= deadline:
            return scanned, moved, state
        if state != "regrouping":
            await asyncio.sleep(pause)


async def _regroup_after_change(url: str, pooled: bool) -> None:
    try:
        conn = await db.connect(url, application_name="taskfleet-regroup", pooled=pooled)
    except (OSError, asyncpg.PostgresError) as exc:
        log.warning("re-grouping: cannot connect (%s); the lease sweeps will do it", exc)
        return
    try:
        started = time.monotonic()
        scanned, moved, state = await regroup_pending(conn)
        log.info(
            "re-grouping: %d pending task(s) walked, %d moved group, %.2fs, %s",
            scanned,
            moved,
            time.monotonic() - started,
            "done" if state == "settled" else f"left to the sweeps ({state})",
        )
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        log.warning("re-grouping stopped (%s); the lease sweeps will finish it", exc)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)


def start_regrouping(url: str, *, pooled: bool = False) -> asyncio.Task[None]:
    """Re-group in the background (its own connection) while the caller goes on. ``pooled``:
    ``url`` is a transaction-mode pooler (each step is one statement, so nothing else changes)."""
    return asyncio.create_task(_regroup_after_change(url, pooled), name="regroup")
