"""Idle load: statements per second one idle worker sends, with nothing to do.

Every idle worker (taskfleet at concurrency 10 and 100, and the peers) runs at the same time, each
on a scratch database of its own and through a statement-counting proxy of its own
(bench.wire_counter), so one window measures them all under the same conditions. Two counts per
window: statements seen on the wire (exact, the figure the target is about) and
``pg_stat_database.xact_commit + xact_rollback`` of the worker's database (transactions as
Postgres counted them; also counts autovacuum, and lags by up to a second).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import asyncpg

from bench import processes
from bench.scratch import Templates, database_name, with_database, with_port
from bench.systems import System
from bench.wire_counter import StatementCounter


@dataclass
class IdleSubject:
    """One idle worker being watched."""

    label: str
    system: System
    concurrency: int
    database: str = ""
    counter: StatementCounter | None = None
    statements_per_s: list[float] = field(default_factory=list)
    transactions_per_s: list[float] = field(default_factory=list)


@asynccontextmanager
async def _idle_worker(templates: Templates, subject: IdleSubject) -> AsyncIterator[None]:
    system = subject.system
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(templates.clone(system.template_key, system.install))
        parts = urlsplit(url)
        counter = StatementCounter(parts.hostname or "127.0.0.1", parts.port or 5432)
        port = await counter.start()
        stack.push_async_callback(counter.close)
        fleet = await system.start_workers(
            with_port(url, "127.0.0.1", port), 1, subject.concurrency
        )
        stack.push_async_callback(processes.stop, fleet)
        subject.database = database_name(url)
        subject.counter = counter
        yield


async def _transactions(conn: asyncpg.Connection, names: list[str]) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT datname, xact_commit + xact_rollback AS n FROM pg_stat_database"
        " WHERE datname = ANY($1)",
        names,
    )
    return {r["datname"]: int(r["n"]) for r in rows}


async def measure_idle(
    templates: Templates,
    subjects: list[IdleSubject],
    *,
    windows: int,
    window_seconds: float,
    settle: float = 5.0,
) -> list[IdleSubject]:
    """Start every subject, let start-up pass, then count over ``windows`` windows."""
    async with AsyncExitStack() as stack:
        for subject in subjects:
            await stack.enter_async_context(_idle_worker(templates, subject))
        await asyncio.sleep(settle)
        conn = await asyncpg.connect(with_database(templates.server_url, "postgres"))
        try:
            names = [s.database for s in subjects]
            loop = asyncio.get_running_loop()
            for _ in range(windows):
                before_tx = await _transactions(conn, names)
                before_st = {s.label: s.counter.statements for s in subjects if s.counter}
                t0 = loop.time()
                await asyncio.sleep(window_seconds)
                elapsed = loop.time() - t0
                after_tx = await _transactions(conn, names)
                for s in subjects:
                    assert s.counter is not None
                    s.statements_per_s.append((s.counter.statements - before_st[s.label]) / elapsed)
                    s.transactions_per_s.append(
                        (after_tx.get(s.database, 0) - before_tx.get(s.database, 0)) / elapsed
                    )
        finally:
            await conn.close()
    return subjects
