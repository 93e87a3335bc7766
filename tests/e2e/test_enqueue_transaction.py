"""Transactional enqueue against a real Postgres and a real worker process.

For each accepted connection type (asyncpg, SQLAlchemy AsyncConnection and AsyncSession, and the
sync Connection and Session on psycopg): a rolled-back enqueue leaves no row and sends no wake-up;
a committed one is stored, wakes the listening worker, and runs. The worker's poll interval is
far longer than every wait here, so a task that runs was picked up by the LISTEN wake-up, not by
a poll: that is the pickup an HTTP submission gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import taskfleet
from taskfleet.shared import db
from taskfleet.shared.queries import TASK_READY_CHANNEL
from tests.e2e.fleet import Fleet, wait_tasks_terminal

#: Far beyond every deadline below: a task that runs was woken by NOTIFY.
POLL_INTERVAL = "600"
MARKER_CHANNEL = "taskfleet_test_marker"
PATIENCE = 60.0


class Notifications:
    """A LISTEN connection that records task_ready wake-ups and test markers, in arrival order."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.received: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def _on(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        self.received.put_nowait((channel, payload))

    async def start(self) -> None:
        await self.conn.add_listener(TASK_READY_CHANNEL, self._on)
        await self.conn.add_listener(MARKER_CHANNEL, self._on)

    async def next(self) -> tuple[str, str]:
        return await asyncio.wait_for(self.received.get(), PATIENCE)

    async def mark(self, name: str) -> list[tuple[str, str]]:
        """Send a marker and read up to it: returns every wake-up that arrived before it."""
        await self.conn.execute(f"NOTIFY {MARKER_CHANNEL}, '{name}'")
        before: list[tuple[str, str]] = []
        while (item := await self.next()) != (MARKER_CHANNEL, name):
            before.append(item)
        return before


# Each driver runs ``enqueue`` in a transaction that it commits or rolls back; returns the task.
Driver = Callable[[str, bool, str], Awaitable[taskfleet.Task]]


async def via_asyncpg(url: str, commit: bool, value: str) -> taskfleet.Task:
    conn = await asyncpg.connect(db.asyncpg_dsn(url))  # no jsonb codec: the plain user setup
    try:
        tx = conn.transaction()
        await tx.start()
        task = await taskfleet.enqueue(conn, "demo.echo", {"value": value}, labels=["tx"])
        await (tx.commit() if commit else tx.rollback())
        return task
    finally:
        await conn.close()


async def via_async_connection(url: str, commit: bool, value: str) -> taskfleet.Task:
    engine = create_async_engine(db.sqlalchemy_url(url))
    try:
        async with engine.connect() as conn:
            task = await taskfleet.enqueue(conn, "demo.echo", {"value": value})
            await (conn.commit() if commit else conn.rollback())
            return task
    finally:
        await engine.dispose()


async def via_async_session(url: str, commit: bool, value: str) -> taskfleet.Task:
    engine = create_async_engine(db.sqlalchemy_url(url))
    try:
        async with AsyncSession(engine) as session:
            task = await taskfleet.enqueue(session, "demo.echo", {"value": value})
            await (session.commit() if commit else session.rollback())
            return task
    finally:
        await engine.dispose()


def _psycopg_url(url: str) -> str:
    return "postgresql+psycopg://" + db.asyncpg_dsn(url).split("://", 1)[1]


def _sync_session(url: str, commit: bool, value: str) -> taskfleet.Task:
    engine = create_engine(_psycopg_url(url))
    try:
        with Session(engine) as session:
            task = taskfleet.enqueue_sync(session, "demo.echo", {"value": value})
            session.commit() if commit else session.rollback()
            return task
    finally:
        engine.dispose()


def _sync_connection(url: str, commit: bool, value: str) -> taskfleet.Task:
    engine = create_engine(_psycopg_url(url))
    try:
        with engine.connect() as conn:
            task = taskfleet.enqueue_sync(conn, "demo.echo", {"value": value})
            conn.commit() if commit else conn.rollback()
            return task
    finally:
        engine.dispose()


async def via_sync_session(url: str, commit: bool, value: str) -> taskfleet.Task:
    return await asyncio.to_thread(_sync_session, url, commit, value)


