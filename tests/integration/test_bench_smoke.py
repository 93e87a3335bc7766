"""The benchmark harness still runs: taskfleet's side of the drain workload with a few tasks,
and the statement counter the idle-load workload relies on.

Not a benchmark (no speed is asserted); it keeps ``python -m bench.run`` from rotting silently.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest

from bench.drain import measure_drain
from bench.scratch import Templates, with_database, with_port
from bench.systems import Taskfleet
from bench.wire_counter import StatementCounter


async def test_drain_harness_drains_taskfleet(pg_server_url: str) -> None:
    templates = Templates(pg_server_url)
    try:
        window = await measure_drain(
            templates, Taskfleet(), tasks=200, workers=1, concurrency=10, timeout=120
        )
    finally:
        await templates.close()
    assert window.completed == 200
    assert window.seconds > 0


async def test_wire_counter_counts_each_statement(pg_server_url: str) -> None:
    url = with_database(pg_server_url, "postgres")
    parts = urlsplit(url)
    if not parts.hostname or "host" in parse_qs(parts.query):
        pytest.skip("the server listens on a unix socket; the counter proxies TCP")
    counter = StatementCounter(parts.hostname, parts.port or 5432)
    proxy_port = await counter.start()
    try:
        conn = await asyncpg.connect(with_port(url, "127.0.0.1", proxy_port))
        try:
            before = counter.statements
            for i in range(3):
                assert await conn.fetchval("SELECT $1::int", i) == i
            await conn.execute("SELECT 1; SELECT 2")  # one simple Query message
            assert counter.statements - before == 4
        finally:
            await conn.close()
    finally:
        await counter.close()
