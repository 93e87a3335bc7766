"""POST /tasks/retry and POST /tasks/cancel against a real Postgres: each filter, each refusal,
the batches, the unique_key promise, and the wake-up. (Who may call them: test_auth_matrix.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from taskfleet.api.app import create_app
from taskfleet.api.bulk import TaskFilter, apply_in_batches
from taskfleet.api.database import Database
from taskfleet.shared import queries as q
from taskfleet.shared.db import sqlalchemy_url
from tests.integration.seed import Seed, seed, statuses
from tests.integration.test_api_tasks import PATIENCE, api_settings, started_client

HOUR = 3600.0


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in started_client(create_app(api_settings(database_url))):
        yield c


def mixed() -> list[Seed]:
    """Tasks in every state, of two types, with labels, at different ages."""
    return [
        Seed("failed", "demo.fail", labels=["a", "b"], created=-3 * HOUR),
        Seed("failed", "demo.fail", labels=["a"], created=-2 * HOUR),
        Seed("failed", "demo.echo", labels=["b"], created=-1 * HOUR),
        Seed("failed", "demo.echo", created=-60),
        Seed("cancelled", "demo.fail", labels=["a", "b"], created=-2 * HOUR),
        Seed("cancelled", "demo.echo", created=-60),
        Seed("pending", "demo.fail", labels=["a", "b"], created=-3 * HOUR),
        Seed("pending", "demo.echo", labels=["a"], created=-60),
        Seed("pending", "demo.echo", created=-30),
        Seed("running", "demo.fail", labels=["a", "b"], created=-2 * HOUR),
        Seed("running", "demo.echo", created=-60),
        Seed("completed", "demo.fail", labels=["a", "b"], created=-3 * HOUR),
        Seed("completed", "demo.echo", created=-60),
    ]


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()


# (filter body without status, predicate on a Seed) - each filter field alone, and together.
FILTERS: dict[str, tuple[Callable[[list[Seed]], dict[str, Any]], Callable[[Seed], bool]]] = {
    "type": (lambda s: {"type": "demo.fail"}, lambda t: t.type == "demo.fail"),
    "one label": (lambda s: {"labels": ["a"]}, lambda t: "a" in t.labels),
    "all of two labels": (
        lambda s: {"labels": ["a", "b"]},
        lambda t: {"a", "b"} <= set(t.labels),
    ),
    "ids": (lambda s: {"ids": [s[0].id, s[3].id, s[5].id, s[6].id]}, None),  # type: ignore[dict-item]
    "created_before": (
        lambda s: {"created_before": ago(1.5 * HOUR)},
        lambda t: t.created < -1.5 * HOUR,
    ),
    "created_after": (
        lambda s: {"created_after": ago(1.5 * HOUR)},
        lambda t: t.created > -1.5 * HOUR,
    ),
    "a window": (
        lambda s: {"created_after": ago(2.5 * HOUR), "created_before": ago(0.5 * HOUR)},
        lambda t: -2.5 * HOUR < t.created < -0.5 * HOUR,
    ),
    "type and label": (
        lambda s: {"type": "demo.echo", "labels": ["b"]},
        lambda t: t.type == "demo.echo" and "b" in t.labels,
    ),
    "all": (lambda s: {"all": True}, lambda t: True),
}


def matches(name: str, tasks: list[Seed]) -> Callable[[Seed], bool]:
    predicate = FILTERS[name][1]
    if predicate is None:  # by ids
        wanted = set(FILTERS[name][0](tasks)["ids"])
        return lambda t: t.id in wanted
    return predicate


@pytest.mark.parametrize("name", FILTERS)
@pytest.mark.parametrize("status", [None, ["cancelled"], ["failed", "cancelled"]])
async def test_retry_applies_to_exactly_the_matching_tasks(
    client: httpx.AsyncClient, conn: asyncpg.Connection, name: str, status: list[str] | None
) -> None:
    tasks = await seed(conn, mixed())
    before = await statuses(conn)
    body = FILTERS[name][0](tasks)
    if status is not None:
        body["status"] = status
    wanted_statuses = set(status or ["failed"])
    expected = {t.id for t in tasks if t.status in wanted_statuses and matches(name, tasks)(t)}

    response = await client.post("/tasks/retry", json=body)

    assert response.status_code == 200, response.text
    assert response.json() == {"retried": len(expected)}
    after = await statuses(conn)
    changed = {i for i in after if after[i] != before[i]}
    assert changed == expected
    assert all(after[i] == ("pending", False) for i in expected)
    retried = await conn.fetch(
        "SELECT attempts, finished_at, worker_id, last_error, run_after <= now() AS due"
        " FROM taskfleet.tasks WHERE id = ANY($1)",
        list(expected),
    )
    # The single-task rule: attempts 0, due now, last_error kept.
    assert all(r["attempts"] == 0 and r["due"] and r["worker_id"] is None for r in retried)
    assert all(r["finished_at"] is None for r in retried)


@pytest.mark.parametrize("name", FILTERS)
@pytest.mark.parametrize("status", [None, ["running"], ["pending", "running"]])
async def test_cancel_applies_to_exactly_the_matching_tasks(
    client: httpx.AsyncClient, conn: asyncpg.Connection, name: str, status: list[str] | None
) -> None:
    tasks = await seed(conn, mixed())
    before = await statuses(conn)
    body = FILTERS[name][0](tasks)
    if status is not None:
        body["status"] = status
    wanted_statuses = set(status or ["pending"])
    expected = {t.id for t in tasks if t.status in wanted_statuses and matches(name, tasks)(t)}

    response = await client.post("/tasks/cancel", json=body)

    assert response.status_code == 200, response.text
    assert response.json() == {"cancelled": len(expected)}
    after = await statuses(conn)
    changed = {i for i in after if after[i] != before[i]}
    assert changed == expected
    for task in tasks:
        if task.id in expected:
            # pending: cancelled at once; running: flagged, its worker interrupts it.
            want = ("cancelled", True) if task.status == "pending" else ("running", True)
            assert after[task.id] == want, task


async def test_bulk_cancel_leaves_the_runtime_config_task_alone(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    [config_task, other] = await seed(
        conn,
        [Seed(type="updateWorkerRuntimeConfig", priority=2_147_483_647), Seed()],
    )
    response = await client.post("/tasks/cancel", json={"all": True})
    assert response.json() == {"cancelled": 1}
    after = await statuses(conn)
    assert after[config_task.id] == ("pending", False)
    assert after[other.id] == ("cancelled", True)


async def test_bulk_retry_never_retries_the_runtime_config_task(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    [config_task] = await seed(
        conn, [Seed("failed", "updateWorkerRuntimeConfig", priority=2_147_483_647)]
    )
    response = await client.post("/tasks/retry", json={"all": True})
    assert response.json() == {"retried": 0}
    assert (await statuses(conn))[config_task.id] == ("failed", False)


async def test_bulk_retry_keeps_the_unique_key_promise(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    older, newer, held, holder, free = await seed(
        conn,
        [
            Seed("failed", unique_key="k1"),
            Seed("failed", unique_key="k1"),
            Seed("failed", unique_key="k2"),
            Seed("pending", unique_key="k2"),
            Seed("cancelled", unique_key="k3"),
        ],
    )
    response = await client.post(
        "/tasks/retry", json={"all": True, "status": ["failed", "cancelled"]}
    )
    assert response.status_code == 200, response.text
    after = await statuses(conn)
    # Of two tasks with one key, the newest; none whose key an unfinished task holds.
    assert after[newer.id][0] == "pending"
    assert after[older.id][0] == "failed"
    assert after[held.id][0] == "failed"
    assert after[holder.id][0] == "pending"
    assert after[free.id][0] == "pending"
    assert response.json() == {"retried": 2}


async def test_bulk_retry_wakes_the_workers_once_per_batch_naming_the_lanes(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    await seed(conn, [Seed("failed", priority=5), Seed("failed"), Seed("failed")])
    woken: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener(q.TASK_READY_CHANNEL, lambda *args: woken.put_nowait(args[3]))

    response = await client.post("/tasks/retry", json={"all": True})

    assert response.json() == {"retried": 3}
    assert await asyncio.wait_for(woken.get(), PATIENCE) == "normal,strict"
    # Nothing retried, nothing sent: a second call finds no failed task.
    assert (await client.post("/tasks/retry", json={"all": True})).json() == {"retried": 0}
    await conn.execute("SELECT 1")  # a round trip, so a stray notification would be in
    assert woken.empty()


@pytest.mark.parametrize("batch_size", [1, 3, 7, 1000])
async def test_every_matching_task_is_reached_whatever_the_batch_size(
    database_url: str, conn: asyncpg.Connection, batch_size: int
) -> None:
    tasks = await seed(conn, [Seed("failed", labels=["x"] if i % 3 else []) for i in range(20)])
    expected = {t.id for t in tasks if t.labels}
    database = Database.create(sqlalchemy_url(database_url), pool_size=1)
    try:
        retried = await apply_in_batches(
            database,
            q.task_retry_batch,
            TaskFilter(labels=["x"]),
            ["failed"],
            batch_size=batch_size,
        )
    finally:
        await database.dispose()
    assert retried == len(expected)
    after = await statuses(conn)
    assert {i for i, (s, _) in after.items() if s == "pending"} == expected


async def test_a_batch_statement_locks_no_more_than_its_batch(
    database_url: str, conn: asyncpg.Connection
) -> None:
    """While a batch's transaction is open, rows beyond it stay free for others to update."""
    tasks = await seed(conn, [Seed("failed") for _ in range(10)])
    other = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        async with other.transaction():
            sql, args = q.task_retry_batch.positional(
                {
                    "status": "failed",
                    "ids": None,
                    "type": None,
                    "labels": None,
                    "created_before": None,
                    "created_after": None,
                    "before_id": None,
                    "batch": 4,
                }
            )
            row = await other.fetchrow(sql, *args)
            assert (row["scanned"], row["changed"]) == (4, 4)
            # The six older rows are not locked: NOWAIT would raise if they were.
            locked_elsewhere = await conn.fetch(
                "SELECT id FROM taskfleet.tasks WHERE id = ANY($1) FOR UPDATE NOWAIT",
                [t.id for t in tasks[:6]],
            )
            assert len(locked_elsewhere) == 6
    finally:
        await other.close()


