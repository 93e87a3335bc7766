"""stop_tasks: a task that loses a cancel (as asyncio.wait_for can on Python 3.11) is cancelled
again until it is done, so a drain that awaits the worker's loops always ends."""

from __future__ import annotations

import asyncio

from taskfleet.worker.stopping import stop_tasks


async def test_a_task_that_swallows_cancels_is_cancelled_until_it_stops() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 3:
                    raise
                # A lost cancel: the loop runs on, as one in a library's wait_for would.

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_tasks([task]), 30)
    assert task.cancelled() and swallowed == 3


async def test_done_and_ordinary_tasks_are_fine() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    sleeping = asyncio.create_task(asyncio.sleep(3600))
    await stop_tasks([done, sleeping])
    assert sleeping.cancelled()
