"""Stopping the worker's own asyncio tasks for sure.

On Python 3.11 a cancel can be lost (``asyncio.wait_for`` swallows one that arrives as its inner
future completes, and library code may do the same); a loop that lost it runs on, and a drain
that awaits it never ends. So: cancel, wait a little, and cancel again until it is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("taskfleet.worker")

#: Between two cancels of a task that is still running (seconds).
RECANCEL_SECONDS = 0.5


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and return once every one of them is done."""
    pending = {t for t in tasks if not t.done()}
    rounds = 0
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
        rounds += 1
        if pending and rounds == 10:
            log.warning(
                "still stopping %s after %d cancels", [t.get_name() for t in pending], rounds
            )
