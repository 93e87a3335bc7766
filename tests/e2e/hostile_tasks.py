"""Handlers that behave as user code does on a bad day, for end-to-end tests.

The fleet's processes load them with ``TASKFLEET_TASK_MODULES=tests.e2e.hostile_tasks`` (the API
too, so that it accepts their payloads). Nothing here sleeps for a fixed time to make a point:
a blocking handler waits on something the test controls (a barrier, a file) with a bound.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from taskfleet.shared.context import TaskContext
from taskfleet.shared.registry import PermanentError, TaskParams, task

HOSTILE_MODULE_ENV = {"TASKFLEET_TASK_MODULES": "tests.e2e.hostile_tasks"}

PoisonKind = Literal[
    "nul",
    "surrogate",
    "nul_key",
    "nul_error",
    "surrogate_error",
    "unencodable",
    "nan",
    "huge",
    "deep",
    "unprintable_error",
    "unprintable_permanent",
    "exit",
]


class Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("no words for this")


class UnprintablePermanent(PermanentError):
    def __str__(self) -> str:
        raise ValueError("no words for this either")


class PoisonParams(TaskParams):
    kind: PoisonKind


@task("hostile.poison", params=PoisonParams)
async def poison(params: PoisonParams) -> Any:
    """Returns or raises something Postgres cannot store as it is."""
    kind = params.kind
    if kind == "nul":
        return {"text": "a\x00b"}
    if kind == "surrogate":
        return {"text": "a\ud800b"}
    if kind == "nul_key":
        return {"k\x00": 1}
    if kind == "nul_error":
        raise RuntimeError("bad \x00 byte in the handler's own words")
    if kind == "surrogate_error":
        raise RuntimeError("lone \udc80 surrogate in the handler's own words")
    if kind == "unencodable":
        return {"object": object()}
    if kind == "nan":
        return {"value": math.nan}
    if kind == "deep":
        deep: list[Any] = []
        for _ in range(100_000):
            deep = [deep]
        return deep
    if kind == "unprintable_error":
        raise Unprintable
    if kind == "unprintable_permanent":
        raise UnprintablePermanent
    if kind == "exit":
        sys.exit(4)
    # huge: a 64 MiB result.
    return {"blob": "x" * (64 << 20)}


class BarrierParams(TaskParams):
    parties: int = Field(ge=1, le=1000)
    #: Bound on the wait: a handler that never meets the others fails instead of hanging.
    timeout: float = Field(default=60.0, gt=0)


_BARRIERS: dict[int, threading.Barrier] = {}
_BARRIERS_LOCK = threading.Lock()


@task("hostile.barrier", params=BarrierParams)
def barrier(params: BarrierParams) -> dict[str, Any]:
    """A plain (blocking) handler that returns only once ``parties`` of its kind are running at
    the same time in this process: proof that they all had a thread at once."""
    with _BARRIERS_LOCK:
        shared = _BARRIERS.setdefault(params.parties, threading.Barrier(params.parties))
    shared.wait(params.timeout)  # BrokenBarrierError when they were not all running at once
    return {"thread": threading.get_ident(), "pid": os.getpid()}


class BlockFileParams(TaskParams):
    #: The handler blocks until this file exists (the test creates it), at most ``timeout``.
    path: str
    timeout: float = Field(default=120.0, gt=0)
    #: Written when the handler starts (so the test knows it runs), if given.
    started: str | None = None


@task("hostile.block_file", params=BlockFileParams)
def block_file(params: BlockFileParams) -> dict[str, Any]:
    """A plain handler that blocks its thread, deaf to cancellation, until a file appears."""
    if params.started:
        Path(params.started).write_text(str(os.getpid()))
    deadline = time.monotonic() + params.timeout
    while not Path(params.path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{params.path} did not appear")
        time.sleep(0.01)
    return {"pid": os.getpid()}


@task("hostile.deaf_async", params=BlockFileParams)
async def deaf_async(params: BlockFileParams) -> dict[str, Any]:
    """An async handler that swallows every cancel (a retry-on-anything loop around its step),
    until a file appears."""
    if params.started:
        Path(params.started).write_text(str(os.getpid()))  # noqa: ASYNC240 - tiny, local
    deadline = time.monotonic() + params.timeout
    while not Path(params.path).exists():  # noqa: ASYNC240
        if time.monotonic() > deadline:
            raise TimeoutError(f"{params.path} did not appear")
        try:
            await asyncio.sleep(0.01)
        except BaseException:  # the hostile part: deaf to its cancel
            pass
    return {"pid": os.getpid()}


class Empty(TaskParams):
    pass


@task("hostile.exit_sync", params=Empty)
def exit_sync(params: Empty) -> None:
    """sys.exit() in a blocking handler's thread."""
    sys.exit(3)


@task("hostile.iso_thread", params=Empty, isolation="process")
def iso_thread(params: Empty) -> dict[str, Any]:
    """Returns at once, leaving a non-daemon thread behind in its process."""
    threading.Thread(target=time.sleep, args=(600,)).start()
    return {"returned": True}


class SpawnParams(TaskParams):
    #: Where the pid of the process it starts is written.
    pidfile: str


@task("hostile.iso_spawn", params=SpawnParams, isolation="process")
def iso_spawn(params: SpawnParams) -> None:
    """Starts a process of its own, then hangs until its timeout."""
    child = subprocess.Popen(["sleep", "300"])
    Path(params.pidfile).write_text(str(child.pid))
    time.sleep(600)


@task("hostile.iso_validation_error", params=Empty, isolation="process")
def iso_validation_error(params: Empty) -> None:
    """Raises a pydantic ValidationError of its own (not its payload's): retried, as any error."""
    BarrierParams.model_validate({"parties": "many"})


class OverlapParams(TaskParams):
    #: One line per event, appended: "start <attempt>", "timed out <attempt>", "end <attempt>".
    log: str
    #: The first attempt returns once this file exists (after its timeout has passed).
    release: str


@task("hostile.overlap", params=OverlapParams)
def overlap(params: OverlapParams, ctx: TaskContext) -> None:
    """A blocking handler that outlives its timeout: its first attempt waits for the timeout's
    signal, then for the test's release file."""

    def note(event: str) -> None:
        with Path(params.log).open("a") as log:
            log.write(f"{event} {ctx.attempt}\n")

    note("start")
    if ctx.attempt == 1:
        ctx.cancellation.wait(120)
        note("timed out")
        deadline = time.monotonic() + 120
        while not Path(params.release).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    note("end")


@task("hostile.iso_huge", params=Empty, isolation="process")
def iso_huge(params: Empty) -> dict[str, Any]:
    """A 40 MiB result: the worker must not read it all into its memory."""
    return {"blob": "x" * (40 << 20)}
