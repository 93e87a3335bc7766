"""Retention against a real Postgres: the pruner deletes what is due and keeps the rest, counts
what it deleted, runs one statement in the fleet at a time, and never holds up a claim."""

from __future__ import annotations

import json

import asyncpg

from taskfleet.api.app import create_app
from taskfleet.shared import queries as q
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.policy.retention import RUNTIME_CONFIG_VERSIONS_KEPT
from tests.integration import workerkit as kit
from tests.integration.seed import Seed, seed, set_config
from tests.integration.test_api_tasks import api_settings, started_client

HOUR = 3600.0
#: A type no test worker has a handler for: a pending row of it stays pending.
UNCLAIMED = "nobody.handles.this"


async def ids_left(conn: asyncpg.Connection) -> set[int]:
    return {r["id"] for r in await conn.fetch("SELECT id FROM taskfleet.tasks")}


async def test_the_pruner_deletes_what_is_due_and_keeps_the_rest(
    database_url: str, conn: asyncpg.Connection
) -> None:
    old_completed, old_cancelled, old_failed, young_completed, old_pending, old_running = [
        s.id
        for s in await seed(
            conn,
            [
                Seed("completed", created=-2 * HOUR, finished=-HOUR),
                Seed("cancelled", created=-2 * HOUR, finished=-HOUR),
                Seed("failed", created=-2 * HOUR, finished=-HOUR),  # failed: never
                Seed("completed", created=-60, finished=-60),  # younger than 30m
                Seed("pending", UNCLAIMED, created=-2 * HOUR),
                Seed("running", UNCLAIMED, created=-2 * HOUR),  # no lease: never rescued
            ],
        )
    ]
    # Worker rows: one offline for an hour, one that stopped heartbeating an hour ago (a kill -9),
    # one offline a minute ago (younger than the retention).
    for worker_id, status, silent in (
        ("gone", "offline", HOUR),
        ("killed", "online", HOUR),
        ("recent", "offline", 60),
    ):
        await conn.execute(
            "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status,"
            " last_heartbeat) VALUES ($1, 'h', 1, 1, $2, now() - make_interval(secs => $3))",
            worker_id,
            status,
            silent,
        )
    # More config versions than are kept; the oldest one is still followed by a running update
    # task (its request must stay readable), another is what the "recent" worker applied.
    versions = [await set_config(conn, {}) for _ in range(RUNTIME_CONFIG_VERSIONS_KEPT + 5)]
    followed = await conn.fetchval(
        "SELECT request_id FROM taskfleet.worker_runtime_configs WHERE version = $1", versions[0]
    )
    await conn.execute(
        "INSERT INTO taskfleet.tasks (type, payload, status, priority, worker_id, attempts)"
        " VALUES ($1, $2::jsonb, 'running', 2147483647, 'recent', 1)",
        RUNTIME_CONFIG_TASK_TYPE,
        json.dumps({"requestID": followed}),
    )
    await conn.execute(
        "UPDATE taskfleet.workers SET applied_config_version = $1 WHERE id = 'recent'", versions[2]
    )
    before = await ids_left(conn)

    async with kit.running_worker(
        database_url,
        retention_completed="30m",
        retention_cancelled="30m",
        retention_failed="never",
        retention_workers="30m",
    ) as worker:
        await kit.wait_until(
            lambda: kit.sample(worker, "taskfleet_pruned_total", status="runtime_config") >= 3,
            "the pruner deleted the old config versions",
        )
        left = await ids_left(conn)
        assert before - left == {old_completed, old_cancelled}
        for kept in (old_failed, young_completed, old_pending, old_running):
            assert kept in left
        assert kit.sample(worker, "taskfleet_pruned_total", status="completed") == 1
        assert kit.sample(worker, "taskfleet_pruned_total", status="cancelled") == 1
        assert kit.sample(worker, "taskfleet_pruned_total", status="failed") == 0
        assert kit.sample(worker, "taskfleet_pruned_total", status="worker") == 2
        workers = {r["id"] for r in await conn.fetch("SELECT id FROM taskfleet.workers")}
        assert workers == {"recent", worker.id}
        kept_versions = {
            r["version"]
            for r in await conn.fetch("SELECT version FROM taskfleet.worker_runtime_configs")
        }
        # The newest ones, the followed request's, the applied one; the others went.
        assert kept_versions == {versions[0], versions[2], *versions[5:]}
        assert len(versions[5:]) == RUNTIME_CONFIG_VERSIONS_KEPT


async def test_tasks_run_now_are_pruned_seconds_after_they_finish_and_answer_404(
    database_url: str, conn: asyncpg.Connection
) -> None:
    async with kit.running_worker(database_url, retention_completed="1s") as worker:
        ids = await kit.submit(conn, "demo.echo", [{"value": i} for i in range(5)])
        # No wait for the rows to finish first: a lone worker writes its outcomes at once, and a
        # one-second retention may prune them before a poll sees them finished.
        await kit.wait_until(
            lambda: kit.sample(worker, "taskfleet_pruned_total", status="completed") >= 5,
            "the completed tasks are pruned",
        )
        assert not (await ids_left(conn)) & set(ids)
    async for client in started_client(create_app(api_settings(database_url))):
        response = await client.get(f"/tasks/{ids[0]}")
        assert response.status_code == 404, response.text