async def via_sync_connection(url: str, commit: bool, value: str) -> taskfleet.Task:
    return await asyncio.to_thread(_sync_connection, url, commit, value)


DRIVERS: dict[str, Driver] = {
    "asyncpg": via_asyncpg,
    "AsyncConnection": via_async_connection,
    "AsyncSession": via_async_session,
    "Session": via_sync_session,
    "Connection": via_sync_connection,
}


@asynccontextmanager
async def idle_fleet(database_url: str) -> AsyncIterator[Fleet]:
    async with Fleet(database_url, env={"TASKFLEET_POLL_INTERVAL": POLL_INTERVAL}) as fleet:
        await fleet.start_worker("w1")
        yield fleet


@pytest.mark.parametrize("driver", list(DRIVERS))
async def test_enqueue_is_part_of_the_callers_transaction(database_url: str, driver: str) -> None:
    enqueue_in_tx = DRIVERS[driver]
    async with idle_fleet(database_url) as fleet:
        conn = await fleet.connect()
        try:
            wakeups = Notifications(conn)
            await wakeups.start()

            rolled_back = await enqueue_in_tx(database_url, False, "rolled back")
            assert await wakeups.mark("after-rollback") == []  # no wake-up from a rollback
            assert (
                await conn.fetchval(
                    "SELECT count(*) FROM taskfleet.tasks WHERE id = $1", rolled_back.id
                )
                == 0
            )

            committed = await enqueue_in_tx(database_url, True, "committed")
            assert committed.status is taskfleet.TaskStatus.PENDING
            assert committed.payload == {"value": "committed"}
            assert await wakeups.next() == (TASK_READY_CHANNEL, "normal")

            done = await wait_tasks_terminal(conn, [committed.id], timeout=PATIENCE)
            assert done[committed.id]["status"] == "completed", fleet.logs()[-3000:]
            result = await conn.fetchval(
                "SELECT result->>'value' FROM taskfleet.tasks WHERE id = $1", committed.id
            )
            assert result == "committed"
            assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 1
        finally:
            await conn.close()


async def test_enqueue_many_and_the_api_rules(database_url: str) -> None:
    conn = await asyncpg.connect(db.asyncpg_dsn(database_url))
    try:
        async with conn.transaction():
            tasks = await taskfleet.enqueue_many(
                conn,
                [
                    {"type": "demo.echo", "payload": {"value": 1}, "priority": 3},
                    {"type": "demo.sleep", "payload": {"seconds": 0.1}, "unique_key": "k"},
                ],
            )
        assert [t.type for t in tasks] == ["demo.echo", "demo.sleep"]
        again = await taskfleet.enqueue(conn, "demo.sleep", {"seconds": 5}, unique_key="k")
        assert (again.id, again.deduplicated) == (tasks[1].id, True)

        # The handler's model: demo.echo takes only "value".
        with pytest.raises(taskfleet.InvalidRequest) as bad_payload:
            await taskfleet.enqueue(conn, "demo.echo", {"valeu": 1})
        assert bad_payload.value.field == "payload.valeu"
        # The envelope: a reserved priority, and the batch names the index.
        with pytest.raises(taskfleet.InvalidRequest) as bad_batch:
            await taskfleet.enqueue_many(
                conn,
                [{"type": "demo.echo"}, {"type": "demo.echo", "priority": 2147483647}],
            )
        assert bad_batch.value.field == "tasks.1.priority"
        with pytest.raises(taskfleet.PayloadTooLarge):
            await taskfleet.enqueue(conn, "x.unregistered", {"blob": "x" * 300_000})
        with pytest.raises(taskfleet.InvalidRequest) as reserved:
            await taskfleet.enqueue(conn, "updateWorkerRuntimeConfig")
        assert reserved.value.field == "type"
        with pytest.raises(TypeError, match="enqueue_sync"):
            await taskfleet.enqueue(object(), "demo.echo")
        # A type with no handler in this process is stored as given.
        loose = await taskfleet.enqueue(conn, "x.unregistered", {"anything": [1, 2]})
        assert loose.payload == {"anything": [1, 2]}
        assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 3
    finally:
        await conn.close()
