"""Test databases: one migrated template per session, one fresh clone per test.

Tests can commit and NOTIFY freely: each gets its own database (``CREATE DATABASE ... TEMPLATE``),
never a shared one cleaned with DELETE.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from taskfleet.shared import migrations
from taskfleet.shared.db import asyncpg_dsn


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at database ``name`` (keeps ?host= for unix sockets)."""
    parts = urlsplit(asyncpg_dsn(url))
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def _admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(with_database(url, "postgres"))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


class TestDatabases:
    """Creates the template once and clones it per test."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.template = f"tf_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._created: list[str] = []

    def setup(self) -> None:
        asyncio.run(_admin(self.server_url, f'CREATE DATABASE "{self.template}"'))
        migrations.upgrade(with_database(self.server_url, self.template))
        # No connection may stay on a template while it is cloned.
        asyncio.run(
            _admin(
                self.server_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{self.template}' AND pid <> pg_backend_pid()",
            )
        )

    def create(self) -> str:
        name = f"tf_t_{uuid.uuid4().hex[:12]}"
        asyncio.run(_admin(self.server_url, f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        self._created.append(name)
        return with_database(self.server_url, name)

    def drop(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        asyncio.run(_admin(self.server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if name in self._created:
            self._created.remove(name)

    def teardown(self) -> None:
        statements = [f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in self._created]
        statements.append(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        asyncio.run(_admin(self.server_url, *statements))
