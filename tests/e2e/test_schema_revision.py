"""A worker against a database at a schema revision it does not know (a newer taskfleet
migrated it), with real processes: it claims nothing, says why in one log line, and its /readyz
answers 503, as the API's does; once the revision is one it knows, it carries on.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx

from tests.e2e.fleet import Fleet, Proc, eventually, wait_tasks_terminal

FUTURE = "9999_from_the_future"


async def _readyz(proc: Proc) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=2.0) as client:
        response = await client.get(f"{proc.url}/readyz")
    return response.status_code, response.json()


async def _set_revision(conn: asyncpg.Connection, revision: str) -> str:
    old = str(await conn.fetchval("SELECT version_num FROM taskfleet.alembic_version"))
    await conn.execute("UPDATE taskfleet.alembic_version SET version_num = $1", revision)
    return old


def _schema_lines(proc: Proc) -> list[str]:
    return [line for line in proc.log().splitlines() if "claims nothing" in line]


async def test_a_running_worker_stops_claiming_on_an_unknown_revision(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        worker = await fleet.start_worker("w1")
        conn = await fleet.connect()
        try:
            head = await _set_revision(conn, FUTURE)

            async def not_ready() -> bool:
                status, body = await _readyz(worker)
                return status == 503 and any("does not know" in r for r in body["reasons"])

            await eventually(not_ready, timeout=15)
            async with fleet.client() as client:
                task = (await client.post("/tasks", json={"type": "demo.echo"})).json()
            # Paused, it claims nothing (readiness says so while the task waits).
            status, body = await _readyz(worker)
            assert status == 503 and any("claiming is paused" in r for r in body["reasons"])
            row = await conn.fetchrow(
                "SELECT status FROM taskfleet.tasks WHERE id = $1", task["id"]
            )
            assert row["status"] == "pending"
            assert len(_schema_lines(worker)) == 1, worker.log()[-2000:]
            assert FUTURE in _schema_lines(worker)[0]

            await _set_revision(conn, head)
            done = await wait_tasks_terminal(conn, [task["id"]], timeout=30)
            assert done[task["id"]]["status"] == "completed"
            await eventually(lambda: _is_ready(worker), timeout=15)
            assert len(_schema_lines(worker)) == 1
        finally:
            await conn.close()


async def test_a_worker_starting_on_an_unknown_revision_waits_without_registering(
    database_url: str,
) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        conn = await fleet.connect()
        try:
            head = await _set_revision(conn, FUTURE)
            worker = await fleet.start_worker("w1", wait_ready=False)

            async def refused() -> bool:
                try:
                    status, _ = await _readyz(worker)
                except httpx.HTTPError:
                    return False
                return status == 503 and bool(_schema_lines(worker))

            await eventually(refused, timeout=30)
            assert not await conn.fetchval("SELECT count(*) FROM taskfleet.workers")
            assert len(_schema_lines(worker)) == 1
            await _set_revision(conn, head)
            await eventually(lambda: _is_ready(worker), timeout=30)
            assert await conn.fetchval("SELECT count(*) FROM taskfleet.workers") == 1
        finally:
            await conn.close()


async def _is_ready(proc: Proc) -> bool:
    return (await _readyz(proc))[0] == 200
