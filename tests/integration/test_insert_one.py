"""``task_insert_one`` (a single submitted task) stores exactly what ``task_insert_batch`` stores
for the same task, and answers in the same columns: the two are one insert written twice, so
every rule of the batch must hold for the single one (docs/reference.md#tasks)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import asyncpg

from taskfleet.shared import queries as q
from taskfleet.shared.submission import (
    Submission,
    TaskIn,
    insert_one_params,
    insert_params,
    insert_statement,
)
from tests.integration.sql import ensure_grouping, run

STORED = (
    "type, payload, status, priority, weight, labels, attempts, max_attempts, timeout,"
    " unique_key, group_key, requires, cancel_requested"
)

TASKS = [
    TaskIn(type="demo.echo"),
    TaskIn(
        type="demo.echo",
        payload={"x": [1, "é"]},
        priority=3,
        weight=7,
        labels=["zeta", "beta", "alpha"],
        max_attempts=5,
        timeout_seconds=2.5,
        requires=["gpu", "eu", "gpu"],
    ),
    TaskIn(type="demo.echo", labels=["other"], delay_seconds=30.0, unique_key="k-1"),
    TaskIn(type="demo.echo", run_at=datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)),
]


def submission(task: TaskIn) -> Submission:
    return Submission(task=task, payload_json=json.dumps(task.payload))


async def stored(conn: asyncpg.Connection, task_id: int) -> dict[str, object]:
    row = await conn.fetchrow(
        f"SELECT {STORED}, run_after - created_at AS delay FROM taskfleet.tasks WHERE id = $1",
        task_id,
    )
    return dict(row)


async def test_one_stores_what_the_batch_stores(conn: asyncpg.Connection) -> None:
    await ensure_grouping(conn, ["beta", "zeta"])
    for task in TASKS:
        s = submission(task)
        assert insert_statement([s])[0] is q.task_insert_one
        (one,) = await run(conn, q.task_insert_one, **insert_one_params(s))
        # The same task again through the batch (its unique key freed first).
        await conn.execute("UPDATE taskfleet.tasks SET unique_key = NULL WHERE id = $1", one["id"])
        (batch,) = await run(conn, q.task_insert_batch, **insert_params([s]))
        assert list(one.keys()) == list(batch.keys())
        assert one["ord"] == batch["ord"] == 1
        assert (one["deduplicated"], batch["deduplicated"]) == (False, False)
        assert one["input_unique_key"] == batch["input_unique_key"] == task.unique_key
        a, b = await stored(conn, one["id"]), await stored(conn, batch["id"])
        a.pop("unique_key"), b.pop("unique_key")
        if task.run_at is not None:  # an absolute start: the same instant, whatever created_at
            a.pop("delay"), b.pop("delay")
        assert a == b
    requires, group = await conn.fetchrow(
        "SELECT requires, group_key FROM taskfleet.tasks WHERE weight = 7 LIMIT 1"
    )
    assert (requires, group) == (["eu", "gpu"], "beta")


async def test_one_answers_a_duplicate_key_as_deduplicated(conn: asyncpg.Connection) -> None:
    s = submission(TaskIn(type="demo.echo", unique_key="same"))
    (first,) = await run(conn, q.task_insert_one, **insert_one_params(s))
    (again,) = await run(conn, q.task_insert_one, **insert_one_params(s))
    assert first["deduplicated"] is False
    assert again["deduplicated"] is True
    assert again["input_unique_key"] == "same"
    assert again["id"] is None
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 1


def test_several_tasks_go_through_the_batch() -> None:
    two = [submission(TaskIn(type="demo.echo")) for _ in range(2)]
    assert insert_statement(two)[0] is q.task_insert_batch
