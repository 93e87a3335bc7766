"""Scheduling controls with real workers (docs/operations.md#scheduling-controls): pause and
resume through the runtime config, routing by worker tags, fleet-wide label limits.

Nothing here depends on timing: every wait is on task rows or worker events under a deadline,
and the limits are asserted on the start and finish times the database recorded (bounds that
a slow machine can only make easier to meet).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import asyncpg

from tests.integration import workerkit as kit
from tests.integration.test_claim_controls import max_overlap


@asynccontextmanager
async def fleet(url: str, *configs: dict[str, Any]) -> AsyncIterator[list[Any]]:
    """Workers started with these settings (each a dict of overrides), stopped on exit."""
    async with AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(kit.running_worker(url, **overrides))
            for overrides in configs
        ]
        yield workers


async def apply_config(conn: asyncpg.Connection, workers: list[Any], **params: Any) -> None:
    """Write a config version and wait until every worker applied it."""
    for worker in workers:
        worker.config_applied.clear()
    version = await kit.insert_config(conn, f"req-{uuid.uuid4()}", **params)
    for worker in workers:
        await kit.wait_until(lambda w=worker: w.applied_version >= version, "config applied")


def key() -> str:
    return f"k-{uuid.uuid4()}"


# --------------------------------------------------------------------------------------------
# Pause and resume


PAUSES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (the pause, how the held tasks are submitted)
    "label": ({"pausedLabels": ["hold"]}, {"labels": ["hold", "x"]}),
    "type": ({"pausedTypes": ["kit.count"]}, {}),
    "lane": ({"pausedLanes": ["strict"]}, {"priority": 5}),
}


async def _pause_and_resume(database_url: str, kind: str) -> None:
    pause, held_fields = PAUSES[kind]
    k = key()
    async with (
        kit.connect(database_url) as conn,
        fleet(database_url, {"concurrency": 1, "worker_id": "w-pause"}) as workers,
    ):
        await apply_config(conn, workers, **pause)
        # Held tasks first: in the usual order they would run before the free ones.
        held = await kit.submit(
            conn, "kit.count", [{"key": k, "i": i} for i in range(4)], **held_fields
        )
        free_type = "demo.echo" if kind == "type" else "kit.count"
        free = await kit.submit(
            conn,
            free_type,
            [{"key": k, "i": 100 + i} if free_type == "kit.count" else {} for i in range(3)],
        )
        await kit.wait_tasks(conn, free, {"completed"})
        rows = await kit.task_rows(conn, held)
        assert {r["status"] for r in rows.values()} == {"pending"}
        assert all(r["attempts"] == 0 for r in rows.values())
        # Resumed: every held task runs once, in its usual order (one slot: one at a time).
        await apply_config(conn, workers)
        done = await kit.wait_tasks(conn, held, {"completed"})
        assert all(kit.INVOCATIONS[(k, i)] == 1 for i in range(4))
        starts = [done[i]["started_at"] for i in held]
        assert starts == sorted(starts)


async def test_pause_and_resume_by_label(database_url: str) -> None:
    await _pause_and_resume(database_url, "label")


async def test_pause_and_resume_by_type(database_url: str) -> None:
    await _pause_and_resume(database_url, "type")


async def test_pause_and_resume_the_strict_lane(database_url: str) -> None:
    await _pause_and_resume(database_url, "lane")


async def test_the_control_lane_runs_while_everything_else_is_paused(database_url: str) -> None:
    async with (
        kit.connect(database_url) as conn,
        fleet(database_url, {"concurrency": 1, "worker_id": "w-ctl"}) as workers,
    ):
        await apply_config(conn, workers, pausedLanes=["strict", "normal"])
        (task,) = await kit.submit(conn, "demo.echo", [{}])
        # A config change still goes through (its task is in the control lane), and resumes.
        await apply_config(conn, workers)
        await kit.wait_task(conn, task)


# --------------------------------------------------------------------------------------------
# Routing by worker tags


async def test_a_tagged_and_an_untagged_worker_share_only_what_both_can_run(
    database_url: str,
) -> None:
    k = key()
    async with (
        kit.connect(database_url) as conn,
        fleet(database_url, {"worker_id": "w-plain"}),
    ):
        gpu = await kit.submit(
            conn, "kit.count", [{"key": k, "i": i} for i in range(6)], requires=["gpu"]
        )
        anywhere = await kit.submit(conn, "kit.count", [{"key": k, "i": 10 + i} for i in range(6)])
        # The untagged worker runs what needs no tag (submitted after, so it would otherwise
        # have run the gpu tasks first) and leaves the rest pending, counted as unrunnable.
        await kit.wait_tasks(conn, anywhere, {"completed"})
        assert {r["status"] for r in (await kit.task_rows(conn, gpu)).values()} == {"pending"}
        unrunnable = await kit.run_query(conn, kit.queries.metrics_unrunnable, limit=10_001)
        assert {r["reason"]: r["tasks"] for r in unrunnable}["missing_tags"] == 6
        async with fleet(database_url, {"worker_id": "w-gpu", "worker_tags": ["gpu", "eu"]}):
            more = await kit.submit(conn, "kit.count", [{"key": k, "i": 20 + i} for i in range(6)])
            rows = await kit.wait_tasks(conn, [*gpu, *more], {"completed"})
            assert {rows[i]["worker_id"] for i in gpu} == {"w-gpu"}
            workers = {
                r["id"]: list(r["tags"])
                for r in await conn.fetch("SELECT * FROM taskfleet.workers")
            }
            assert workers == {"w-gpu": ["eu", "gpu"], "w-plain": []}


# --------------------------------------------------------------------------------------------
# Fleet-wide label limits


async def test_max_in_flight_holds_across_racing_workers(database_url: str) -> None:
    k, limit = key(), 2
    async with (
        kit.connect(database_url) as conn,
        fleet(
            database_url,
            {"worker_id": "w-a", "concurrency": 4},
            {"worker_id": "w-b", "concurrency": 4},
            {"worker_id": "w-c", "concurrency": 4},
        ) as workers,
    ):
        await apply_config(conn, workers, labelLimits={"hot": {"maxInFlight": limit}})
        hot = await kit.submit(
            conn,
            "kit.count",
            [{"key": k, "i": i, "seconds": 0.02} for i in range(24)],
            labels=["hot"],
        )
        cold = await kit.submit(
            conn, "kit.count", [{"key": k, "i": 100 + i, "seconds": 0.02} for i in range(12)]
        )
        rows = await kit.wait_tasks(conn, [*hot, *cold], {"completed"})
        hot_intervals = [(rows[i]["started_at"], rows[i]["finished_at"]) for i in hot]
        assert max_overlap(hot_intervals) <= limit
        # Several workers took part, and the limit did not hold the other label back to it.
        assert len({rows[i]["worker_id"] for i in hot}) >= 2
        assert max_overlap([(rows[i]["started_at"], rows[i]["finished_at"]) for i in cold]) > limit


async def test_rate_per_second_bounds_the_starts_fleet_wide(database_url: str) -> None:
    k, rate, n = key(), 8.0, 16
    async with (
        kit.connect(database_url) as conn,
        fleet(
            database_url,
            {"worker_id": "w-a", "concurrency": 8},
            {"worker_id": "w-b", "concurrency": 8},
        ) as workers,
    ):
        await apply_config(conn, workers, labelLimits={"slow": {"ratePerSecond": rate}})
        ids = await kit.submit(
            conn, "kit.count", [{"key": k, "i": i} for i in range(n)], labels=["slow"]
        )
        rows = await kit.wait_tasks(conn, ids, {"completed"})
    starts = sorted(rows[i]["started_at"].timestamp() for i in ids)
    burst = max(1.0, rate)
    # Windows whose rate x window is not whole: ceil() leaves a fraction of a token of slack for
    # the few milliseconds between the bucket's clock reading and the start's, in one claim.
    for window in (0.3, 0.6, 1.1):
        most = max(
            sum(1 for s in starts[j:] if s < start + window) for j, start in enumerate(starts)
        )
        assert most <= math.ceil(rate * window) + burst, (window, most)
    # n starts with a bucket of one second's worth take at least (n - burst) / rate seconds.
    assert starts[-1] - starts[0] >= (n - burst - 1) / rate


async def test_a_tiny_stored_rate_does_not_stop_the_claims(database_url: str) -> None:
    """A rate below MIN_RATE_PER_SECOND is refused now, but an older version could store one
    (1e-320): the seconds to its next token, 1 / rate, overflowed float8 and every claim failed,
    the config task's too. The claim reads such a rate as the minimum."""
    k = key()
    async with (
        kit.connect(database_url) as conn,
        fleet(database_url, {"worker_id": "w-a", "concurrency": 4}) as workers,
    ):
        await apply_config(conn, workers, labelLimits={"tiny": {"ratePerSecond": 1.0}})
        await conn.execute(
            "UPDATE taskfleet.label_limits SET rate_per_second = 1e-320 WHERE label = 'tiny'"
        )
        limited = await kit.submit(
            conn, "kit.count", [{"key": k, "i": i} for i in range(2)], labels=["tiny"]
        )
        (free,) = await kit.submit(conn, "kit.count", [{"key": k, "i": 9}])
        assert (await kit.wait_task(conn, free))["status"] == "completed"
        # The bucket's one token: one of the two limited tasks starts, the other waits.
        await kit.wait_until(
            lambda: kit.INVOCATIONS[(k, 0)] + kit.INVOCATIONS[(k, 1)] == 1, "one limited start"
        )
        (worker,) = workers
        assert worker.claim_loop.problem() is None
        rows = await kit.task_rows(conn, limited)
        assert sorted(r["status"] for r in rows.values()) == ["completed", "pending"]


