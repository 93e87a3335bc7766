"""Worker ids with real processes: a second live process cannot take an id that is in use (it
exits 2 with one line), the id of a dead process can be reused, and a worker whose row was
marked offline by someone else restores it at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import signal

import asyncpg

from tests.e2e.fleet import Fleet, eventually


async def _row(conn: asyncpg.Connection, worker_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT status, pid, last_heartbeat > now() - 3 * heartbeat_interval * interval '1s'"
        " AS fresh FROM taskfleet.workers WHERE id = $1",
        worker_id,
    )
    assert row is not None
    return row


async def test_a_second_process_with_a_live_worker_id_is_refused(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        first = await fleet.start_worker("dup")
        conn = await fleet.connect()
        try:
            first_pid = (await _row(conn, "dup"))["pid"]
            second = await fleet.start_worker("dup", wait_ready=False)
            code = await asyncio.to_thread(second.wait, 60)
            assert code == 2, second.log()[-3000:]
            refusals = [line for line in second.log().splitlines() if "already in use" in line]
            assert len(refusals) == 1, second.log()[-3000:]
            assert "--worker-id" in refusals[0] and str(first_pid) in refusals[0]
            assert "Traceback" not in second.log()
            # The first one never noticed: its row is its own, online and fresh.
            row = await _row(conn, "dup")
            assert (row["status"], row["pid"], row["fresh"]) == ("online", first_pid, True)
            assert first.alive()

            # Dead, its id is free again (once its heartbeat is stale).
            first.kill9()
            third = await fleet.start_worker("dup")
            row = await _row(conn, "dup")
            assert (row["status"], row["fresh"]) == ("online", True)
            assert row["pid"] != first_pid and third.alive()
        finally:
            await conn.close()


async def test_a_worker_restores_its_row_when_someone_else_marked_it_offline(
    database_url: str,
) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        worker = await fleet.start_worker("w1")
        conn = await fleet.connect()
        try:
            await conn.execute("UPDATE taskfleet.workers SET status = 'offline' WHERE id = 'w1'")

            async def online_again() -> bool:
                return (await _row(conn, "w1"))["status"] == "online"

            await eventually(online_again, timeout=15)
            async with fleet.client() as client:
                workers = (await client.get("/workers")).json()["workers"]
            assert [(w["id"], w["alive"]) for w in workers] == [("w1", True)]
            # Its own drain still says offline, at the end.
            worker.signal(signal.SIGTERM)
            assert await asyncio.to_thread(worker.wait, 30) == 0
            assert (await _row(conn, "w1"))["status"] == "offline"
        finally:
            await conn.close()
