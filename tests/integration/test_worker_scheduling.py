"""The worker's one scheduler loop against a real Postgres (docs/reference.md#worker-runtime):
wake-up by NOTIFY, no claims while saturated, several tasks per claim, the strict cap, weighted
fairness between groups, and the control lane that neither the cap nor a full worker can lock out.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import asyncpg

from taskfleet.shared import protocol, queries
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY
from taskfleet.worker.worker import Worker
from tests.integration import workerkit as kit

#: Observation window while saturated. Only an upper bound on what a broken loop could do in it;
#: nothing is asserted about how long anything took.
SATURATED_WINDOW = 0.3


async def test_an_idle_worker_picks_up_a_task_on_the_wake_up_notification(
    database_url: str,
) -> None:
    # Every timer far above the 5 s bound: only the NOTIFY can explain a pickup within it.
    slow: dict[str, Any] = {
        "poll_interval": 30.0,
        "heartbeat_interval": 10.0,
        "lease_ttl": 60.0,
        "runtime_config_poll_interval": 30.0,
        "sweep_interval": 30.0,
    }
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, **slow) as worker,
    ):
        # The start-up claim found nothing: the loop is asleep until a hint (or 30 s).
        await kit.wait_until(lambda: kit.claim_queries(worker)[1] >= 1, "the first empty claim")
        (task_id,) = await kit.submit(conn, "demo.echo", [{"value": "woken"}])
        row = await kit.wait_task(conn, task_id, timeout=5.0)
        assert row["status"] == "completed"
        assert row["result"] == {"value": "woken"}
        assert kit.notifications(worker, queries.TASK_READY_CHANNEL) >= 1


async def test_a_saturated_worker_sends_no_claims_and_claims_many_per_round_trip(
    database_url: str,
) -> None:
    gate = kit.gate("saturated")
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, concurrency=10) as worker,
    ):
        await kit.wait_until(lambda: kit.claim_queries(worker)[1] >= 1, "the first empty claim")
        ids = await kit.submit(conn, "kit.block", [{"gate": "saturated"}] * 10)
        await kit.wait_until(lambda: worker.inflight == 10, "all 10 slots busy")
        # The claim that filled the slots got all ten at once.
        assert kit.claimed_tasks(worker, "normal", "default") == 10
        assert kit.claim_queries(worker)[0] == 1
        before = kit.claim_queries(worker)
        # New work announced while saturated must not cause a claim either.
        notified = kit.notifications(worker, queries.TASK_READY_CHANNEL)
        (extra,) = await kit.submit(conn, "demo.echo", [{"value": "extra"}])
        await kit.wait_until(
            lambda: kit.notifications(worker, queries.TASK_READY_CHANNEL) > notified,
            "the wake-up reached the worker",
        )
        await asyncio.sleep(SATURATED_WINDOW)
        assert worker.inflight == 10
        assert kit.claim_queries(worker) == before
        assert (await kit.task_rows(conn, [extra]))[extra]["status"] == "pending"

        gate.open.set()
        rows = await kit.wait_tasks(conn, [*ids, extra])
        assert {r["status"] for r in rows.values()} == {"completed"}


class _LoopClock:
    """The worker's clock, counting calls per asyncio task name: the scheduler loop reads it once
    per iteration, so its count is the number of times the loop went round."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self) -> float:
        task = asyncio.current_task()
        name = task.get_name() if task is not None else ""
        self.calls[name] = self.calls.get(name, 0) + 1
        return time.monotonic()


async def test_a_saturated_worker_told_of_new_work_waits_for_a_slot_without_spinning(
    database_url: str,
) -> None:
    """With every slot busy, a wake-up notification must not make the scheduler loop go round
    and round until a slot frees (docs/reference.md#worker-runtime: wait for a free slot). A correct
    loop wakes once or twice; however long the window, the count stays small."""
    gate = kit.gate("spin")
    clock = _LoopClock()
    worker = Worker(
        kit.worker_settings(database_url, concurrency=2), kit.make_registry(), clock=clock
    )
    async with kit.connect(database_url) as conn, kit.running_worker(database_url, worker=worker):
        ids = await kit.submit(conn, "kit.block", [{"gate": "spin"}] * 2)
        await kit.wait_until(lambda: worker.inflight == 2, "both slots busy")
        notified = kit.notifications(worker, queries.TASK_READY_CHANNEL)
        rounds_before = clock.calls.get("claim-loop", 0)
        assert rounds_before >= 1  # the loop is the task named so, and reads the clock
        (extra,) = await kit.submit(conn, "demo.echo", [{"value": "extra"}])
        await kit.wait_until(
            lambda: kit.notifications(worker, queries.TASK_READY_CHANNEL) > notified,
            "the wake-up reached the worker",
        )
        await asyncio.sleep(SATURATED_WINDOW)
        rounds = clock.calls.get("claim-loop", 0) - rounds_before
        gate.open.set()
        await kit.wait_tasks(conn, [*ids, extra])
    assert rounds <= 5, f"the scheduler loop went round {rounds} times with no free slot"


