"""How a handler is called: async handlers on the event loop, plain (blocking) ones in the
worker's own thread pool, ``isolation="process"`` ones in a child process.

The pool has a thread for every slot (plus the control slot), so every slot can run a blocking
handler at once. A thread cannot be stopped: a blocking handler past its timeout (or cancelled)
is recorded as such at once, but its thread goes on until the handler returns, and its attempt
keeps its slot until then (``Running.thread``), so the worker never runs more than its
concurrency; a retry is sent only then (the executor), so the task never runs twice at once.
For code that must be stopped, ``isolation="process"`` runs the attempt in a child
process that is killed at the timeout.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from taskfleet.shared.context import TaskContext
from taskfleet.shared.registry import PermanentError, TaskDefinition
from taskfleet.worker.isolation import run_in_child
from taskfleet.worker.slots import Running


class AttemptTimeout(Exception):
    """The attempt ran past the task's ``timeout_seconds``."""


class HandlerRunner:
    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="taskfleet-handler")

    async def call(
        self,
        definition: TaskDefinition,
        payload: Any,
        running: Running,
        context: TaskContext | None,
    ) -> Any:
        """Run the handler once; its result. Raises what the handler raised, PermanentError for
        a payload its model refuses, or AttemptTimeout."""
        try:
            params = definition.validate(payload)
        except ValidationError as exc:
            raise PermanentError(f"invalid payload: {exc}") from exc
        timeout = running.timeout
        if definition.isolation == "process":
            assert context is not None
            try:
                return await run_in_child(definition, payload, context, timeout)
            except TimeoutError:
                raise AttemptTimeout(_timed_out(timeout)) from None
        args = (params, context) if definition.takes_context else (params,)
        if timeout is None and definition.is_async:
            return await definition.func(*args)  # the common case, without a timeout scope
        if definition.is_async:
            return await _bounded(definition.func(*args), timeout, running, context)
        try:
            async with asyncio.timeout(timeout) as scope:
                loop = asyncio.get_running_loop()
                running.thread = loop.run_in_executor(self._pool, _call, definition, args)
                # Shielded: a timeout or cancel ends the wait, never the thread.
                return await asyncio.shield(running.thread)
        except TimeoutError:
            if scope.expired():
                if context is not None:
                    context.cancellation.set("timeout")
                raise AttemptTimeout(_timed_out(timeout)) from None
            raise

    def shutdown(self) -> None:
        """No new work; threads still running are left to finish (or to die with the process)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class HandlerExited(Exception):
    """The handler raised ``SystemExit`` or ``KeyboardInterrupt`` (``sys.exit()``): in a task of
    its own that would leave the event loop and end the worker, so it is carried out as this."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")


async def _contained(coro: Any) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise HandlerExited(exc) from exc


async def _bounded(
    coro: Any, timeout: float | None, running: Running, context: TaskContext | None
) -> Any:
    """An async handler with a timeout, in a task of its own: at the timeout it is cancelled and
    the attempt ends as timed out even if it swallows the cancel (it stayed ``running`` for
    ever). One that goes on keeps its slot until it ends (``Running.thread``, as a blocking
    handler's thread does), and its retry waits for that. A cancel from outside (a cancel
    request, the drain) is passed on, every time, and the attempt waits for the handler as it
    did running inline: what the handler ends with is the outcome, and one that never ends is
    the drain's to abandon."""
    inner = asyncio.ensure_future(_contained(coro))
    try:
        await asyncio.wait({inner}, timeout=timeout)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        inner.cancel()
        while not inner.done():
            try:
                await asyncio.wait({inner})
            except asyncio.CancelledError:
                inner.cancel()  # the drain cancels again: so does the handler's task
                if task is not None:
                    task.uncancel()  # one cancel is re-raised below, not each
        if not inner.cancelled():
            # It ended on its own terms despite the cancel (finished its work, or failed): that
            # is the attempt's outcome; given back as interrupted, a task that completed would
            # run again.
            if task is not None:
                task.uncancel()
            return inner.result()
        raise
    if inner.done():
        return inner.result()  # what it returned or raised (its own CancelledError too)
    if context is not None:
        context.cancellation.set("timeout")
    inner.cancel()
    running.thread = inner  # freed, and a retry sent, once it has really ended
    raise AttemptTimeout(_timed_out(timeout))


def _call(definition: TaskDefinition, args: tuple[Any, ...]) -> Any:
    return definition.func(*args)


def _timed_out(timeout: float | None) -> str:
    return f"timed out after {timeout:g}s (the task's timeout_seconds)"
