"""An async handler with a timeout runs in a task of its own (invocation._bounded): what the
attempt ends with when the handler is cancelled from outside or outlives its timeout."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from taskfleet.worker import invocation


async def _started(coro: Any, timeout: float | None, running: Any) -> asyncio.Task[Any]:
    task = asyncio.create_task(invocation._bounded(coro, timeout, running, None))
    await asyncio.sleep(0.01)  # the handler is inside its await
    return task


async def test_a_handler_that_finishes_despite_a_cancel_keeps_its_result() -> None:
    # Given back as interrupted, a task whose work was done would run again.
    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "done anyway"
        return "not cancelled"

    running = SimpleNamespace(thread=None)
    task = await _started(stubborn(), 60, running)
    task.cancel()
    assert await task == "done anyway"
    assert running.thread is None


async def test_a_handler_that_honours_a_cancel_is_interrupted() -> None:
    running = SimpleNamespace(thread=None)
    task = await _started(asyncio.sleep(30), 60, running)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert running.thread is None


async def test_a_handler_deaf_to_its_timeout_times_out_and_keeps_its_slot() -> None:
    release = asyncio.Event()

    async def deaf() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                pass

    running = SimpleNamespace(thread=None)
    with pytest.raises(invocation.AttemptTimeout):
        await invocation._bounded(deaf(), 0.05, running, None)
    assert running.thread is not None and not running.thread.done()
    release.set()
    await asyncio.wait_for(running.thread, 5)
