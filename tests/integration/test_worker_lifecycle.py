"""The worker's life cycle against a real Postgres (docs/reference.md#worker-runtime): graceful
drain, database blips, and leases (a dead worker's tasks run again; so must the tasks a worker holds
without knowing).
"""

from __future__ import annotations

import asyncio
import uuid
from functools import partial

import asyncpg

from tests import pg
from tests.integration import workerkit as kit


async def test_drain_finishes_quick_tasks_and_gives_the_rest_back(database_url: str) -> None:
    quick_gate = kit.gate("quick")
    async with kit.connect(database_url) as conn:
        worker = kit.build_worker(database_url, drain_timeout=0.5)
        run = await kit.start(worker)
        try:
            (quick,) = await kit.submit(conn, "kit.block", [{"gate": "quick"}])
            (long,) = await kit.submit(conn, "demo.sleep", [{"seconds": 30}])
            await kit.wait_until(lambda: worker.inflight == 2, "both tasks running")

            worker.request_stop()
            await kit.wait_until(lambda: worker.status == "draining", "draining")
            quick_gate.open.set()  # finishes well within drain_timeout
            await asyncio.wait_for(asyncio.shield(run.task), kit.DEADLINE)
        finally:
            await run.stop()
        assert run.task.exception() is None
        assert worker.status == "stopped"

        rows = await kit.task_rows(conn, [quick, long])
        assert rows[quick]["status"] == "completed"
        assert rows[quick]["result"] == {"kind": ""}
        # The long one went back to pending, its interrupted attempt given back.
        assert rows[long]["status"] == "pending"
        assert rows[long]["attempts"] == 0
        assert rows[long]["worker_id"] is None
        assert "shutdown" in rows[long]["last_error"]
        assert (await kit.worker_row(conn, "w1"))["status"] == "offline"
        assert (
            kit.sample(
                worker, "taskfleet_task_outcomes_total", type="demo.sleep", outcome="released"
            )
            == 1
        )

        # Nothing is lost: the next worker runs it.
        async with kit.running_worker(database_url, worker_id="w2"):
            await conn.execute(
                "UPDATE taskfleet.tasks SET payload = '{\"seconds\": 0}' WHERE id = $1", long
            )
            row = await kit.wait_task(conn, long)
        assert row["status"] == "completed"
        assert row["worker_id"] == "w2"
        assert row["attempts"] == 1


async def test_a_draining_worker_claims_nothing_new(database_url: str) -> None:
    gate = kit.gate("hold")
    async with kit.connect(database_url) as conn:
        worker = kit.build_worker(database_url, drain_timeout=5.0)
        run = await kit.start(worker)
        try:
            (held,) = await kit.submit(conn, "kit.block", [{"gate": "hold"}])
            await kit.wait_until(lambda: worker.inflight == 1, "the task running")
            worker.request_stop()
            await kit.wait_until(lambda: worker.status == "draining", "draining")
            await kit.wait_until(
                lambda: _worker_status(conn, "draining"), "the worker row says draining"
            )
            (late,) = await kit.submit(conn, "demo.echo", [{"value": "late"}])
            gate.open.set()
            await asyncio.wait_for(asyncio.shield(run.task), kit.DEADLINE)
        finally:
            await run.stop()
        rows = await kit.task_rows(conn, [held, late])
        assert rows[held]["status"] == "completed"
        assert rows[late]["status"] == "pending" and rows[late]["attempts"] == 0


async def _worker_status(conn: asyncpg.Connection, status: str) -> bool:
    return bool((await kit.worker_row(conn, "w1"))["status"] == status)


async def test_tasks_survive_the_database_dropping_every_worker_connection(
    database_url: str,
) -> None:
    """docs/reference.md#worker-runtime: "the process does not die on one database blip". Every
    connection the worker has is terminated by the server, several times, while tasks flow: the
    worker keeps running and every task ends completed."""
    key = uuid.uuid4().hex
    batches, per_batch = 5, 30
    ids: list[int] = []
    terminated: list[int] = []
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, concurrency=4) as worker,
    ):

        def alive() -> None:
            assert worker.status == "running", (
                f"the worker stopped after a database blip (status {worker.status!r})"
            )

        for b in range(batches):
            batch = range(b * per_batch, (b + 1) * per_batch)
            ids += await kit.submit(
                conn, "kit.count", [{"key": key, "i": i, "seconds": 0.01} for i in batch]
            )
            # Let the batch start, then cut every worker connection mid-flow.
            await kit.wait_until(partial(_started, key, batch), "the batch started", check=alive)
            terminated.append(await kit.terminate_worker_backends(conn))
        rows = await kit.wait_tasks(conn, ids, timeout=30, check=alive)
        alive()
        reconnects = worker.listener.reconnects
    assert all(n >= 1 for n in terminated), terminated
    assert sum(terminated) >= 2 * batches, terminated  # claim, io and listen connections
    assert {r["status"] for r in rows.values()} == {"completed"}
    for row in rows.values():
        assert kit.INVOCATIONS[(key, row["result"]["i"])] >= 1
    assert reconnects >= 1


