"""POST /tasks/{id}/retry against a real Postgres: what goes back to pending, and what is a 409."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from taskfleet.api.app import create_app
from taskfleet.shared import queries as q
from tests.integration.test_api_tasks import (
    AS_SUBMIT,
    PATIENCE,
    api_settings,
    set_status,
    started_client,
    submit,
)


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in started_client(create_app(api_settings(database_url))):
        yield c


@pytest.mark.parametrize("finished", ["failed", "cancelled"])
async def test_retry_puts_a_failed_or_cancelled_task_back_to_pending(
    client: httpx.AsyncClient, conn: asyncpg.Connection, finished: str
) -> None:
    task = await submit(client, priority=3)
    await set_status(conn, task["id"], finished)
    await conn.execute(
        "UPDATE taskfleet.tasks SET attempts = 3, last_error = 'boom',"
        " run_after = now() + interval '1 hour' WHERE id = $1",
        task["id"],
    )
    woken: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener(q.TASK_READY_CHANNEL, lambda *args: woken.put_nowait(args[3]))

    response = await client.post(f"/tasks/{task['id']}/retry")

    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["status"], body["attempts"], body["last_error"]) == ("pending", 0, "boom")
    assert (body["finished_at"], body["worker_id"], body["result"]) == (None, None, None)
    due = await conn.fetchval(
        "SELECT run_after <= now() FROM taskfleet.tasks WHERE id = $1", task["id"]
    )
    assert due is True
    # The wake-up names the task's lane, as a submission's does.
    assert await asyncio.wait_for(woken.get(), PATIENCE) == "strict"


@pytest.mark.parametrize("status", ["pending", "running", "completed"])
async def test_retry_of_any_other_status_is_409_and_changes_nothing(
    client: httpx.AsyncClient, conn: asyncpg.Connection, status: str
) -> None:
    task = await submit(client)
    if status != "pending":
        await set_status(conn, task["id"], status)

    response = await client.post(f"/tasks/{task['id']}/retry")

    assert response.status_code == 409
    assert response.json() == {
        "detail": f"task {task['id']}: only a failed or cancelled task can be retried; "
        f"it is {status}"
    }
    assert (
        await conn.fetchval("SELECT status FROM taskfleet.tasks WHERE id = $1", task["id"])
        == status
    )


async def test_retry_unknown_task_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/tasks/424242/retry")
    assert response.status_code == 404
    assert response.json() == {"detail": "task 424242 not found"}


async def test_retry_needs_the_admin_role(client: httpx.AsyncClient) -> None:
    response = await client.post("/tasks/1/retry", headers=AS_SUBMIT)
    assert response.status_code == 403


async def test_retry_when_another_task_holds_the_unique_key_is_409(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    first = await submit(client, unique_key="k1")
    await set_status(conn, first["id"], "failed")
    second = await submit(client, unique_key="k1")
    assert second["id"] != first["id"]

    response = await client.post(f"/tasks/{first['id']}/retry")

    assert response.status_code == 409
    assert "unique_key" in response.json()["detail"]
    assert (
        await conn.fetchval("SELECT status FROM taskfleet.tasks WHERE id = $1", first["id"])
        == "failed"
    )
