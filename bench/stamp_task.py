"""taskfleet's stamping no-op for the pickup benchmark (``TASKFLEET_TASK_MODULES=
bench.stamp_task``): the same first act as the peers' no-op handlers, :func:`bench.stamps.stamp`
of its id."""

from __future__ import annotations

from typing import Any

from bench.stamps import STAMP_TYPE, stamp
from taskfleet.shared.context import TaskContext
from taskfleet.shared.registry import TaskParams, task


class StampParams(TaskParams):
    pass


@task(STAMP_TYPE, params=StampParams)
async def stamped(params: StampParams, context: TaskContext) -> dict[str, Any]:
    stamp(context.task_id)
    return {}
