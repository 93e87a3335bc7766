"""GET /tasks/stats against a real Postgres: equal to the truth on a seeded table, and honest
about what it estimates once the table is past its counting limits."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from taskfleet.api.app import create_app
from taskfleet.api.database import Database
from taskfleet.api.stats import read_stats
from taskfleet.shared.db import sqlalchemy_url
from taskfleet.shared.statuses import TaskStatus
from tests.integration.seed import Seed, seed, set_config
from tests.integration.test_api_tasks import AS_SUBMIT, api_settings, started_client

CONTROL = 2_147_483_647
MINUTE = 60.0
HOUR = 3600.0


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in started_client(create_app(api_settings(database_url))):
        yield c


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database.create(sqlalchemy_url(database_url), pool_size=1)
    yield db
    await db.dispose()


def the_table() -> list[Seed]:
    """Every lane, groups (a task with two configured labels belongs to the smaller one),
    scheduled tasks, and finished tasks of several ages."""
    return [
        # normal lane, group "a" (configured), due for 10 min / 2 min, one scheduled later
        Seed(labels=["a"], created=-10 * MINUTE),
        Seed(labels=["b", "a"], created=-2 * MINUTE),
        Seed(labels=["a"], created=-20 * MINUTE, run_after=5 * MINUTE),
        # group "b": due for 30 min
        Seed(labels=["b", "zz"], created=-30 * MINUTE),
        # default group: unconfigured labels or none; one due 7 min, one not yet
        Seed(labels=["zz"], created=-7 * MINUTE),
        Seed(created=-MINUTE, run_after=HOUR),
        # strict lane: due 40 min and 1 min
        Seed(priority=5, created=-40 * MINUTE),
        Seed(priority=1, labels=["a"], created=-MINUTE),
        # control lane
        Seed(type="updateWorkerRuntimeConfig", priority=CONTROL, created=-3 * MINUTE),
        # running, per lane
        Seed("running", priority=3),
        Seed("running"),
        Seed("running", labels=["a"]),
        # finished: in the last minute, in the last hour, long ago
        Seed("completed", finished=-10),
        Seed("completed", finished=-20),
        Seed("completed", finished=-10 * MINUTE),
        Seed("failed", finished=-5),
        Seed("failed", finished=-30 * MINUTE),
        Seed("failed", finished=-2 * HOUR),
        Seed("cancelled", finished=-30),
        Seed("cancelled", finished=-3 * HOUR),
    ]


async def test_stats_equal_the_truth_on_a_seeded_table(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    version = await set_config(conn, {"labelWeights": {"a": 5, "b": 2}, "defaultWeight": 3})
    tasks = await seed(conn, the_table())
    seeded_at = time.monotonic()

    response = await client.get("/tasks/stats", headers=AS_SUBMIT)

    elapsed = time.monotonic() - seeded_at
    assert response.status_code == 200, response.text
    stats = response.json()
    counted = Counter(t.status for t in tasks)
    assert stats["by_status"] == {s: counted[s] for s in TaskStatus}
    assert stats["estimated"] == []
    assert stats["sample_complete"] is True
    assert stats["config_version"] == version

    def ready_age(*seconds_ago: float) -> tuple[float, float]:
        low = max(seconds_ago)
        return low, low + elapsed + 1.0

    lanes = stats["lanes"]
    assert {lane: (v["pending"], v["running"]) for lane, v in lanes.items()} == {
        "control": (1, 0),
        "strict": (2, 1),
        "normal": (6, 2),
    }
    assert all(v["pending_exact"] for v in lanes.values())
    for lane, ages in {
        "control": (3 * MINUTE,),
        "strict": (40 * MINUTE, MINUTE),
        "normal": (10 * MINUTE, 2 * MINUTE, 30 * MINUTE, 7 * MINUTE),
    }.items():
        low, high = ready_age(*ages)
        assert low <= lanes[lane]["oldest_ready_seconds"] <= high, (lane, lanes[lane])

    groups = {g["group"]: g for g in stats["groups"]}
    assert [g["group"] for g in stats["groups"]] == ["a", "b", "default"]
    assert {name: (g["weight"], g["pending"], g["ready"]) for name, g in groups.items()} == {
        "a": (5, 3, 2),
        "b": (2, 1, 1),
        "default": (3, 2, 1),
    }
    for name, ages in {"a": (10 * MINUTE,), "b": (30 * MINUTE,), "default": (7 * MINUTE,)}.items():
        low, high = ready_age(*ages)
        assert low <= groups[name]["oldest_ready_seconds"] <= high, groups[name]

    assert stats["finished_last_minute"] == {"completed": 2, "failed": 1, "cancelled": 1}
    assert stats["failed_last_hour"] == 2


async def test_stats_of_an_empty_table_with_no_config(client: httpx.AsyncClient) -> None:
    stats = (await client.get("/tasks/stats")).json()
    assert stats["by_status"] == dict.fromkeys(
        ["pending", "running", "completed", "failed", "cancelled"], 0
    )
    assert stats["groups"] == [
        {"group": "default", "weight": 1, "pending": 0, "ready": 0, "oldest_ready_seconds": 0.0}
    ]
    assert stats["config_version"] == 0
    assert stats["finished_last_minute"] == {"completed": 0, "failed": 0, "cancelled": 0}
    assert all(v["oldest_ready_seconds"] == 0 for v in stats["lanes"].values())


async def test_past_the_limits_counts_become_estimates_and_say_so(
    database: Database, conn: asyncpg.Connection
) -> None:
    await seed(
        conn,
        [Seed("completed") for _ in range(30)]
        + [Seed(labels=["a"]) for _ in range(12)]
        + [Seed("failed") for _ in range(3)],
    )
    await conn.execute("ANALYZE taskfleet.tasks")

    stats = await read_stats(database, count_limit=10, sample_limit=5)

    # Over the limit: the planner's estimate, which ANALYZE of a small table makes exact.
    assert stats["estimated"] == ["completed", "pending"]
    assert stats["by_status"]["completed"] == 30
    assert stats["by_status"]["pending"] == 12
    assert stats["by_status"]["failed"] == 3
    normal = stats["lanes"]["normal"]
    assert (normal["pending"], normal["pending_exact"]) == (10, False)
    assert stats["lanes"]["strict"]["pending_exact"] is True
    # The group figures cover the oldest 5 pending tasks only, and say so.
    assert stats["sample_complete"] is False
    assert sum(g["pending"] for g in stats["groups"]) == 5
    assert stats["finished_last_minute"]["completed"] == 10
    # The finished counts that stopped at the limit say so too (the console showed 10,000 a
    # minute as exact when far more finished).
    assert stats["finished_capped"] == ["completed"]
    assert stats["finished_last_minute"]["failed"] == 3


async def test_past_the_limit_with_no_statistics_the_count_is_the_limit_not_a_guess(
    database: Database, conn: asyncpg.Connection
) -> None:
    await seed(conn, [Seed("completed") for _ in range(30)])
    # A table that was never analysed has no per-status statistics.
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pg_stats WHERE schemaname = 'taskfleet' AND tablename = 'tasks'"
        )
        == 0
    )

    stats = await read_stats(database, count_limit=10, sample_limit=5)

    assert stats["estimated"] == ["completed"]
    assert stats["by_status"]["completed"] == 10


async def test_tasks_of_a_group_just_taken_out_of_the_config_count_where_they_go(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # Their stored group_key names a group the config no longer has until the re-grouping
    # reaches them (minutes at depth): the stats answered 500 (KeyError) meanwhile, and the
    # console's overview with them.
    await set_config(conn, {"labelWeights": {"a": 5, "b": 2}})
    await seed(conn, [Seed(labels=["a"]), Seed(labels=["a", "b"]), Seed(labels=["b"])])
    await set_config(conn, {"labelWeights": {"b": 2}})
    keys = await conn.fetch("SELECT group_key FROM taskfleet.tasks ORDER BY id")
    assert [r["group_key"] for r in keys] == ["a", "a", "b"]  # not re-grouped yet

    response = await client.get("/tasks/stats", headers=AS_SUBMIT)
    assert response.status_code == 200, response.text
    pending = {g["group"]: g["pending"] for g in response.json()["groups"]}
    # [a] goes to the default group, [a, b] to b (the rule), [b] stays in b.
    assert pending == {"b": 2, "default": 1}
