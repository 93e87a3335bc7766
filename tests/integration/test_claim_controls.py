"""The claim statement's scheduling controls on a real Postgres: routing by worker tags, paused
labels, and the fleet-wide label limits kept in ``label_limits``
(docs/operations.md#scheduling-controls)."""

from __future__ import annotations

import asyncio
import itertools
import math
from datetime import datetime

import asyncpg

from taskfleet.shared import db
from taskfleet.shared import queries as q
from taskfleet.shared.policy.runtime_config import normalise_runtime_config
from tests.integration.sql import (
    NewTask,
    claim,
    claim_ids,
    connected,
    control_task,
    insert_tasks,
    register_worker,
    run,
    tick,
)


async def write_config(conn: asyncpg.Connection, **params: object) -> int:
    """A runtime-config version, as the update task writes it (the triggers follow it)."""
    config = normalise_runtime_config(params)
    (row,) = await run(
        conn,
        q.runtime_config_insert,
        request_id=config.request_id,
        payload=db.dumps(config.to_payload()),
    )
    return int(row["version"])


async def finish(conn: asyncpg.Connection, ids: list[int], worker_id: str = "w1") -> None:
    await run(
        conn,
        q.task_finish_batch,
        fin_ids=ids,
        fin_attempts=[1] * len(ids),
        fin_statuses=["completed"] * len(ids),
        fin_results=['{"ok": true}'] * len(ids),
        fin_errors=[None] * len(ids),
        fin_retry_in=[0.0] * len(ids),
        worker_id=worker_id,
    )


# --------------------------------------------------------------------------------------------
# Routing by worker tags


async def test_a_task_is_claimed_only_by_a_worker_with_every_tag_it_requires(
    conn: asyncpg.Connection,
) -> None:
    gpu, gpu_eu, anywhere = await insert_tasks(
        conn, [NewTask(requires=["gpu"]), NewTask(requires=["eu", "gpu"]), NewTask()]
    )
    assert await claim_ids(conn, groups=[(None, 10)]) == [anywhere]
    assert await claim_ids(conn, groups=[(None, 10)], tags=["eu"]) == []
    assert await claim_ids(conn, groups=[(None, 10)], tags=["gpu"]) == [gpu]
    assert await claim_ids(conn, groups=[(None, 10)], tags=["eu", "gpu", "x"]) == [gpu_eu]


async def test_requires_applies_to_the_strict_lane_too(conn: asyncpg.Connection) -> None:
    (task,) = await insert_tasks(conn, [NewTask(priority=5, requires=["gpu"])])
    untagged = await claim(conn, strict=2, probe_strict=False)
    assert untagged.ids == []
    assert await claim_ids(conn, strict=2, tags=["gpu"]) == [task]


async def test_requires_is_stored_as_a_sorted_set(conn: asyncpg.Connection) -> None:
    (task,) = await insert_tasks(conn, [NewTask(requires=["gpu", "eu", "gpu"])])
    assert await conn.fetchval("SELECT requires FROM taskfleet.tasks WHERE id = $1", task) == [
        "eu",
        "gpu",
    ]


async def test_unrunnable_counts_tasks_no_alive_worker_has_the_tags_for(
    conn: asyncpg.Connection,
) -> None:
    async def missing() -> int:
        rows = {
            r["reason"]: int(r["tasks"])
            for r in await run(conn, q.metrics_unrunnable, limit=10_001)
        }
        return rows["missing_tags"]

    await insert_tasks(
        conn, [NewTask(requires=["gpu"]), NewTask(requires=["gpu", "eu"]), NewTask()]
    )
    assert await missing() == 2
    await register_worker(conn, "w-plain")
    assert await missing() == 2
    await register_worker(conn, "w-gpu", tags=["gpu"])
    assert await missing() == 1
    await register_worker(conn, "w-both", tags=["eu", "gpu"])
    assert await missing() == 0
    await conn.execute("UPDATE taskfleet.workers SET status = 'offline' WHERE id = 'w-both'")
    assert await missing() == 1


