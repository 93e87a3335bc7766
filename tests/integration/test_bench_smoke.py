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


async def test_deep_drain_harness_reports_every_tenth(pg_server_url: str) -> None:
    import argparse

    from bench.deep_drain import measure

    result = await measure(
        argparse.Namespace(
            tasks=2_000,
            concurrency=10,
            vacuum_dead_rows=0,
            timeout=120,
            database_url=pg_server_url,
        )
    )
    assert len(result["tenths_per_second"]) == 10
    assert result["vacuums"] == 0  # off: the worker ran none
    assert result["tasks_per_second"] > 0


async def test_pickup_harness_stamps_every_handler_start(pg_server_url: str) -> None:
    from bench.latency import measure_pickup

    templates = Templates(pg_server_url)
    try:
        pickup = await measure_pickup(templates, Taskfleet(), tasks=20, interval=0.005, settle=0.2)
    finally:
        await templates.close()
    assert len(pickup.seconds) == 20
    # One handler stamp per submitted task, each after its submission began.
    assert len(pickup.handler_seconds) == 20
    assert all(s > 0 for s in pickup.handler_seconds)


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


async def test_noisy_neighbour_harness_measures_both_phases(pg_server_url: str) -> None:
    from bench.noisy import measure_noisy

    templates = Templates(pg_server_url)
    try:
        result = await measure_noisy(
            templates, a_tasks=3000, b_tasks=200, workers=1, concurrency=10, timeout=120
        )
    finally:
        await templates.close()
    # b's 200 tasks all started within the mixed phase, about half of it by the 1:1 weights.
    assert result.mixed_starts >= 200
    assert 0.3 < result.b_share <= 1.0
    assert result.mixed_rate > 0 and result.alone_rate > 0


async def test_http_submit_and_backlog_harnesses_run(pg_server_url: str) -> None:
    from bench.backlog import measure_backlog_drain
    from bench.http_submit import measure

    templates = Templates(pg_server_url)
    try:
        rates = await measure(templates, tasks=50, inflight=4, rep=0)
        window = await measure_backlog_drain(
            templates, Taskfleet(), tasks=200, workers=1, concurrency=10, timeout=120
        )
    finally:
        await templates.close()
    assert rates.http > 0 and rates.raw > 0 and rates.api_cpu_per_request > 0
    assert window.completed == 200