async def test_the_strict_cap_limits_strict_tasks_and_normal_tasks_fill_the_rest(
    database_url: str,
) -> None:
    strict_gate = kit.gate("strict")
    normal_gate = kit.gate("normal")
    async with kit.connect(database_url) as conn:
        v1 = await kit.insert_config(conn, "cap-50", notify=False, maxStrictPercentage=50)
        strict_ids = await kit.submit(
            conn, "kit.block", [{"gate": "strict", "kind": "s"}] * 10, priority=5
        )
        normal_ids = await kit.submit(conn, "kit.block", [{"gate": "normal", "kind": "n"}] * 6)
        worker = kit.build_worker(database_url, concurrency=4, drain_timeout=0.5)
        strict_gate.observe = normal_gate.observe = lambda: worker.strict_inflight
        async with kit.running_worker(database_url, worker=worker):
            assert worker.applied_version == v1
            assert worker.planner.strict_cap == 2
            # A slot is taken at the claim; its handler starts a step later: wait for both.
            await kit.wait_until(
                lambda: (
                    worker.inflight == 4
                    and strict_gate.running["s"] + normal_gate.running["n"] == 4
                ),
                "all four slots busy",
            )
            assert worker.strict_inflight == 2
            # Claimed is not yet running: each handler enters its gate when its coroutine runs.
            await kit.wait_until(
                lambda: strict_gate.running["s"] == 2 and normal_gate.running["n"] == 2,
                "two strict and two normal handlers running",
            )

            # Normal work flows through the two normal slots; strict stays at its cap.
            normal_gate.open.set()
            await kit.wait_tasks(conn, normal_ids, {"completed"})
            assert strict_gate.entered["s"] == 2
            assert worker.strict_inflight == 2
            assert kit.sample(worker, "anclax_worker_strict_saturation_total") >= 1
            assert all(observed <= 2 for _, observed in strict_gate.observations)
            assert all(observed <= 2 for _, observed in normal_gate.observations)
            assert strict_gate.max_running["s"] == 2

            # Lowering the cap to 0 stops new strict claims and leaves the running ones alone.
            v2 = await kit.insert_config(conn, "cap-0", maxStrictPercentage=0)
            await kit.wait_until(lambda: worker.applied_version == v2, "cap 0 applied")
            assert worker.planner.strict_cap == 0
            assert kit.sample(worker, "anclax_worker_strict_cap") == 0
            assert worker.strict_inflight == 2 and strict_gate.running["s"] == 2
            rows = await kit.task_rows(conn, strict_ids)
            running = [i for i in strict_ids if rows[i]["status"] == "running"]
            assert len(running) == 2
            assert not any(rows[i]["cancel_requested"] for i in running)

            strict_gate.open.set()
            await kit.wait_tasks(conn, running, {"completed"})
            # A later normal task runs, so the loop has claimed since; no strict task came along.
            (sentinel,) = await kit.submit(conn, "demo.echo", [{"value": 1}])
            await kit.wait_task(conn, sentinel, {"completed"})
            assert strict_gate.entered["s"] == 2
            rows = await kit.task_rows(conn, strict_ids)
            waiting = [r for r in rows.values() if r["id"] not in running]
            assert {r["status"] for r in waiting} == {"pending"}
            assert {r["attempts"] for r in waiting} == {0}


