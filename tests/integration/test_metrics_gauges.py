"""The API's queue gauges against a real Postgres: equal to the truth on a seeded table while
each series is under its counting bound, the planner's estimate (never below the bound) past
it, and a snapshot served for a few seconds rather than read on every scrape."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from taskfleet.api.database import Database
from taskfleet.api.metrics import QueueGauges
from taskfleet.shared.db import sqlalchemy_url
from taskfleet.shared.metrics import ApiMetrics
from tests.integration.seed import Seed, seed, set_config

CONTROL = 2_147_483_647
HOUR = 3600.0


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database.create(sqlalchemy_url(database_url), pool_size=1)
    try:
        yield db
    finally:
        await db.dispose()


def gauges(**limits: int) -> tuple[QueueGauges, CollectorRegistry]:
    registry = CollectorRegistry()
    return QueueGauges(ApiMetrics.create(registry), registry, **limits), registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


SEEDS = [
    # Normal lane, groups a and b configured: a task's group is its smallest configured label.
    Seed(labels=["a"], created=-300),
    Seed(labels=["a", "b"], created=-200),
    Seed(labels=["a"], created=-100),
    Seed(labels=["b"], created=-50),
    Seed(labels=["x"], created=-400),  # no configured label: default
    Seed(created=-30),
    Seed(created=-20, run_after=HOUR),  # pending, not due: counted, no wait
    Seed(type="new.kind", created=-10),  # no alive worker knows it
    Seed(type="new.kind", priority=3, created=-10),
    Seed(priority=5, created=-500),
    Seed(priority=1, created=-60),
    Seed(priority=CONTROL, type="updateWorkerRuntimeConfig", created=-5),
    # Not pending: never counted.
    Seed("running", labels=["a"], created=-900),
    Seed("completed", created=-900),
    Seed("failed", priority=5, created=-900),
]


async def test_the_gauges_equal_the_truth_on_a_seeded_table(
    conn: asyncpg.Connection, database: Database
) -> None:
    await set_config(conn, {"labelWeights": {"a": 2, "b": 1}})
    await seed(conn, SEEDS)
    await conn.execute(
        "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, task_types)"
        " VALUES ('w', 'h', 1, 4, ARRAY['demo.echo'])"
    )
    gauge, registry = gauges()
    await gauge.refresh(database)

    depth = Counter({("control", ""): 0, ("strict", ""): 0})
    depth.update({("normal", g): 0 for g in ("a", "b", "default")})
    oldest: dict[tuple[str, str], float] = {}
    for s in SEEDS:
        if s.status != "pending":
            continue
        group = (
            ""
            if s.lane != "normal"
            else next((label for label in sorted(s.labels) if label in ("a", "b")), "default")
        )
        depth[(s.lane, group)] += 1
        if s.run_after is None or s.run_after <= 0:
            oldest[(s.lane, group)] = max(oldest.get((s.lane, group), 0.0), -s.created)
    for (lane, group), expected in depth.items():
        assert value(registry, "taskfleet_queue_depth", lane=lane, group=group) == expected, (
            lane,
            group,
        )
        seconds = value(
            registry, "taskfleet_queue_oldest_ready_age_seconds", lane=lane, group=group
        )
        assert seconds is not None
        # The database's clock moved on a little since the rows were written.
        assert oldest.get((lane, group), 0.0) <= seconds < oldest.get((lane, group), 0.0) + 30
    assert value(registry, "taskfleet_queue_unrunnable_tasks", reason="unknown_type") == 2
    assert value(registry, "taskfleet_workers_alive") == 1
    assert value(registry, "taskfleet_api_database_up") == 1


async def test_past_the_bound_a_depth_is_the_planners_estimate_never_below_the_bound(
    conn: asyncpg.Connection, database: Database
) -> None:
    await conn.execute(
        "INSERT INTO taskfleet.tasks (type) SELECT 'demo.echo' FROM generate_series(1, 3000)"
    )
    await conn.execute("INSERT INTO taskfleet.tasks (type, priority) VALUES ('demo.echo', 4)")
    await conn.execute("ANALYZE taskfleet.tasks")
    gauge, registry = gauges(depth_limit=100, sample_limit=50)
    await gauge.refresh(database)
    estimate = await conn.fetchval("SELECT taskfleet.pending_estimate('normal', '')")
    normal = value(registry, "taskfleet_queue_depth", lane="normal", group="default")
    assert normal == max(100, estimate)
    assert 2000 < normal < 4000  # the statistics know the table after ANALYZE
    # Under the bound: exact.
    assert value(registry, "taskfleet_queue_depth", lane="strict", group="") == 1


async def test_a_snapshot_is_served_until_it_is_a_few_seconds_old(
    conn: asyncpg.Connection, database: Database
) -> None:
    now = [100.0]
    registry = CollectorRegistry()
    gauge = QueueGauges(ApiMetrics.create(registry), registry, clock=lambda: now[0])
    await gauge.refresh(database)
    assert value(registry, "taskfleet_queue_depth", lane="normal", group="default") == 0
    await conn.execute("INSERT INTO taskfleet.tasks (type) VALUES ('demo.echo')")
    now[0] += 4.9
    await gauge.refresh(database)
    assert value(registry, "taskfleet_queue_depth", lane="normal", group="default") == 0
    now[0] += 0.2
    await gauge.refresh(database)
    assert value(registry, "taskfleet_queue_depth", lane="normal", group="default") == 1


async def test_a_young_snapshot_is_not_served_once_the_database_stops_answering(
    database: Database,
) -> None:
    gauge, registry = gauges()
    await gauge.refresh(database)
    assert value(registry, "taskfleet_api_database_up") == 1
    assert value(registry, "taskfleet_queue_depth", lane="normal", group="default") == 0
    unreachable = Database.create("postgresql://postgres@127.0.0.1:1/taskfleet", pool_size=1)
    try:
        await gauge.refresh(unreachable)  # within the snapshot's age, yet checked
    finally:
        await unreachable.dispose()
    assert value(registry, "taskfleet_api_database_up") == 0
    assert value(registry, "taskfleet_queue_depth", lane="normal", group="default") is None
    # Back: everything is read again at once, whatever the age.
    await gauge.refresh(database)
    assert value(registry, "taskfleet_api_database_up") == 1
    assert value(registry, "taskfleet_queue_depth", lane="normal", group="default") == 0
