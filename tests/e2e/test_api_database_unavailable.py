"""A real ``taskfleet api`` answers 503, never 500, whatever makes the database unavailable, and
``/metrics`` keeps answering with ``taskfleet_api_database_up 0`` (the alert's input)."""

from __future__ import annotations

from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from taskfleet.shared.db import asyncpg_dsn
from tests.e2e.fleet import ADMIN_TOKEN, Fleet, eventually, scrape_metric, wait_http
from tests.pg import with_database

pytestmark = pytest.mark.e2e


def _database_name(url: str) -> str:
    return urlsplit(asyncpg_dsn(url)).path.lstrip("/")


async def _assert_every_route_is_503(api_url: str, reason_part: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert reason_part in ready.json()["reason"]
        for response in (
            await client.post("/tasks", json={"type": "demo.echo", "payload": {"value": 1}}),
            await client.get("/tasks"),
            await client.get("/workers"),
        ):
            assert response.status_code == 503, (response.request.url, response.text)
            assert response.json()["detail"] == "database unavailable"
            assert reason_part in response.json()["reason"]
        scrape = await client.get("/metrics")
        assert scrape.status_code == 200
    assert await scrape_metric(f"{api_url}/metrics", "taskfleet_api_database_up") == 0.0


async def test_database_not_accepting_connections_is_503_and_database_up_0(
    database_url: str,
) -> None:
    """SQLSTATE 55000: ALTER DATABASE ... ALLOW_CONNECTIONS false plus terminated sessions."""
    name = _database_name(database_url)
    admin = await asyncpg.connect(with_database(database_url, "postgres"))
    try:
        async with Fleet(database_url) as fleet:
            await fleet.start_api()
            assert await scrape_metric(f"{fleet.api_url}/metrics", "taskfleet_api_database_up")
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
            )
            await _assert_every_route_is_503(fleet.api_url, "not accepting connections")

            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

            async def database_up() -> bool:
                up = await scrape_metric(f"{fleet.api_url}/metrics", "taskfleet_api_database_up")
                return up == 1.0

            await eventually(database_up)
            await wait_http(f"{fleet.api_url}/readyz", fleet.api)
            assert "Traceback" not in fleet.api.log()  # type: ignore[union-attr]
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await admin.close()


async def test_login_refused_is_503_and_database_up_0(database_url: str) -> None:
    """SQLSTATE class 28: the role in DATABASE_URL does not exist."""
    unknown_role = asyncpg_dsn(database_url).replace("postgres@", "no_such_role_o18@", 1)
    assert unknown_role != asyncpg_dsn(database_url)
    async with Fleet(unknown_role) as fleet:
        api = await fleet.start_api(wait_ready=False)
        await _assert_every_route_is_503(fleet.api_url, "refused the login")
        assert "Traceback" not in api.log()