# --------------------------------------------------------------------------------------------
# Paused labels


async def test_a_paused_label_is_left_pending_in_every_group_and_lane(
    conn: asyncpg.Connection,
) -> None:
    ids = await insert_tasks(
        conn,
        [
            NewTask(labels=["a", "hold"]),
            NewTask(labels=["a"]),
            NewTask(labels=["hold"]),
            NewTask(priority=3, labels=["hold"]),
            NewTask(priority=3),
        ],
    )
    got = await claim_ids(
        conn,
        strict=5,
        groups=[("a", 5), (None, 5)],
        configured=["a"],
        paused_labels=["hold"],
    )
    assert sorted(got) == [ids[1], ids[4]]
    # Resumed: the rest, in the usual order.
    rest = await claim_ids(conn, strict=5, groups=[("a", 5), (None, 5)], configured=["a"])
    assert sorted(rest) == [ids[0], ids[2], ids[3]]


async def test_a_group_whose_key_is_paused_is_not_even_probed(conn: asyncpg.Connection) -> None:
    await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(3)])
    result = await claim(conn, groups=[("a", 3)], configured=["a"], paused_labels=["a"])
    assert result.ids == []
    (row,) = await run(
        conn,
        q.task_claim_limited,
        fin_ids=[],
        fin_attempts=[],
        fin_statuses=[],
        fin_results=[],
        fin_errors=[],
        fin_retry_in=[],
        control_limit=0,
        strict_limit=0,
        group_keys=["a"],
        group_limits=[3],
        probe_strict=False,
        probe_normal=False,
        worker_id="w1",
        lease_ttl=30.0,
        types=["demo.echo"],
        tags=[],
        paused_labels=["a"],
    )
    # A paused group is not contention: nothing to ask again soon.
    assert row["contended_groups"] == []


# --------------------------------------------------------------------------------------------
# Fleet-wide label limits


async def test_a_config_version_keeps_the_limit_rows(conn: asyncpg.Connection) -> None:
    await write_config(conn, labelLimits={"a": {"maxInFlight": 2}, "b": {"ratePerSecond": 4}})
    rows = await conn.fetch(
        "SELECT label, max_in_flight, rate_per_second, in_flight, tokens "
        "FROM taskfleet.label_limits ORDER BY label"
    )
    assert [tuple(r) for r in rows] == [("a", 2, None, 0, 1.0), ("b", None, 4.0, 0, 4.0)]
    # Removed from the config: the row stays, inactive (its count is still right).
    await write_config(conn, labelLimits={"b": {"ratePerSecond": 4}})
    rows = await conn.fetch(
        "SELECT label, max_in_flight, rate_per_second FROM taskfleet.label_limits ORDER BY label"
    )
    assert [tuple(r) for r in rows] == [("a", None, None), ("b", None, 4.0)]


async def test_the_plain_claim_takes_nothing_but_control_while_a_limit_is_active(
    conn: asyncpg.Connection,
) -> None:
    """A worker whose config does not show a limit yet must not start tasks uncounted."""
    await write_config(conn, labelLimits={"hot": {"maxInFlight": 5}})
    cold, strict = await insert_tasks(conn, [NewTask(labels=["cold"]), NewTask(priority=2)])
    (config_task,) = await insert_tasks(conn, [control_task()])
    rows = await run(conn, q.task_claim, **plain_claim_params(strict=2, control=1, group=5))
    assert [r["id"] for r in rows] == [config_task]
    assert all(r["limits_active"] for r in rows)
    statuses = await conn.fetch(
        "SELECT status FROM taskfleet.tasks WHERE id = ANY($1::bigint[])", [cold, strict]
    )
    assert {r["status"] for r in statuses} == {"pending"}
    # Limits removed: the plain claim takes everything again, and says so.
    await write_config(conn)
    rows = await run(conn, q.task_claim, **plain_claim_params(strict=2, control=0, group=5))
    assert sorted(r["id"] for r in rows) == sorted([cold, strict])
    assert not rows[0]["limits_active"]