async def test_one_pruner_at_a_time_and_batches_stay_bounded(
    database_url: str, conn: asyncpg.Connection
) -> None:
    await conn.execute(
        "INSERT INTO taskfleet.tasks (type, status, finished_at, worker_id, attempts)"
        " SELECT 'demo.echo', 'completed', now() - interval '1 hour', 'w', 1"
        " FROM generate_series(1, 250)"
    )
    sql, args = q.task_prune_batch.positional(
        {"lock_key": q.PRUNE_LOCK_KEY, "statuses": ["completed"], "keep": [60.0], "batch": 100}
    )
    async with kit.connect(database_url) as second:
        # Another worker's pruning transaction holds the lock: this one deletes nothing.
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", q.PRUNE_LOCK_KEY)
            (row,) = await second.fetch(sql, *args)
            assert (row["held"], row["deleted"]) == (False, 0)
        # Free again (a transaction-level lock ends with its transaction): one batch at most
        # per statement.
        deleted = [(await second.fetch(sql, *args))[0]["deleted"] for _ in range(4)]
    assert deleted == [100, 100, 50, 0]


async def test_a_large_prune_in_progress_does_not_hold_up_claims(
    database_url: str, conn: asyncpg.Connection
) -> None:
    """A pruning transaction deleting a big batch is still open (its row locks held) while a
    worker claims and completes tasks: claims touch pending rows only and never wait for it."""
    await conn.execute(
        "INSERT INTO taskfleet.tasks (type, status, finished_at, worker_id, attempts)"
        " SELECT 'demo.echo', 'completed', now() - interval '1 hour', 'w', 1"
        " FROM generate_series(1, 20000)"
    )
    sql, args = q.task_prune_batch.positional(
        {"lock_key": q.PRUNE_LOCK_KEY, "statuses": ["completed"], "keep": [60.0], "batch": 20000}
    )
    async with kit.connect(database_url) as pruning:
        tx = pruning.transaction()
        await tx.start()
        try:
            (row,) = await pruning.fetch(sql, *args)
            assert row["deleted"] == 20000  # locked and deleted, not committed yet
            async with kit.running_worker(database_url, retention_completed="1s"):
                ids = await kit.submit(conn, "demo.echo", [{"value": i} for i in range(20)])
                done = await kit.wait_tasks(conn, ids)
                assert {r["status"] for r in done.values()} == {"completed"}
                # The worker's own pruner found the lock taken (or the rows locked): it deleted
                # none of the big batch's rows.
                assert (
                    await conn.fetchval(
                        "SELECT count(*) FROM taskfleet.tasks WHERE worker_id = 'w'"
                    )
                    == 20000
                )
        finally:
            await tx.commit()
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks WHERE worker_id = 'w'") == 0


async def test_a_worker_row_holding_running_tasks_is_not_pruned(
    database_url: str, conn: asyncpg.Connection
) -> None:
    # A draining worker still running a task (its lease run out) is not alive, and its row was
    # pruned once older than the worker retention; the next sweep then took the task at once
    # (its worker row gone) while its code still ran.
    for worker_id in ("draining-busy", "draining-idle"):
        await conn.execute(
            "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status,"
            " last_heartbeat) VALUES ($1, 'h', 1, 1, 'draining', now() - interval '3 seconds')",
            worker_id,
        )
    await conn.execute(
        "INSERT INTO taskfleet.tasks (type, status, worker_id, attempts, started_at,"
        " lease_expires_at) VALUES ($1, 'running', 'draining-busy', 1,"
        " now() - interval '40 seconds', now() - interval '10 seconds')",
        UNCLAIMED,
    )
    sql, args = q.worker_prune.positional({"lock_key": q.PRUNE_LOCK_KEY, "workers_keep": 2.0})
    (row,) = await conn.fetch(sql, *args)
    assert (row["held"], row["deleted"]) == (True, 1)
    workers = {r["id"] for r in await conn.fetch("SELECT id FROM taskfleet.workers")}
    assert workers == {"draining-busy"}


def test_the_pruner_and_the_regrouping_have_lock_keys_of_their_own() -> None:
    # They shared one: a prune pass stopped as if another pruner ran while a re-grouping step
    # was open, and a re-grouping step answered busy while a prune batch was.
    import importlib

    regroup = importlib.import_module("taskfleet.alembic.versions.0003_group_key")
    keys = [q.SWEEP_LOCK_KEY, q.PRUNE_LOCK_KEY, regroup.REGROUP_LOCK_KEY]
    assert len(set(keys)) == len(keys)
