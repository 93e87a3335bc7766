"""Concurrent requests against the real API under uvicorn (a pool of real connections)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from taskfleet.shared.settings import ApiSettings
from tests.integration.apiserver import RunningApi, running_api

TOKENS = "admin:admintoken123,submit:submittoken123"
SUBMIT = {"Authorization": "Bearer submittoken123"}


@pytest.fixture
def api(database_url: str) -> Iterator[RunningApi]:
    settings = ApiSettings(database_url=database_url, api_tokens=TOKENS, db_pool_size=10)
    with running_api(settings) as running:
        yield running


async def test_concurrent_batches_with_overlapping_unique_keys_do_not_deadlock(
    api: RunningApi, conn: asyncpg.Connection
) -> None:
    # 8 batches of the same 200 keys at once, half of them in reverse order: each transaction
    # inserts and waits on the others' uncommitted keys. In opposite orders they deadlocked
    # (23 of 40 requests answered 500 DeadlockDetectedError).
    keys = [f"key-{i:03d}" for i in range(200)]
    bodies = [
        {
            "tasks": [
                {"type": "demo.echo", "payload": {"value": k}, "unique_key": k}
                for k in (keys if n % 2 == 0 else list(reversed(keys)))
            ]
        }
        for n in range(8)
    ]
    async with httpx.AsyncClient(base_url=api.url, headers=SUBMIT, timeout=60) as client:
        for _round in range(3):
            await conn.execute("DELETE FROM taskfleet.tasks")
            answers = await asyncio.gather(*(client.post("/tasks/batch", json=b) for b in bodies))
            statuses = [a.status_code for a in answers]
            assert statuses == [201] * 8, [a.text[:200] for a in answers if a.status_code != 201]
            # One task per key, whichever batch wrote it; every answer names it.
            assert await conn.fetchval("SELECT count(*) FROM taskfleet.tasks") == 200
            ids_by_key = dict(
                await conn.fetch("SELECT unique_key, id FROM taskfleet.tasks")  # type: ignore[arg-type]
            )
            for answer in answers:
                for task in answer.json()["tasks"]:
                    assert task["id"] == ids_by_key[task["unique_key"]]
