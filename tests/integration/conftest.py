from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from taskfleet.shared import db


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A raw connection to this test's database (jsonb codec as the product sets it)."""
    connection = await db.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def count_tasks(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM taskfleet.tasks"))
