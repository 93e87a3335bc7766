"""A cancel that races a timeout retry or a lease rescue, with real processes: the task ends
``cancelled``, is never claimed again, and holds no slot (before, it went back to pending with
its cancel still requested, was claimed again and stayed running for good).
"""

from __future__ import annotations

import asyncio
import signal

import asyncpg
import httpx

from tests.e2e.fleet import (
    Fleet,
    Proc,
    eventually,
    scrape_metric,
    task_rows,
    wait_tasks_terminal,
)

INFLIGHT = "taskfleet_worker_inflight_tasks"


async def _submit(client: httpx.AsyncClient, body: dict[str, object]) -> int:
    response = await client.post("/tasks", json=body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


async def _running_on(conn: asyncpg.Connection, task_id: int, worker_id: str) -> bool:
    row = (await task_rows(conn, [task_id]))[task_id]
    return bool(row["status"] == "running" and row["worker_id"] == worker_id)


async def test_a_cancel_racing_a_timeout_retry_ends_cancelled_and_frees_the_slot(
    database_url: str,
) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        worker = await fleet.start_worker("w1", concurrency=1)
        conn = await fleet.connect()
        blocker = await fleet.connect()
        try:
            async with fleet.client() as client:
                task_id = await _submit(
                    client,
                    {
                        "type": "demo.sleep",
                        "payload": {"seconds": 5},
                        "timeout_seconds": 0.3,
                        "max_attempts": 3,
                    },
                )
                await eventually(lambda: _running_on(conn, task_id, "w1"))
                # The heartbeat (which delivers the cancel) waits on the worker's row, so the
                # timeout fires first: the attempt's outcome is a retry.
                async with blocker.transaction():
                    await blocker.execute(
                        "SELECT 1 FROM taskfleet.workers WHERE id = 'w1' FOR UPDATE"
                    )
                    response = await client.post(f"/tasks/{task_id}/cancel")
                    assert response.status_code == 200, response.text
                    rows = await wait_tasks_terminal(conn, [task_id], timeout=30)
                assert rows[task_id]["status"] == "cancelled", rows[task_id]
                assert rows[task_id]["attempts"] == 1

                async def slot_free() -> bool:
                    return await scrape_metric(f"{worker.url}/metrics", INFLIGHT) == 0

                await eventually(slot_free, timeout=15)
                # The one slot runs the next task.
                plain = await _submit(client, {"type": "demo.echo", "payload": {"value": 1}})
                done = await wait_tasks_terminal(conn, [plain], timeout=30)
                assert done[plain]["status"] == "completed"
                assert (await task_rows(conn, [task_id]))[task_id]["attempts"] == 1
        finally:
            await blocker.close()
            await conn.close()


async def test_a_lease_rescue_of_a_task_whose_cancel_was_requested_ends_it_cancelled(
    database_url: str,
) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        w1 = await fleet.start_worker("w1", concurrency=1)
        conn = await fleet.connect()
        try:
            async with fleet.client() as client:
                task_id = await _submit(
                    client,
                    {"type": "demo.sleep", "payload": {"seconds": 60}, "max_attempts": 3},
                )
                await eventually(lambda: _running_on(conn, task_id, "w1"))
                # Frozen, w1 cannot see the cancel; killed, it never will.
                w1.signal(signal.SIGSTOP)
                response = await client.post(f"/tasks/{task_id}/cancel")
                assert response.status_code == 200, response.text
                assert response.json()["cancel_requested"] is True
                w1.kill9()
                # w2's sweep rescues the expired lease: cancelled, not pending, not run again.
                w2 = await fleet.start_worker("w2", concurrency=1)
                rows = await wait_tasks_terminal(conn, [task_id], timeout=45)
                row = rows[task_id]
                assert row["status"] == "cancelled", row
                assert (row["attempts"], row["worker_id"]) == (1, "w1")
                assert "cancelled as requested" in row["last_error"]
                plain = await _submit(client, {"type": "demo.echo", "payload": {"value": 2}})
                done = await wait_tasks_terminal(conn, [plain], timeout=30)
                assert (done[plain]["status"], done[plain]["worker_id"]) == ("completed", "w2")
                # A drain of w2 has nothing stuck to give back, and exits 0.
                w2.signal(signal.SIGTERM)
                assert await _exit_code(w2) == 0
                assert "returning" not in w2.log()
        finally:
            await conn.close()


async def _exit_code(proc: Proc) -> int:
    return await asyncio.to_thread(proc.wait, 30)