async def test_groups_share_the_normal_lane_by_weight(database_url: str) -> None:
    async with kit.connect(database_url) as conn:
        await kit.insert_config(conn, "weights", notify=False, labelWeights={"a": 3, "b": 1})
        per_group = 600
        await kit.submit(
            conn,
            "demo.echo",
            [{"value": i} for i in range(2 * per_group)],
            labels=[["a"] if i % 2 == 0 else ["b"] for i in range(2 * per_group)],
        )
        async with kit.running_worker(database_url, concurrency=4) as worker:

            def claimed() -> tuple[float, float]:
                return (
                    kit.claimed_tasks(worker, "normal", "a"),
                    kit.claimed_tasks(worker, "normal", "b"),
                )

            await kit.wait_until(lambda: sum(claimed()) >= 400, "400 claims", timeout=30)
            a, b = claimed()
            default = kit.claimed_tasks(worker, "normal", "default")
    # Both groups had work all along (neither ran out), so the split is the weights' 3:1.
    assert a < per_group and b < per_group
    assert default == 0
    share = a / (a + b)
    assert 0.65 <= share <= 0.85, (a, b)


async def test_the_control_lane_runs_the_config_task_on_a_full_worker_with_cap_0(
    database_url: str,
) -> None:
    gate = kit.gate("busy")
    async with kit.connect(database_url) as conn:
        v1 = await kit.insert_config(conn, "r1", notify=False, maxStrictPercentage=0)
        async with kit.running_worker(database_url, concurrency=2) as worker:
            assert worker.applied_version == v1 and worker.planner.strict_cap == 0
            busy = await kit.submit(conn, "kit.block", [{"gate": "busy"}] * 3)
            await kit.wait_until(lambda: worker.inflight == 2, "both slots busy")
            task_id = await kit.submit_config_task(
                conn, {"requestID": "r2", "maxStrictPercentage": 50}
            )
            row = await kit.wait_task(conn, task_id)
            assert row["status"] == "completed", row["last_error"]
            assert row["result"]["outcome"] == "converged"
            version = row["result"]["version"]
            assert version > v1
            assert worker.applied_version == version
            assert worker.planner.strict_cap == 1
            assert (await kit.worker_row(conn, "w1"))["applied_config_version"] == version
            # It ran beside the business work, which is still running.
            assert worker.inflight == 2 and gate.running[""] == 2
            gate.open.set()
            await kit.wait_tasks(conn, busy, {"completed"})


async def test_a_control_task_without_its_wake_up_hint_is_found_by_the_heartbeat(
    database_url: str,
) -> None:
    # The NOTIFY says nothing about the control lane (or was lost): the tick's control_pending
    # row must still get it claimed into the spare control slot of a full worker.
    gate = kit.gate("busy2")
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, concurrency=1) as worker,
    ):
        busy = await kit.submit(conn, "kit.block", [{"gate": "busy2"}] * 2)
        await kit.wait_until(lambda: worker.inflight == 1, "the slot is busy")
        (task_id,) = await kit.submit(
            conn,
            "updateWorkerRuntimeConfig",
            [{"requestID": "quiet", "maxStrictPercentage": 20}],
            priority=CONTROL_PRIORITY,
            wake_hint="",
        )
        row = await kit.wait_task(conn, task_id)
        assert row["status"] == "completed", row["last_error"]
        assert row["result"]["outcome"] == "converged"
        assert worker.applied_version == row["result"]["version"]
        assert gate.running[""] == 1
        gate.open.set()
        await kit.wait_tasks(conn, busy, {"completed"})


async def test_a_strict_backlog_behind_the_cap_is_claimed_as_slots_free_not_per_poll(
    database_url: str,
) -> None:
    # Cap 1 of 2 slots, only strict work queued. Each finished strict task frees the strict
    # room; the loop must claim the next one then, not at the next poll (30 s here). 20 tasks
    # one at a time would take 10 minutes at one claim per poll.
    async with kit.connect(database_url) as conn:
        await kit.insert_config(conn, "cap-1", notify=False, maxStrictPercentage=50)
        async with kit.running_worker(
            database_url,
            concurrency=2,
            poll_interval=30.0,
            heartbeat_interval=10.0,
            lease_ttl=60.0,
            runtime_config_poll_interval=30.0,
        ) as worker:
            assert worker.planner.strict_cap == 1
            ids = await kit.submit(conn, "demo.echo", [{"value": i} for i in range(20)], priority=5)
            rows = await kit.wait_tasks(conn, ids, ["completed"], timeout=20)
            assert len(rows) == 20


