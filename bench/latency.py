"""Pickup latency: an idle fleet (one worker), N tasks submitted one at a time, 20 ms apart.

Latency is enqueue -> start, both stamped by the database clock in the system's own tables:
taskfleet ``tasks.started_at - created_at``; pgqueuer the ``picked`` minus the ``queued`` entry
of ``pgqueuer_log``; procrastinate the ``started`` minus the ``deferred`` event. Each stamp is
its transaction's ``now()`` (the transaction start), so the figure includes the submitting
transaction's commit (and its WAL flush), the wake-up and the claim.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

from bench import processes
from bench.drain import wait_until_empty
from bench.report import percentile
from bench.scratch import Templates
from bench.systems import System


@dataclass(frozen=True)
class Pickup:
    seconds: list[float]
    #: Median wall time of one enqueue call as the submitter saw it (mostly the commit).
    enqueue_call: float

    def p(self, q: float) -> float:
        return percentile(self.seconds, q)


async def measure_pickup(
    templates: Templates,
    system: System,
    *,
    tasks: int = 200,
    interval: float = 0.02,
    settle: float = 1.0,
) -> Pickup:
    async with templates.clone(system.template_key, system.install) as url:
        fleet = await system.start_workers(url, 1, 10)
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
                    t0 = time.perf_counter()
                    await submitter.one()
                    calls.append(time.perf_counter() - t0)
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
    return Pickup(seconds, sorted(calls)[len(calls) // 2])
