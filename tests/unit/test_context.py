"""TaskContext and its cancellation signal (shared/context.py), without a worker."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

from taskfleet.shared.context import Cancellation, make_context


def test_the_context_knows_its_attempt_and_deadline() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ctx = make_context(
        task_id=7,
        type="t",
        attempt=3,
        max_attempts=3,
        labels=["a"],
        worker_id="w",
        timeout=10.0,
        now=now,
    )
    assert ctx.is_last_attempt and not ctx.cancelled
    assert ctx.deadline is not None and (ctx.deadline - now).total_seconds() == 10.0
    left = ctx.time_left()
    assert left is not None and 0 < left <= 10.0
    untimed = make_context(
        task_id=7,
        type="t",
        attempt=1,
        max_attempts=3,
        labels=[],
        worker_id="w",
        timeout=None,
        now=now,
    )
    assert untimed.deadline is None and untimed.time_left() is None


def test_cancellation_wakes_sync_and_async_waiters_once() -> None:
    signal = Cancellation()
    seen: list[bool] = []
    waiter = threading.Thread(target=lambda: seen.append(signal.wait(10)))
    waiter.start()

    async def main() -> None:
        task = asyncio.create_task(signal.until_set())
        await asyncio.sleep(0)
        # Set from another thread, as a handler thread's view would be.
        threading.Thread(target=signal.set, args=("user",)).start()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    waiter.join(10)
    assert seen == [True]
    assert signal.is_set and signal.reason == "user"
    signal.set("timeout")  # the first reason stays
    assert signal.reason == "user"
    asyncio.run(signal.until_set())  # already set: returns at once