async def test_a_wake_up_naming_the_normal_lane_claims_its_task_in_one_round_trip(
    database_url: str,
) -> None:
    """The API names the lanes it put work in; an idle worker claims from those at once, not
    from the strict lane first (which a cap of 100% would give every slot), then the normal."""
    slow: dict[str, Any] = {
        "poll_interval": 30.0,
        "heartbeat_interval": 10.0,
        "lease_ttl": 60.0,
        "runtime_config_poll_interval": 30.0,
        "sweep_interval": 30.0,
    }
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, **slow) as worker,
    ):
        await kit.wait_until(lambda: kit.claim_queries(worker)[1] >= 1, "the first empty claim")
        claimed, empty = kit.claim_queries(worker)
        (task_id,) = await kit.submit(
            conn, "demo.echo", [{"value": 1}], wake_hint=protocol.wake_hint(["normal"])
        )
        assert (await kit.wait_task(conn, task_id, timeout=5.0))["status"] == "completed"
        assert kit.claim_queries(worker) == (claimed + 1, empty)


async def test_wake_ups_naming_one_lane_do_not_keep_due_work_in_another_waiting(
    database_url: str,
) -> None:
    """A delayed strict task becomes due without a notification: the poll finds it. Wake-ups
    naming only the normal lane, arriving more often than the poll interval, used to put the
    poll off each time, and the strict task waited for as long as they kept coming."""
    async with (
        kit.connect(database_url) as conn,
        kit.connect(database_url) as stream_conn,
        kit.running_worker(database_url, poll_interval=1.0),
    ):
        (strict_id,) = await kit.submit(
            conn,
            "demo.echo",
            [{"value": "due later"}],
            priority=5,
            delay=0.5,
            wake_hint=protocol.wake_hint(["strict"]),
        )
        done = asyncio.Event()

        async def normal_wake_ups() -> None:
            while not done.is_set():
                await kit.submit(
                    stream_conn,
                    "demo.echo",
                    [{"value": 1}],
                    wake_hint=protocol.wake_hint(["normal"]),
                )
                await asyncio.sleep(0.2)

        stream = asyncio.create_task(normal_wake_ups())
        try:
            row = await kit.wait_task(conn, strict_id, timeout=30.0)
        finally:
            done.set()
            await stream
        assert row["status"] == "completed"


async def claim_statements(worker: Worker) -> list[asyncpg.Record]:
    """The claim statements prepared on ``worker``'s claim connection, with their plan counts."""
    claims = worker._claim_db
    async with claims._lock:
        assert claims._conn is not None
        return await claims._conn.fetch(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%claimed AS (%'"
        )


async def test_the_claims_run_their_generic_plan(database_url: str) -> None:
    # Once autovacuum had analysed the tasks table, Postgres found the claim's custom plan
    # cheaper and planned the whole statement again on every call: the drain fell from about
    # 3,800 to 1,600 tasks/s (docs/benchmarks.md). The claim connection forces the generic plan,
    # whose bounds tests/integration/test_claim_depth.py checks at a million rows.
    async with kit.connect(database_url) as conn, kit.running_worker(database_url) as worker:
        await conn.execute("ANALYZE taskfleet.tasks")
        for i in range(8):  # more than the five custom plans Postgres would try first
            ids = await kit.submit(conn, "demo.echo", [{"value": i}])
            await kit.wait_tasks(conn, ids)
        plans = await claim_statements(worker)
    assert plans, "the claim statement is prepared on the claim connection"
    assert [(p["generic_plans"] > 0, p["custom_plans"]) for p in plans] == [(True, 0)] * len(plans)


async def test_a_worker_draining_a_backlog_claims_without_the_probes_and_loses_nothing(
    database_url: str,
) -> None:
    # While its claims come back full, a worker leaves out the probes that explain a shortfall
    # (task_claim_steady); the one that comes back short at the end is asked again with them.
    # A lone worker writes its outcomes at once, and nothing asks the strict lane after its
    # first empty answer: it drains with the normal-only claim (task_claim_normal).
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, concurrency=4) as worker,
    ):
        ids = await kit.submit(conn, "demo.echo", [{"value": i} for i in range(120)])
        rows = await kit.wait_tasks(conn, ids)
        prepared = await claim_statements(worker)
    assert {r["status"] for r in rows.values()} == {"completed"}
    assert {r["attempts"] for r in rows.values()} == {1}
    runs: Counter[str] = Counter()
    for p in prepared:
        if "FROM limit_wait LEFT JOIN claimed" not in p["statement"]:
            kind = "probing"
        elif "strict AS (" in p["statement"]:
            kind = "steady"
        else:
            kind = "normal-only"
        runs[kind] += p["generic_plans"] + p["custom_plans"]
    assert runs["normal-only"] > 0, runs
    assert runs["probing"] > 0, runs  # the first claim, and the one that found the end
