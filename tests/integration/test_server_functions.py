"""The hot statements through their server-side functions, as a worker or the API behind a
transaction-mode pooler runs them (docs/operations.md#pgbouncer): used when installed, the
statement itself when not.

The pooled mode is exercised here straight against Postgres (the same protocol path; the PgBouncer
tests run it through a real pooler).
"""

from __future__ import annotations

import logging

import asyncpg
import pytest

from bench.systems import taskfleet_insert_params
from taskfleet.api.database import Database as ApiDatabase
from taskfleet.api.database import fetch_all
from taskfleet.shared import queries as q
from taskfleet.shared import submission
from taskfleet.worker.database import Database
from tests.integration import workerkit as kit
from tests.integration.sql import connected, insert_task


def release_params(task_id: int) -> dict[str, object]:
    return dict(ids=[task_id], attempts=[1], worker_id="w1", reason="test release")


async def _running(conn: asyncpg.Connection) -> int:
    """A task claimed by w1 (attempt 1), as a claim leaves it."""
    task_id = await insert_task(conn)
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'running', worker_id = 'w1', attempts = 1,"
        " started_at = now(), lease_expires_at = now() + interval '1 minute' WHERE id = $1",
        task_id,
    )
    return task_id


async def test_a_pooled_statement_runs_its_function_and_falls_back_when_it_is_missing(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pooled = Database(database_url, "taskfleet-test", pooled=True)
    try:
        async with connected(database_url) as conn:
            first = await _running(conn)
            rows = await pooled.fetch(q.task_release, **release_params(first))
            assert [(r["id"], r["status"]) for r in rows] == [(first, "pending")]
            assert "task_release" in pooled.by_function

            await conn.execute(f"DROP FUNCTION {q.server_function_name(q.task_release)}")
            second = await _running(conn)
            with caplog.at_level(logging.WARNING, logger="taskfleet.worker.database"):
                rows = await pooled.fetch(q.task_release, **release_params(second))
            assert [(r["id"], r["status"]) for r in rows] == [(second, "pending")]
            assert "task_release" not in pooled.by_function
            (warning,) = [r.getMessage() for r in caplog.records]
            assert "no server-side function" in warning and "migrate" in warning
    finally:
        await pooled.close()


async def test_the_function_sets_the_commit_mode_and_bounds_its_lock_waits(
    database_url: str,
) -> None:
    # What SET LOCAL gives a statement through a pooler, the function gives its own call: the
    # transaction's synchronous_commit (as the worker's setting says) and a bound on lock waits.
    call = q.server_function_call(q.task_release)
    async with connected(database_url) as conn:
        for setting in ("off", "on"):
            async with conn.transaction():
                await conn.execute("SET LOCAL synchronous_commit = 'local'")
                sql, args = call.positional(
                    {**release_params(0), q.SYNCHRONOUS_COMMIT_PARAM: setting}
                )
                await conn.fetch(sql, *args)
                assert (
                    await conn.fetchval("SELECT current_setting('synchronous_commit')") == setting
                )
        config = await conn.fetchval(
            "SELECT proconfig FROM pg_proc WHERE oid = to_regproc($1)",
            q.server_function_name(q.task_release),
        )
        assert config == [f"lock_timeout={q.SERVER_FUNCTION_LOCK_TIMEOUT}"]


async def test_a_single_task_goes_through_its_own_function_behind_a_pooler(
    database_url: str,
) -> None:
    """task_insert_one names two parameters twice (labels, unique_key): its function takes each
    once and answers what the statement answers."""
    call = q.server_function_call(q.task_insert_one)
    task = submission.Submission(
        submission.TaskIn(type="demo.echo", labels=["b", "a"], unique_key="one", requires=["x"]),
        "{}",
    )
    params = submission.insert_one_params(task)
    pooled = ApiDatabase.create(database_url, pool_size=1, pooled=True)
    direct = ApiDatabase.create(database_url, pool_size=1)
    try:
        async with pooled.autocommit() as conn:
            assert await pooled.routed(conn, q.task_insert_one) == call
            (through_function,) = await fetch_all(
                conn, call, **params, **{q.SYNCHRONOUS_COMMIT_PARAM: "on"}
            )
            (again,) = await fetch_all(conn, call, **params, **{q.SYNCHRONOUS_COMMIT_PARAM: "on"})
        async with connected(database_url) as raw:
            await raw.execute("UPDATE taskfleet.tasks SET unique_key = NULL")
        async with direct.autocommit() as conn:
            (through_statement,) = await fetch_all(conn, q.task_insert_one, **params)
    finally:
        await pooled.dispose()
        await direct.dispose()
    assert list(through_function.keys()) == list(through_statement.keys())
    varying = {"id", "created_at", "run_after"}
    assert {k: v for k, v in through_function.items() if k not in varying} == {
        k: v for k, v in through_statement.items() if k not in varying
    }
    assert (through_function["labels"], through_function["requires"]) == (["b", "a"], ["x"])
    assert (again["deduplicated"], again["input_unique_key"]) == (True, "one")


async def test_the_api_inserts_through_the_function_behind_a_pooler(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Pooled mode straight against Postgres: the same statements as through PgBouncer.
    call = q.server_function_call(q.task_insert_batch)
    params = {**taskfleet_insert_params(2), q.SYNCHRONOUS_COMMIT_PARAM: "on"}
    pooled = ApiDatabase.create(database_url, pool_size=1, pooled=True)
    direct = ApiDatabase.create(database_url, pool_size=1)
    try:
        async with pooled.autocommit() as conn:
            assert await pooled.routed(conn, q.task_insert_batch) == call
            assert await pooled.routed(conn, q.task_get) is q.task_get
            through_function = await fetch_all(conn, call, **params)
        async with direct.autocommit() as conn:
            assert await direct.routed(conn, q.task_insert_batch) is q.task_insert_batch
            through_statement = await fetch_all(conn, q.task_insert_batch, **params)
        # The same rows but for the ids and the clock: same columns, same values otherwise.
        assert [list(r) for r in through_function] == [list(r) for r in through_statement]
        varying = {"id", "created_at", "run_after"}
        assert [{k: v for k, v in r.items() if k not in varying} for r in through_function] == [
            {k: v for k, v in r.items() if k not in varying} for r in through_statement
        ]
    finally:
        await pooled.dispose()
        await direct.dispose()

    # Without the function (a schema migrated by other code): the statement itself, said once.
    async with connected(database_url) as conn:
        await conn.execute(f"DROP FUNCTION {q.server_function_name(q.task_insert_batch)}")
    fresh = ApiDatabase.create(database_url, pool_size=1, pooled=True)
    try:
        with caplog.at_level(logging.WARNING, logger="taskfleet.api"):
            async with fresh.autocommit() as conn:
                assert await fresh.routed(conn, q.task_insert_batch) is q.task_insert_batch
                # The others present still go through theirs.
                assert await fresh.routed(conn, q.task_release) == (
                    q.server_function_call(q.task_release)
                )
        (warning,) = [r.getMessage() for r in caplog.records]
        assert "task_insert_batch" in warning and "migrate" in warning
    finally:
        await fresh.dispose()


async def test_a_pooled_worker_runs_every_hot_statement_through_its_function(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker in pooled mode (straight to Postgres: the same protocol path) finishes tasks,
    # delivers a cancel (heartbeat) and gives a task back at shutdown, each through its
    # server-side function, none falling back; it applies and acknowledges a config version on
    # its LISTEN session.
    kit.gate("pooled")  # never opened: both block until cancelled or released
    with caplog.at_level(logging.WARNING, logger="taskfleet.worker.database"):
        async with kit.connect(database_url) as conn:
            worker = kit.build_worker(
                database_url,
                database_pooler="transaction",
                listen_database_url=database_url,
                drain_timeout=0.2,
            )
            run = await kit.start(worker)
            try:
                (done,) = await kit.submit(conn, "demo.echo", [{"value": 1}])
                assert (await kit.wait_task(conn, done))["status"] == "completed"
                cancelled, released = await kit.submit(
                    conn, "kit.block", [{"gate": "pooled"}, {"gate": "pooled", "kind": "b"}]
                )
                await kit.wait_until(lambda: worker.inflight == 2, "both block")
                await kit.run_query(conn, q.task_cancel, id=cancelled)
                assert (await kit.wait_task(conn, cancelled))["status"] == "cancelled"
                version = await kit.insert_config(conn, "pooled-1", maxStrictPercentage=50)
                await kit.wait_until(
                    lambda: _applied(conn, worker.id, version), "the version acknowledged"
                )
            finally:
                await run.stop()
            row = (await kit.task_rows(conn, [released]))[released]
            assert (row["status"], row["attempts"]) == ("pending", 0), row["last_error"]
    used = {"task_finish_batch", "task_release", "worker_tick"}
    assert used <= worker._io_db.by_function | worker._tick_db.by_function
    # The claims, the config reads and ACKs ran on the direct LISTEN connection, prepared (no
    # function needed).
    assert worker._claim_db.by_function == frozenset()
    assert [r.getMessage() for r in caplog.records if "server-side" in r.getMessage()] == []
    assert worker.metrics.heartbeat_failures._value.get() == 0


async def _applied(conn: object, worker_id: str, version: int) -> bool:
    row = await kit.worker_row(conn, worker_id)  # type: ignore[arg-type]
    return bool(row["applied_config_version"] >= version)