def plain_claim_params(*, strict: int, control: int, group: int) -> dict[str, object]:
    return {
        "fin_ids": [],
        "fin_attempts": [],
        "fin_statuses": [],
        "fin_results": [],
        "fin_errors": [],
        "fin_retry_in": [],
        "control_limit": control,
        "strict_limit": strict,
        "group_keys": [None],
        "group_limits": [group],
        "probe_strict": False,
        "probe_normal": False,
        "worker_id": "w1",
        "lease_ttl": 30.0,
        "types": ["demo.echo", "updateWorkerRuntimeConfig"],
        "tags": [],
        "paused_labels": [],
    }


async def test_max_in_flight_caps_claims_and_a_finish_frees_a_slot(
    conn: asyncpg.Connection,
) -> None:
    await write_config(conn, labelLimits={"a": {"maxInFlight": 2}})
    a_ids = await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(5)])
    (other,) = await insert_tasks(conn, [NewTask(labels=["b"])])
    first = await claim_ids(conn, groups=[(None, 10)])
    assert sorted(first) == [*a_ids[:2], other]  # other labels untouched
    assert await claim_ids(conn, groups=[(None, 10)]) == []
    await finish(conn, [a_ids[0]])
    assert await claim_ids(conn, groups=[(None, 10)]) == [a_ids[2]]
    assert await conn.fetchval("SELECT in_flight FROM taskfleet.label_limits") == 2


async def test_the_limited_claim_stamps_when_it_takes_rows_the_plain_one_when_it_began(
    conn: asyncpg.Connection,
) -> None:
    """started_at: a plain claim's statement start (now(), as a peer's dequeue stamps it); the
    limited claim's clock when it takes the rows, so a claim that used a slot a finish freed
    stamps after that finish (docs/architecture.md, "The claim's clock"). Each claim runs in a
    transaction that slept first: its now() is then well before its clock."""

    async def began_and_taken(label: str) -> tuple[datetime, datetime]:
        (task,) = await insert_tasks(conn, [NewTask(labels=[label])])
        async with conn.transaction():
            await conn.execute("SELECT pg_sleep(0.05)")
            assert await claim_ids(conn, groups=[(None, 10)]) == [task]
            began, taken = await conn.fetchrow(
                "SELECT now(), started_at FROM taskfleet.tasks WHERE id = $1", task
            )
        return began, taken

    began, taken = await began_and_taken("b")
    assert taken == began

    await write_config(conn, labelLimits={"a": {"maxInFlight": 2}})
    began, taken = await began_and_taken("a")
    assert (taken - began).total_seconds() >= 0.05


async def test_a_limit_counts_tasks_already_running_when_it_is_set(
    conn: asyncpg.Connection,
) -> None:
    ids = await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(4)])
    assert len(await claim_ids(conn, groups=[(None, 3)])) == 3
    await write_config(conn, labelLimits={"a": {"maxInFlight": 3}})
    assert await conn.fetchval("SELECT in_flight FROM taskfleet.label_limits") == 3
    assert await claim_ids(conn, groups=[(None, 3)]) == []
    await finish(conn, ids[:1])
    assert await claim_ids(conn, groups=[(None, 3)]) == [ids[3]]


