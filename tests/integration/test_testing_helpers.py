"""taskfleet.testing: handlers run inline as a worker runs them, and disposable databases."""

from __future__ import annotations

import asyncio
import threading

import asyncpg
import pytest
from pydantic import BaseModel

from taskfleet import PermanentError, TaskContext, TaskParams
from taskfleet.errors import InvalidRequest
from taskfleet.shared.db import asyncpg_dsn
from taskfleet.shared.registry import TaskRegistry
from taskfleet.shared.storable import UnstorableResult
from taskfleet.testing import disposable_database, run_task, run_task_async

registry = TaskRegistry()


class Greet(TaskParams):
    name: str


@registry.task("test.greet", params=Greet)
def greet(params: Greet) -> dict[str, object]:
    return {"hello": params.name, "thread": threading.current_thread().name}


class Stamp(BaseModel):
    at: str


@registry.task("test.model_result", params=Greet)
async def model_result(params: Greet) -> Stamp:
    return Stamp(at=params.name)


@registry.task("test.refuse", params=Greet)
async def refuse(params: Greet) -> None:
    raise PermanentError(f"no {params.name}")


@registry.task("test.slow", params=Greet)
async def slow(params: Greet) -> None:
    await asyncio.Event().wait()


@registry.task("test.nul", params=Greet)
async def nul(params: Greet) -> dict[str, str]:
    return {"text": f"a\x00{params.name}"}


@registry.task("test.context", params=Greet)
def with_context(params: Greet, ctx: TaskContext) -> dict[str, object]:
    return {
        "id": ctx.task_id,
        "type": ctx.type,
        "attempt": ctx.attempt,
        "last": ctx.is_last_attempt,
        "labels": list(ctx.labels),
        "worker": ctx.worker_id,
        "deadline": ctx.deadline is not None,
        "cancelled": ctx.cancelled,
    }


@registry.task("test.not_json", params=Greet)
async def not_json(params: Greet) -> object:
    return object()


def test_run_task_runs_a_sync_handler_in_a_thread_and_returns_the_stored_json() -> None:
    result = run_task("test.greet", {"name": "ada"}, registry=registry)
    assert result["hello"] == "ada"
    assert result["thread"] != threading.main_thread().name
    # What is stored is JSON: a pydantic model comes back as its fields.
    assert run_task("test.model_result", {"name": "x"}, registry=registry) == {"at": "x"}


def test_run_task_gives_a_handler_that_asks_for_it_a_real_context() -> None:
    result = run_task(
        "test.context",
        {"name": "ada"},
        registry=registry,
        task_id=42,
        attempt=3,
        max_attempts=3,
        labels=["tenant-a"],
        timeout=30,
    )
    assert result == {
        "id": 42,
        "type": "test.context",
        "attempt": 3,
        "last": True,
        "labels": ["tenant-a"],
        "worker": "taskfleet-testing",
        "deadline": True,
        "cancelled": False,
    }


def test_run_task_uses_the_registered_handlers_by_default() -> None:
    assert run_task("demo.echo", {"value": [1, 2]}) == {"value": [1, 2]}


def test_run_task_refuses_what_the_api_would_and_raises_what_the_handler_raises() -> None:
    with pytest.raises(InvalidRequest) as bad:
        run_task("test.greet", {"nom": "ada"}, registry=registry)
    assert [e["loc"] for e in bad.value.errors] == [["payload", "name"], ["payload", "nom"]]
    with pytest.raises(LookupError):
        run_task("test.missing", registry=registry)
    with pytest.raises(PermanentError, match="no ada"):
        run_task("test.refuse", {"name": "ada"}, registry=registry)
    with pytest.raises(UnstorableResult, match="not JSON"):
        run_task("test.not_json", {"name": "ada"}, registry=registry)
    with pytest.raises(UnstorableResult, match="NUL"):
        run_task("test.nul", {"name": "ada"}, registry=registry)
    with pytest.raises(TimeoutError):
        run_task("test.slow", {"name": "ada"}, timeout=0.01, registry=registry)


async def test_run_task_async_runs_an_async_handler_in_the_callers_loop() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    @registry.task("test.loop", params=Greet)
    async def which_loop(params: Greet) -> str:
        loops.append(asyncio.get_running_loop())
        return params.name

    assert await run_task_async("test.loop", {"name": "b"}, registry=registry) == "b"
    assert loops == [asyncio.get_running_loop()]


def test_disposable_database_is_migrated_and_dropped(pg_server_url: str) -> None:
    async def tables(url: str) -> set[str]:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            rows = await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'taskfleet'"
            )
            return {r["tablename"] for r in rows}
        finally:
            await conn.close()

    with disposable_database(pg_server_url) as url:
        assert {"tasks", "workers", "worker_runtime_configs"} <= asyncio.run(tables(url))
    with pytest.raises(asyncpg.InvalidCatalogNameError):
        asyncio.run(tables(url))
