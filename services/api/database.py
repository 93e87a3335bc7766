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
import select
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import psycopg
import sqlalchemy.exc
from psycopg.rows import dict_row
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
    if isinstance(exc, psycopg.Error):
        # The session ended under the statement (its backend terminated, or the server going
        # down: 57P01, 57P02), or no SQLSTATE at all (the server hung up, the connection is
        # closed): the connection is lost, as asyncpg says it.
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and (
            exc.sqlstate is None or exc.sqlstate in ("57P01", "57P02")
        ):
            return "database connection lost"
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
    it sat in the pool (a restart, ``pg_terminate_backend``) is already marked closed by asyncpg,
    which read the server's goodbye: replaced at no cost; psycopg reads only when asked, so its
    goodbye waits in the socket, seen by a ``select`` without a wait (:func:`_unasked_data`),
    and that connection is pinged. One that sat idle for a moment
    (the goodbye may not have been read yet; a pooler or a firewall may have dropped it unseen)
    is pinged first. One in steady use (several requests a second per pooled connection) is not
    pinged: if the server went away under it mid-request, that request is answered 503 and
    SQLAlchemy discards the pool.
    """

    @event.listens_for(engine.sync_engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    dialect = engine.dialect

    @event.listens_for(engine.sync_engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and _driver_closed(driver):
            raise sqlalchemy.exc.DisconnectionError("the server closed this connection")
        since = record.info.get("idle_since")
        recent = since is None or time.monotonic() - since < idle_seconds
        if recent and not (driver is not None and _unasked_data(driver)):
            return
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool replaces this connection and tries again.
            raise sqlalchemy.exc.DisconnectionError(str(exc)) from exc


def _driver_closed(driver: Any) -> bool:
    """The driver saw its connection end. asyncpg reads its socket all the time and knows at
    once; psycopg learns it only at its next read (see :func:`_unasked_data`)."""
    if isinstance(driver, psycopg.AsyncConnection):
        return bool(driver.closed)
    return bool(driver.is_closed())


def _unasked_data(driver: Any) -> bool:
    """An idle psycopg connection whose socket has something to read: the server (or the
    pooler) wrote without being asked, which on an idle connection is almost always its goodbye
    (a restart, a terminated backend, an idle timeout). One ``select`` with no wait, no round
    trip; asyncpg needs none (it reads every message as it comes)."""
    if not isinstance(driver, psycopg.AsyncConnection):
        return False
    try:
        readable, _, _ = select.select([driver.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True  # no usable socket: let the ping decide
    return bool(readable)


#: The isolation of ``Database.transaction()``: Postgres's default, named (behind a pooler
#: the engine's connections rest in autocommit).
TRANSACTION_ISOLATION = "READ COMMITTED"


class AutocommitConnection:
    """A pooled connection used in autocommit: each statement is its own transaction, sent
    straight to the driver, past SQLAlchemy's execution layer.

    For work that is one statement (``POST /tasks``, reads), that layer is most of what the
    API spends on the statement besides the driver's own work (compiling the text clause's
    parameters, the cursor adapter, the result's metadata: about 8 % of the API's CPU under a
    stream of ``POST /tasks``, profiled; docs/benchmarks.md). Rows come back as dicts, jsonb
    decoded, as through SQLAlchemy. The connection is SQLAlchemy's pooled one, checked out and
    returned by the engine. Driver errors are translated by :func:`unavailable_reason` like
    SQLAlchemy's.
    """

    async def fetch_all(self, query: Query, params: dict[str, Any]) -> list[Row]:
        raise NotImplementedError


class AsyncpgAutocommit(AutocommitConnection):
    """On asyncpg (directly on Postgres), which runs outside a transaction unless told: nothing
    begins one, so returning the connection costs no round trip. The driver's statement cache is
    the connection's: a statement is prepared once per connection. jsonb is decoded by the codec
    SQLAlchemy's dialect installed on the connection."""

    def __init__(self, driver: asyncpg.Connection) -> None:
        self.driver = driver

    async def fetch_all(self, query: Query, params: dict[str, Any]) -> list[Row]:
        sql, args = query.positional(params)
        return [dict(record) for record in await self.driver.fetch(sql, *args)]


