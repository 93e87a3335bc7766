"""The API's pool checks a connection on checkout without a round trip, and pings it only after
it sat idle: a connection the server closed is replaced before use, and one in steady use costs
no ping (the pre-ping was a fifth of the API's CPU per request)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from sqlalchemy.dialects.postgresql import asyncpg as sa_asyncpg

from taskfleet.api import database as api_database
from taskfleet.api.database import Database, DatabaseUnavailable
from taskfleet.shared import queries as q
from tests.integration.workerkit import connect, wait_until


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the pings SQLAlchemy's asyncpg adapter sends."""
    count = [0]
    original = sa_asyncpg.AsyncAdapt_asyncpg_connection.ping

    def ping(self: Any) -> None:
        count[0] += 1
        original(self)

    monkeypatch.setattr(sa_asyncpg.AsyncAdapt_asyncpg_connection, "ping", ping)
    return count


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database.create(database_url, pool_size=1)
    yield db
    await db.dispose()


async def _kill_api_backends(conn: asyncpg.Connection) -> None:
    await conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'taskfleet-api' AND datname = current_database()"
    )

    async def gone() -> bool:
        return not await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'taskfleet-api' AND datname = current_database()"
        )

    await wait_until(gone, "the API's backend exited")


async def test_a_connection_in_steady_use_is_not_pinged(
    database: Database, pings: list[int]
) -> None:
    for _ in range(20):
        assert await database.fetch_all(q.schema_revision)
    assert pings[0] == 0


async def test_a_connection_idle_past_the_threshold_is_pinged(
    database_url: str, pings: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api_database, "PING_AFTER_IDLE_SECONDS", 0.0)
    db = Database.create(database_url, pool_size=1)
    try:
        for _ in range(3):
            assert await db.fetch_all(q.schema_revision)
    finally:
        await db.dispose()
    assert pings[0] == 2  # every checkout but the first (a new connection)


async def test_a_connection_the_server_closed_is_replaced_before_use(
    database: Database, database_url: str, pings: list[int]
) -> None:
    async with database.autocommit() as pooled:  # the pool's one connection, idle afterwards
        driver = pooled.driver
    async with connect(database_url) as conn:
        await _kill_api_backends(conn)
    # The driver read the server's goodbye: the pool replaces the connection, no ping needed.
    await wait_until(driver.is_closed, "the driver saw the server close the connection")
    assert await database.fetch_all(q.schema_revision)
    assert pings[0] == 0


@asynccontextmanager
async def _blocked_statement(
    database: Database, database_url: str
) -> AsyncIterator[tuple[asyncio.Future[None], asyncpg.Connection]]:
    """An autocommit statement of ``database`` waiting on a table lock (released on exit), and
    a connection to watch it from (pg_stat_activity is read once per transaction, so not the
    locker's)."""
    async with connect(database_url) as locker, connect(database_url) as observer:
        await locker.execute("BEGIN")
        await locker.execute("LOCK TABLE taskfleet.alembic_version IN ACCESS EXCLUSIVE MODE")

        async def blocked() -> None:
            async with database.autocommit() as conn:
                await api_database.fetch_all(conn, q.schema_revision)

        statement = asyncio.ensure_future(blocked())

        async def waiting() -> bool:
            return bool(
                await observer.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND application_name = 'taskfleet-api' AND datname = current_database()"
                )
            )

        await wait_until(waiting, "the API's statement waits on the lock")
        yield statement, observer
        await locker.execute("ROLLBACK")


async def test_a_connection_lost_mid_statement_is_unavailable_then_replaced(
    database: Database, database_url: str
) -> None:
    """An autocommit statement runs on the driver itself, past SQLAlchemy: a backend killed
    under it is still the 503's "connection lost", not a 500, and the next checkout gets a
    working connection."""
    async with _blocked_statement(database, database_url) as (statement, observer):
        await _kill_api_backends(observer)
        with pytest.raises(DatabaseUnavailable) as raised:
            await statement
        assert raised.value.reason == "database connection lost"
    assert await database.fetch_all(q.schema_revision)


async def test_a_cancelled_statement_leaves_the_pooled_connection_usable(
    database: Database, database_url: str
) -> None:
    """A request cancelled mid-statement (the server stopping, a timeout) returns its pooled
    connection with the driver still busy; the next checkout must still work."""
    async with _blocked_statement(database, database_url) as (statement, _observer):
        statement.cancel()
        with pytest.raises(asyncio.CancelledError):
            await statement
    for _ in range(3):
        assert await database.fetch_all(q.schema_revision)
