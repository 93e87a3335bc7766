"""The claim loop's flags (``taskfleet.worker.wakeup``): one future per wait, on several flags."""

from __future__ import annotations

import asyncio

from taskfleet.worker.wakeup import Flag, wait_any


async def test_a_wait_ends_at_the_first_flag_set_and_leaves_no_waiter_behind() -> None:
    a, b = Flag(), Flag()
    waiting = asyncio.create_task(wait_any([a, b], timeout=None))
    await asyncio.sleep(0)
    assert not waiting.done()
    b.set()
    await asyncio.wait_for(waiting, 5)
    assert b.is_set() and not a.is_set()
    assert a._waiters == [] and b._waiters == []


async def test_a_flag_already_set_ends_the_wait_at_once_until_cleared() -> None:
    flag = Flag()
    flag.set()
    await asyncio.wait_for(wait_any([flag], timeout=None), 5)
    flag.clear()
    waiting = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    flag.set()
    await asyncio.wait_for(waiting, 5)


async def test_a_wait_ends_at_its_timeout_and_a_cancelled_wait_unregisters() -> None:
    flag = Flag()
    await asyncio.wait_for(wait_any([flag], timeout=0.01), 5)
    assert not flag.is_set() and flag._waiters == []
    waiting = asyncio.create_task(wait_any([flag], timeout=None))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert flag._waiters == []
    flag.set()  # resolving nothing: no waiter left


async def test_one_set_wakes_every_waiter() -> None:
    flag = Flag()
    waits = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    flag.set()
    await asyncio.wait_for(asyncio.gather(*waits), 5)
