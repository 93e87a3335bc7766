"""The API's pool pings a connection only after it sat idle: one killed while idle (a restart, a
pooler's idle timeout) is replaced before use, unseen by the request."""

from __future__ import annotations

import asyncpg
import pytest

from taskfleet.api import database as api_database
from taskfleet.api.database import Database
from taskfleet.shared import queries as q
from tests.integration.workerkit import connect


@pytest.fixture
async def database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Database:
    monkeypatch.setattr(api_database, "PING_AFTER_IDLE_SECONDS", 0.0)
    db = Database.create(database_url, pool_size=1)
    yield db
    await db.dispose()


async def _kill_api_backends(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'taskfleet-api' AND datname = current_database()"
        )
    )


async def test_a_connection_killed_while_idle_is_replaced_before_use(
    database: Database, database_url: str
) -> None:
    assert await database.fetch_all(q.schema_revision)  # the pool's one connection, now idle
    async with connect(database_url) as conn:
        assert await _kill_api_backends(conn) == 1
    # Pinged on checkout (idle past the threshold), found dead, replaced: the request succeeds.
    assert await database.fetch_all(q.schema_revision)


async def test_without_the_idle_ping_the_dead_connection_fails_the_request(
    database_url: str,
) -> None:
    """The same with the threshold out of reach: the statement meets the dead connection (so
    the test above does test the ping); the next request gets a fresh one."""
    db = Database.create(database_url, pool_size=1)
    try:
        assert await db.fetch_all(q.schema_revision)
        async with connect(database_url) as conn:
            assert await _kill_api_backends(conn) == 1
        with pytest.raises(api_database.DatabaseUnavailable):
            await db.fetch_all(q.schema_revision)
        assert await db.fetch_all(q.schema_revision)
    finally:
        await db.dispose()
