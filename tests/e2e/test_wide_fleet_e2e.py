"""Twenty ``taskfleet worker`` processes and two ``taskfleet api`` replicas on one Postgres: every
worker converges on config changes sent through either replica, and tasks submitted through
both run.

Kept light: one slot per worker, a handful of tasks. The fleet reaches Postgres through a
transaction-mode PgBouncer (tests/pgbouncer.py), LISTEN directly, as such a fleet is deployed:
directly, twenty workers hold 80 connections (docs/operations.md), which a test server's
default ``max_connections`` of 100 shared with other tests cannot spare. The same fleet without
PgBouncer is measured by ``python -m bench.wide_fleet``.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from taskfleet.client import AsyncClient
from taskfleet.config_events import Converged
from tests.e2e.fleet import ADMIN_TOKEN, Fleet, Proc, wait_http, wait_tasks_terminal
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.e2e

WORKERS = 20


async def _applied_versions(workers: list[Proc]) -> dict[str, int]:
    """Each worker's applied config version, as the worker itself reports it on /readyz."""
    async with httpx.AsyncClient(timeout=30) as http:

        async def one(proc: Proc) -> tuple[str, int]:
            body = (await http.get(f"{proc.url}/readyz")).json()
            return proc.name, int(body["applied_config_version"])

        return dict(await asyncio.gather(*(one(p) for p in workers)))


async def test_twenty_workers_and_two_api_replicas_converge(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    env = {
        "DATABASE_URL": pgbouncer.url(database_url),
        "TASKFLEET_LISTEN_DATABASE_URL": database_url,
        "TASKFLEET_DATABASE_POOLER": "transaction",
        "TASKFLEET_DB_POOL_SIZE": "2",
        "TASKFLEET_LOG_LEVEL": "WARNING",
    }
    async with Fleet(database_url, env=env) as fleet:
        apis = [await fleet.start_api(), await fleet.start_api()]
        procs = [
            await fleet.start_worker(f"w{i:02d}", concurrency=1, wait_ready=False)
            for i in range(WORKERS)
        ]
        await asyncio.gather(*(wait_http(f"{p.url}/readyz", p, timeout=150) for p in procs))

        versions = []
        for api, percent in zip(apis, (40, 70), strict=True):
            async with AsyncClient(api.url, token=ADMIN_TOKEN) as client:
                change = await client.change_config(
                    max_strict_percentage=percent, label_weights={"a": 3}, timeout=120
                )
                final = await change.result()
            assert isinstance(final, Converged), final
            assert final.version is not None
            versions.append(final.version)
            # Converged means every alive worker applied it: each says so itself.
            assert await _applied_versions(procs) == {p.name: final.version for p in procs}
        assert versions[1] > versions[0]

        ids: list[int] = []
        for index, api in enumerate(apis):
            async with httpx.AsyncClient(
                base_url=api.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            ) as http:
                tasks = [
                    {"type": "demo.echo", "payload": {"value": index * 100 + i}} for i in range(20)
                ]
                created = await http.post("/tasks/batch", json={"tasks": tasks})
                assert created.status_code == 201, created.text
                ids += [int(t["id"]) for t in created.json()["tasks"]]
        conn = await fleet.connect()
        try:
            rows = await wait_tasks_terminal(conn, ids, timeout=120)
        finally:
            await conn.close()
        assert {r["status"] for r in rows.values()} == {"completed"}
        assert all(p.alive() for p in fleet.procs)
