"""Races between a worker's own transitions and the world: a cancel against a timeout retry, a
lease lost and reclaimed by the same worker, a cancel that arrives before an attempt's first
step. Every outcome is read from the task rows; waits poll conditions, never the clock.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
from prometheus_client import CollectorRegistry

from taskfleet.shared import queries
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import BackoffPolicy
from taskfleet.shared.policy.lanes import Lane
from taskfleet.worker.database import Database
from taskfleet.worker.executor import Executor
from taskfleet.worker.invocation import HandlerRunner
from taskfleet.worker.outcomes import OutcomeWriter
from taskfleet.worker.slots import Running, Slots
from tests.integration import workerkit as kit


async def test_a_cancel_that_races_a_timeout_retry_ends_the_task_cancelled(
    database_url: str,
) -> None:
    async with (
        kit.connect(database_url) as conn,
        kit.connect(database_url) as blocker,
        kit.running_worker(database_url, drain_timeout=0.2) as worker,
    ):
        (task_id,) = await kit.submit(
            conn, "demo.sleep", [{"seconds": 5}], timeout=0.5, max_attempts=3
        )
        await kit.wait_task(conn, task_id, {"running"})
        # Hold the worker's row: its heartbeat (which delivers cancels) waits, so the timeout
        # wins the race and the attempt's outcome is a retry of a task whose cancel was asked.
        async with blocker.transaction():
            await blocker.execute("SELECT 1 FROM taskfleet.workers WHERE id = 'w1' FOR UPDATE")
            (row,) = await kit.run_query(conn, queries.task_cancel, id=task_id)
            assert row["cancel_requested"]
            row = await kit.wait_task(conn, task_id)
            assert row["status"] == "cancelled", row
            assert row["attempts"] == 1
            assert "timed out" in row["last_error"]
        await kit.wait_until(lambda: worker.inflight == 0, "the slot is free")
        # Never claimed again, and the worker goes on with other work.
        (later,) = await kit.submit(conn, "demo.echo", [{"value": 1}])
        assert (await kit.wait_task(conn, later))["status"] == "completed"
        row = (await kit.task_rows(conn, [task_id]))[task_id]
        assert (row["status"], row["attempts"]) == ("cancelled", 1)


async def test_a_lease_lost_and_reclaimed_by_the_same_worker_is_fenced_by_attempt(
    database_url: str,
) -> None:
    key = uuid.uuid4().hex
    first, second = kit.gate(f"{key}-1"), kit.gate(f"{key}-2")
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, concurrency=2) as worker,
    ):
        (task_id,) = await kit.submit(conn, "kit.nth", [{"key": key}], max_attempts=3)
        await kit.wait_until(lambda: first.entered[""] == 1, "attempt 1 runs")
        # The worker lost the lease (as if its heartbeats had failed and another worker's sweep
        # had rescued the task); it claims the task again while attempt 1 still runs.
        await conn.execute(
            "UPDATE taskfleet.tasks SET status = 'pending', worker_id = NULL,"
            " lease_expires_at = NULL WHERE id = $1",
            task_id,
        )
        await kit.notify_raw(conn, queries.TASK_READY_CHANNEL, "")
        await kit.wait_until(lambda: second.entered[""] == 1, "attempt 2 runs")
        assert worker.inflight == 2

        # Attempt 1 ends first: its outcome must not finish attempt 2, nor free its slot.
        first.open.set()
        await kit.wait_until(lambda: first.finished[""] == 1, "attempt 1 returned")
        await kit.wait_until(lambda: not worker.outcomes.busy, "attempt 1's outcome handled")
        row = (await kit.task_rows(conn, [task_id]))[task_id]
        assert (row["status"], row["attempts"], row["worker_id"]) == ("running", 2, "w1")
        assert row["result"] is None
        assert worker.inflight == 1

        second.open.set()
        row = await kit.wait_task(conn, task_id)
        assert (row["status"], row["attempts"], row["result"]) == ("completed", 2, {"call": 2})
        await kit.wait_until(lambda: worker.inflight == 0, "both slots free")


async def test_a_cancel_before_an_attempts_first_step_still_frees_its_slot() -> None:
    # A cancel can arrive (from the heartbeat) after the claim started an attempt's coroutine
    # and before that coroutine ran at all; cancelling it then skipped its clean-up for good.
    metrics = WorkerMetrics.create(CollectorRegistry())
    slots = Slots(2, metrics)
    # Never connected: queueing an outcome does not touch the database.
    outcomes = OutcomeWriter(
        Database("postgresql://unused/unused", "test"),
        "w1",
        metrics,
        on_retry_written=lambda: None,
    )
    executor = Executor(
        registry=kit.make_registry(),
        worker_id="w1",
        handlers=HandlerRunner(threads=3),
        slots=slots,
        outcomes=outcomes,
        metrics=metrics,
        backoff=BackoffPolicy(),
        run_control=lambda _id, _payload: asyncio.sleep(0),
        on_control_slot_freed=lambda: None,
    )
    running = Running(7, "demo.sleep", Lane.NORMAL, None, 1, 3, None)
    executor.start(running, {"seconds": 30}, cancel_requested=False)
    executor.cancel(7, "user")  # before the event loop ran the attempt's first step
    assert running.task is not None
    await asyncio.wait_for(running.task, 5)
    assert slots.inflight == 0
    (outcome,) = outcomes.take_for_claim()
    assert (outcome.id, outcome.attempt, outcome.status) == (7, 1, "cancelled")


async def test_a_slow_outcome_write_does_not_cost_the_other_tasks_their_leases(
    database_url: str,
) -> None:
    gate_a, gate_b = kit.gate("slow-a"), kit.gate("slow-b")
    async with kit.connect(database_url) as conn, kit.connect(database_url) as blocker:
        worker = kit.build_worker(database_url, drain_timeout=30.0)
        run = await kit.start(worker)
        try:
            a, b = await kit.submit(conn, "kit.block", [{"gate": "slow-a"}, {"gate": "slow-b"}])
            await kit.wait_until(lambda: worker.inflight == 2, "both running")
            async with blocker.transaction():
                # A's row is locked: writing A's outcome waits (a slow finish).
                await blocker.execute("SELECT 1 FROM taskfleet.tasks WHERE id = $1 FOR UPDATE", a)
                # Draining, the claim loop is stopped: A's outcome goes by the finish loop.
                worker.request_stop()
                await kit.wait_until(lambda: worker.status == "draining", "draining")
                gate_a.open.set()
                await kit.wait_until(
                    lambda: kit.waits_on_a_lock(conn, "taskfleet-worker-io"),
                    "A's outcome write waits for the lock",
                )
                since = await conn.fetchval("SELECT now()")
                lease_ttl = worker.settings.lease_ttl
                await kit.wait_until(
                    lambda: _db_time_passed(conn, since, 3 * lease_ttl), "three lease TTLs"
                )
                # B's lease, the worker's heartbeat, went on all along, though A's write is
                # stuck: B is still running and would not be swept.
                row = await conn.fetchrow(
                    "SELECT t.status,"
                    " w.last_heartbeat > now() - make_interval(secs => $2::float8) AS live"
                    " FROM taskfleet.tasks t JOIN taskfleet.workers w ON w.id = t.worker_id"
                    " WHERE t.id = $1",
                    b,
                    lease_ttl,
                )
                assert (row["status"], row["live"]) == ("running", True)
            gate_b.open.set()
            await asyncio.wait_for(asyncio.shield(run.task), kit.DEADLINE)
        finally:
            await run.stop()
        rows = await kit.task_rows(conn, [a, b])
        assert [rows[a]["status"], rows[b]["status"]] == ["completed", "completed"]
        assert rows[b]["attempts"] == 1


async def _db_time_passed(conn: asyncpg.Connection, since: object, seconds: float) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT now() > $1::timestamptz + make_interval(secs => $2::float8)", since, seconds
        )
    )


async def _an_io_statement_waits_on_a_lock(conn: asyncpg.Connection) -> bool:
    return await kit.waits_on_a_lock(conn, "taskfleet-worker-claim") or await kit.waits_on_a_lock(
        conn, "taskfleet-worker-io"
    )


async def test_an_outcome_on_its_way_is_still_held(database_url: str) -> None:
    # A task that ran longer than its lease finishes; the statement that carries its outcome (a
    # claim, or the finish loop's batch: whichever takes it first) waits on the task's row. The
    # heartbeat must keep reporting the task as held all along: in CI a task that timed out
    # was failed for an expired lease 0.1 s after a claim took its outcome from the queue and
    # before that claim returned (the outcome was in neither the slots nor the queue, and the
    # sweep takes a running task of this worker that it does not hold). Here the row lock keeps
    # the sweep off the row; what is asserted is what the heartbeat reports.
    the_gate = kit.gate("long")
    async with (
        kit.connect(database_url) as conn,
        kit.connect(database_url) as blocker,
        kit.running_worker(database_url, concurrency=1) as worker,
    ):
        (task_id,) = await kit.submit(conn, "kit.block", [{"gate": "long"}], max_attempts=3)
        await kit.wait_task(conn, task_id, {"running"})
        await kit.wait_until(
            lambda: conn.fetchval(
                "SELECT lease_expires_at < now() FROM taskfleet.tasks WHERE id = $1", task_id
            ),
            "the claim's lease time is past (the worker's heartbeat vouches for the task)",
        )
        async with blocker.transaction():
            await blocker.execute("SELECT 1 FROM taskfleet.tasks WHERE id = $1 FOR UPDATE", task_id)
            the_gate.open.set()
            await kit.wait_until(
                lambda: _an_io_statement_waits_on_a_lock(conn),
                "the statement carrying the outcome waits for the row",
            )
            assert worker.inflight == 0 and len(worker.outcomes) == 0  # neither slot nor queue
            assert (task_id, 1) in worker.outcomes.held()
            assert (task_id, 1) in worker._tick_state().held
        row = await kit.wait_task(conn, task_id)
        assert (row["status"], row["attempts"], row["last_error"]) == ("completed", 1, None)
        await kit.wait_until(lambda: worker.inflight == 0 and not worker.outcomes.busy, "idle")
