"""Pickup latency: an idle fleet (one worker), N tasks submitted one at a time, 20 ms apart.

Two figures per task:

- **database stamps**, enqueue -> start as each system records them in its own tables:
  taskfleet ``tasks.started_at - created_at``; pgqueuer the ``picked`` minus the ``queued`` entry
  of ``pgqueuer_log``; procrastinate the ``started`` minus the ``deferred`` event. The enqueue
  stamp is the submitting transaction's ``now()`` everywhere, so each figure includes that
  transaction's commit (and its WAL flush) and the wake-up. The start stamp is the ``now()`` of
  the statement that claimed the task everywhere: the peers' dequeue transaction's, taskfleet's
  claim statement's (with no label limit active; a limited claim stamps when it takes the rows,
  which its accounting needs, docs/architecture.md). Earlier builds stamped that later clock in
  every claim, so their figure also held most of the claim's execution (0.36-0.38 ms p50,
  measured with an instrumented worker; docs/benchmarks.md has figures of both).
- **end to end**, on the wall clock of this machine: from just before the submitter's enqueue
  call to the first line of the handler (:mod:`bench.stamps`: every system's handler appends its
  job id and ``time.time()`` to one file, the same write for all). What a submitter waits for,
  with nothing left out: its own call, the commit, the wake-up, the whole claim and the dispatch
  to the handler.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench import processes, stamps
from bench.drain import wait_until_empty
from bench.report import percentile
from bench.scratch import Templates
from bench.systems import System


@dataclass(frozen=True)
class Pickup:
    #: By the database stamps, in submission order.
    seconds: list[float]
    #: Median wall time of one enqueue call as the submitter saw it (mostly the commit).
    enqueue_call: float
    #: End to end: enqueue call -> handler's first line, on the wall clock.
    handler_seconds: list[float]

    def p(self, q: float) -> float:
        return percentile(self.seconds, q)

    def handler_p(self, q: float) -> float:
        return percentile(self.handler_seconds, q)


async def measure_pickup(
    templates: Templates,
    system: System,
    *,
    tasks: int = 200,
    interval: float = 0.02,
    settle: float = 1.0,
) -> Pickup:
    with tempfile.TemporaryDirectory(prefix="bench-stamps-") as scratch:
        stamp_file = Path(scratch) / "stamps"
        return await _measure(
            templates, system, stamp_file, tasks=tasks, interval=interval, settle=settle
        )


async def _measure(
    templates: Templates,
    system: System,
    stamp_file: Path,
    *,
    tasks: int,
    interval: float,
    settle: float,
) -> Pickup:
    submitted: dict[int, float] = {}
    async with templates.clone(system.template_key, system.install) as url:
        # The workers inherit this process's environment (bench.processes).
        os.environ[stamps.STAMP_FILE_ENV] = str(stamp_file)
        try:
            fleet = await system.start_workers(url, 1, 10)
        finally:
            del os.environ[stamps.STAMP_FILE_ENV]
        try:
            (submitter,) = await system.submitters(url, 1)
            calls: list[float] = []
            try:
                # Let the worker's start-up work (first polls, registration) pass.
                await asyncio.sleep(settle)
                loop = asyncio.get_running_loop()
                start = loop.time()
                for i in range(tasks):
                    delay = start + i * interval - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    at = time.time()
                    t0 = time.perf_counter()
                    job_id = await submitter.one()
                    calls.append(time.perf_counter() - t0)
                    submitted[job_id] = at
            finally:
                await submitter.close()
            conn = await asyncpg.connect(url)
            try:
                await wait_until_empty(system, conn, timeout=60)
                seconds = await system.pickup_seconds(conn)
            finally:
                await conn.close()
        finally:
            await processes.stop(fleet)
    if len(seconds) != tasks:
        raise RuntimeError(f"{system.name}: {len(seconds)} of {tasks} pickups recorded")
    started = stamps.read_stamps(stamp_file)
    missing = set(submitted) - set(started)
    if missing:
        raise RuntimeError(f"{system.name}: {len(missing)} of {tasks} handler stamps missing")
    handler = [started[job] - at for job, at in submitted.items()]
    return Pickup(seconds, sorted(calls)[len(calls) // 2], handler)
