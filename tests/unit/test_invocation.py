"""An async handler with a timeout runs in a task of its own (invocation._bounded): what the
attempt ends with when the handler is cancelled from outside or outlives its timeout."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
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


async def test_sys_exit_in_a_bounded_handler_is_an_error_not_the_end_of_the_loop() -> None:
    # In a task of its own, SystemExit left the event loop: the worker process ended.
    async def exits() -> None:
        sys.exit(4)

    with pytest.raises(invocation.HandlerExited, match="SystemExit: 4"):
        await invocation._bounded(exits(), 30, SimpleNamespace(thread=None), None)


async def test_cancels_repeated_by_the_drain_wait_for_a_slow_cleanup() -> None:
    # The drain cancels again every 0.5 s: each cut the wait short, so a handler that took
    # longer to clean up was abandoned (its task not given back) instead of ending cleanly.
    cleaned = asyncio.Event()

    async def slow_cleanup() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            # 0.3 s of clean-up that each further cancel interrupts only for a step.
            loop = asyncio.get_running_loop()
            end = loop.time() + 0.3
            while loop.time() < end:
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    pass
            cleaned.set()

    running = SimpleNamespace(thread=None)
    task = await _started(slow_cleanup(), 60, running)
    for _ in range(5):
        task.cancel()
        await asyncio.sleep(0.02)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()
    assert running.thread is None


def test_an_isolated_child_that_cannot_import_its_handler_answers_why() -> None:
    # It exited without an answer (the worker said only "exited with code 1").
    request = {
        "handler": ["json", "no_such_handler"],
        "params": ["json", "JSONDecoder"],
        "takes_context": False,
        "payload": {},
        "sys_path": [],
        "context": {},
    }
    done = subprocess.run(
        [sys.executable, "-m", "taskfleet.worker.isolated_child"],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and answer["permanent"] is False
    assert "AttributeError" in answer["error"] and "no_such_handler" in answer["error"]
