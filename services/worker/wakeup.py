"""Flags the claim loop sleeps on, several at a time, with one future per wait.

``asyncio.Event`` can only be waited on one at a time: waiting for the first of several meant a
task per event and ``asyncio.wait`` on every sleep, and at every wake-up the loop ran those tasks
(one finishing, the others cancelled) before it sent its claim. That bookkeeping sat on the
pickup path of every task that arrives at an idle worker. Here a wait registers one future with
each flag it watches; the first ``set()`` resolves it, and the waiter resumes at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


class Flag:
    """Set or clear, like ``asyncio.Event``; waited on through :func:`wait_any`."""

    __slots__ = ("_is_set", "_waiters")

    def __init__(self) -> None:
        self._is_set = False
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        if self._is_set:
            return
        self._is_set = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._is_set = False

    async def wait(self) -> None:
        await wait_any([self], timeout=None)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def wait_any(flags: Sequence[Flag], *, timeout: float | None) -> None:
    """Return once any of ``flags`` is set (at once if one is), or after ``timeout`` seconds."""
    if any(flag.is_set() for flag in flags):
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    for flag in flags:
        flag._waiters.append(waiter)
    timer = loop.call_later(timeout, _wake, waiter) if timeout is not None else None
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        for flag in flags:
            flag._waiters.remove(waiter)
