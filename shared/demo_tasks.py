"""Built-in demo handlers (always registered): for the docs, the tests and the benchmarks."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from taskfleet.shared.registry import PermanentError, TaskParams, task


class EchoParams(TaskParams):
    value: Any = None


@task("demo.echo", params=EchoParams)
async def echo(params: EchoParams) -> dict[str, Any]:
    return {"value": params.value}


class SleepParams(TaskParams):
    seconds: float = Field(ge=0, le=86_400)


@task("demo.sleep", params=SleepParams)
async def sleep(params: SleepParams) -> dict[str, Any]:
    await asyncio.sleep(params.seconds)  # cancellable: cancel and timeouts interrupt it
    return {"slept": params.seconds}


class FailParams(TaskParams):
    message: str = "demo failure"
    permanent: bool = False


@task("demo.fail", params=FailParams)
async def fail(params: FailParams) -> None:
    if params.permanent:
        raise PermanentError(params.message)
    raise RuntimeError(params.message)


class CpuParams(TaskParams):
    iterations: int = Field(ge=0, le=1_000_000_000)


@task("demo.cpu", params=CpuParams)
def cpu(params: CpuParams) -> dict[str, Any]:
    # Sync handler: runs in a worker thread, so the scheduler loop stays responsive.
    acc = 0
    for i in range(params.iterations):
        acc = (acc * 31 + i) % 1_000_003
    return {"iterations": params.iterations, "checksum": acc}