class PsycopgAutocommit(AutocommitConnection):
    """On psycopg 3 (behind a transaction-mode pooler, see :func:`Database.create`), whose
    pooled connections rest in autocommit. psycopg sends an unprepared statement as Parse, Bind
    and Execute in one round trip; asyncpg without a statement cache needs two (the statement's
    description first), and through the pooler each is a hop more (docs/benchmarks.md, "the
    API's driver behind a pooler")."""

    def __init__(self, driver: psycopg.AsyncConnection[Any]) -> None:
        self.driver = driver

    async def fetch_all(self, query: Query, params: dict[str, Any]) -> list[Row]:
        sql, args = query.formatted(params)
        async with self.driver.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(sql, args)
            if cursor.description is None:
                return []
            return await cursor.fetchall()


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
        """``pooled``: ``url`` is a transaction-mode pooler without prepared statements
        (PgBouncer 1.18): the engine runs on psycopg 3 with prepared statements off
        (``prepare_threshold``), whose unprepared statement is one round trip, where asyncpg's
        is two (:class:`PsycopgAutocommit`). Directly on Postgres: asyncpg, each statement
        prepared once per connection."""
        driver = "psycopg" if pooled else "asyncpg"
        connect_args: dict[str, Any]
        if pooled:
            connect_args = {
                "connect_timeout": 5,
                "prepare_threshold": None,
                # libpq sends only what it is given: these, and nothing a pooler refuses.
                **POOLED_STARTUP_PARAMETERS,
            }
        else:
            connect_args = {
                "timeout": 5,
                "server_settings": {"application_name": "taskfleet-api"},
            }
        engine = create_async_engine(
            sqlalchemy_url(url, driver=driver),
            pool_size=pool_size,
            # The pool size is the API's whole budget of connections: no overflow beyond it.
            max_overflow=0,
            pool_timeout=10,
            connect_args=connect_args,
            # psycopg's connections rest in autocommit, as asyncpg's do: the single statements
            # (the hot path) run as they are, and transaction() switches a connection out of it
            # for its block (SQLAlchemy switches it back when the connection is returned).
            **({"isolation_level": "AUTOCOMMIT"} if pooled else {}),
        )
        _ping_after_idle(engine, PING_AFTER_IDLE_SECONDS)
        return cls(engine, pooled=pooled)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction, committed when the block exits without an error."""
        async with translated_errors(), self.engine.connect() as conn:
            if self._pooled:
                await conn.execution_options(isolation_level=TRANSACTION_ISOLATION)
            async with conn.begin():
                yield conn

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AutocommitConnection]:
        """A connection on which each statement is its own transaction: one round trip per
        statement instead of BEGIN, statement, COMMIT. For work that is a single statement."""
        async with translated_errors(), self.engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            if not self._pooled:
                yield AsyncpgAutocommit(driver)
                return
            # psycopg, in autocommit already (the engine's default, see create()).
            assert isinstance(driver, psycopg.AsyncConnection)
            try:
                yield PsycopgAutocommit(driver)
            except BaseException:
                if driver.broken or driver.closed:
                    # Discarded, not reset: a rollback on it would only fail (and log).
                    await conn.invalidate()
                raise

    async def fetch_all(self, query: Query, **params: Any) -> list[Row]:
        async with self.autocommit() as conn:
            return await fetch_all(conn, query, **params)

    async def fetch_one(self, query: Query, **params: Any) -> Row | None:
        async with self.autocommit() as conn:
            return await fetch_one(conn, query, **params)

    async def dispose(self) -> None:
        await self.engine.dispose()
