"""The API's database access: named queries over a SQLAlchemy async engine.

Connection-level failures (server down or refusing connections, login refused, database not
accepting connections, pool exhausted, database or schema missing) become
:class:`DatabaseUnavailable`, which the app answers with a 503 (and ``/metrics`` with
``taskfleet_api_database_up 0``). Anything else, a constraint violation or a bad statement, is a
bug and propagates as one.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import sqlalchemy.exc
from sqlalchemy import TextClause, event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from taskfleet.shared import queries as q
from taskfleet.shared.db import POOLED_STARTUP_PARAMETERS, sqlalchemy_url
from taskfleet.shared.queries import Query

log = logging.getLogger("taskfleet.api")

_POOLER_REASON = (
    "database prepared statements collide: DATABASE_URL is a transaction-mode pooler "
    "(PgBouncer); set TASKFLEET_DATABASE_POOLER=transaction"
)

# SQLSTATE classes and codes that mean "the database cannot serve us now", not "we sent
# something wrong", each with the reason the 503 gives. Checked in order, the first match wins.
_UNAVAILABLE_SQLSTATES: tuple[tuple[str, str], ...] = (
    # A prepared statement of the same name already there, or ours gone: taskfleet names none
    # itself, so DATABASE_URL is a transaction-mode pooler sharing server connections between
    # clients that cache statements. Nothing is written; the operator has a setting to fix.
    ("42P05", _POOLER_REASON),  # duplicate_prepared_statement
    ("26000", _POOLER_REASON),  # invalid_sql_statement_name
    ("3D000", "database does not exist"),
    ("3F000", "database schema is not migrated (run taskfleet migrate)"),  # invalid schema
    ("42P01", "database schema is not migrated (run taskfleet migrate)"),  # undefined table
    # The role may not connect or read: a grant or pg_hba.conf was changed under us.
    ("42501", "database permission denied for the configured role"),
    ("08", "database connection failed"),  # connection exception
    ("28", "database refused the login (check the role and password in DATABASE_URL)"),
    ("53", "database out of resources (too many connections, disk full or out of memory)"),
    # Object not in prerequisite state: a lock that cannot be had now, or ALTER DATABASE ...
    # ALLOW_CONNECTIONS false.
    ("55P03", "database lock not available"),
    ("55", "database is not accepting connections"),
    ("57", "database unavailable (shutting down, starting up or restarting)"),
)


class DatabaseUnavailable(Exception):
    """The database cannot be used right now; ``reason`` is safe to show to clients."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", None)
    for candidate in (orig, getattr(orig, "__cause__", None), exc):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


def unavailable_reason(exc: BaseException) -> str | None:
    """Why ``exc`` means the database is unavailable, or None when it means something else."""
    if isinstance(exc, DatabaseUnavailable):
        return exc.reason
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        return "database connection pool exhausted"
    if isinstance(exc, OSError | TimeoutError):
        # Refused, unreachable, DNS failure, connect timeout: asyncpg raises these unwrapped.
        return "database unreachable"
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sqlalchemy.exc.InterfaceError):
            return "database connection lost"
        return _sqlstate_reason(_sqlstate(exc))
    # Raised by the driver itself, on an autocommit connection (see AutocommitConnection).
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.ConnectionDoesNotExistError):
        return "database connection lost"
    if isinstance(exc, asyncpg.PostgresError):
        return _sqlstate_reason(exc.sqlstate)
    return None


def _sqlstate_reason(code: str | None) -> str | None:
    if code is not None:
        for prefix, reason in _UNAVAILABLE_SQLSTATES:
            if code.startswith(prefix):
                return reason
    return None


@asynccontextmanager
async def translated_errors() -> AsyncIterator[None]:
    """Turn connection-level failures inside the block into :class:`DatabaseUnavailable`."""
    try:
        yield
    except Exception as exc:
        reason = unavailable_reason(exc)
        if reason is None:
            raise
        raise DatabaseUnavailable(reason) from exc


@functools.cache
def _statement(query: Query) -> TextClause:
    return text(query.sql)


Row = dict[str, Any]

#: A pooled connection idle longer than this is pinged before use (see _ping_after_idle).
PING_AFTER_IDLE_SECONDS = 0.1


def _ping_after_idle(engine: AsyncEngine, idle_seconds: float) -> None:
    """Check a pooled connection on checkout without a round trip, and ping it only when it sat
    idle for ``idle_seconds``.

    SQLAlchemy's ``pool_pre_ping`` pings on every checkout: with asyncpg that is BEGIN, ``;``,
    ROLLBACK, three round trips before each request's one statement (a fifth of the API's CPU
    under a stream of ``POST /tasks``, profiled). Instead: a connection the server closed while
    it sat in the pool (a restart, ``pg_terminate_backend``) is already marked closed by the
    driver, which read the server's goodbye: replaced at no cost. One that sat idle for a moment
    (the goodbye may not have been read yet; a pooler or a firewall may have dropped it unseen)
    is pinged first. One in steady use (several requests a second per pooled connection) is not
    pinged: if the server went away under it mid-request, that request is answered 503 and
    SQLAlchemy discards the pool.
    """

    @event.listens_for(engine.sync_engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and driver.is_closed():
            raise sqlalchemy.exc.DisconnectionError("the server closed this connection")
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < idle_seconds:
            return
        try:
            dbapi_connection.ping()
        except Exception as exc:
            # The pool replaces this connection and tries again.
            raise sqlalchemy.exc.DisconnectionError(str(exc)) from exc


def _unnamed() -> str:
    return ""


def pooler_connect_args() -> dict[str, Any]:
    """The asyncpg dialect's arguments for a transaction-mode pooler (PgBouncer), where two
    transactions of one client connection may run on different server connections, and a server
    connection serves other clients in between: no statement is kept prepared, by asyncpg
    (``statement_cache_size``) or by SQLAlchemy (``prepared_statement_cache_size``), and the
    statements SQLAlchemy prepares are the unnamed one, which the next statement replaces. A
    named one (``__asyncpg_stmt_1__``) would collide with another client's of the same name on
    that server connection, or be missing from the next. The prepare and its execution are sent
    without a Sync in between, so the pooler keeps them on one server connection."""
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _unnamed,
    }


