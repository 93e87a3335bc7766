"""The Python client's retry_many, cancel_many, stats and list(worker=) against the real API under
uvicorn: the same surface sync and async, each filter field on the wire, the refusals as
exceptions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

import taskfleet
from taskfleet.client import AsyncClient, Client
from taskfleet.models import TaskStats
from tests.integration.apiserver import RunningApi, running_api
from tests.integration.seed import Seed, seed, statuses
from tests.integration.test_api_tasks import ADMIN, SUBMIT, api_settings


@pytest.fixture
def api(database_url: str) -> Iterator[RunningApi]:
    with running_api(api_settings(database_url)) as running:
        yield running


def table() -> list[Seed]:
    return [
        Seed("failed", "demo.fail", labels=["a", "b"], created=-7200),
        Seed("failed", "demo.echo", labels=["a"], created=-60),
        Seed("cancelled", "demo.echo", created=-60),
        Seed("pending", "demo.echo", labels=["a"], created=-60),
        Seed("pending", "demo.fail", created=-7200),
        Seed("running", "demo.echo", labels=["a"], created=-60),
    ]


async def test_sync_client_bulk_actions_and_stats(
    api: RunningApi, conn: asyncpg.Connection
) -> None:
    tasks = await seed(conn, table())
    hour_ago = datetime.now(UTC) - timedelta(hours=1)

    def calls() -> tuple[int, ...]:
        with Client(api.url, token=ADMIN) as client:
            return (
                client.retry_many(labels=["a", "b"]),
                client.retry_many(status=[taskfleet.TaskStatus.CANCELLED], all=True),
                client.retry_many(type="demo.echo", created_after=hour_ago),
                client.cancel_many(created_before=hour_ago),
                client.cancel_many(ids=[tasks[5].id], status=["running"]),
            )

    assert await asyncio.to_thread(calls) == (1, 1, 1, 2, 1)
    after = await statuses(conn)
    assert after[tasks[0].id] == ("cancelled", True)  # retried, then cancelled as old pending
    assert after[tasks[1].id] == ("pending", False)
    assert after[tasks[2].id] == ("pending", False)
    assert after[tasks[4].id] == ("cancelled", True)
    assert after[tasks[5].id] == ("running", True)

    def read() -> TaskStats:
        with Client(api.url, token=SUBMIT) as client:
            return client.stats()

    stats = await asyncio.to_thread(read)
    assert stats.by_status == {
        "pending": 3,
        "running": 1,
        "completed": 0,
        "failed": 0,
        "cancelled": 2,
    }
    assert stats.lanes["normal"].pending == 3
    assert [g.group for g in stats.groups] == ["default"]


async def test_async_client_bulk_actions_stats_and_worker_filter(
    api: RunningApi, conn: asyncpg.Connection
) -> None:
    tasks = await seed(conn, table())
    async with AsyncClient(api.url, token=ADMIN) as client:
        assert await client.retry_many(ids=[tasks[0].id, tasks[3].id]) == 1
        assert await client.cancel_many(labels=["a"], status="pending") == 2
        stats = await client.stats()
        assert stats.by_status["cancelled"] == 3
        by_worker = [t.id async for t in client.list(worker="w-seed")]
        assert by_worker == sorted(
            (t.id for t in tasks if t.status != "pending" and t.id != tasks[0].id),
            reverse=True,
        )
        with pytest.raises(taskfleet.InvalidRequest) as empty:
            await client.retry_many()
        assert '"all": true' in empty.value.message
        with pytest.raises(taskfleet.InvalidRequest) as wrong_status:
            await client.retry_many(all=True, status=["pending"])
        assert wrong_status.value.field == "status.0"
        with pytest.raises(TypeError, match="unknown filter field"):
            await client.cancel_many(worker="w1")  # type: ignore[call-arg]
    async with AsyncClient(api.url, token=SUBMIT) as submitter:
        with pytest.raises(taskfleet.Forbidden):
            await submitter.cancel_many(all=True)
        assert (await submitter.stats()).by_status["pending"] == 1  # tasks[4]
