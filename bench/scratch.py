"""Scratch databases for the benchmarks: one template per system, one fresh clone per run.

Every run gets its own database (``CREATE DATABASE ... TEMPLATE``), so a run never sees another
run's rows, dead tuples or statistics, and per-database counters (``pg_stat_database``) count
only what that run sent. Schema installs happen once per system and benchmark session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from taskfleet.shared.db import asyncpg_dsn

DEFAULT_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

#: Every database this harness creates starts with this, so a crashed run is easy to clean up.
PREFIX = "tf_bench_"


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at database ``name``."""
    parts = urlsplit(asyncpg_dsn(url))
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def with_port(url: str, host: str, port: int) -> str:
    """The same URL through another host and port (the statement-counting proxy)."""
    parts = urlsplit(asyncpg_dsn(url))
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def admin(server_url: str, *statements: str) -> None:
    conn = await asyncpg.connect(with_database(server_url, "postgres"))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _drop(server_url: str, name: str) -> None:
    await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Templates:
    """One installed template database per system, built on first use, dropped at the end."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self._names: dict[str, str] = {}

    async def template(self, system: str, install: Callable[[str], Awaitable[None]]) -> str:
        if system not in self._names:
            name = f"{PREFIX}tpl_{system}_{uuid.uuid4().hex[:6]}"
            await admin(self.server_url, f'CREATE DATABASE "{name}"')
            self._names[system] = name
            await install(with_database(self.server_url, name))
            # No session may stay on a template while it is cloned.
            await admin(
                self.server_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()",
            )
        return self._names[system]

    @asynccontextmanager
    async def clone(
        self, system: str, install: Callable[[str], Awaitable[None]]
    ) -> AsyncIterator[str]:
        """A fresh database cloned from the system's template; dropped when the block ends."""
        template = await self.template(system, install)
        name = f"{PREFIX}{system}_{uuid.uuid4().hex[:8]}"
        await admin(self.server_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        try:
            yield with_database(self.server_url, name)
        finally:
            await _drop(self.server_url, name)

    async def close(self) -> None:
        for name in self._names.values():
            await _drop(self.server_url, name)
        self._names.clear()