class AutocommitConnection:
    """A pooled connection used in autocommit: each statement is its own transaction, sent
    straight to the driver (asyncpg), past SQLAlchemy's execution layer.

    For work that is one statement (``POST /tasks``, reads), that layer is most of what the
    API spends on the statement besides the driver's own work (compiling the text clause's
    parameters, the cursor adapter, the result's metadata: about 8 % of the API's CPU under a
    stream of ``POST /tasks``, profiled; docs/benchmarks.md). The driver's statement cache is
    the connection's, so a statement is prepared once per connection (never, behind a
    transaction-mode pooler: :func:`pooler_connect_args`). Rows come back with jsonb decoded by
    the codec SQLAlchemy's dialect installed on the connection, as through SQLAlchemy.

    The connection is SQLAlchemy's pooled one, checked out and returned by the engine; nothing
    here begins a transaction, so returning it costs no round trip. Driver errors are translated
    by :func:`unavailable_reason` like SQLAlchemy's.
    """

    def __init__(self, driver: asyncpg.Connection) -> None:
        self.driver = driver

    async def fetch_all(self, query: Query, params: dict[str, Any]) -> list[Row]:
        sql, args = query.positional(params)
        return [dict(record) for record in await self.driver.fetch(sql, *args)]


#: A connection a named query can run on: in a transaction (SQLAlchemy's) or in autocommit.
Connection = AsyncConnection | AutocommitConnection


async def fetch_all(conn: Connection, query: Query, **params: Any) -> list[Row]:
    """Run a named query on ``conn``: its rows as dicts (jsonb as Python objects)."""
    if isinstance(conn, AutocommitConnection):
        return await conn.fetch_all(query, params)
    result = await conn.execute(_statement(query), params)
    if not result.returns_rows:
        return []
    return [dict(row) for row in result.mappings()]


async def fetch_one(conn: Connection, query: Query, **params: Any) -> Row | None:
    rows = await fetch_all(conn, query, **params)
    return rows[0] if rows else None


class Database:
    """The API's engine, with connection failures translated."""

    def __init__(self, engine: AsyncEngine, *, pooled: bool = False) -> None:
        self.engine = engine
        self._pooled = pooled
        #: Through a pooler: the statements run by their server-side function, by name (read
        #: from the database at first use; None until then).
        self._by_function: dict[str, Query] | None = None

    async def routed(self, conn: Connection, query: Query) -> Query:
        """The statement to run for ``query`` on ``conn``: through a transaction-mode pooler, the
        call of its server-side function when the database has it (queries.SERVER_FUNCTIONS: its
        plan is cached on the server connection, where a statement would be planned on every
        call); else ``query`` itself. A call takes queries.SYNCHRONOUS_COMMIT_PARAM too."""
        if not self._pooled or query not in q.SERVER_FUNCTIONS:
            return query
        if self._by_function is None:
            present = {}
            for candidate in q.SERVER_FUNCTIONS:
                name = q.server_function_name(candidate)
                row = await fetch_one(conn, q.server_function_exists, name=name)
                if row is not None and row["present"]:
                    present[candidate.name] = q.server_function_call(candidate)
                else:
                    log.warning(
                        "%s: no server-side function %s in the database; running the "
                        "statement itself (slower through a pooler). Run this taskfleet's "
                        "migrate to install it",
                        candidate.name,
                        name,
                    )
            self._by_function = present
        return self._by_function.get(query.name, query)

    @classmethod
    def create(cls, url: str, *, pool_size: int, pooled: bool = False) -> Database:
        """``pooled``: ``url`` is a transaction-mode pooler (see :func:`pooler_connect_args`)."""
        connect_args: dict[str, Any] = {
            "timeout": 5,
            "server_settings": {"application_name": "taskfleet-api"},
        }
        if pooled:
            connect_args.update(pooler_connect_args())
            connect_args["server_settings"] = dict(POOLED_STARTUP_PARAMETERS)
        engine = create_async_engine(
            sqlalchemy_url(url),
            pool_size=pool_size,
            # The pool size is the API's whole budget of connections: no overflow beyond it.
            max_overflow=0,
            pool_timeout=10,
            connect_args=connect_args,
        )
        _ping_after_idle(engine, PING_AFTER_IDLE_SECONDS)
        return cls(engine, pooled=pooled)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction, committed when the block exits without an error."""
        async with translated_errors(), self.engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AutocommitConnection]:
        """A connection on which each statement is its own transaction: one round trip per
        statement instead of BEGIN, statement, COMMIT. For work that is a single statement."""
        async with translated_errors(), self.engine.connect() as conn:
            pooled = await conn.get_raw_connection()
            yield AutocommitConnection(pooled.driver_connection)

    async def fetch_all(self, query: Query, **params: Any) -> list[Row]:
        async with self.autocommit() as conn:
            return await fetch_all(conn, query, **params)

    async def fetch_one(self, query: Query, **params: Any) -> Row | None:
        async with self.autocommit() as conn:
            return await fetch_one(conn, query, **params)

    async def dispose(self) -> None:
        await self.engine.dispose()