def _started(key: str, batch: range) -> bool:
    return any(kit.INVOCATIONS[(key, i)] for i in batch)


async def test_a_dead_workers_tasks_are_rescued_and_run_again(database_url: str) -> None:
    async with kit.connect(database_url) as conn:
        retry, exhausted = await kit.submit(conn, "demo.echo", [{"value": "again"}, {}])
        await _orphan(conn, retry, "dead-worker", attempts=1)
        await _orphan(conn, exhausted, "dead-worker", attempts=3)
        async with kit.running_worker(database_url) as worker:
            rows = await kit.wait_tasks(conn, [retry, exhausted])
            rescued = kit.sample(worker, "taskfleet_lease_rescues_total", outcome="pending")
    assert rows[retry]["status"] == "completed"
    assert rows[retry]["attempts"] == 2
    assert rows[retry]["worker_id"] == "w1"
    assert rows[exhausted]["status"] == "failed"
    assert "lease expired" in rows[exhausted]["last_error"]
    assert rescued == 1


async def test_tasks_left_running_under_this_workers_own_id_are_rescued(
    database_url: str,
) -> None:
    """A worker started with a fixed id (``--worker-id``) after a crash of its previous
    incarnation: the tasks that incarnation held are running under the same worker id, with
    expired leases, and nobody runs them. They must run again within lease_ttl + sweep interval
    like any dead worker's tasks (docs/reference.md#worker-runtime, "Leases and rescue"), not be
    kept leased forever by the new incarnation's heartbeat while it never runs them."""
    async with kit.connect(database_url) as conn:
        (task_id,) = await kit.submit(conn, "demo.echo", [{"value": "orphan"}])
        await _orphan(conn, task_id, "w1", attempts=1)
        async with kit.running_worker(database_url, worker_id="w1"):
            row = await kit.wait_task(conn, task_id, timeout=6)
    assert row["status"] == "completed"
    assert row["result"] == {"value": "orphan"}


async def _orphan(conn: asyncpg.Connection, task_id: int, worker_id: str, *, attempts: int) -> None:
    """Make a task look like it was running on a worker that died (lease already expired)."""
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'running', worker_id = $2, attempts = $3,"
        " started_at = now() - interval '1 minute',"
        " lease_expires_at = now() - interval '1 second' WHERE id = $1",
        task_id,
        worker_id,
        attempts,
    )


async def test_a_worker_whose_row_disappeared_registers_again(database_url: str) -> None:
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url) as worker,
    ):
        await conn.execute("DELETE FROM taskfleet.workers WHERE id = 'w1'")
        await kit.wait_until(
            lambda: conn.fetchval("SELECT status FROM taskfleet.workers WHERE id = 'w1'"),
            "the row is back",
        )
        assert (await kit.worker_row(conn, "w1"))["status"] == "online"
        (task_id,) = await kit.submit(conn, "demo.echo", [{"value": 1}])
        assert (await kit.wait_task(conn, task_id))["status"] == "completed"
        assert worker.status == "running"


