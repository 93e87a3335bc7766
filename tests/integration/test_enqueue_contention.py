"""A batch enqueued in the caller's own transaction is all or nothing, even when a unique_key's
holder keeps finishing until the deduplication gives up (``Conflict``): the rows the batch had
already inserted are gone from that transaction, so catching the Conflict and committing keeps
none of the batch."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

import taskfleet
from taskfleet import enqueuing as enqueue_module
from taskfleet.shared import queries as q
from taskfleet.shared.submission import DEDUP_ATTEMPTS


async def test_a_batch_refused_for_key_contention_leaves_nothing_in_the_transaction(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    await conn.execute("SELECT taskfleet.enqueue('demo.echo', unique_key => 'held')")
    real_fetcher = enqueue_module._async_fetcher
    reads = 0

    def contended_fetcher(connection: Any) -> Any:
        fetch = real_fetcher(connection)

        async def fetch_all(query: q.Query, params: dict[str, Any]) -> list[Any]:
            nonlocal reads
            if query is q.task_get_unfinished_by_unique_key:
                # The holder "finished" between the insert and this read, every time.
                reads += 1
                return []
            rows: list[Any] = await fetch(query, params)
            return rows

        return fetch_all

    monkeypatch.setattr(enqueue_module, "_async_fetcher", contended_fetcher)
    async with conn.transaction():
        with pytest.raises(taskfleet.Conflict):
            await taskfleet.enqueue_many(
                conn,
                [
                    {"type": "demo.echo", "payload": {"value": "1"}},
                    {"type": "demo.echo", "unique_key": "held"},
                    {"type": "demo.echo", "payload": {"value": "3"}},
                ],
            )
        # The caller caught the Conflict and commits: only the holder is stored.
    assert reads == DEDUP_ATTEMPTS
    rows = await conn.fetch("SELECT unique_key, payload FROM taskfleet.tasks")
    assert [r["unique_key"] for r in rows] == ["held"]
