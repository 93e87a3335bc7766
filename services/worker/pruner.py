"""Retention: deletes finished tasks, offline worker rows and old runtime-config versions.

The heartbeat's sweep (one worker at a time) asks the database whether anything is due; when it
is, this loop runs a pruning pass on a connection of its own, so a long pass never delays a
heartbeat. A pass is a series of short statements, each one transaction that takes the pruner's
transaction-level advisory lock first (a try: when another worker holds it, this one stops) and
deletes at most :data:`BATCH` rows per status through the ``(status, finished_at)`` index.
Claims never wait on it: it touches finished rows only, and skips any row someone holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from taskfleet.shared import queries
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.retention import (
    PRUNED_RUNTIME_CONFIG,
    PRUNED_WORKER,
    RUNTIME_CONFIG_VERSIONS_KEPT,
    RetentionPolicy,
)
from taskfleet.worker.database import DATABASE_ERRORS, Database

log = logging.getLogger("taskfleet.worker")

#: Rows deleted per status per statement: a few milliseconds of locks and one modest WAL record
#: burst each; 1,000 finished tasks a second need one statement a second.
BATCH = 2000


class Pruner:
    def __init__(
        self,
        *,
        policy: RetentionPolicy,
        database: Database,
        metrics: WorkerMetrics,
        budget: float,
        batch: int = BATCH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._db = database
        self._metrics = metrics
        #: Longest one pass runs before it waits for the next sweep to say more is due.
        self._budget = budget
        self._batch = batch
        self._clock = clock
        self._due = asyncio.Event()
        #: Passes completed (tests wait on it).
        self.passes = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def due(self) -> None:
        """The sweep found something to prune."""
        self._due.set()

    async def run(self) -> None:
        while True:
            await self._due.wait()
            self._due.clear()
            self.idle.clear()
            try:
                await self.prune_pass()
            except DATABASE_ERRORS as exc:
                # The next sweep asks again; nothing is half-done (each batch is atomic).
                log.warning("pruning failed (%s); the next sweep retries", first_line(exc))
            finally:
                self.passes += 1
                self.idle.set()

    async def prune_pass(self) -> dict[str, int]:
        """Delete what is due, batch after batch, until done, the lock is someone else's, or
        the budget is spent. Returns the rows deleted per kind."""
        deadline = self._clock() + self._budget
        totals: dict[str, int] = {}
        statuses, keep = self._policy.task_cutoffs()
        while statuses and self._clock() < deadline:
            rows = await self._db.fetch(
                queries.task_prune_batch,
                lock_key=queries.PRUNE_LOCK_KEY,
                statuses=statuses,
                keep=keep,
                batch=self._batch,
            )
            if not rows or not rows[0]["held"]:
                return totals  # another worker prunes right now
            full = False
            for row in rows:
                self._count(totals, row["status"], row["deleted"])
                full = full or row["deleted"] >= self._batch
            if not full:
                break
            await asyncio.sleep(0)  # let the heartbeat and the claims in between batches
        if self._policy.workers is not None:
            (row,) = await self._db.fetch(
                queries.worker_prune,
                lock_key=queries.PRUNE_LOCK_KEY,
                workers_keep=self._policy.workers,
            )
            self._count(totals, PRUNED_WORKER, row["deleted"])
        (row,) = await self._db.fetch(
            queries.runtime_config_prune,
            lock_key=queries.PRUNE_LOCK_KEY,
            kept=RUNTIME_CONFIG_VERSIONS_KEPT,
            batch=self._batch,
        )
        self._count(totals, PRUNED_RUNTIME_CONFIG, row["deleted"])
        if any(totals.values()):
            log.info(
                "pruned %s", ", ".join(f"{n} {kind}" for kind, n in sorted(totals.items()) if n)
            )
        return totals

    def _count(self, totals: dict[str, int], kind: str, deleted: int) -> None:
        if deleted:
            totals[kind] = totals.get(kind, 0) + int(deleted)
            self._metrics.pruned.labels(status=kind).inc(int(deleted))