REFUSALS: dict[str, tuple[str, dict[str, Any], list[Any]]] = {
    "empty filter": ("retry", {}, ["body"]),
    "status alone": ("retry", {"status": ["failed"]}, ["body"]),
    "all false": ("cancel", {"all": False}, ["body"]),
    "retry of pending": ("retry", {"all": True, "status": ["pending"]}, ["body", "status", 0]),
    "retry of completed": (
        "retry",
        {"all": True, "status": ["failed", "completed"]},
        ["body", "status", 1],
    ),
    "cancel of failed": ("cancel", {"all": True, "status": ["failed"]}, ["body", "status", 0]),
    "unknown status": ("cancel", {"all": True, "status": ["lost"]}, ["body", "status", 0]),
    "empty status list": ("retry", {"all": True, "status": []}, ["body", "status"]),
    "empty ids": ("retry", {"ids": []}, ["body", "ids"]),
    "id zero": ("retry", {"ids": [0]}, ["body", "ids", 0]),
    "id as text": ("retry", {"ids": ["1"]}, ["body", "ids", 0]),
    "empty labels": ("cancel", {"labels": []}, ["body", "labels"]),
    "empty label": ("cancel", {"labels": [""]}, ["body", "labels", 0]),
    "empty type": ("cancel", {"type": ""}, ["body", "type"]),
    "naive time": ("retry", {"created_before": "2026-01-01T00:00:00"}, ["body", "created_before"]),
    "not a time": ("retry", {"created_after": "yesterday"}, ["body", "created_after"]),
    "time as a number": ("retry", {"created_after": 0}, ["body", "created_after"]),
    # Years 1 and 9999 whose offset takes them out of range in UTC (each answered 500).
    "year 0 in UTC": (
        "cancel",
        {"created_before": "0001-01-01T00:00:00+14:00"},
        ["body", "created_before"],
    ),
    "year 10000 in UTC": (
        "retry",
        {"created_after": "9999-12-31T23:59:59-14:00"},
        ["body", "created_after"],
    ),
    "empty window": (
        "retry",
        {"created_after": "2026-01-02T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"},
        ["body"],
    ),
    "all as text": ("cancel", {"all": "true"}, ["body", "all"]),
    "unknown field": ("cancel", {"all": True, "worker": "w1"}, ["body", "worker"]),
    "not an object": ("retry", [1, 2], ["body"]),
}


@pytest.mark.parametrize("name", REFUSALS)
async def test_each_refusal_is_a_422_naming_the_field_and_writes_nothing(
    client: httpx.AsyncClient, conn: asyncpg.Connection, name: str
) -> None:
    action, body, loc = REFUSALS[name]
    await seed(conn, mixed())
    before = await statuses(conn)

    response = await client.post(f"/tasks/{action}", json=body)

    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail[0]["loc"] == loc, detail
    assert detail[0]["msg"]
    assert await statuses(conn) == before


async def test_the_empty_filter_refusal_says_how_to_act_on_everything(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/tasks/retry", json={})
    assert response.status_code == 422
    assert '"all": true' in response.json()["detail"][0]["msg"]
