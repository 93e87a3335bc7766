"""Fairness that holds fleet-wide: workers of unequal size draining the same backlog together
share the starts by the weights, because each worker's rotation is charged for what its claims
got and a claim that lost a ``SKIP LOCKED`` race does not mark the group dry."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from tests.integration import workerkit as kit

PER_GROUP = 1500
#: Starts counted from the first: both groups have work all along (a runs out after ~2,000).
WINDOW = 800


async def test_workers_of_2_5_and_10_slots_share_the_first_starts_3_to_1(
    database_url: str,
) -> None:
    async with kit.connect(database_url) as conn:
        await kit.insert_config(conn, "a3b1", notify=False, labelWeights={"a": 3, "b": 1})
        await kit.submit(
            conn,
            "demo.echo",
            [{"value": i} for i in range(2 * PER_GROUP)],
            labels=[["a"] if i % 2 == 0 else ["b"] for i in range(2 * PER_GROUP)],
        )
        async with AsyncExitStack() as stack:
            workers = []
            for name, slots in (("w2", 2), ("w5", 5), ("w10", 10)):
                worker = kit.build_worker(database_url, worker_id=name, concurrency=slots)
                workers.append(worker)
            # Started together, so all three claim from the backlog at once.
            await asyncio.gather(
                *(
                    stack.enter_async_context(kit.running_worker(database_url, worker=w))
                    for w in workers
                )
            )

            async def window_started() -> bool:
                n = await conn.fetchval(
                    "SELECT count(*) FROM taskfleet.tasks WHERE started_at IS NOT NULL"
                )
                return int(n) >= WINDOW

            await kit.wait_until(window_started, "the window's starts", timeout=60)
        rows = await conn.fetch(
            "SELECT labels[1] AS grp, worker_id FROM taskfleet.tasks"
            " WHERE started_at IS NOT NULL ORDER BY started_at, id LIMIT $1",
            WINDOW,
        )
    by_worker = {r["worker_id"] for r in rows}
    assert {"w2", "w5", "w10"} <= by_worker, "every worker took part"
    share_a = sum(1 for r in rows if r["grp"] == "a") / len(rows)
    assert abs(share_a - 0.75) <= 0.0375, share_a