async def test_a_drain_lets_a_claim_in_flight_finish_and_loses_nothing_it_carried(
    database_url: str,
) -> None:
    # The claim statement carries the outcomes finished since the last claim. Cancelling it
    # mid-statement (as the drain did) lost them: the finished task stayed running until its
    # lease expired, to be run again. Made deterministic with row locks held in Postgres.
    from taskfleet.worker.outcomes import Outcome

    async with kit.connect(database_url) as conn, kit.connect(database_url) as blocker:
        # A long poll interval: the claim loop claims only when this test wakes it.
        worker = kit.build_worker(database_url, poll_interval=30.0, drain_timeout=10.0)
        run = await kit.start(worker)
        try:
            # Its first claim done and the loop asleep: an outcome put now goes to the finish
            # loop (put while a claim is pending, it would ride that claim instead).
            await kit.wait_until(lambda: not worker.outcomes.claim_pending, "the claim loop sleeps")
            # Two tasks this worker holds (as if claimed; their handlers never run).
            carried, other = await kit.submit(conn, "demo.echo", [{}, {}], delay=3600)
            await conn.execute(
                "UPDATE taskfleet.tasks SET status = 'running', worker_id = 'w1', attempts = 1,"
                " lease_expires_at = now() + interval '1 minute' WHERE id = ANY($1::bigint[])",
                [carried, other],
            )
            async with blocker.transaction():
                await blocker.execute(
                    "SELECT 1 FROM taskfleet.tasks WHERE id = ANY($1::bigint[]) FOR UPDATE",
                    [carried, other],
                )
                # The finish loop takes the first outcome and waits on its row...
                worker.outcomes.put(
                    Outcome(other, 1, "completed", result='{"n": 1}', type="demo.echo")
                )
                await kit.wait_until(
                    lambda: kit.waits_on_a_lock(conn, "taskfleet-worker-io"), "the finish waits"
                )
                # ... so the next outcome rides the next claim, which waits on its row too, and
                # claims a task that is ready (inserted without a wake-up: only we wake it).
                claimable = await conn.fetchval(
                    "INSERT INTO taskfleet.tasks (type, payload, priority, max_attempts)"
                    " VALUES ('demo.echo', '{\"value\": 3}', 5, 1) RETURNING id"
                )
                worker.outcomes.put(
                    Outcome(carried, 1, "completed", result='{"n": 2}', type="demo.echo")
                )
                worker.claim_loop.on_task_ready(None, control=False)
                await kit.wait_until(
                    lambda: kit.waits_on_a_lock(conn, "taskfleet-worker-claim"), "the claim waits"
                )
                worker.request_stop()
                await kit.wait_until(lambda: worker.status == "draining", "draining")
            await asyncio.wait_for(asyncio.shield(run.task), kit.DEADLINE)
        finally:
            await run.stop()
        rows = await kit.task_rows(conn, [carried, other, claimable])
        assert (rows[carried]["status"], rows[carried]["result"]) == ("completed", {"n": 2})
        assert (rows[other]["status"], rows[other]["result"]) == ("completed", {"n": 1})
        # What the claim took was run during the drain (or given back), not orphaned running
        # under a worker that is gone (to fail unrun, at max_attempts=1, after its lease).
        assert (rows[claimable]["status"], rows[claimable]["result"]) in [
            ("completed", {"value": 3}),
            ("pending", None),
        ], rows[claimable]


async def test_readiness_needs_a_claim_loop_that_makes_progress(database_url: str) -> None:
    # /readyz was green while either connection was up. A claim stuck on a lock is not
    # progress: the worker says so, and is ready again once the claim goes through.
    from taskfleet.worker.outcomes import Outcome

    async with kit.connect(database_url) as conn, kit.connect(database_url) as blocker:
        # In a fleet, so the next claim carries the outcome (a lone worker writes it at once).
        await kit.set_live_peer(conn, alive=True)
        worker = kit.build_worker(database_url, poll_interval=30.0)
        async with kit.running_worker(database_url, worker=worker):
            assert not worker.outcomes.at_once
            assert worker.not_ready_reasons() == []
            (held,) = await kit.submit(conn, "demo.echo", [{}], delay=3600)
            await conn.execute(
                "UPDATE taskfleet.tasks SET status = 'running', worker_id = 'w1', attempts = 1,"
                " lease_expires_at = now() + interval '1 minute' WHERE id = $1",
                held,
            )
            async with blocker.transaction():
                await blocker.execute(
                    "SELECT 1 FROM taskfleet.tasks WHERE id = $1 FOR UPDATE", held
                )
                worker.outcomes.claim_pending = True
                worker.outcomes.put(Outcome(held, 1, "completed", result="{}", type="demo.echo"))
                worker.claim_loop.hint_work()
                await kit.wait_until(
                    lambda: kit.waits_on_a_lock(conn, "taskfleet-worker-claim"), "the claim waits"
                )
                await kit.wait_until(
                    lambda: any("in flight" in r for r in worker.not_ready_reasons()),
                    "readiness sees the stuck claim",
                )
                assert not worker.healthy
            await kit.wait_until(lambda: worker.healthy, "ready again")


async def test_readiness_needs_every_database_connection(database_url: str) -> None:
    async with kit.connect(database_url) as conn, kit.running_worker(database_url) as worker:
        assert worker.healthy
        # The database refuses new connections and the worker's are dropped: its claims and
        # heartbeats fail (the test's own connection stays).
        name = str(await conn.fetchval("SELECT current_database()"))
        async with kit.connect(pg.with_database(database_url, "postgres")) as admin:
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            try:
                await kit.terminate_worker_backends(conn)
                await kit.wait_until(
                    lambda: any("is failing" in r for r in worker.not_ready_reasons()),
                    "readiness sees the failing connections",
                )
            finally:
                await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await kit.wait_until(lambda: worker.healthy, "ready again", timeout=30)
