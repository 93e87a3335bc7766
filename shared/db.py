"""Database URLs and raw asyncpg connections (codecs set as SQLAlchemy's dialect sets them)."""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import urlsplit

import asyncpg
from pydantic import AfterValidator

_SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in _SCHEMES:
        raise ValueError("must be a postgresql:// or postgresql+asyncpg:// URL")
    # host[:port], several of them comma-separated for libpq-style multi-host URLs.
    for host in parts.netloc.rpartition("@")[2].split(","):
        if host.startswith("["):  # [IPv6]:port
            port = host.partition("]")[2].removeprefix(":")
        else:
            port = host.partition(":")[2]
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"port {port!r} is not a number from 1 to 65535")
    return value


DatabaseURL = Annotated[str, AfterValidator(_check_url)]


def asyncpg_dsn(url: str) -> str:
    """The URL as asyncpg takes it."""
    scheme, rest = url.split("://", 1)
    if scheme not in _SCHEMES:
        raise ValueError(f"unsupported database URL scheme {scheme!r}")
    return f"postgresql://{rest}"


def sqlalchemy_url(url: str) -> str:
    """The URL as SQLAlchemy's asyncpg dialect takes it."""
    return "postgresql+asyncpg://" + asyncpg_dsn(url).split("://", 1)[1]


def dumps(value: Any) -> str:
    """JSON text for a jsonb parameter (both access paths pass JSON as text)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb in: JSON text (as SQLAlchemy's dialect takes it); jsonb out: Python objects.
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename, encoder=lambda v: v, decoder=json.loads, schema="pg_catalog"
        )


async def connect(
    url: str,
    *,
    application_name: str = "taskfleet",
    synchronous_commit: bool = True,
    statement_timeout: float | None = None,
) -> asyncpg.Connection:
    """One raw connection, no pool: the worker's hot paths must not pay the pool's reset
    statements (``UNLISTEN *``, ``RESET ALL``, ... on every release).

    ``statement_timeout`` (seconds): the server ends any statement running longer, and with it
    the locks it holds. A client-side timeout alone cannot: the server does not notice that a
    client hung up while the statement waits for a lock."""
    server_settings = {"application_name": application_name}
    if not synchronous_commit:
        server_settings["synchronous_commit"] = "off"
    if statement_timeout is not None:
        server_settings["statement_timeout"] = str(max(1, round(statement_timeout * 1000)))
    conn = await asyncpg.connect(
        asyncpg_dsn(url),
        server_settings=server_settings,
        statement_cache_size=256,
    )
    await _init_connection(conn)
    return conn
