"""The heartbeat: one statement per tick refreshes the worker row (which is the lease of every
task this process runs: no task row is written), returns the cancellations requested, runs
the lease sweep when due (one worker at a time, under an advisory lock), reports the latest
config version, whether a control task waits, whether rows are due for pruning (the pruner
deletes them on its own connection) and when the next schedule is due.

What the tick learns is handed to the supervisor through :class:`TickHandlers`; this file only
keeps time and talks to the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from taskfleet.shared import queries
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import LoopBackoff
from taskfleet.shared.policy.retention import RUNTIME_CONFIG_VERSIONS_KEPT
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.database import DATABASE_ERRORS, Database

log = logging.getLogger("taskfleet.worker")


@dataclass(frozen=True)
class TickHandlers:
    """What the supervisor does with a tick's news."""

    #: The user asked to cancel this running task.
    cancel: Callable[[int], None]
    #: The latest config version in the database.
    latest_config: Callable[[int], None]
    #: A control-lane task is waiting.
    control_pending: Callable[[], None]
    #: The worker row is gone: register again.
    unregistered: Callable[[], Awaitable[None]]
    #: The schema's revisions (alembic_version), every tick.
    schema_revisions: Callable[[list[str]], None]
    #: This worker swept and found rows due for pruning (retention).
    prune_due: Callable[[], None]
    #: Seconds until the earliest schedule's next slot (None: there is no schedule).
    schedule_wait: Callable[[float | None], None]
    #: How many other workers are alive.
    peers: Callable[[int], None]


@dataclass(frozen=True)
class TickState:
    """What a tick reports about this process."""

    #: online, or draining: a row someone else marked offline is restored.
    status: str
    inflight: int
    strict_inflight: int
    applied_version: int
    #: (task id, attempt) whose leases this process holds.
    held: list[tuple[int, int]]


class Heartbeat:
    def __init__(
        self,
        *,
        settings: WorkerSettings,
        worker_id: str,
        owner: tuple[str, int],
        database: Database,
        metrics: WorkerMetrics,
        state: Callable[[], TickState],
        handlers: TickHandlers,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._worker_id = worker_id
        #: (hostname, pid): the heartbeat refreshes the row only while it is this process's.
        self._owner = owner
        self._db = database
        self._metrics = metrics
        self._state = state
        self._handlers = handlers
        self._clock = clock
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """End the loop after the tick in flight, if any, has returned. Cancelling it instead
        could leave that tick running on the server after the worker marked its row offline,
        and the tick re-asserts the row's status (draining): a stopped worker's row said
        draining."""
        self._stopping.set()

    async def run(self) -> None:
        settings = self._settings
        interval = min(settings.heartbeat_interval, settings.runtime_config_poll_interval)
        sweep_every = settings.sweep_interval
        now = self._clock()
        next_tick = now + interval
        next_sweep = now + random.uniform(0, sweep_every)  # spread the fleet's sweeps
        retry = LoopBackoff(base=0.2, cap=interval)
        retention = settings.retention
        prune_statuses, prune_keep = retention.task_cutoffs()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(next_tick, next_sweep) - self._clock())):
                    await self._stopping.wait()
            if self._stopping.is_set():
                return
            now = self._clock()
            sweep = now >= next_sweep - interval / 2
            state = self._state()
            try:
                rows = await self._db.fetch(
                    queries.worker_tick,
                    status=state.status,
                    hostname=self._owner[0],
                    pid=self._owner[1],
                    inflight=state.inflight,
                    strict_inflight=state.strict_inflight,
                    applied_version=state.applied_version,
                    worker_id=self._worker_id,
                    held=[task_id for task_id, _ in state.held],
                    held_attempts=[attempt for _, attempt in state.held],
                    sweep=sweep,
                    sweep_lock_key=queries.SWEEP_LOCK_KEY,
                    prune_statuses=prune_statuses,
                    prune_keep=prune_keep,
                    workers_keep=retention.workers,
                    configs_kept=RUNTIME_CONFIG_VERSIONS_KEPT,
                )
            except DATABASE_ERRORS as exc:
                self._metrics.heartbeat_failures.inc()
                delay = retry.next()
                log.warning("heartbeat failed (%s); retrying in %.2fs", first_line(exc), delay)
                # The next try, the sweep included, waits the whole delay: a sweep time left in
                # the past made the loop retry at once, hundreds of times a second in an outage.
                next_tick = self._clock() + delay  # from now: the delay it logs is the one it waits
                next_sweep = max(next_sweep, next_tick)
                continue
            retry.reset()
            next_tick = now + interval
            if sweep:
                next_sweep = now + sweep_every
            for row in rows:
                kind = row["kind"]
                if kind == "cancel":
                    self._handlers.cancel(row["id"])
                elif kind == "rescued":
                    self._metrics.lease_rescues.labels(row["status"]).inc()
                    log.warning(
                        "rescued task %d from an expired lease -> %s", row["id"], row["status"]
                    )
                elif kind == "config":
                    self._handlers.latest_config(row["id"])
                elif kind == "control_pending":
                    self._handlers.control_pending()
                elif kind == "registered" and row["id"] == 0:
                    await self._handlers.unregistered()
                elif kind == "prune_due":
                    self._handlers.prune_due()
                elif kind == "schedule":
                    wait = row["status"]
                    self._handlers.schedule_wait(float(wait) if wait is not None else None)
                elif kind == "peers":
                    self._handlers.peers(int(row["id"]))
                elif kind == "schema":
                    found = row["status"]
                    self._handlers.schema_revisions(found.split(",") if found else [])
