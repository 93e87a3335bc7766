"""The claim index's dead head, against a real Postgres: the rows claimed since the last vacuum
leave dead entries at the head of the claim index, which every later claim reads past; a busy
worker's vacuum clears them, so the claim reads a bounded number of buffers again. It vacuums
only when due, never as a role that may not, and a running worker does it on its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from taskfleet.shared import queries as q
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.vacuum import VacuumPolicy
from taskfleet.worker.database import Database
from taskfleet.worker.vacuum import Vacuumer, direct_connect
from tests.integration import workerkit as kit
from tests.integration.sql import connected, plan_as
from tests.integration.test_claim_depth import MAX_READ_BUFFERS, explain_claim, plan_nodes

PENDING = 40_000
#: Claimed and finished in claim order, as a drain would: 40,000 dead row versions, 20,000 dead
#: entries at the head of the claim index (about five pages a thousand).
DRAINED = 20_000


async def dead_rows(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables"
            " WHERE relid = CAST('taskfleet.tasks' AS regclass)"
        )
    )


async def vacuum_count(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT vacuum_count FROM pg_stat_user_tables"
            " WHERE relid = CAST('taskfleet.tasks' AS regclass)"
        )
    )


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with connected(database_url) as conn:
        await plan_as(conn, "generic")  # as the worker's claim connection plans
        yield conn


@pytest.fixture
async def stats(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, "taskfleet-test-vacuum-stats")
    try:
        yield database
    finally:
        await database.close()


def vacuumer(url: str, stats: Any, policy: VacuumPolicy | None = None) -> Vacuumer:
    return Vacuumer(
        policy=policy or VacuumPolicy(),
        stats=stats,
        connect=direct_connect(url),
        metrics=WorkerMetrics.create(CollectorRegistry()),
    )


async def claim_index_buffers(conn: asyncpg.Connection) -> int:
    """Buffers the worker's steady claim of ten default-group tasks reads in the normal lane's
    index."""
    plan = await explain_claim(
        conn, q.task_claim_steady, group_keys=[None], group_limits=[10], types=["demo.echo"]
    )
    scans = [n for n in plan_nodes(plan) if n.get("Index Name") == "tasks_claim_normal_idx"]
    assert scans, "the claim no longer reads tasks_claim_normal_idx"
    assert sum(int(n["Actual Rows"]) * int(n.get("Actual Loops", 1)) for n in scans) == 10
    return sum(
        int(n.get("Shared Hit Blocks", 0)) + int(n.get("Shared Read Blocks", 0)) for n in scans
    )


async def drained_backlog(conn: asyncpg.Connection, *, pending: int, drained: int) -> None:
    """``pending`` no-op tasks, the first ``drained`` of them claimed and finished in claim
    order; returns once the statistics show their dead versions (the server reports them about
    a second late)."""
    await conn.execute(
        "INSERT INTO taskfleet.tasks (type, created_at)"
        " SELECT 'demo.echo', now() - interval '1 hour' + g * interval '1 millisecond'"
        f" FROM generate_series(1, {pending}) AS g"
    )
    await conn.execute("VACUUM ANALYZE taskfleet.tasks")
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'running', worker_id = 'w', attempts = 1,"
        " started_at = now() WHERE id IN (SELECT id FROM taskfleet.tasks"
        " WHERE status = 'pending' AND priority = 0"
        f" ORDER BY group_key, weight DESC, created_at, id LIMIT {drained})"
    )
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'completed', finished_at = now()"
        " WHERE status = 'running'"
    )

    async def reported() -> bool:
        return await dead_rows(conn) >= 2 * drained

    await kit.wait_until(reported, "the dead row versions in pg_stat_user_tables")


async def test_the_vacuum_clears_the_dead_head_the_claims_read_past(
    database_url: str, conn: asyncpg.Connection, stats: Database
) -> None:
    await drained_backlog(conn, pending=PENDING, drained=DRAINED)
    # The next claim reads past the 20,000 dead entries of the tasks claimed before it.
    before = await claim_index_buffers(conn)
    assert before > 2 * MAX_READ_BUFFERS

    vacuums = await vacuum_count(conn)
    vac = vacuumer(database_url, stats)
    assert await vac.check()
    # Done: right after, the statistics say nothing is due.
    assert not await vac.check()
    assert vac.vacuums == 1
    assert await vacuum_count(conn) == vacuums + 1

    after = await claim_index_buffers(conn)
    assert after <= MAX_READ_BUFFERS


async def test_below_the_threshold_nothing_is_vacuumed(
    database_url: str, conn: asyncpg.Connection, stats: Database
) -> None:
    # 2,000 dead versions: under the default floor of 10,000.
    await drained_backlog(conn, pending=4_000, drained=1_000)
    vacuums = await vacuum_count(conn)
    vac = vacuumer(database_url, stats)
    assert not await vac.check()
    assert vac.vacuums == 0
    assert await vacuum_count(conn) == vacuums
    # The same table with a floor under what is dead is vacuumed.
    low = vacuumer(database_url, stats, VacuumPolicy(min_dead_rows=1_000))
    assert await low.check()


async def test_a_vacuum_already_holding_the_table_is_not_waited_for_nor_counted(
    database_url: str, conn: asyncpg.Connection, stats: Database
) -> None:
    await drained_backlog(conn, pending=24_000, drained=6_000)  # 12,000 dead: due
    vacuums = await vacuum_count(conn)
    vac = vacuumer(database_url, stats)
    # What another worker's VACUUM (or autovacuum, or an index build) holds on the table.
    async with connected(database_url) as other, other.transaction():
        await other.execute("LOCK TABLE taskfleet.tasks IN SHARE UPDATE EXCLUSIVE MODE")
        assert not await asyncio.wait_for(vac.check(), 10.0)
    assert vac.vacuums == 0
    assert await vacuum_count(conn) == vacuums
    # Free again: done now.
    assert await vac.check()
    assert vac.vacuums == 1


async def test_dead_rows_an_old_snapshot_still_sees_are_not_vacuumed_again_and_again(
    database_url: str, conn: asyncpg.Connection, stats: Database
) -> None:
    async with connected(database_url) as old, old.transaction(isolation="repeatable_read"):
        # A long transaction (a report, a backup) whose snapshot predates the drain: the
        # versions the drain leaves dead are still visible to it, so no vacuum can remove them.
        await old.fetchval("SELECT count(*) FROM taskfleet.tasks")
        await drained_backlog(conn, pending=24_000, drained=6_000)  # 12,000 dead: due
        vac = vacuumer(database_url, stats)
        assert await vac.check()  # it cannot know before it tried
        vacuums = await vacuum_count(conn)
        # Still 12,000 dead, but none new since the vacuum that could not remove them.
        assert await dead_rows(conn) >= 12_000
        assert not await vac.check()
        assert vac.vacuums == 1
        assert await vacuum_count(conn) == vacuums
    # The snapshot gone, the next vacuum is due once as many new dead rows pile up again.


async def test_a_role_that_may_not_vacuum_leaves_the_table_to_autovacuum(
    database_url: str, conn: asyncpg.Connection, stats: Database
) -> None:
    await drained_backlog(conn, pending=24_000, drained=6_000)  # 12,000 dead: due
    role = f"tf_no_vacuum_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} NOLOGIN")
    # What a worker's role needs besides (the rights on the tasks do not matter here).
    await conn.execute(f"GRANT USAGE ON SCHEMA taskfleet TO {role}")
    connect = direct_connect(database_url)

    async def connect_as_role() -> asyncpg.Connection:
        session = await connect()
        await session.execute(f"SET ROLE {role}")
        return session

    vacuums = await vacuum_count(conn)
    try:
        vac = Vacuumer(
            policy=VacuumPolicy(),
            stats=stats,
            connect=connect_as_role,
            metrics=WorkerMetrics.create(CollectorRegistry()),
        )
        assert not await vac.check()
        assert not vac.enabled
        assert vac.vacuums == 0
        # Said once: it no longer counts or looks; its loop waits for the worker to stop.
        vac.claimed(10 * VacuumPolicy().check_every)
        loop = asyncio.create_task(vac.run())
        await asyncio.sleep(0.2)
        assert not loop.done()
        loop.cancel()
        assert vac.checks == 1
    finally:
        await conn.execute(f"DROP OWNED BY {role}")
        await conn.execute(f"DROP ROLE {role}")
    assert await vacuum_count(conn) == vacuums
    # As the owner (the test's superuser) the same table is due.
    vac = vacuumer(database_url, stats)
    assert await vac.check()


async def test_a_busy_worker_vacuums_on_its_own(database_url: str) -> None:
    async with kit.connect(database_url) as conn:
        vacuums = await vacuum_count(conn)
        # A low floor, so that a few thousand tasks are enough; the worker looks at the
        # statistics every 1,000 tasks it claims. The server reports dead rows about a second
        # late, so tasks keep coming until it has vacuumed (or the deadline says it never did).
        async with kit.running_worker(
            database_url, concurrency=10, vacuum_dead_rows=1_000
        ) as worker:

            async def vacuumed() -> bool:
                if await conn.fetchval(
                    "SELECT count(*) FROM taskfleet.tasks WHERE status IN ('pending', 'running')"
                ):
                    return False
                if worker.vacuumer.vacuums:
                    return True
                await kit.submit(conn, "demo.echo", [{}] * 1_000)
                return False

            await kit.wait_until(vacuumed, "a vacuum by the worker")
            assert worker.metrics.vacuums._value.get() == worker.vacuumer.vacuums
        assert await vacuum_count(conn) > vacuums
        # Stopped: its vacuum connection is gone too.
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'taskfleet-worker-vacuum' AND datname = current_database()"
        )
        assert left == 0


async def test_a_worker_that_does_not_vacuum_runs_on(database_url: str) -> None:
    # Off: its vacuum loop waits; a loop that ended would stop the worker.
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, concurrency=10, vacuum_dead_rows=0) as worker,
    ):
        ids = await kit.submit(conn, "demo.echo", [{}] * 2_500)

        async def all_done() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) = $2 FROM taskfleet.tasks"
                    " WHERE id = ANY($1::bigint[]) AND status = 'completed'",
                    ids,
                    len(ids),
                )
            )

        await kit.wait_until(all_done, "every task completed")
        assert worker.status == "running"
        assert worker.vacuumer.checks == 0
