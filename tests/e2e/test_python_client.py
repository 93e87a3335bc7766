"""taskfleet.Client and AsyncClient against a real ``taskfleet api`` and a real worker: round
trips, and each error class raised by the matching HTTP answer."""

from __future__ import annotations

import asyncio

import pytest

import taskfleet
from taskfleet.client import AsyncClient, Client
from taskfleet.config_events import Converged, Enqueued, FleetProgress, VersionWritten
from tests.e2e.fleet import ADMIN_TOKEN, SUBMIT_TOKEN, Fleet


def sync_round_trip(url: str) -> None:
    with Client(url, token=ADMIN_TOKEN) as client:
        task = client.submit("demo.echo", {"value": "hello"}, labels=["py"], priority=2)
        assert (task.status, task.labels, task.priority) == ("pending", ["py"], 2)
        done = client.wait(task.id, timeout=60)
        assert done.status is taskfleet.TaskStatus.COMPLETED
        assert done.result == {"value": "hello"}
        assert client.get(task.id) == done

        many = client.submit_many(
            [{"type": "demo.echo", "payload": {"value": i}} for i in range(5)]
        )
        assert [t.payload["value"] for t in many] == list(range(5))
        listed = [t.id for t in client.list(type="demo.echo", page_size=2)]
        assert listed == sorted([task.id, *(t.id for t in many)], reverse=True)

        later = client.submit("demo.echo", {"value": 1}, delay_seconds=3600)
        with pytest.raises(taskfleet.WaitTimeout) as timed_out:
            client.wait(later.id, timeout=0.2)
        assert timed_out.value.task.status is taskfleet.TaskStatus.PENDING
        cancelled = client.cancel(later.id)
        assert cancelled.status is taskfleet.TaskStatus.CANCELLED
        retried = client.retry(later.id)
        assert (retried.status, retried.attempts) == ("pending", 0)
        assert client.wait(later.id, timeout=60).status is taskfleet.TaskStatus.COMPLETED

        assert [w.id for w in client.workers()] == ["w1"]
        change = client.change_config(max_strict_percentage=50, label_weights={"py": 3})
        events = list(change)
        assert isinstance(events[0], Enqueued)
        assert any(isinstance(e, VersionWritten) for e in events)
        assert any(isinstance(e, FleetProgress) for e in events)
        assert isinstance(change.result(), Converged)
        config = client.config()
        assert (config.payload["maxStrictPercentage"], config.request_id) == (50, change.request_id)
        patched = client.change_config(patch=True, default_weight=2).result()
        assert isinstance(patched, Converged)
        assert client.config().payload["maxStrictPercentage"] == 50  # kept by the patch

        # Each refusal as its own class, with the API's message and field.
        with pytest.raises(taskfleet.NotFound):
            client.get(987654321)
        with pytest.raises(taskfleet.Conflict, match="already completed"):
            client.cancel(task.id)
        with pytest.raises(taskfleet.PayloadTooLarge) as too_large:
            client.submit("demo.echo", {"value": "x" * 300_000})
        assert too_large.value.status == 413
        assert "limit" in too_large.value.message
        with pytest.raises(taskfleet.InvalidRequest) as invalid:
            client.submit("demo.echo", {"valeu": 1})
        assert (invalid.value.status, invalid.value.field) == (422, "payload.valeu")
        assert invalid.value.errors[0]["type"] == "extra_forbidden"
    with Client(url) as anonymous, pytest.raises(taskfleet.Unauthorized):
        anonymous.get(task.id)
    with Client(url, token=SUBMIT_TOKEN) as submitter, pytest.raises(taskfleet.Forbidden):
        submitter.workers()


async def async_round_trip(url: str) -> None:
    async with AsyncClient(url, token=ADMIN_TOKEN) as client:
        held = await client.submit("demo.echo", unique_key="a1", delay_seconds=3600)
        same = await client.submit("demo.echo", unique_key="a1")
        assert (same.id, same.deduplicated) == (held.id, True)
        task = await client.submit("demo.echo", {"value": "async"})
        done = await client.wait(task.id, timeout=60)
        assert done.result == {"value": "async"}
        newest_completed = [t.id async for t in client.list(status="completed")]
        assert newest_completed[0] == task.id
        change = await client.change_config(max_strict_percentage=40)
        events = [event async for event in change]
        assert isinstance(events[-1], Converged)
        assert isinstance(await change.result(), Converged)
        with pytest.raises(taskfleet.InvalidRequest) as invalid:
            await client.submit("demo.echo", priority=-1)
        assert invalid.value.field == "priority"
        with pytest.raises(taskfleet.Conflict):
            await client.retry(task.id)
    async with AsyncClient(url, token="not-a-token") as stranger:
        with pytest.raises(taskfleet.Unauthorized):
            await stranger.get(task.id)


async def test_sync_and_async_clients_against_real_processes(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        await fleet.start_worker("w1")
        await asyncio.to_thread(sync_round_trip, fleet.api_url)
        await async_round_trip(fleet.api_url)