async def test_a_new_limit_counts_the_tasks_a_claim_in_flight_takes(
    database_url: str, conn: asyncpg.Connection
) -> None:
    """A plain claim whose snapshot predates a new limit took the label's tasks uncounted, and
    the limit's marking of running tasks (its own snapshot) could not see them: 2 running, 0
    counted, so limited claims could start another. The version now waits for that claim."""
    ids = await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(3)])
    async with connected(database_url) as claimer, connected(database_url) as writer:
        in_flight = claimer.transaction()
        await in_flight.start()
        # The claim has run (no limit in its snapshot) but not committed.
        assert sorted(await claim_ids(claimer, groups=[(None, 2)])) == ids[:2]
        writer_pid = await writer.fetchval("SELECT pg_backend_pid()")
        writing = asyncio.create_task(write_config(writer, labelLimits={"a": {"maxInFlight": 1}}))
        # Either the version waits for the claim's lock, or (before the fix) it is written.
        while not writing.done():
            waiting = await conn.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                writer_pid,
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        await in_flight.commit()
        await asyncio.wait_for(writing, 30)
    limit = await conn.fetchrow("SELECT in_flight, max_in_flight FROM taskfleet.label_limits")
    assert dict(limit) == {"in_flight": 2, "max_in_flight": 1}
    marked = await conn.fetchval(
        "SELECT count(*) FROM taskfleet.tasks WHERE status = 'running' AND limit_labels = '{a}'"
    )
    assert marked == 2
    # Over the limit until they finish: the third task waits.
    assert await claim_ids(conn, groups=[(None, 3)]) == []


async def test_a_claim_started_while_a_new_limit_is_written_sees_the_limit(
    database_url: str, conn: asyncpg.Connection
) -> None:
    """The other order: a claim that starts before the version commits waits for it, then
    counts under the limit (it took three tasks uncounted before)."""
    await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(3)])
    async with connected(database_url) as claimer, connected(database_url) as writer:
        writing = writer.transaction()
        await writing.start()
        await write_config(writer, labelLimits={"a": {"maxInFlight": 1}})
        claimer_pid = await claimer.fetchval("SELECT pg_backend_pid()")
        claiming = asyncio.create_task(claim_ids(claimer, groups=[(None, 3)]))
        while not claiming.done():
            waiting = await conn.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                claimer_pid,
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        await writing.commit()
        got = await asyncio.wait_for(claiming, 30)
    assert len(got) == 1
    assert await conn.fetchval("SELECT in_flight FROM taskfleet.label_limits") == 1


async def test_a_retry_or_a_lease_rescue_releases_the_slot_too(conn: asyncpg.Connection) -> None:
    await write_config(conn, labelLimits={"a": {"maxInFlight": 1}})
    first, second = await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(2)])
    assert await claim_ids(conn, groups=[(None, 2)]) == [first]
    # The attempt fails with attempts left: back to pending (a retry in 0 s).
    await run(
        conn,
        q.task_finish_batch,
        fin_ids=[first],
        fin_attempts=[1],
        fin_statuses=["pending"],
        fin_results=[None],
        fin_errors=["boom"],
        fin_retry_in=[0.0],
        worker_id="w1",
    )
    assert await claim_ids(conn, groups=[(None, 2)]) == [first]
    await conn.execute(
        "UPDATE taskfleet.tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        first,
    )
    await tick(conn, "w-sweeper", sweep=True)
    assert await conn.fetchval("SELECT status FROM taskfleet.tasks WHERE id = $1", first) == (
        "pending"
    )
    got = await claim_ids(conn, groups=[(None, 2)])
    assert len(got) == 1 and got[0] in (first, second)


async def test_the_rate_limit_bucket_holds_one_seconds_worth(conn: asyncpg.Connection) -> None:
    await write_config(conn, labelLimits={"a": {"ratePerSecond": 2}})
    await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(10)])
    # Pretend the bucket has been filling for an hour: still at most one second's worth.
    await conn.execute("UPDATE taskfleet.label_limits SET refilled_at = now() - interval '1 hour'")
    result = await claim(conn, groups=[(None, 10)])
    assert len(result.ids) == 2
    again = await claim(conn, groups=[(None, 10)])
    assert again.ids == []
    (row,) = await run(
        conn,
        q.task_claim_limited,
        fin_ids=[],
        fin_attempts=[],
        fin_statuses=[],
        fin_results=[],
        fin_errors=[],
        fin_retry_in=[],
        control_limit=0,
        strict_limit=0,
        group_keys=[None],
        group_limits=[10],
        probe_strict=False,
        probe_normal=False,
        worker_id="w1",
        lease_ttl=30.0,
        types=["demo.echo"],
        tags=[],
        paused_labels=[],
    )
    # Held back by the rate: the answer says when the next token is due (under 1/2 s).
    assert row["limit_wait_seconds"] is not None and 0 < row["limit_wait_seconds"] <= 0.5


