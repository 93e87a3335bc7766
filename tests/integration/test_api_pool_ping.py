"""The API's pool checks a connection on checkout without a round trip, and pings it only after
it sat idle: a connection the server closed is replaced before use, and one in steady use costs
no ping (the pre-ping was a fifth of the API's CPU per request). Each test runs on both of the
API's drivers: asyncpg (directly on Postgres) and psycopg (behind a transaction-mode pooler; run
here straight against Postgres, the same statements as through PgBouncer)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from bench.systems import taskfleet_insert_params
from taskfleet.api import database as api_database
from taskfleet.api.database import Database, DatabaseUnavailable
from taskfleet.shared import queries as q
from tests.integration.workerkit import connect, wait_until


@pytest.fixture(params=["asyncpg", "psycopg"])
def pooled(request: pytest.FixtureRequest) -> bool:
    """The API's driver: asyncpg (direct), or psycopg (``TASKFLEET_DATABASE_POOLER``)."""
    return bool(request.param == "psycopg")


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch, pooled: bool, database_url: str) -> list[int]:
    """Counts the pings the API's dialect sends (on every engine of that dialect)."""
    count = [0]
    probe = Database.create(database_url, pool_size=1, pooled=pooled)
    dialect = type(probe.engine.dialect)
    original = dialect.do_ping

    def do_ping(self: Any, dbapi_connection: Any) -> bool:
        count[0] += 1
        return bool(original(self, dbapi_connection))

    monkeypatch.setattr(dialect, "do_ping", do_ping)
    return count


@pytest.fixture
async def database(database_url: str, pooled: bool) -> AsyncIterator[Database]:
    db = Database.create(database_url, pool_size=1, pooled=pooled)
    assert db.engine.dialect.driver == ("psycopg" if pooled else "asyncpg")
    yield db
    await db.dispose()


def _application(database: Database) -> str:
    # Behind a pooler every client sends the same name (POOLED_STARTUP_PARAMETERS).
    return "taskfleet" if database.engine.dialect.driver == "psycopg" else "taskfleet-api"


async def _kill_api_backends(conn: asyncpg.Connection, database: Database) -> None:
    name = _application(database)
    await conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = $1 AND datname = current_database()",
        name,
    )

    async def gone() -> bool:
        return not await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = $1 AND datname = current_database()",
            name,
        )

    await wait_until(gone, "the API's backend exited")


async def test_a_connection_in_steady_use_is_not_pinged(
    database: Database, pings: list[int]
) -> None:
    for _ in range(20):
        assert await database.fetch_all(q.schema_revision)
    assert pings[0] == 0


async def test_a_connection_idle_past_the_threshold_is_pinged(
    database_url: str, pings: list[int], monkeypatch: pytest.MonkeyPatch, pooled: bool
) -> None:
    monkeypatch.setattr(api_database, "PING_AFTER_IDLE_SECONDS", 0.0)
    db = Database.create(database_url, pool_size=1, pooled=pooled)
    try:
        for _ in range(3):
            assert await db.fetch_all(q.schema_revision)
    finally:
        await db.dispose()
    assert pings[0] == 2  # every checkout but the first (a new connection)


async def test_a_connection_the_server_closed_is_replaced_before_use(
    database: Database, database_url: str, pings: list[int]
) -> None:
    async with database.autocommit() as checked_out:  # the pool's one connection, idle afterwards
        driver = checked_out.driver  # type: ignore[attr-defined]
    async with connect(database_url) as conn:
        await _kill_api_backends(conn, database)

    if isinstance(driver, asyncpg.Connection):
        # The driver read the server's goodbye: the pool replaces the connection, no ping needed.
        await wait_until(driver.is_closed, "the driver saw the server close the connection")
        assert await database.fetch_all(q.schema_revision)
        assert pings[0] == 0
    else:
        # psycopg reads only when asked: the goodbye waits in the socket, which the checkout
        # sees without a round trip; its ping then fails and the pool replaces the connection.
        await wait_until(
            lambda: api_database._unasked_data(driver), "the server's goodbye reached the socket"
        )
        assert await database.fetch_all(q.schema_revision)
        assert pings[0] == 1


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
                    " AND application_name = $1 AND datname = current_database()",
                    _application(database),
                )
            )

        await wait_until(waiting, "the API's statement waits on the lock")
        yield statement, observer
        await locker.execute("ROLLBACK")


async def test_a_connection_lost_mid_statement_is_unavailable_then_replaced(
    database: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An autocommit statement runs on the driver itself, past SQLAlchemy: a backend killed
    under it is still the 503's "connection lost", not a 500, and the next checkout gets a
    working connection."""
    async with _blocked_statement(database, database_url) as (statement, observer):
        await _kill_api_backends(observer, database)
        with pytest.raises(DatabaseUnavailable) as raised:
            await statement
        assert raised.value.reason == "database connection lost"
    assert await database.fetch_all(q.schema_revision)
    # Discarded quietly: no pool reset tried on the dead connection (and logged as an error).
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


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


async def test_a_transaction_is_one_and_single_statements_stand_alone(
    database: Database, database_url: str
) -> None:
    """transaction() is atomic on both drivers (behind a pooler the connections rest in
    autocommit and the block switches one out of it), and autocommit() right after it on the
    same pooled connection is back to one statement, one transaction."""

    class Abort(Exception):
        pass

    params = taskfleet_insert_params(1)
    with pytest.raises(Abort):
        async with database.transaction() as conn:
            await api_database.fetch_all(conn, q.task_insert_batch, **params)
            raise Abort
    async with database.autocommit() as single:
        await api_database.fetch_all(single, q.task_insert_batch, **params)
    async with connect(database_url) as observer:
        # Only the single statement's task: the transaction's was rolled back.
        assert await observer.fetchval("SELECT count(*) FROM taskfleet.tasks") == 1
        # And no transaction left open on the API's connection.
        assert not await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'"
            " AND application_name = $1 AND datname = current_database()",
            _application(database),
        )