async def test_a_limit_change_applies_without_a_restart(database_url: str) -> None:
    k = key()
    async with (
        kit.connect(database_url) as conn,
        fleet(database_url, {"worker_id": "w-a", "concurrency": 4}) as workers,
    ):
        gate = kit.gate(k)
        await apply_config(conn, workers, labelLimits={"hot": {"maxInFlight": 1}})
        ids = await kit.submit(
            conn, "kit.block", [{"gate": k, "kind": "hot"} for _ in range(3)], labels=["hot"]
        )
        await kit.wait_until(lambda: gate.entered["hot"] == 1, "one hot task running")
        await apply_config(conn, workers, labelLimits={"hot": {"maxInFlight": 3}})
        await kit.wait_until(lambda: gate.entered["hot"] == 3, "three hot tasks running")
        assert gate.max_running["hot"] == 3
        gate.open.set()
        await kit.wait_tasks(conn, ids, {"completed"})


async def test_racing_workers_all_finish_under_limits(database_url: str) -> None:
    """Nothing is lost or run twice under a limit: every task completes once."""
    k = key()
    async with (
        kit.connect(database_url) as conn,
        fleet(
            database_url,
            {"worker_id": "w-a", "concurrency": 3},
            {"worker_id": "w-b", "concurrency": 3},
        ) as workers,
    ):
        await apply_config(
            conn, workers, labelLimits={"hot": {"maxInFlight": 2, "ratePerSecond": 50}}
        )
        ids = await kit.submit(
            conn, "kit.count", [{"key": k, "i": i} for i in range(30)], labels=["hot"]
        )
        await kit.wait_tasks(conn, ids, {"completed"})
        assert all(kit.INVOCATIONS[(k, i)] == 1 for i in range(30))
        await asyncio.sleep(0)