async def test_a_limit_row_held_by_another_claim_is_skipped_never_waited_for(
    database_url: str, conn: asyncpg.Connection
) -> None:
    await write_config(conn, labelLimits={"hot": {"maxInFlight": 5}})
    hot, cold = await insert_tasks(conn, [NewTask(labels=["hot"]), NewTask(labels=["cold"])])
    async with connected(database_url) as other:
        holding = other.transaction()
        await holding.start()
        await other.execute("SELECT 1 FROM taskfleet.label_limits WHERE label = 'hot' FOR UPDATE")
        # The claim does not wait: it takes what it can and leaves the hot task pending.
        got = await asyncio.wait_for(claim_ids(conn, groups=[(None, 5)]), 10)
        assert got == [cold]
        assert await conn.fetchval("SELECT status FROM taskfleet.tasks WHERE id = $1", hot) == (
            "pending"
        )
        await holding.rollback()
    assert await claim_ids(conn, groups=[(None, 5)]) == [hot]
    assert await conn.fetchval("SELECT in_flight FROM taskfleet.label_limits") == 1


async def test_concurrent_claimers_never_exceed_max_in_flight(database_url: str) -> None:
    """Eight connections claim and finish as fast as they can; the running count read from
    started_at/finished_at never goes over the limit (each claim and finish is its own
    transaction, as a worker's are)."""
    limit, total = 3, 120
    async with connected(database_url) as setup:
        await write_config(setup, labelLimits={"hot": {"maxInFlight": limit}})
        await insert_tasks(
            setup, [NewTask(labels=["hot"] if i % 4 else ["cold"]) for i in range(total)]
        )

    async def claimer(index: int) -> None:
        worker_id = f"w{index}"
        async with connected(database_url) as conn:
            for _ in range(400):
                got = await claim_ids(conn, worker_id=worker_id, groups=[(None, 2)])
                if got:
                    await asyncio.sleep(0.001 * (index % 3))
                    await finish(conn, got, worker_id)
                else:
                    left = await conn.fetchval(
                        "SELECT count(*) FROM taskfleet.tasks WHERE status <> 'completed'"
                    )
                    if left == 0:
                        return
                    await asyncio.sleep(0.002)

    await asyncio.gather(*(claimer(i) for i in range(8)))
    async with connected(database_url) as conn:
        rows = await conn.fetch(
            "SELECT started_at, finished_at, status FROM taskfleet.tasks "
            "WHERE labels @> ARRAY['hot']"
        )
        assert all(r["status"] == "completed" for r in rows)
        assert max_overlap([(r["started_at"], r["finished_at"]) for r in rows]) <= limit
        assert await conn.fetchval("SELECT in_flight FROM taskfleet.label_limits") >= 0


def max_overlap(intervals: list[tuple[object, object]]) -> int:
    """The most intervals open at one instant (an end at t comes before a start at t: the
    finish committed before the claim that used its slot)."""
    events = sorted(
        itertools.chain(((s, 1) for s, _ in intervals), ((e, -1) for _, e in intervals)),
        key=lambda ev: (ev[0], ev[1]),
    )
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def test_max_overlap_counts_what_runs_at_once() -> None:
    assert max_overlap([(1, 3), (2, 4), (3, 5)]) == 2
    assert max_overlap([(1, 10), (2, 3), (2, 4)]) == 3
    assert math.isfinite(max_overlap([]))
