"""Re-grouping after a change of the configured labels: it waits for transactions that were open
at the change (an insert in one may have read the old labels), then moves exactly the rows a
changed label moves, writing nobody else."""

from __future__ import annotations

import asyncpg

from taskfleet.shared import queries as q
from tests.integration.sql import NewTask, connected, ensure_grouping, insert_tasks, run


async def _config(conn: asyncpg.Connection, request_id: str, labels: list[str]) -> None:
    await conn.execute(
        "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)"
        " VALUES ($1, jsonb_build_object('labelWeights', $2::jsonb))",
        request_id,
        "{" + ",".join(f'"{label}": 1' for label in labels) + "}",
    )


async def _step(conn: asyncpg.Connection) -> asyncpg.Record:
    (row,) = await run(conn, q.task_regroup_step, batch=1000)
    return row


async def _keys(conn: asyncpg.Connection) -> dict[int, str]:
    rows = await conn.fetch("SELECT id, group_key FROM taskfleet.tasks ORDER BY id")
    return {r["id"]: r["group_key"] for r in rows}


async def test_an_insert_that_read_the_old_labels_is_waited_for_then_regrouped(
    conn: asyncpg.Connection, database_url: str
) -> None:
    await ensure_grouping(conn, ["b"])
    async with connected(database_url) as racer:
        tx = racer.transaction()
        await tx.start()
        try:
            # Written under {b}, not committed when the labels change to {a, b}.
            (late,) = await insert_tasks(racer, [NewTask(labels=["a", "b"])])
            await _config(conn, "add-a", ["a", "b"])
            assert (await _step(conn))["state"] == "waiting"
            assert (await _step(conn))["state"] == "waiting"
        finally:
            await tx.commit()
    assert (await _keys(conn))[late] == "b"  # the old key, until re-grouped
    step = await _step(conn)
    assert step["state"] == "settled"
    assert step["moved"] == 1
    assert (await _keys(conn))[late] == "a"


async def test_only_rows_a_changed_label_moves_are_written(conn: asyncpg.Connection) -> None:
    await ensure_grouping(conn, ["m", "x"])
    ids = await insert_tasks(
        conn,
        [
            NewTask(labels=["x"]),  # x: stays in x
            NewTask(labels=["m", "x"]),  # m: stays in m (m < x)
            NewTask(labels=["k", "x"]),  # x today; k will be configured: moves to k
            NewTask(labels=["k"]),  # default today: moves to k
            NewTask(labels=["z"]),  # default: stays
            NewTask(),  # unlabelled: always default, never walked
        ],
    )
    before = await conn.fetch("SELECT id, xmin::text AS xmin FROM taskfleet.tasks ORDER BY id")
    await _config(conn, "add-k", ["k", "m", "x"])
    step = await _step(conn)
    assert step["state"] == "settled"
    assert step["moved"] == 2
    keys = await _keys(conn)
    assert [keys[i] for i in ids] == ["x", "m", "k", "k", "", ""]
    after = await conn.fetch("SELECT id, xmin::text AS xmin FROM taskfleet.tasks ORDER BY id")
    rewritten = [a["id"] for a, b in zip(after, before, strict=True) if a["xmin"] != b["xmin"]]
    assert rewritten == [ids[2], ids[3]]
