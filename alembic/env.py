"""Alembic environment: async engine, every run serialised by a transaction-level advisory lock.

At head a run changes nothing and needs no CREATE privilege: the schema is created only when it
is missing. A database at a revision this code does not know (migrated by a newer taskfleet) is
refused with :class:`UnknownRevision` before anything runs.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.util import await_only

from alembic import context
from taskfleet.shared import server_functions
from taskfleet.shared.db import sqlalchemy_url
from taskfleet.shared.migrations import (
    FUNCTIONS_CREATED,
    MIGRATION_LOCK_KEY,
    REVISIONS_BEFORE,
    SCHEMA,
    VERSION_TABLE,
    UnknownRevision,
)

config = context.config


def _database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL")
    url = url or os.environ.get("TASKFLEET_DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL is not set")
    return sqlalchemy_url(url)


def _current_revisions(connection: Connection) -> list[str]:
    table = f"{SCHEMA}.{VERSION_TABLE}"
    if connection.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
        return []
    rows = connection.execute(text(f"SELECT version_num FROM {table}"))
    return sorted(str(row[0]) for row in rows)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema=SCHEMA,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        # Concurrent `taskfleet migrate` runs queue here; the second sees the schema at head.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        current = _current_revisions(connection)
        config.attributes[REVISIONS_BEFORE] = current
        script = context.script
        known = {rev.revision for rev in script.walk_revisions()}
        unknown = [rev for rev in current if rev not in known]
        if unknown:
            raise UnknownRevision(unknown, script.get_current_head() or "none")
        # CREATE SCHEMA IF NOT EXISTS would need the CREATE privilege even when it exists.
        if connection.execute(text("SELECT to_regnamespace(:s)"), {"s": SCHEMA}).scalar() is None:
            connection.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        context.run_migrations()
        # At head only (not after a downgrade, or an upgrade to an earlier revision): the
        # server-side functions of this code's hot statements, when missing or stale (never a
        # migration: one per statement text, see taskfleet.shared.server_functions).
        if _current_revisions(connection) == [script.get_current_head()]:
            config.attributes[FUNCTIONS_CREATED] = await_only(
                server_functions.install(connection.connection.driver_connection)
            )


def _statement_name() -> str:
    return f"__taskfleet_migrate_{uuid.uuid4().hex}__"


async def _main() -> None:
    # Works through a transaction-mode pooler (PgBouncer) too: no statement cache, and names no
    # other client can have left prepared on the server connection this one is handed.
    engine = create_async_engine(
        _database_url(),
        poolclass=NullPool,
        connect_args={"statement_cache_size": 0, "prepared_statement_name_func": _statement_name},
    )
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported")
asyncio.run(_main())
