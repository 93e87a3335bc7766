"""Periodic tasks: declares the task modules' schedules at start, then fires the due ones.

Every worker runs this loop; which one enqueues a slot's task does not matter and needs no
agreement between clocks: the firing statement (``schedule_fire``) advances the schedule's row
only from the slot this worker read, with a conditional UPDATE, and inserts the task in the same
statement, so whichever worker's statement commits first fires the slot and the others change
nothing. The task also carries (schedule, slot) under a unique index. Slots are computed from the
database's clock (``schedule_due`` returns it), never this machine's.

The loop costs nothing while no schedule is due: it sleeps until the earliest ``next_run_at``
it knows of, and every heartbeat tick reports that time (one index probe in the tick's
statement), so a schedule added or moved earlier is seen at the next tick. When one is due, the
loop reads the due ones (``schedule_due``), fires them, and sleeps until the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from taskfleet.shared import protocol, queries
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import LoopBackoff
from taskfleet.shared.policy.lanes import lane_for_priority
from taskfleet.shared.policy.schedules import ScheduleError, fire_plan, next_slot
from taskfleet.shared.registry import TaskRegistry
from taskfleet.shared.schedules import (
    SOURCE_CODE,
    code_schedules,
    schedule_params,
    stored_timing,
    undeclared_types,
)
from taskfleet.worker.database import DATABASE_ERRORS, Database

log = logging.getLogger("taskfleet.worker")

#: After a look that fired nothing although schedules were due (their timing no longer parses:
#: logged once), the next look is this much later (seconds).
BROKEN_RETRY = 1.0
#: Due schedules read (and fired) per look.
DUE_BATCH = 100


class Scheduler:
    def __init__(
        self,
        *,
        database: Database,
        registry: TaskRegistry,
        metrics: WorkerMetrics,
        sleep: Callable[[float], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = database
        self._registry = registry
        self._metrics = metrics
        #: Sleeps, cut short by the worker's stop request.
        self._sleep = sleep
        #: (name, revision) of stored schedules whose timing no longer parses (logged once).
        self._broken: set[tuple[str, int]] = set()
        #: Tasks this process enqueued from schedules (tests read it).
        self.fired = 0
        self.declared = asyncio.Event()
        self._clock = clock
        #: When (on ``clock``) to look next; None: only when a tick says a schedule exists.
        self._next_look: float | None = clock()
        self._woken = asyncio.Event()

    def next_due_in(self, seconds: float | None) -> None:
        """A heartbeat tick's news: the earliest schedule is due in ``seconds`` (None: there is
        no schedule). Wakes the loop when that is sooner than it planned to look."""
        if seconds is None:
            return
        at = self._clock() + max(0.0, seconds)
        if self._next_look is None or at < self._next_look:
            self._next_look = at
            self._woken.set()

    async def run(self) -> None:
        retry = LoopBackoff(base=0.2, cap=5.0)
        while not self.declared.is_set():
            try:
                await self.declare()
            except DATABASE_ERRORS as exc:
                delay = retry.next()
                log.warning("declaring schedules failed (%s); retrying", first_line(exc))
                await self._sleep(delay)
                # A stop request makes that sleep return at once: yield all the same, or this
                # loop would keep the event loop (and the worker's drain) from ever running.
                await asyncio.sleep(0)
        retry.reset()
        while True:
            await self._until_next_look()
            try:
                wait = await self.fire_due()
            except DATABASE_ERRORS as exc:
                delay = retry.next()
                log.warning(
                    "firing schedules failed (%s); retrying in %.2fs", first_line(exc), delay
                )
                self._next_look = self._clock() + delay
                continue
            retry.reset()
            self._next_look = None if wait is None else self._clock() + wait

    async def _until_next_look(self) -> None:
        while True:
            self._woken.clear()
            if self._next_look is not None and self._next_look <= self._clock():
                return
            timeout = None if self._next_look is None else self._next_look - self._clock()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._woken.wait()

    async def declare(self) -> None:
        """Upsert the schedules this worker's task modules declare (an API-set one wins)."""
        try:
            declared = code_schedules(self._registry)
        except ValueError as exc:  # pydantic's ValidationError too
            # Not the database's fault, so no retry would help: the schedules already stored
            # still fire.
            log.error("the schedules declared in code cannot be declared: %s", first_line(exc))
            declared = []
        if declared:
            (row,) = await self._db.fetch(queries.database_now)
            for name, submission in declared:
                params = schedule_params(
                    name,
                    submission,
                    source=SOURCE_CODE,
                    next_run_at=next_slot(submission.timing, row["now"]),
                )
                written = await self._db.fetch(queries.schedule_declare, **params)
                if written:
                    log.info("declared schedule %s", name)
        removed = await self._db.fetch(
            queries.schedule_retire_code, names=undeclared_types(self._registry)
        )
        for row in removed:
            log.info("removed schedule %s: its task type no longer declares one", row["name"])
        self.declared.set()

    async def fire_due(self) -> float | None:
        """Fire every due schedule; the seconds until the next look (None: no schedule)."""
        broken = sorted(self._broken)
        rows = await self._db.fetch(
            queries.schedule_due,
            limit=DUE_BATCH,
            broken_names=[name for name, _ in broken],
            broken_revisions=[revision for _, revision in broken],
        )
        head = rows[0]
        due = [row for row in rows if row["name"] is not None]
        fired_any = False
        for row in due:
            fired_any |= await self._fire(row, head["db_now"])
        if fired_any or len(due) == DUE_BATCH:
            return 0.0  # look again at once: the next slot's wait, or more due schedules
        wait = head["wait_seconds"]
        if wait is None:
            return None
        if due:  # only broken ones are due
            return BROKEN_RETRY
        return max(0.0, float(wait))

    async def _fire(self, row: Any, now: Any) -> bool:
        key = (row["name"], row["revision"])
        if key in self._broken:
            return False
        try:
            timing = stored_timing(row["cron"], row["every"], row["timezone"])
        except ScheduleError as exc:
            self._broken.add(key)
            log.error("schedule %s cannot fire: %s (set it again)", row["name"], exc)
            return False
        plan = fire_plan(timing, row["next_run_at"], now)
        if plan is None:
            return False
        fired = await self._db.fetch(
            queries.schedule_fire,
            name=row["name"],
            due=row["next_run_at"],
            revision=row["revision"],
            slot=plan.slot,
            next_run_at=plan.next_run_at,
            wake_hint=protocol.wake_hint([lane_for_priority(row["priority"]).value]),
        )
        if not fired:
            return True  # another worker fired it first (or it changed): look again
        self.fired += 1
        self._metrics.schedule_runs.labels(kind="catch_up" if plan.skipped else "on_time").inc()
        if plan.skipped:
            log.info(
                "schedule %s: enqueued task %d for slot %s, the one catch-up run (%d earlier "
                "missed slots not run)",
                row["name"],
                fired[0]["id"],
                plan.slot.isoformat(),
                plan.skipped,
            )
        else:
            log.debug(
                "schedule %s: enqueued task %d for slot %s",
                row["name"],
                fired[0]["id"],
                plan.slot.isoformat(),
            )
        return True
