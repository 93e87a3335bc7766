"""The core pipeline with real processes through a real PgBouncer in transaction mode.

``taskfleet api`` and two ``taskfleet worker`` processes with ``DATABASE_URL`` on PgBouncer
(tests/pgbouncer.py: Debian's package, transaction pooling, no prepared-statement support),
``TASKFLEET_LISTEN_DATABASE_URL`` on Postgres and ``TASKFLEET_DATABASE_POOLER=transaction``:
submission over HTTP, claims, finishes, a runtime-config change converging, LISTEN wake-ups (no
idle poll is due within the test), and PgBouncer's server connections killed under the fleet.
"""

from __future__ import annotations

import pytest

from taskfleet.client import AsyncClient
from taskfleet.config_events import Converged
from tests.e2e.fleet import ADMIN_TOKEN, Fleet, wait_tasks_terminal
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.e2e


async def _submit(fleet: Fleet, first: int, n: int) -> list[int]:
    tasks = [{"type": "demo.echo", "payload": {"value": i}} for i in range(first, first + n)]
    async with fleet.client() as client:
        created = await client.post("/tasks/batch", json={"tasks": tasks})
    assert created.status_code == 201, created.text
    return [int(t["id"]) for t in created.json()["tasks"]]


async def _all_completed(fleet: Fleet, ids: list[int]) -> set[str]:
    conn = await fleet.connect()
    try:
        rows = await wait_tasks_terminal(conn, ids)
    finally:
        await conn.close()
    assert {r["status"] for r in rows.values()} == {"completed"}, rows
    assert all(r["attempts"] == 1 for r in rows.values())
    return {str(r["worker_id"]) for r in rows.values()}


async def test_the_fleet_works_through_pgbouncer(database_url: str, pgbouncer: PgBouncer) -> None:
    env = {
        "DATABASE_URL": pgbouncer.url(database_url),
        "TASKFLEET_LISTEN_DATABASE_URL": database_url,
        "TASKFLEET_DATABASE_POOLER": "transaction",
        # No idle poll within the test: only NOTIFY wakes a claim loop or a config follower.
        "TASKFLEET_POLL_INTERVAL": "600",
        "TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL": "600",
    }
    async with Fleet(database_url, env=env) as fleet:
        await fleet.start_api()
        await fleet.start_workers("w1", "w2", concurrency=2)

        # Submit, claim, finish.
        ids = await _submit(fleet, 0, 40)
        assert await _all_completed(fleet, ids) <= {"w1", "w2"}

        # A config change converges on both workers (the update task writes the version on the
        # direct URL, each worker reads it through PgBouncer when its LISTEN hears of it).
        async with AsyncClient(fleet.api_url, token=ADMIN_TOKEN) as client:
            change = await client.change_config(max_strict_percentage=50, timeout=60)
            final = await change.result()
        assert isinstance(final, Converged), final
        conn = await fleet.connect()
        try:
            applied = await conn.fetch(
                "SELECT id, applied_config_version FROM taskfleet.workers ORDER BY id"
            )
            # PgBouncer's server connections die (a failover, a reaper, an operator).
            database = database_url.rsplit("/", 1)[1].split("?", 1)[0]
            servers = [
                r for r in await pgbouncer.admin("SHOW SERVERS") if r["database"] == database
            ]
            assert servers
            for server in servers:
                await conn.execute("SELECT pg_terminate_backend($1)", int(server["remote_pid"]))
        finally:
            await conn.close()
        assert [(r["id"], r["applied_config_version"]) for r in applied] == [
            ("w1", final.version),
            ("w2", final.version),
        ]

        # Still submitting, claiming and finishing. (Server connections idle in PgBouncer's
        # pool are not linked to any client in transaction mode: their death costs a client
        # nothing. One killed inside a transaction fails that statement, which is retried.)
        more = await _submit(fleet, 40, 40)
        assert await _all_completed(fleet, more)
        assert all(proc.alive() for proc in fleet.procs)
