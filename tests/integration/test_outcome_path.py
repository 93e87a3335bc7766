"""Where a worker writes its outcomes (shared/policy/outcome_path.py): a lone worker writes them
at once, on the outcome writer's connection, while its next claim runs; in a fleet the next claim
carries them. Made deterministic with row locks held in Postgres: a blocked write shows which
statement carried the outcome."""

from __future__ import annotations

from typing import Any

import asyncpg

from taskfleet.shared import queries
from taskfleet.worker.outcomes import Outcome
from taskfleet.worker.worker import Worker
from tests.integration import workerkit as kit


async def _held_task(conn: asyncpg.Connection, worker_id: str = "w1") -> int:
    """A task this worker holds (as if claimed; its handler never runs)."""
    (task_id,) = await kit.submit(conn, "demo.echo", [{}], delay=3600)
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'running', worker_id = $2, attempts = 1,"
        " lease_expires_at = now() + interval '1 minute' WHERE id = $1",
        task_id,
        worker_id,
    )
    return int(task_id)


LOCK_ROW = "SELECT 1 FROM taskfleet.tasks WHERE id = $1 FOR UPDATE"


def _claims(worker: Worker) -> float:
    claimed, empty = kit.claim_queries(worker)
    return claimed + empty


async def test_a_lone_worker_writes_outcomes_at_once_and_goes_on_claiming(
    database_url: str,
) -> None:
    async with kit.connect(database_url) as conn, kit.connect(database_url) as blocker:
        worker = kit.build_worker(database_url, poll_interval=30.0)
        async with kit.running_worker(database_url, worker=worker):
            assert worker.outcomes.at_once  # no other worker: decided at registration
            held = await _held_task(conn)
            async with blocker.transaction():
                await blocker.execute(LOCK_ROW, held)
                # The claim loop is about to claim (a wake-up is coming): carried by the claim,
                # the outcome would hold that claim on the locked row.
                worker.outcomes.claim_pending = True
                worker.outcomes.put(Outcome(held, 1, "completed", result="{}", type="demo.echo"))
                await kit.wait_until(
                    lambda: kit.waits_on_a_lock(conn, "taskfleet-worker-io"), "the finish waits"
                )
                # The finish loop waits on the row; the claims go on without it (the new task's
                # own outcome queues behind the blocked write: one finish statement at a time).
                before = _claims(worker)
                (task,) = await kit.submit(conn, "demo.echo", [{"value": 7}])
                await kit.wait_tasks(conn, [task], {"running"})
                assert _claims(worker) > before
                assert not await kit.waits_on_a_lock(conn, "taskfleet-worker-claim")
                assert (await kit.task_rows(conn, [held]))[held]["status"] == "running"
            # The lock released, both outcomes are written.
            rows = await kit.wait_tasks(conn, [held, task])
            assert rows[held]["status"] == "completed"
            assert (rows[task]["status"], rows[task]["result"]) == ("completed", {"value": 7})


async def test_in_a_fleet_the_next_claim_carries_the_outcomes(database_url: str) -> None:
    async with kit.connect(database_url) as conn, kit.connect(database_url) as blocker:
        await kit.set_live_peer(conn, alive=True)
        worker = kit.build_worker(database_url, poll_interval=30.0)
        async with kit.running_worker(database_url, worker=worker):
            assert not worker.outcomes.at_once
            held = await _held_task(conn)
            async with blocker.transaction():
                await blocker.execute(LOCK_ROW, held)
                worker.outcomes.claim_pending = True
                worker.outcomes.put(Outcome(held, 1, "completed", result="{}", type="demo.echo"))
                worker.claim_loop.hint_work()
                # Carried by the claim: the claim waits on the row, the finish loop writes nothing.
                await kit.wait_until(
                    lambda: kit.waits_on_a_lock(conn, "taskfleet-worker-claim"), "the claim waits"
                )
                assert not await kit.waits_on_a_lock(conn, "taskfleet-worker-io")
            row = await kit.wait_task(conn, held)
            assert row["status"] == "completed"


async def test_the_path_follows_the_fleet_at_every_heartbeat(database_url: str) -> None:
    async with kit.connect(database_url) as conn:
        worker = kit.build_worker(database_url)
        async with kit.running_worker(database_url, worker=worker):
            assert worker.outcomes.at_once
            await kit.set_live_peer(conn, alive=True)
            await kit.wait_until(lambda: not worker.outcomes.at_once, "a peer: claims carry them")
            await kit.set_live_peer(conn, alive=False)
            await kit.wait_until(lambda: worker.outcomes.at_once, "alone again: at once")
            # Work still flows after the switches.
            (task,) = await kit.submit(conn, "demo.echo", [{"value": 1}])
            row = await kit.wait_task(conn, task)
            assert row["status"] == "completed"


def _finish_statements(worker: Worker) -> list[int]:
    """How many outcomes each finish statement of ``worker``'s outcome writer carried (a spy on
    its real database calls)."""
    sizes: list[int] = []
    database = worker.outcomes._db
    fetch = database.fetch

    async def counting_fetch(query: queries.Query, **params: Any) -> list[asyncpg.Record]:
        if query is queries.task_finish_batch:
            sizes.append(len(params["fin_ids"]))
        return await fetch(query, **params)

    database.fetch = counting_fetch  # type: ignore[method-assign]
    return sizes


async def test_a_busy_lone_worker_writes_several_claims_outcomes_in_one_statement(
    database_url: str,
) -> None:
    # One finish statement a claim cost a lone worker's drain the CPU its claims needed: while
    # its slots are busy it gathers them (LINGER_CLAIMS claims' worth, or LINGER_SECONDS).
    async with kit.connect(database_url) as conn:
        worker = kit.build_worker(database_url, concurrency=4, poll_interval=30.0)
        worker.outcomes.linger = 600.0  # here only a full batch or an idle loop ends a gathering
        sizes = _finish_statements(worker)
        async with kit.running_worker(database_url, worker=worker):
            assert worker.outcomes.at_once
            ids = await kit.submit(conn, "demo.echo", [{"value": i} for i in range(200)])
            rows = await kit.wait_tasks(conn, ids)
    assert {r["status"] for r in rows.values()} == {"completed"}
    target = worker.outcomes.linger_target
    assert target == 20  # LINGER_CLAIMS (5) times the concurrency
    # Claims of at most 4 tasks: written after each claim, 50 statements or more. (A claim
    # carries what finished while the finish loop was writing: not counted here.)
    assert max(sizes) >= target and len(sizes) <= 200 // target + 5, sizes


async def test_an_idle_lone_worker_writes_its_outcome_without_gathering(database_url: str) -> None:
    # Nothing else is coming when the claim loop has nothing to claim: no waiting for more.
    async with kit.connect(database_url) as conn:
        worker = kit.build_worker(database_url, poll_interval=30.0)
        worker.outcomes.linger = 600.0  # a gathering would outlast the wait below
        async with kit.running_worker(database_url, worker=worker):
            assert worker.outcomes.at_once
            for value in range(3):
                (task,) = await kit.submit(conn, "demo.echo", [{"value": value}])
                row = await kit.wait_task(conn, task, timeout=20.0)
                assert (row["status"], row["result"]) == ("completed", {"value": value})
