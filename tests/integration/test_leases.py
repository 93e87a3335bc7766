"""Leases, the rescue sweep, guarded transitions and the one-statement heartbeat
(docs/reference.md#task-states, #worker-runtime).

Time is the database's: leases are expired by moving ``lease_expires_at`` into the past, never by
sleeping.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import replace

import asyncpg
import pytest

from taskfleet.shared import queries as q
from tests.integration.sql import (
    NewTask,
    claim,
    claim_ids,
    connected,
    control_task,
    expire_leases,
    finish,
    insert_task,
    insert_tasks,
    of_kind,
    register_worker,
    run,
    task_row,
    tick,
)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with connected(database_url) as conn:
        await register_worker(conn, "A")
        await register_worker(conn, "B")
        yield conn


# --------------------------------------------------------------------------------------------
# Rescue
# --------------------------------------------------------------------------------------------


async def test_expired_lease_goes_back_to_pending_with_the_attempt_kept(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn, NewTask(max_attempts=3))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await expire_leases(conn, [task_id])

    rows = await tick(conn, "B", sweep=True)
    assert of_kind(rows, "rescued") == [(task_id, "pending")]
    assert ("wake", None, "") in rows
    row = await task_row(conn, task_id)
    assert (row["status"], row["attempts"], row["worker_id"], row["lease_expires_at"]) == (
        "pending",
        1,
        None,
        None,
    )
    assert row["finished_at"] is None
    assert "lease" in row["last_error"] and "A" in row["last_error"]
    # It is claimable again at once, and the next attempt is counted on top.
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == [task_id]
    assert (await task_row(conn, task_id))["attempts"] == 2


async def test_expired_lease_on_the_last_attempt_fails_the_task(conn: asyncpg.Connection) -> None:
    task_id = await insert_task(conn, NewTask(max_attempts=1))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await expire_leases(conn, [task_id])

    rows = await tick(conn, "B", sweep=True)
    assert of_kind(rows, "rescued") == [(task_id, "failed")]
    assert of_kind(rows, "wake") == []  # nothing became claimable
    row = await task_row(conn, task_id)
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("failed", 1, 1)
    assert row["finished_at"] is not None
    assert row["lease_expires_at"] is None
    assert "lease expired" in row["last_error"]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == []


async def test_live_leases_and_unswept_ticks_rescue_nothing(conn: asyncpg.Connection) -> None:
    live, expired = await insert_tasks(conn, [NewTask(), NewTask()])
    assert sorted(await claim_ids(conn, worker_id="A", groups=[(None, 2)])) == [live, expired]
    await expire_leases(conn, [expired])

    assert of_kind(await tick(conn, "B", sweep=False), "rescued") == []
    assert (await task_row(conn, expired))["status"] == "running"
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(expired, "pending")]
    assert (await task_row(conn, live))["status"] == "running"


async def test_a_worker_keeps_the_tasks_it_holds_by_heartbeating_not_by_rewriting_them(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn)
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await expire_leases(conn, [task_id])  # the claim's lease is past, A fell silent

    # A beats again, naming the task: neither its own sweep nor another worker's takes it, and
    # the task row is not rewritten (its lease is A's heartbeat).
    rows = await tick(conn, "A", held=[task_id], sweep=True, inflight=1)
    assert of_kind(rows, "rescued") == []
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == []
    row = await task_row(conn, task_id)
    assert (row["status"], row["worker_id"], row["attempts"]) == ("running", "A", 1)
    assert row["lease_expires_at"] < await conn.fetchval("SELECT now()")


async def test_rows_left_under_a_worker_id_it_no_longer_holds_are_rescued_by_itself(
    conn: asyncpg.Connection,
) -> None:
    # An earlier process with the same worker id died holding `orphan`; the new process holds
    # only `current`. Its heartbeat must not keep the orphan alive, and its sweep rescues it.
    orphan, current = await insert_tasks(conn, [NewTask(), NewTask()])
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [orphan]
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [current]
    await expire_leases(conn, [orphan, current])

    assert of_kind(await tick(conn, "A", held=[current]), "rescued") == []
    orphan_lease = await conn.fetchval(
        "SELECT lease_expires_at < now() FROM taskfleet.tasks WHERE id = $1", orphan
    )
    assert orphan_lease is True
    rows = await tick(conn, "A", held=[current], sweep=True)
    assert of_kind(rows, "rescued") == [(orphan, "pending")]
    assert (await task_row(conn, current))["status"] == "running"


async def test_a_heartbeat_vouches_only_for_the_tasks_it_names_and_owns(
    conn: asyncpg.Connection,
) -> None:
    a_task, b_task = await insert_tasks(conn, [NewTask(), NewTask()])
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [a_task]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == [b_task]
    await expire_leases(conn, [a_task, b_task])

    # A names B's task too (a stale id): the owner guard keeps it out, and B is silent, so a
    # sweep rescues B's task and keeps A's.
    await tick(conn, "A", held=[a_task, b_task], inflight=1, strict_inflight=1)
    rows = await tick(conn, "A", held=[a_task, b_task], sweep=True, inflight=1)
    assert of_kind(rows, "rescued") == [(b_task, "pending")]
    assert (await task_row(conn, a_task))["status"] == "running"
    worker = await conn.fetchrow(
        "SELECT inflight, strict_inflight, last_heartbeat > now() - interval '1 minute' AS beat "
        "FROM taskfleet.workers WHERE id = 'A'"
    )
    assert dict(worker) == {"inflight": 1, "strict_inflight": 0, "beat": True}


async def test_a_worker_silent_for_a_lease_loses_its_tasks_to_another_sweeper(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn)
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await conn.execute(
        "UPDATE taskfleet.tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        task_id,
    )
    # Claimed more than a lease ago, but A beat a moment ago: not expired.
    await tick(conn, "A", held=[task_id])
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == []
    # A's last beat is older than its lease (30 s): expired.
    await conn.execute(
        "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '31 seconds' WHERE id = 'A'"
    )
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(task_id, "pending")]


async def test_a_workers_silence_is_judged_by_its_own_lease_not_the_sweepers(
    conn: asyncpg.Connection,
) -> None:
    # The sweeper judged every worker by its own TASKFLEET_LEASE_TTL: B (30 s) took the task of
    # a live worker configured for 120 s after 31 s of silence, while its code still ran it.
    await register_worker(conn, "slow", lease_ttl=120.0)
    await register_worker(conn, "quick", lease_ttl=10.0)
    slow_task, quick_task = await insert_tasks(conn, [NewTask(), NewTask()])
    assert await claim_ids(conn, worker_id="slow", groups=[(None, 1)]) == [slow_task]
    assert await claim_ids(conn, worker_id="quick", groups=[(None, 1)]) == [quick_task]
    await conn.execute(
        "UPDATE taskfleet.tasks SET lease_expires_at = now() - interval '1 second'"
        " WHERE id = ANY($1::bigint[])",
        [slow_task, quick_task],
    )
    await conn.execute(
        "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '31 seconds'"
        " WHERE id IN ('slow', 'quick')"
    )
    # 31 s is past quick's 10 s lease, within slow's 120 s: only quick's task is taken.
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(quick_task, "pending")]
    assert (await task_row(conn, slow_task))["status"] == "running"
    await conn.execute(
        "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '121 seconds'"
        " WHERE id = 'slow'"
    )
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(slow_task, "pending")]


async def test_the_tasks_of_a_worker_whose_row_is_gone_are_rescued(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn)
    assert await claim_ids(conn, worker_id="gone", groups=[(None, 1)]) == [task_id]
    await conn.execute(
        "UPDATE taskfleet.tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        task_id,
    )
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(task_id, "pending")]


async def test_a_held_sweep_lock_makes_other_sweepers_skip(database_url: str) -> None:
    async with (
        connected(database_url) as first,
        connected(database_url) as second,
        connected(database_url) as admin,
    ):
        ids = await insert_tasks(admin, [NewTask()] * 5)
        early, late = ids[:3], ids[3:]
        assert len(await claim_ids(admin, worker_id="dead", groups=[(None, 3)])) == 3
        await expire_leases(admin, early)

        async with first.transaction():
            swept = of_kind(await tick(first, "A", sweep=True), "rescued")
            # More leases expire (committed elsewhere) while the first sweep's transaction still
            # holds the lock: the second sweeper skips at once rather than taking them (a
            # try-lock, so a heartbeat never waits behind a sweep).
            assert sorted(await claim_ids(admin, worker_id="dead", groups=[(None, 5)])) == late
            await expire_leases(admin, late)
            assert of_kind(await tick(second, "B", sweep=True), "rescued") == []
        assert sorted(swept) == [(i, "pending") for i in early]
        # Lock released: the next sweep takes what expired meanwhile, and only that.
        assert sorted(of_kind(await tick(second, "B", sweep=True), "rescued")) == [
            (i, "pending") for i in late
        ]
        assert of_kind(await tick(first, "A", sweep=True), "rescued") == []
        rows = await admin.fetch("SELECT status, attempts FROM taskfleet.tasks")
        assert Counter((r["status"], r["attempts"]) for r in rows) == {("pending", 1): 5}


async def test_concurrent_sweepers_never_process_a_task_twice(database_url: str) -> None:
    n_tasks, n_sweepers, rounds = 300, 4, 5
    async with connected(database_url) as seed:
        ids = await insert_tasks(seed, [NewTask(max_attempts=rounds + 1) for _ in range(n_tasks)])

    rescues: Counter[tuple[int, int]] = Counter()

    async def sweeper(index: int, conn: asyncpg.Connection, round_no: int) -> None:
        for _ in range(3):
            for task_id, status in of_kind(await tick(conn, f"s{index}", sweep=True), "rescued"):
                assert status == "pending"
                rescues[(task_id, round_no)] += 1

    async with connected(database_url) as admin, AsyncExitStack() as stack:
        conns = [
            await stack.enter_async_context(connected(database_url, f"sweeper-{i}"))
            for i in range(n_sweepers)
        ]
        for round_no in range(rounds):
            claimed = await claim_ids(admin, worker_id="dead", groups=[(None, n_tasks)])
            assert sorted(claimed) == ids
            await expire_leases(admin, ids)
            await asyncio.gather(*(sweeper(i, c, round_no) for i, c in enumerate(conns)))
            # Stragglers (a sweeper may have skipped while another held the lock).
            for task_id, _ in of_kind(await tick(admin, "s-final", sweep=True), "rescued"):
                rescues[(task_id, round_no)] += 1
        rows = await admin.fetch("SELECT status, attempts FROM taskfleet.tasks")

    assert set(rescues.values()) == {1}
    assert len(rescues) == n_tasks * rounds
    # Each rescue kept the attempt: one per claim, never counted twice.
    assert Counter((r["status"], r["attempts"]) for r in rows) == {("pending", rounds): n_tasks}


# --------------------------------------------------------------------------------------------
# Guarded transitions
# --------------------------------------------------------------------------------------------


async def test_a_worker_that_lost_its_lease_cannot_finish_the_task(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn)
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await expire_leases(conn, [task_id])
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(task_id, "pending")]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == [task_id]

    for status in ("completed", "failed", "pending"):
        assert await finish(conn, "A", [(task_id, status)], error="late") == []
    row = await task_row(conn, task_id)
    assert (row["status"], row["worker_id"], row["attempts"], row["result"]) == (
        "running",
        "B",
        2,
        None,
    )
    assert await finish(conn, "B", [(task_id, "completed")]) == [(task_id, "completed")]
    row = await task_row(conn, task_id)
    assert (row["status"], row["worker_id"], row["result"]) == ("completed", "B", {"ok": True})
    assert row["finished_at"] is not None and row["lease_expires_at"] is None
    # Finished is final: not even the owner can move it again.
    assert await finish(conn, "B", [(task_id, "failed")], error="twice") == []


async def test_outcomes_carried_by_a_claim_are_guarded_the_same_way(
    conn: asyncpg.Connection,
) -> None:
    lost, kept = await insert_tasks(conn, [NewTask(), NewTask()])
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [lost]
    await expire_leases(conn, [lost])
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(lost, "pending")]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == [lost]
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [kept]

    # A reports the lost task with its next claim: nothing is written for it.
    late = await claim(conn, worker_id="A", outcomes=[(lost, "completed")], groups=[(None, 1)])
    assert (late.finished_ids, late.ids) == ([], [])
    row = await task_row(conn, lost)
    assert (row["status"], row["worker_id"], row["result"]) == ("running", "B", None)

    # The owner's outcomes go through; a retried attempt is not re-claimed by the same round
    # trip (it still reads as running there) but is by the next one.
    done = await claim(conn, worker_id="B", outcomes=[(lost, "completed")], groups=[(None, 1)])
    assert (done.finished_ids, done.ids) == ([lost], [])
    retry = await claim(
        conn, worker_id="A", outcomes=[(kept, "pending")], error="flaky", groups=[(None, 1)]
    )
    assert (retry.finished_ids, retry.ids) == ([kept], [])
    row = await task_row(conn, kept)
    assert (row["status"], row["worker_id"], row["last_error"]) == ("pending", None, "flaky")
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [kept]
    assert (await task_row(conn, kept))["attempts"] == 2
    row = await task_row(conn, lost)
    assert (row["status"], row["worker_id"], row["result"]) == ("completed", "B", {"ok": True})


async def test_finish_batch_applies_each_outcome_and_skips_foreign_rows(
    conn: asyncpg.Connection,
) -> None:
    done, failed, retried, foreign = await insert_tasks(conn, [NewTask()] * 4)
    assert sorted(await claim_ids(conn, worker_id="A", groups=[(None, 3)])) == [
        done,
        failed,
        retried,
    ]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == [foreign]
    outcomes = [(done, "completed"), (failed, "failed"), (retried, "pending"), (foreign, "failed")]
    changed = await finish(conn, "A", outcomes, error="boom", retry_in=3600.0)
    assert changed == sorted(outcomes[:3])
    retry = await conn.fetchrow(
        "SELECT status, worker_id, last_error, finished_at, "
        "run_after > now() + interval '3000 seconds' AS backed_off "
        "FROM taskfleet.tasks WHERE id = $1",
        retried,
    )
    assert dict(retry) == {
        "status": "pending",
        "worker_id": None,
        "last_error": "boom",
        "finished_at": None,
        "backed_off": True,
    }
    assert (await task_row(conn, failed))["last_error"] == "boom"
    assert (await task_row(conn, foreign))["status"] == "running"
    # The retried task waits for its backoff.
    assert await claim_ids(conn, worker_id="A", groups=[(None, 5)]) == []


async def test_release_gives_back_only_the_callers_running_tasks(
    conn: asyncpg.Connection,
) -> None:
    mine, theirs = await insert_tasks(conn, [NewTask(), NewTask()])
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [mine]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == [theirs]

    released = await run(
        conn, q.task_release, ids=[mine, theirs], attempts=[1, 1], worker_id="B", reason="stop"
    )
    assert [r["id"] for r in released] == [theirs]
    assert (await task_row(conn, mine))["status"] == "running"
    released = await run(
        conn, q.task_release, ids=[mine], attempts=[1], worker_id="B", reason="stop"
    )
    assert released == []
    row = await task_row(conn, mine)
    assert (row["status"], row["worker_id"]) == ("running", "A")

    released = await run(
        conn, q.task_release, ids=[mine], attempts=[1], worker_id="A", reason="shutdown"
    )
    assert [r["id"] for r in released] == [mine]
    row = await task_row(conn, mine)
    # The interrupted attempt is not counted.
    assert (row["status"], row["worker_id"], row["attempts"], row["last_error"]) == (
        "pending",
        None,
        0,
        "shutdown",
    )


# --------------------------------------------------------------------------------------------
# Heartbeat payload
# --------------------------------------------------------------------------------------------


async def test_heartbeat_returns_the_running_tasks_whose_cancel_was_requested(
    conn: asyncpg.Connection,
) -> None:
    keep, cancel, other_workers, pending = await insert_tasks(conn, [NewTask()] * 4)
    assert sorted(await claim_ids(conn, worker_id="A", groups=[(None, 2)])) == [keep, cancel]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 1)]) == [other_workers]
    for task_id in (cancel, other_workers, pending):
        (row,) = await run(conn, q.task_cancel, id=task_id)
        assert row["cancel_requested"] is True

    assert (await task_row(conn, pending))["status"] == "cancelled"
    rows = await tick(conn, "A", held=[keep, cancel], inflight=2)
    assert of_kind(rows, "cancel") == [(cancel, None)]
    rows = await tick(conn, "B", held=[other_workers], inflight=1)
    assert of_kind(rows, "cancel") == [(other_workers, None)]


async def test_heartbeat_reports_registration_config_version_and_pending_control(
    conn: asyncpg.Connection,
) -> None:
    rows = await tick(conn, "A")
    assert of_kind(rows, "registered") == [(1, None)]
    assert of_kind(rows, "config") == [(0, None)]
    assert of_kind(rows, "control_pending") == []
    assert of_kind(await tick(conn, "nobody"), "registered") == [(0, None)]

    versions = [
        (await run(conn, q.runtime_config_insert, request_id=r, payload='{"x": 1}'))[0]["version"]
        for r in ("r1", "r2")
    ]
    delayed = await insert_task(conn, replace(control_task(), delay=3600))
    rows = await tick(conn, "A")
    assert of_kind(rows, "config") == [(max(versions), None)]
    assert of_kind(rows, "control_pending") == []  # not due yet

    control = await insert_task(conn, control_task())
    assert of_kind(await tick(conn, "A"), "control_pending") == [(control, None)]
    assert await claim_ids(conn, worker_id="B", control=1) == [control]
    assert of_kind(await tick(conn, "A"), "control_pending") == []
    assert (await task_row(conn, delayed))["status"] == "pending"


async def test_heartbeat_only_ever_raises_the_applied_config_version(
    conn: asyncpg.Connection,
) -> None:
    async def applied() -> int:
        return int(
            await conn.fetchval(
                "SELECT applied_config_version FROM taskfleet.workers WHERE id = 'A'"
            )
        )

    await tick(conn, "A", applied_version=3)
    assert await applied() == 3
    await tick(conn, "A", applied_version=1)
    assert await applied() == 3
    await run(conn, q.worker_applied_config, worker_id="A", version=5, ack="{}")
    await tick(conn, "A", applied_version=3)
    assert await applied() == 5


# --------------------------------------------------------------------------------------------
# Runtime config rows
# --------------------------------------------------------------------------------------------


async def test_config_insert_is_idempotent_per_request_and_applied_version_only_rises(
    conn: asyncpg.Connection,
) -> None:
    (first,) = await run(conn, q.runtime_config_insert, request_id="r1", payload='{"a": 1}')
    (again,) = await run(conn, q.runtime_config_insert, request_id="r1", payload='{"a": 2}')
    (second,) = await run(conn, q.runtime_config_insert, request_id="r2", payload='{"a": 3}')
    # The retried request kept its version and payload; versions rise (gaps allowed: the
    # identity is drawn before the conflict is seen).
    assert first["version"] == again["version"]
    v1, v2 = first["version"], second["version"]
    assert v2 > v1
    (latest,) = await run(conn, q.runtime_config_latest)
    assert (latest["version"], latest["payload"]) == (v2, {"a": 3})
    (by_request,) = await run(conn, q.runtime_config_by_request, request_id="r1")
    assert (by_request["version"], by_request["payload"]) == (v1, {"a": 1})

    (row,) = await run(conn, q.runtime_config_convergence, version=v2)
    assert (row["latest"], row["alive_workers"], row["applied_workers"], row["lagging"]) == (
        v2,
        2,
        0,
        ["A", "B"],
    )
    (applied,) = await run(conn, q.worker_applied_config, worker_id="A", version=v2, ack="{}")
    assert applied["applied_config_version"] == v2
    # A replayed, older notification cannot move the worker back.
    (applied,) = await run(conn, q.worker_applied_config, worker_id="A", version=v1, ack="{}")
    assert applied["applied_config_version"] == v2
    (row,) = await run(conn, q.runtime_config_convergence, version=v2)
    assert (row["applied_workers"], row["lagging"]) == (1, ["B"])

    # A worker that stops heartbeating no longer counts as alive.
    await conn.execute(
        "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '1 hour' WHERE id = 'B'"
    )
    (row,) = await run(conn, q.runtime_config_convergence, version=v2)
    assert (row["alive_workers"], row["applied_workers"], row["lagging"]) == (1, 1, [])


async def test_a_worker_stopped_before_a_version_is_not_left_out_of_it(
    conn: asyncpg.Connection,
) -> None:
    # A worker stopped cleanly a moment before the version was written (offline, its row's
    # heartbeat stamped when it said so) was listed as excluded: "alive after the version".
    await conn.execute(
        "UPDATE taskfleet.workers SET status = 'offline', last_heartbeat = now() - interval "
        "'1 second' WHERE id = 'B'"
    )
    (written,) = await run(conn, q.runtime_config_insert, request_id="r9", payload="{}")
    (row,) = await run(conn, q.runtime_config_convergence, version=written["version"])
    assert (row["alive_workers"], row["lagging"], row["excluded"]) == (1, ["A"], [])
    # One that stops after it, still behind, is.
    await conn.execute(
        "UPDATE taskfleet.workers SET status = 'offline', last_heartbeat = now() + interval "
        "'1 second' WHERE id = 'A'"
    )
    (row,) = await run(conn, q.runtime_config_convergence, version=written["version"])
    assert (row["excluded"], row["excluded_statuses"]) == (["A"], ["offline"])


# --------------------------------------------------------------------------------------------
# A cancel request is never lost to a retry, a rescue, a release, or a claim
# --------------------------------------------------------------------------------------------


async def test_a_retry_of_a_task_whose_cancel_was_requested_ends_it_cancelled(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn, NewTask(max_attempts=3))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    (row,) = await run(conn, q.task_cancel, id=task_id)
    assert (row["status"], row["cancel_requested"]) == ("running", True)

    # The attempt timed out before the heartbeat saw the cancel: its outcome is a retry.
    assert await finish(conn, "A", [(task_id, "pending")], error="timed out") == [
        (task_id, "cancelled")
    ]
    row = await task_row(conn, task_id)
    assert (row["status"], row["attempts"], row["worker_id"]) == ("cancelled", 1, "A")
    assert row["finished_at"] is not None and row["lease_expires_at"] is None
    assert row["last_error"] == (
        "cancelled: requested while attempt 1 ran, which then failed: timed out"
    )
    assert await claim_ids(conn, worker_id="B", groups=[(None, 5)]) == []


async def test_a_retry_carried_by_a_claim_also_ends_cancelled(conn: asyncpg.Connection) -> None:
    task_id = await insert_task(conn, NewTask(max_attempts=3))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await run(conn, q.task_cancel, id=task_id)
    done = await claim(conn, worker_id="A", outcomes=[(task_id, "pending")], groups=[(None, 1)])
    assert (done.finished_ids, done.ids) == ([task_id], [])
    assert (await task_row(conn, task_id))["status"] == "cancelled"


async def test_a_rescued_lease_of_a_task_whose_cancel_was_requested_ends_cancelled(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn, NewTask(max_attempts=3))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await run(conn, q.task_cancel, id=task_id)
    await expire_leases(conn, [task_id])

    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(task_id, "cancelled")]
    row = await task_row(conn, task_id)
    assert (row["status"], row["attempts"], row["worker_id"]) == ("cancelled", 1, "A")
    assert row["finished_at"] is not None
    assert row["last_error"].startswith("cancelled as requested; lease expired: worker A")
    assert await claim_ids(conn, worker_id="B", groups=[(None, 5)]) == []


async def test_a_released_task_whose_cancel_was_requested_ends_cancelled(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn, NewTask(max_attempts=3))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await run(conn, q.task_cancel, id=task_id)
    released = await run(
        conn, q.task_release, ids=[task_id], attempts=[1], worker_id="A", reason="shutdown"
    )
    assert [r["id"] for r in released] == [task_id]
    row = await task_row(conn, task_id)
    assert (row["status"], row["attempts"]) == ("cancelled", 1)
    assert "cancelled" in row["last_error"]
    assert await claim_ids(conn, worker_id="B", groups=[(None, 5)]) == []


async def test_the_schema_refuses_a_pending_task_whose_cancel_was_requested(
    conn: asyncpg.Connection,
) -> None:
    # So no path (today's or a future one) can put one back in the queue to be claimed.
    task_id = await insert_task(conn)
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute(
            "UPDATE taskfleet.tasks SET cancel_requested = true WHERE id = $1", task_id
        )


# --------------------------------------------------------------------------------------------
# Fencing by attempt
# --------------------------------------------------------------------------------------------


async def test_an_earlier_attempts_outcome_cannot_finish_a_later_attempt(
    conn: asyncpg.Connection,
) -> None:
    # A lost the lease of attempt 1 and claimed the task again (attempt 2): attempt 1's late
    # outcome carries the same task id and worker id, and must change nothing.
    task_id = await insert_task(conn, NewTask(max_attempts=3))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await expire_leases(conn, [task_id])
    assert of_kind(await tick(conn, "B", sweep=True), "rescued") == [(task_id, "pending")]
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]

    for status in ("completed", "failed", "pending", "cancelled"):
        assert await finish(conn, "A", [(task_id, status)], attempts=[1], error="stale") == []
    late = await claim(conn, worker_id="A", outcomes=[(task_id, "completed")], attempts=[1])
    assert late.finished_ids == []
    released = await run(
        conn, q.task_release, ids=[task_id], attempts=[1], worker_id="A", reason="stop"
    )
    assert released == []
    row = await task_row(conn, task_id)
    assert (row["status"], row["attempts"], row["worker_id"], row["result"]) == (
        "running",
        2,
        "A",
        None,
    )
    assert await finish(conn, "A", [(task_id, "completed")], attempts=[2]) == [
        (task_id, "completed")
    ]


async def test_the_heartbeat_vouches_only_for_the_attempt_it_holds(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn, NewTask(max_attempts=3))
    assert await claim_ids(conn, worker_id="A", groups=[(None, 1)]) == [task_id]
    await expire_leases(conn, [task_id])
    # Holding attempt 1 (the one running) keeps it.
    assert (
        of_kind(await tick(conn, "A", held=[task_id], held_attempts=[1], sweep=True), "rescued")
        == []
    )
    # Holding attempt 0 (not the one running) does not: A's own sweep rescues its attempt 1.
    rows = await tick(conn, "A", held=[task_id], held_attempts=[0], sweep=True)
    assert of_kind(rows, "rescued") == [(task_id, "pending")]


# --------------------------------------------------------------------------------------------
# Bounded writes: a running task's lease is its worker's heartbeat
# --------------------------------------------------------------------------------------------


async def _task_updates(conn: asyncpg.Connection) -> int:
    # This backend's counters reach the shared statistics when its next transaction ends.
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await conn.fetchval(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'taskfleet.tasks'::regclass"
        )
    )


async def test_a_heartbeat_writes_no_task_row_however_many_tasks_run(
    conn: asyncpg.Connection,
) -> None:
    ids = await insert_tasks(conn, [NewTask() for _ in range(5)])
    assert sorted(await claim_ids(conn, worker_id="A", groups=[(None, 5)])) == sorted(ids)
    before = await _task_updates(conn)
    for _ in range(3):
        rows = await tick(conn, "A", held=ids, sweep=True, inflight=5)
        assert of_kind(rows, "rescued") == []
    assert await _task_updates(conn) == before
    assert {r["status"] for r in (await conn.fetch("SELECT status FROM taskfleet.tasks"))} == {
        "running"
    }
