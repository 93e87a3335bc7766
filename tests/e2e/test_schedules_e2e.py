"""Periodic tasks with real worker processes: an every-second schedule fired by three
``taskfleet worker`` processes, one of them killed with SIGKILL and another started meanwhile.
Every slot has exactly one task, read from the tasks' (schedule, slot) in Postgres; nothing is
asserted about timing."""

from __future__ import annotations

import asyncpg

from tests.e2e.fleet import Fleet, eventually


async def _slots(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(
        await conn.fetch(
            "SELECT schedule_slot, count(*) AS n FROM taskfleet.tasks "
            "WHERE schedule_name = 'e2e-tick' GROUP BY schedule_slot ORDER BY schedule_slot"
        )
    )


async def test_kill9_and_restarts_never_fire_a_slot_twice(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        conn = await fleet.connect()
        try:
            await conn.execute(
                "INSERT INTO taskfleet.schedules (name, type, every, next_run_at) "
                "VALUES ('e2e-tick', 'demo.echo', '1s', date_trunc('second', now()))"
            )
            await fleet.start_workers("w1", "w2", "w3")

            async def at_least(n: int) -> bool:
                return len(await _slots(conn)) >= n

            await eventually(lambda: at_least(3))
            fleet.proc("w1").kill9()
            await fleet.start_worker("w4")
            await eventually(lambda: at_least(6))
            slots = await _slots(conn)
            assert all(r["n"] == 1 for r in slots), [(r["schedule_slot"], r["n"]) for r in slots]
            total = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE schedule_name = 'e2e-tick'"
            )
            assert total == len(slots)
        finally:
            await conn.close()
