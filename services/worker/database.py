"""The worker's database connections: raw asyncpg, one per concern, reconnected after a failure.

No pool: asyncpg's pool sends reset statements (UNLISTEN *, RESET ALL, ...) on every release,
which a claim loop would pay on every round trip.

Through a transaction-mode pooler (``TASKFLEET_DATABASE_POOLER=transaction``) a connection keeps
nothing in its session: each statement runs in a transaction of its own that starts with
``SET LOCAL`` of the connection's settings (statement timeout, synchronous commit), and is
prepared unnamed each time. Four round trips instead of one; the pooler's server connection is
held for exactly that transaction. Nothing stays prepared, so the hot statements run through
their server-side functions (queries.SERVER_FUNCTIONS), whose plans the server connection
caches: they are not parsed and planned again every time. Such a call is one statement in its
own implicit transaction (the function sets synchronous_commit and bounds its lock waits; the
client cancels a call that outlives the statement timeout): two round trips, not four. The
claims (and config reads) behind a pooler do not come here: they borrow the worker's direct
LISTEN session (``borrow``), where they stay prepared.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from taskfleet.shared import db, queries
from taskfleet.shared.queries import Query

log = logging.getLogger(__name__)

#: Bound on any one statement, so a hung server cannot wedge a loop forever. The server enforces
#: it (its statement_timeout ends the statement and releases its locks); the client waits a
#: little longer, for a server that does not answer at all.
STATEMENT_TIMEOUT = 30.0
CLIENT_TIMEOUT_MARGIN = 2.0
CONNECT_TIMEOUT = 30.0


#: What a database round trip can raise: server errors, network errors, timeouts, and asyncpg's
#: own client-side errors (InternalClientError after a killed connection is not an
#: InterfaceError). All of them are retried with backoff; none may stop the worker.
DATABASE_ERRORS: tuple[type[Exception], ...] = (Exception,)


#: SQLSTATE classes of errors that are the statement's own fault (bad data, a broken constraint,
#: a limit): sending the same statement again cannot succeed.
_REJECTED_CLASSES = ("22", "23", "42", "54")


def rejected_statement(exc: BaseException) -> bool:
    """True when the server refused the statement itself, not the connection or the moment."""
    if not isinstance(exc, asyncpg.PostgresError):
        return False
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return sqlstate[:2] in _REJECTED_CLASSES


class Database:
    """One connection used by one concern (claims; outcomes and config reads; the heartbeat).
    Statements on it are serialised; a broken connection is dropped and the next statement
    reconnects."""

    def __init__(
        self,
        url: str,
        application_name: str,
        *,
        synchronous_commit: bool = True,
        statement_timeout: float = STATEMENT_TIMEOUT,
        pooled: bool = False,
        generic_plans: bool = False,
        borrow: Callable[[float], Awaitable[asyncpg.Connection]] | None = None,
    ) -> None:
        self._url = url
        #: Statements run on a connection someone else owns (the listener's, see
        #: Listener.connection), given this long to be there; None: one of its own.
        self._borrow = borrow
        self._timeout = statement_timeout
        self._synchronous_commit = synchronous_commit
        self._application_name = application_name
        self._pooled = pooled
        self._generic_plans = generic_plans
        self._begin = queries.transaction_begin(
            db.session_settings(
                synchronous_commit=synchronous_commit,
                statement_timeout=statement_timeout,
                generic_plans=generic_plans,
            )
        )
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        #: Through a pooler: the statements run by their server-side function (see
        #: queries.SERVER_FUNCTIONS) until the database says that function is missing.
        self._commit_setting = "on" if synchronous_commit else "off"
        self._calls = (
            {q.name: queries.server_function_call(q) for q in queries.SERVER_FUNCTIONS}
            if pooled
            else {}
        )
        #: The last statement failed (none yet: not failing).
        self.failing = False

    async def _connection(self) -> asyncpg.Connection:
        if self._borrow is not None:
            self._conn = None  # a failure while waiting must not terminate a later one
            self._conn = await self._borrow(CONNECT_TIMEOUT)
            return self._conn
        if self._conn is None or self._conn.is_closed():
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
            # arrives as the connection completes, and a loop being stopped would run on.
            async with asyncio.timeout(CONNECT_TIMEOUT):
                self._conn = await db.connect(
                    self._url,
                    application_name=self._application_name,
                    synchronous_commit=self._synchronous_commit,
                    statement_timeout=self._timeout,
                    pooled=self._pooled,
                    generic_plans=self._generic_plans,
                )
        return self._conn

    async def _fetch_in_transaction(
        self, conn: asyncpg.Connection, sql: str, args: list[Any], timeout: float
    ) -> list[asyncpg.Record]:
        """The statement in a transaction of its own, the session settings SET LOCAL in it."""
        await conn.execute(self._begin, timeout=timeout)
        try:
            rows: list[asyncpg.Record] = await conn.fetch(sql, *args, timeout=timeout)
        except asyncpg.PostgresError:
            # The server answered: end the failed transaction so the connection is usable
            # again (a connection that cannot is dropped by the caller's handler).
            try:
                await conn.execute(queries.TRANSACTION_ROLLBACK, timeout=timeout)
            except BaseException:
                self._discard()
                raise
            raise
        await conn.execute(queries.TRANSACTION_COMMIT, timeout=timeout)
        return rows

    @property
    def statement_bound(self) -> float:
        """The longest one statement on this connection can take (the client's timeout)."""
        return self._timeout + CLIENT_TIMEOUT_MARGIN

    @property
    def by_function(self) -> frozenset[str]:
        """The statements this connection runs through their server-side function."""
        return frozenset(self._calls)

    async def _fetch_pooled(
        self, conn: asyncpg.Connection, query: Query, params: dict[str, Any], timeout: float
    ) -> list[asyncpg.Record]:
        call = self._calls.get(query.name)
        if call is not None:
            sql, args = call.positional(
                {**params, queries.SYNCHRONOUS_COMMIT_PARAM: self._commit_setting}
            )
            try:
                # One statement, its own implicit transaction (the function sets what SET LOCAL
                # would): one server connection from Parse to Sync, two round trips.
                rows: list[asyncpg.Record] = await conn.fetch(sql, *args, timeout=timeout)
                return rows
            except asyncpg.UndefinedFunctionError:
                # Not installed (the schema was migrated by other code, or by hand): the plain
                # statement does the same, planned on every call. Said once.
                del self._calls[query.name]
                log.warning(
                    "%s: no server-side function %s in the database; running the statement "
                    "itself (slower through a pooler). Run this taskfleet's migrate to install it",
                    query.name,
                    queries.server_function_name(query),
                )
        sql, args = query.positional(params)
        return await self._fetch_in_transaction(conn, sql, args, timeout)

    async def fetch(self, query: Query, **params: Any) -> list[asyncpg.Record]:
        # Direct: the statement itself, its arguments checked before anything is sent.
        direct = None if self._pooled else query.positional(params)
        async with self._lock:
            try:
                conn = await self._connection()
                timeout = self._timeout + CLIENT_TIMEOUT_MARGIN
                if direct is None:
                    rows = await self._fetch_pooled(conn, query, params, timeout)
                else:
                    sql, args = direct
                    rows = await conn.fetch(sql, *args, timeout=timeout)
            except asyncpg.PostgresError as exc:
                # The server answered with an error: the connection is still good, unless the
                # error is the server going away (admin shutdown, crash recovery, ...).
                # A statement the server timed out (QueryCanceledError) leaves it usable.
                if isinstance(
                    exc, (asyncpg.PostgresConnectionError, asyncpg.OperatorInterventionError)
                ) and not isinstance(exc, asyncpg.QueryCanceledError):
                    self._discard()
                self.failing = True
                raise
            except BaseException as exc:
                # Network errors, timeouts, cancellation: the protocol state is unknown.
                self._discard()
                if not isinstance(exc, asyncio.CancelledError):
                    self.failing = True
                raise
            self.failing = False
            return rows

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    async def close(self) -> None:
        async with self._lock:
            if self._borrow is not None:
                self._conn = None  # its owner closes it
                return
            if self._conn is not None and not self._conn.is_closed():
                try:
                    await asyncio.wait_for(self._conn.close(), 5)
                except (OSError, asyncpg.PostgresError, TimeoutError):
                    self._conn.terminate()
            self._conn = None
