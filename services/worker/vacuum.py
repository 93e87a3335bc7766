"""The claim index's dead head: a busy worker vacuums ``taskfleet.tasks`` when the dead row
versions its claims walk past have piled up (the rule and why: shared/policy/vacuum.py).

The claim loop reports the tasks it claims (:meth:`Vacuumer.claimed`); every
``policy.check_every`` of them this loop reads the table's statistics on the pruner's connection
(one cheap statement; an idle worker never sends it) and, when the policy says so, runs
``VACUUM`` on a direct connection opened for it and closed after. VACUUM cannot run inside a
transaction, so not through a transaction-mode pooler's wrapper either
(``TASKFLEET_LISTEN_DATABASE_URL`` is Postgres itself); and the role is asked on that session,
which may not be the pooler's. Claims never wait for it (VACUUM takes no lock a claim or a finish
needs), and it never waits for another vacuum or a migration (``SKIP_LOCKED``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import asyncpg

from taskfleet.shared import db, queries
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.vacuum import VacuumPolicy
from taskfleet.worker.database import CONNECT_TIMEOUT, DATABASE_ERRORS

log = logging.getLogger("taskfleet.worker")

#: Longest one VACUUM may run before the server stops it (a table of tens of millions of rows
#: takes seconds to tens of seconds; what a stopped vacuum had removed stays removed).
VACUUM_TIMEOUT = 600.0

Connect = Callable[[], Awaitable[asyncpg.Connection]]

#: SQLSTATE of VACUUM's warning that SKIP_LOCKED skipped the table (its lock was held).
LOCK_NOT_AVAILABLE = "55P03"


class Statements(Protocol):
    """Where the statistics are read (the worker's :class:`Database`)."""

    async def fetch(self, query: queries.Query, **params: Any) -> list[asyncpg.Record]: ...


class Vacuumer:
    def __init__(
        self,
        *,
        policy: VacuumPolicy,
        stats: Statements,
        connect: Connect,
        metrics: WorkerMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._stats = stats
        self._connect = connect
        self._metrics = metrics
        self._clock = clock
        self._claimed = 0
        #: Dead row versions the last vacuum left (not yet removable), as its statistics said.
        self._left_behind = 0
        self._due = asyncio.Event()
        #: False once the database said this role may not vacuum the table (said once in the log).
        self.enabled = policy.enabled
        #: Checks done and vacuums run (tests wait on them).
        self.checks = 0
        self.vacuums = 0

    def claimed(self, tasks: int) -> None:
        """The claim loop took ``tasks`` tasks: look at the statistics every check_every."""
        if not self.enabled:
            return
        self._claimed += tasks
        if self._claimed >= self._policy.check_every:
            self._claimed = 0
            self._due.set()

    async def run(self) -> None:
        # Never returns: the worker stops when one of its loops ends. Off (or found not allowed),
        # claimed() sets nothing and this waits until the worker cancels it.
        while True:
            await self._due.wait()
            self._due.clear()
            try:
                await self.check()
            except DATABASE_ERRORS as exc:
                # The next check_every claimed tasks ask again; a stopped VACUUM kept what it
                # had done.
                log.warning("vacuum of taskfleet.tasks failed (%s)", first_line(exc))

    async def check(self) -> bool:
        """Read the statistics and vacuum if due; True when a VACUUM ran."""
        self.checks += 1
        rows = await self._stats.fetch(queries.tasks_vacuum_state)
        if not rows:
            return False  # no statistics for the table (track_counts off)
        state = rows[0]
        dead = int(state["dead"])
        if dead < self._left_behind:
            self._left_behind = 0  # a later vacuum (another worker's, autovacuum) removed them
        # Counted from what the last vacuum could not remove: dead rows an old snapshot still
        # sees (a long transaction, a backup) stay dead through any number of vacuums, and each
        # would read every index whole again for nothing.
        if not self._policy.due(
            dead=dead - self._left_behind,
            live=int(state["live"]),
            vacuum_running=state["running"],
        ):
            return False
        started = self._clock()
        async with asyncio.timeout(CONNECT_TIMEOUT):
            conn = await self._connect()
        try:
            # Asked on the session that would vacuum (its role may differ from the pooler's).
            sql, _ = queries.tasks_vacuum_allowed.positional({})
            if not await conn.fetchval(sql):
                self.enabled = False
                log.info(
                    "not vacuuming taskfleet.tasks: this role is neither its owner nor the "
                    "database's; autovacuum alone clears the dead index entries the claims walk "
                    "(docs/operations.md#vacuum)"
                )
                return False
            skipped: list[str] = []

            def on_message(_: object, message: asyncpg.PostgresLogMessage) -> None:
                if getattr(message, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                    skipped.append(str(message))

            conn.add_log_listener(on_message)
            await conn.execute(queries.TASKS_VACUUM, timeout=VACUUM_TIMEOUT + 5)
            await asyncio.sleep(0)  # the listener runs at the loop's next turn
        finally:
            await self._close(conn)
        if skipped:
            # Another vacuum of the table (or a migration) held its lock: that one does it.
            return False
        after = await self._stats.fetch(queries.tasks_vacuum_state)
        self._left_behind = int(after[0]["dead"]) if after else 0
        self.vacuums += 1
        self._metrics.vacuums.inc()
        log.debug(
            "vacuumed taskfleet.tasks (%d dead of %d rows) in %.3fs",
            state["dead"],
            state["live"],
            self._clock() - started,
        )
        return True

    @staticmethod
    async def _close(conn: asyncpg.Connection) -> None:
        try:
            await asyncio.wait_for(conn.close(), 5.0)
        except BaseException:
            conn.terminate()
            raise


def direct_connect(url: str) -> Connect:
    """A plain session on Postgres itself (the worker's LISTEN URL), bounded by VACUUM_TIMEOUT."""

    async def connect() -> asyncpg.Connection:
        return await db.connect(
            url, application_name="taskfleet-worker-vacuum", statement_timeout=VACUUM_TIMEOUT
        )

    return connect
