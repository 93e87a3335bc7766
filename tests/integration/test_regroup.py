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


async def test_a_row_locked_during_the_walk_is_regrouped_before_it_settles(
    conn: asyncpg.Connection, database_url: str
) -> None:
    # The walk skips locked rows (SKIP LOCKED); it used to settle anyway, and such a row kept a
    # group no worker's rotation had any more: that task was never claimed.
    await ensure_grouping(conn, ["a"])
    ids = await insert_tasks(conn, [NewTask(labels=["a"]) for _ in range(3)])
    await _config(conn, "drop-a", [])
    # A first step of one row: it has seen every transaction open at the change end.
    (first,) = await run(conn, q.task_regroup_step, batch=1)
    assert first["state"] == "regrouping", dict(first)
    async with connected(database_url) as other:
        tx = other.transaction()
        await tx.start()
        try:
            # A claim's pick that a label limit left pending holds such a lock, for instance.
            await other.execute("SELECT 1 FROM taskfleet.tasks WHERE id = $1 FOR UPDATE", ids[2])
            step = await _step(conn)
            assert step["state"] == "regrouping", dict(step)
            assert (await _keys(conn))[ids[2]] == "a"
        finally:
            await tx.rollback()
    step = await _step(conn)
    assert step["state"] == "settled", dict(step)
    assert [(await _keys(conn))[i] for i in ids] == ["", "", ""]
