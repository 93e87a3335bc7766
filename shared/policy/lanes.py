"""Lanes and the strict cap (docs/reference.md#lanes)."""

from __future__ import annotations

import enum

#: Priority reserved for the control lane (the runtime-config task). Never accepted from users.
CONTROL_PRIORITY = 2_147_483_647

#: The task type of the runtime-config writer. Reserved: users cannot submit it.
RUNTIME_CONFIG_TASK_TYPE = "updateWorkerRuntimeConfig"

#: The control lane's wire name (it can never be paused).
CONTROL_LANE_NAME = "control"


class Lane(enum.StrEnum):
    CONTROL = "control"
    STRICT = "strict"
    NORMAL = "normal"


def lane_for_priority(priority: int) -> Lane:
    """The lane a task of this priority is claimed from."""
    if priority >= CONTROL_PRIORITY:
        return Lane.CONTROL
    if priority > 0:
        return Lane.STRICT
    return Lane.NORMAL


def strict_cap(concurrency: int, max_strict_percentage: int) -> int:
    """How many strict-lane tasks one worker may run at once.

    ``ceil(concurrency * pct / 100)``, with ``pct <= 0`` giving 0 and ``pct >= 100`` giving
    ``concurrency``. Integer arithmetic, so no float rounding can move a boundary.
    """
    if concurrency <= 0 or max_strict_percentage <= 0:
        return 0
    if max_strict_percentage >= 100:
        return concurrency
    return min(concurrency, -(-concurrency * max_strict_percentage // 100))


__all__ = [
    "CONTROL_PRIORITY",
    "RUNTIME_CONFIG_TASK_TYPE",
    "Lane",
    "lane_for_priority",
    "strict_cap",
]
