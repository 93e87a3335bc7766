"""``TaskContext``: what a handler may know about the attempt it runs.

A handler takes its parameters, and optionally a second argument, the context::

    @task("report.build", params=BuildReport)
    def build(params: BuildReport, ctx: TaskContext) -> dict:
        for part in params.parts:
            if ctx.cancelled:            # a cancel request, the task's timeout, or shutdown
                break
            ...
        return {"attempt": ctx.attempt}

The cancellation signal works from sync code (``cancelled``, ``wait(timeout)``, running in the
handler's thread) and from async code (``await ctx.until_cancelled()``). An async handler is
also cancelled the asyncio way; a sync handler cannot be interrupted, so it should look at the
signal in its loops: until its thread returns, it keeps its worker slot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta


class Cancellation:
    """Set once when the attempt should stop: a cancel was requested, its timeout passed, or
    the worker shuts down. Safe to read and wait on from any thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lock = threading.Lock()
        self.reason: str | None = None

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, reason: str) -> None:
        """Signal it (the worker does this; idempotent, the first reason stays)."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def wait(self, timeout: float | None = None) -> bool:
        """Block (in sync code) until signalled or ``timeout`` seconds pass; True if signalled."""
        return self._event.wait(timeout)

    async def until_set(self) -> None:
        """Return once signalled (in async code)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._event.is_set():
                return
            self._waiters.append((loop, future))
        await future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(frozen=True)
class TaskContext:
    """The attempt a handler runs. Read-only; build none yourself (the worker does)."""

    #: The task's id.
    task_id: int
    #: Its type, e.g. ``"email.send"``.
    type: str
    #: This attempt's number, from 1.
    attempt: int
    #: Attempts the task has in all; ``attempt == max_attempts`` is the last one.
    max_attempts: int
    #: The task's labels.
    labels: Sequence[str]
    #: The id of the worker running it.
    worker_id: str
    #: When the attempt times out (UTC), or None without a timeout.
    deadline: datetime | None
    #: Signalled when the attempt should stop (see :class:`Cancellation`).
    cancellation: Cancellation = field(default_factory=Cancellation, compare=False)
    _deadline_monotonic: float | None = field(default=None, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once the attempt should stop (cancel requested, timeout, shutdown)."""
        return self.cancellation.is_set

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def time_left(self) -> float | None:
        """Seconds until the deadline (never below 0), or None without a timeout."""
        if self._deadline_monotonic is None:
            return None
        return max(0.0, self._deadline_monotonic - time.monotonic())

    async def until_cancelled(self) -> None:
        """Return once the attempt should stop (for ``asyncio.wait``/task groups)."""
        await self.cancellation.until_set()


def make_context(
    *,
    task_id: int,
    type: str,
    attempt: int,
    max_attempts: int,
    labels: Sequence[str],
    worker_id: str,
    timeout: float | None,
    now: datetime,
) -> TaskContext:
    """A context for an attempt starting ``now`` (UTC) with ``timeout`` seconds, if any."""
    return TaskContext(
        task_id=task_id,
        type=type,
        attempt=attempt,
        max_attempts=max_attempts,
        labels=tuple(labels),
        worker_id=worker_id,
        deadline=now + timedelta(seconds=timeout) if timeout is not None else None,
        _deadline_monotonic=time.monotonic() + timeout if timeout is not None else None,
    )
