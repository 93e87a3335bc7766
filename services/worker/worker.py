"""The worker process: one scheduler loop, task execution, heartbeat, sweep, runtime config.

Loops, each a single asyncio task:
- ``_claim_loop``: waits for a free slot, claims up to the free slots in one statement, hands each
  task to its own execution coroutine, repeats at once; sleeps only when a claim returns nothing
  (until a wake-up notification, the poll interval or shutdown). A busy worker sends no claims.
- ``_finish_loop``: writes finished attempts, all that accumulated, in one statement.
- ``_tick_loop``: one statement per tick refreshes the worker row and every lease, returns the
  cancellations requested, runs the lease sweep when due and reports the latest config version.
- ``Listener`` (listener.py): LISTEN on a dedicated connection, reconnecting with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import socket
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from taskfleet.shared import protocol, queries
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import BackoffPolicy
from taskfleet.shared.policy.claim_plan import ClaimPlan, ClaimPlanner
from taskfleet.shared.policy.groups import GroupKey, group_name
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE, Lane
from taskfleet.shared.policy.runtime_config import RuntimeConfig, config_from_payload
from taskfleet.shared.registry import PermanentError, TaskRegistry
from taskfleet.shared.schema import TaskStatus, WorkerStatus
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.database import Database
from taskfleet.worker.listener import Listener

log = logging.getLogger("taskfleet.worker")

MAX_ERROR_CHARS = 8000
#: What a database round trip can raise: server errors, network errors, timeouts, and asyncpg's
#: own client-side errors (InternalClientError after a killed connection is not an
#: InterfaceError). All of them are retried with backoff; none may stop the worker.
DATABASE_ERRORS: tuple[type[Exception], ...] = (Exception,)
MAX_RESULT_BYTES = 1 << 20


@dataclass
class Running:
    """A task this worker is running."""

    id: int
    type: str
    lane: Lane
    group: GroupKey
    attempts: int
    max_attempts: int
    timeout: float | None
    task: asyncio.Task[None] | None = None
    #: Why we cancelled it: "user" (cancel requested) or "shutdown" (drain timed out).
    cancel_reason: str | None = None


@dataclass(frozen=True)
class Outcome:
    """A finished attempt waiting to be written."""

    id: int
    status: str  # completed | failed | cancelled | pending (retry) | released (drain)
    result: str | None = None
    error: str | None = None
    retry_in: float = 0.0


@dataclass
class _Backoff:
    base: float = 0.05
    cap: float = 5.0
    failures: int = 0

    def next(self) -> float:
        self.failures += 1
        delay = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 20))
        return delay / 2 + random.random() * delay / 2

    def reset(self) -> None:
        self.failures = 0


class Worker:
    """One worker process's runtime. Build it, ``await run()``, call ``request_stop()``."""

    def __init__(
        self,
        settings: WorkerSettings,
        registry: TaskRegistry,
        *,
        metrics_registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.id = settings.resolved_worker_id()
        self.registry = registry
        self.metrics_registry = metrics_registry or CollectorRegistry()
        self.metrics = WorkerMetrics.create(self.metrics_registry)
        self.clock = clock
        self.planner = ClaimPlanner(settings.concurrency)
        self.backoff = BackoffPolicy(base=settings.retry_base, cap=settings.retry_cap)
        self.applied_version = 0
        self.status = "starting"
        self.metrics_port: int | None = None

        url = settings.database_url
        sync = settings.synchronous_commit
        self._claim_db = Database(url, "taskfleet-worker-claim", synchronous_commit=sync)
        self._io_db = Database(url, "taskfleet-worker-io", synchronous_commit=sync)
        self.listener = Listener(
            settings.listen_url,
            channels=(queries.TASK_READY_CHANNEL, protocol.CONFIG_CHANNEL),
            on_message=self._on_notification,
            on_connect=self._on_listener_connect,
            metrics=self.metrics,
        )

        self._running: dict[int, Running] = {}
        #: Running tasks per lane, kept with _running (read on every loop pass: O(1)).
        self._lane_counts: Counter[Lane] = Counter({lane: 0 for lane in Lane})
        self._outcomes: list[Outcome] = []
        self._outcome_event = asyncio.Event()
        #: A batch of outcomes is being written by the finish loop (drain waits for it).
        self._flushing = False
        self._slot_freed = asyncio.Event()
        self._work_hint = asyncio.Event()
        #: Every wake-up since the claim loop last slept named its lanes (notifications).
        self._named_lanes_only = False
        self._control_hint = False
        #: The last claim's probe saw strict work that only the strict cap held back.
        self._strict_held_back = False
        self._control_event = asyncio.Event()
        self._hint_generation = 0
        self._last_dry_reset = 0.0
        self._stop = asyncio.Event()
        #: True while the claim loop will claim soon (outcomes can ride along with the claim).
        self._claim_pending = True
        self._force_stop = asyncio.Event()
        self._config_lock = asyncio.Lock()
        self._config_refresh: asyncio.Task[None] | None = None
        self._loops: list[asyncio.Task[None]] = []
        #: Set once registered and claiming; tests and /readyz wait on it.
        self.ready = asyncio.Event()
        #: Set every time a config version is applied (tests wait on it).
        self.config_applied = asyncio.Event()

        self._inflight_gauges = {lane: self.metrics.inflight.labels(lane.value) for lane in Lane}
        self.metrics.concurrency.set(settings.concurrency)
        self._publish_config_metrics()

    # ----------------------------------------------------------------------------------------
    # Life cycle
    # ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Start, run until ``request_stop()``, drain, mark offline."""
        if self.settings.listen_enabled:
            # LISTEN before reading the latest version, so no version slips in between.
            self.listener.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.listener.connected.wait(), 5.0)
        if not await self._start_up():
            await self._close()
            return
        self.status = "running"
        self._loops = [
            asyncio.create_task(self._claim_loop(), name="claim-loop"),
            asyncio.create_task(self._finish_loop(), name="finish-loop"),
            asyncio.create_task(self._tick_loop(), name="tick-loop"),
        ]
        self.ready.set()
        log.info(
            "worker %s online: concurrency %d, config version %d",
            self.id,
            self.settings.concurrency,
            self.applied_version,
        )
        stop_waiter = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait(
            [stop_waiter, *self._loops], return_when=asyncio.FIRST_COMPLETED
        )
        stop_waiter.cancel()
        for loop_task in done:
            if loop_task is not stop_waiter and loop_task.exception() is not None:
                log.error("worker loop crashed", exc_info=loop_task.exception())
        await self._drain()

    def request_stop(self) -> None:
        """SIGTERM/SIGINT: stop claiming and drain. A second request stops at once."""
        if self._stop.is_set():
            log.warning("second stop request: interrupting running tasks now")
            self._force_stop.set()
        self._stop.set()
        self._work_hint.set()
        self._slot_freed.set()
        self._control_event.set()

    async def _start_up(self) -> bool:
        retry = _Backoff(base=0.2, cap=5.0)
        while not self._stop.is_set():
            try:
                await self._refresh_config(ack=False)
                await self._io_db.fetch(
                    queries.worker_register,
                    id=self.id,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    concurrency=self.settings.concurrency,
                    heartbeat_interval=self.settings.heartbeat_interval,
                    applied_config_version=self.applied_version,
                    metrics_port=self.metrics_port,
                )
                return True
            except DATABASE_ERRORS as exc:
                delay = retry.next()
                log.warning("start-up: database unavailable (%s); retrying in %.1fs", exc, delay)
                await self._sleep(delay)
        return False

    async def _drain(self) -> None:
        """Stop claiming, let running tasks finish within drain_timeout, give the rest back."""
        self.status = "draining"
        self.ready.clear()
        log.info("draining: %d task(s) running", len(self._running))
        claim_loop = self._loops[0] if self._loops else None
        if claim_loop is not None:
            claim_loop.cancel()
            await asyncio.gather(claim_loop, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._set_status(WorkerStatus.DRAINING)
        running = [r.task for r in self._running.values() if r.task is not None]
        if running:
            all_done = asyncio.gather(*running, return_exceptions=True)
            force = asyncio.create_task(self._force_stop.wait())
            waiting: list[asyncio.Future[Any]] = [all_done, force]
            await asyncio.wait(
                waiting,
                timeout=self.settings.drain_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            force.cancel()
            unfinished = [r for r in self._running.values() if r.task and not r.task.done()]
            for r in unfinished:
                r.cancel_reason = "shutdown"
                assert r.task is not None
                r.task.cancel()
            if unfinished:
                log.warning("drain timeout: returning %d task(s) to pending", len(unfinished))
            await all_done
        # Write every outcome (retrying through database blips, bounded).
        deadline = self.clock() + max(5.0, self.settings.drain_timeout)
        while (self._outcomes or self._flushing) and self.clock() < deadline:
            self._outcome_event.set()
            await asyncio.sleep(0.02)
        for loop_task in self._loops[1:]:
            loop_task.cancel()
        await asyncio.gather(*self._loops[1:], return_exceptions=True)
        if self._outcomes:
            log.error(
                "could not write %d outcome(s); their leases will expire", len(self._outcomes)
            )
        with contextlib.suppress(Exception):
            await self._set_status(WorkerStatus.OFFLINE)
        await self._close()
        self.status = "stopped"
        log.info("worker %s stopped", self.id)

    async def _close(self) -> None:
        if self._config_refresh is not None:
            self._config_refresh.cancel()
        await self.listener.stop()
        await self._claim_db.close()
        await self._io_db.close()

    async def _set_status(self, status: WorkerStatus) -> None:
        await self._io_db.fetch(
            queries.worker_set_status,
            status=status.value,
            inflight=self.inflight,
            strict_inflight=self.strict_inflight,
            worker_id=self.id,
        )

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short by a stop request."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    # ----------------------------------------------------------------------------------------
    # Counting
    # ----------------------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        """Running tasks in the regular slots (the control slot excluded)."""
        return self._lane_counts[Lane.STRICT] + self._lane_counts[Lane.NORMAL]

    @property
    def strict_inflight(self) -> int:
        return self._lane_counts[Lane.STRICT]

    @property
    def control_inflight(self) -> int:
        return self._lane_counts[Lane.CONTROL]

    @property
    def healthy(self) -> bool:
        """For /readyz: running, database reachable, listener up (when enabled)."""
        if self.status != "running":
            return False
        if self.settings.listen_enabled and not self.listener.connected.is_set():
            return False
        return self._io_db.healthy or self._claim_db.healthy

    # ----------------------------------------------------------------------------------------
    # The scheduler loop
    # ----------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        retry = _Backoff()
        while not self._stop.is_set():
            now = self.clock()
            if now - self._last_dry_reset >= self.settings.poll_interval:
                # Delayed tasks and retries become ready without a notification.
                self.planner.reset_dry()
                self._last_dry_reset = now
            free = self.settings.concurrency - self.inflight
            control_free = self.control_inflight == 0
            if free <= 0:
                if control_free and self._control_hint:
                    plan = ClaimPlan(control=1)
                else:
                    # Every slot is busy: only a freed slot or a control-lane task matters now.
                    # (A general wake-up must not wake this wait, or the loop would spin.)
                    self._slot_freed.clear()
                    self._control_event.clear()
                    self._enter_wait()
                    await self._wait_any(self._slot_freed, self._control_event, timeout=None)
                    self._claim_pending = True
                    continue
            else:
                plan = self.planner.plan(
                    free_slots=free, strict_inflight=self.strict_inflight, control_free=control_free
                )
            if plan.total == 0:
                # Nothing claimable now: sleep until a hint, the poll interval, or stop; and, when
                # strict work may be held back only by the cap (the cap is full and the strict
                # lane is not known to be empty), until a slot frees.
                self._enter_wait()
                events = [self._work_hint]
                if plan.probe_strict or self._strict_held_back:
                    self._slot_freed.clear()
                    events.append(self._slot_freed)
                await self._wait_any(*events, timeout=self.settings.poll_interval)
                self._claim_pending = True
                self._work_hint.clear()
                if self._named_lanes_only:
                    # A wake-up that named its lanes already made them claimable: trying the
                    # others again would cost a claim per pickup (strict first, then normal).
                    self._named_lanes_only = False
                else:
                    self.planner.reset_dry()
                self._last_dry_reset = self.clock()
                continue
            generation = self._hint_generation
            self._work_hint.clear()
            if plan.control:
                self._control_hint = False
            outcomes = self._take_outcomes()
            try:
                rows = await self._claim_db.fetch(
                    queries.task_claim,
                    **self._finish_params(outcomes),
                    control_limit=plan.control,
                    strict_limit=plan.strict,
                    group_keys=plan.group_keys,
                    group_limits=plan.group_limits,
                    probe_strict=plan.probe_strict,
                    probe_normal=plan.probe_normal,
                    worker_id=self.id,
                    lease_ttl=self.settings.lease_ttl,
                )
            except DATABASE_ERRORS as exc:
                self._outcomes[:0] = outcomes  # never drop an outcome: they go out next time
                delay = retry.next()
                log.warning("claim failed (%s); retrying in %.2fs", exc, delay)
                self._enter_wait()
                await self._sleep(delay)
                self._claim_pending = True
                continue
            retry.reset()
            if outcomes:
                self._report_lost(outcomes, rows[0]["finished_ids"] if rows else [])
            claimed: Counter[tuple[Lane, GroupKey]] = Counter()
            for row in rows:
                if row["id"] is None:
                    continue
                running = self._start(row)
                claimed[(running.lane, running.group)] += 1
            self.metrics.claim_queries.labels("claimed" if claimed else "empty").inc()
            if plan.probe_strict:
                self._strict_held_back = bool(rows and rows[0]["strict_waiting"])
                if self._strict_held_back:
                    self.metrics.strict_saturation.inc()
            elif plan.strict:
                self._strict_held_back = False
            # Charged for what it got; a shortfall is trusted only if no new work was announced
            # meanwhile, and one caused by another worker's locks (contended) is not dryness.
            self.planner.observe(
                plan,
                claimed,
                normal_waiting=bool(rows and rows[0]["normal_waiting"]),
                contended=[g or None for g in rows[0]["contended_groups"]] if rows else (),
                strict_contended=bool(rows and rows[0]["strict_contended"]),
                shortfall_trusted=generation == self._hint_generation,
            )
            self._publish_inflight()

    def _enter_wait(self) -> None:
        """The claim loop is about to wait: outcomes it would have carried go out on their own."""
        self._claim_pending = False
        if self._outcomes:
            self._outcome_event.set()

    def _take_outcomes(self) -> list[Outcome]:
        """Outcomes to write with the next claim (drain releases go by task_release)."""
        taken = [o for o in self._outcomes if o.status != "released"]
        if taken:
            self._outcomes = [o for o in self._outcomes if o.status == "released"]
        return taken

    @staticmethod
    def _finish_params(outcomes: list[Outcome]) -> dict[str, list[Any]]:
        return {
            "fin_ids": [o.id for o in outcomes],
            "fin_statuses": [o.status for o in outcomes],
            "fin_results": [o.result for o in outcomes],
            "fin_errors": [o.error for o in outcomes],
            "fin_retry_in": [o.retry_in for o in outcomes],
        }

    async def _wait_any(self, *events: asyncio.Event, timeout: float | None) -> None:
        waiters = [asyncio.create_task(e.wait()) for e in (*events, self._stop)]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    def _start(self, row: asyncpg.Record) -> Running:
        lane, group = self.planner.classify(row["priority"], list(row["labels"]), row["group_key"])
        running = Running(
            id=row["id"],
            type=row["type"],
            lane=lane,
            group=group,
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            timeout=row["timeout"],
        )
        self._running[running.id] = running
        self._lane_counts[lane] += 1
        self.metrics.claims.labels(
            lane.value, group_name(group) if lane is Lane.NORMAL else ""
        ).inc()
        self.metrics.task_wait.labels(lane.value).observe(max(0.0, row["wait_seconds"] or 0.0))
        running.task = asyncio.create_task(
            self._execute(running, row["payload"]), name=f"task-{running.id}"
        )
        if row["cancel_requested"]:
            self._cancel(running.id, "user")
        return running

    # ----------------------------------------------------------------------------------------
    # Execution
    # ----------------------------------------------------------------------------------------

    async def _execute(self, running: Running, payload: Any) -> None:
        started = self.clock()
        try:
            outcome = await self._attempt(running, payload)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if running.cancel_reason == "user":
                outcome = Outcome(running.id, TaskStatus.CANCELLED.value, error="cancelled")
            else:
                outcome = Outcome(running.id, "released", error="interrupted by worker shutdown")
        finally:
            if self._running.pop(running.id, None) is not None:
                self._lane_counts[running.lane] -= 1
            self._slot_freed.set()
            if running.lane is Lane.CONTROL:
                # The control slot is free again: a config task that arrived meanwhile (its
                # wake-up came while the slot was busy) is claimed now, not at the next poll.
                self.planner.reset_dry([Lane.CONTROL.value])
                self._work_hint_local()
            self._publish_inflight()
        self.metrics.task_duration.labels(running.lane.value).observe(self.clock() - started)
        label = {"pending": "retried", "released": "released"}.get(outcome.status, outcome.status)
        self.metrics.outcomes.labels(running.type, label).inc()
        self._outcomes.append(outcome)
        self._outcome_event.set()

    async def _attempt(self, running: Running, payload: Any) -> Outcome:
        """Run the handler once; map what happened to an outcome (retry rules applied)."""
        try:
            result = await self._invoke(running, payload)
        except PermanentError as exc:
            return self._failure(running, exc, permanent=True)
        except _Timeout as exc:
            return self._failure(running, exc, permanent=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._failure(running, exc, permanent=False)
        try:
            encoded = json.dumps(result, default=to_jsonable_python, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            return self._failure(
                running, PermanentError(f"result is not JSON-serialisable: {exc}"), permanent=True
            )
        if len(encoded) > MAX_RESULT_BYTES:
            return self._failure(
                running, PermanentError("result is larger than 1 MiB"), permanent=True
            )
        return Outcome(running.id, TaskStatus.COMPLETED.value, result=encoded)

    async def _invoke(self, running: Running, payload: Any) -> Any:
        if running.type == RUNTIME_CONFIG_TASK_TYPE:
            from taskfleet.worker.config_update import run_config_update

            return await run_config_update(self, running.id, payload)
        definition = self.registry.get(running.type)
        if definition is None or definition.internal:
            raise PermanentError(f"no handler for task type {running.type!r} on worker {self.id}")
        try:
            params = definition.validate(payload)
        except ValidationError as exc:
            raise PermanentError(f"invalid payload: {exc}") from exc

        async def call() -> Any:
            if definition.is_async:
                return await definition.func(params)
            return await asyncio.to_thread(definition.func, params)

        if running.timeout is None:
            return await call()
        try:
            async with asyncio.timeout(running.timeout) as scope:
                return await call()
        except TimeoutError as exc:
            if scope.expired():
                raise _Timeout(f"timed out after {running.timeout:g}s") from exc
            raise

    def _failure(self, running: Running, exc: BaseException, *, permanent: bool) -> Outcome:
        if isinstance(exc, (PermanentError, _Timeout)) and not exc.__cause__:
            message = f"{type(exc).__name__}: {exc}"
        else:
            message = "".join(traceback.format_exception(exc))
        message = message[-MAX_ERROR_CHARS:]
        definition = self.registry.get(running.type)
        policy = (definition.backoff if definition else None) or self.backoff
        if not permanent and running.attempts < running.max_attempts:
            return Outcome(
                running.id,
                TaskStatus.PENDING.value,
                error=message,
                retry_in=policy.delay(running.attempts),
            )
        return Outcome(running.id, TaskStatus.FAILED.value, error=message)

    def _cancel(self, task_id: int, reason: str) -> None:
        running = self._running.get(task_id)
        if running is None or running.task is None or running.task.done():
            return
        if running.cancel_reason is None:
            running.cancel_reason = reason
            running.task.cancel()

    # ----------------------------------------------------------------------------------------
    # Writing outcomes
    # ----------------------------------------------------------------------------------------

    async def _finish_loop(self) -> None:
        retry = _Backoff(base=0.05, cap=2.0)
        while True:
            await self._outcome_event.wait()
            self._outcome_event.clear()
            if not self._outcomes or (self._claim_pending and not self._stop.is_set()):
                # The claim loop is about to claim: the outcomes ride along in that statement.
                continue
            batch, self._outcomes = self._outcomes, []
            self._flushing = True
            try:
                await self._write(batch)
                retry.reset()
            except DATABASE_ERRORS as exc:
                # Never drop an outcome: put it back and try again.
                self._outcomes[:0] = batch
                delay = retry.next()
                log.warning(
                    "writing %d outcome(s) failed (%s); retry in %.2fs", len(batch), exc, delay
                )
                await asyncio.sleep(delay)
                self._outcome_event.set()
            finally:
                self._flushing = False

    async def _write(self, batch: list[Outcome]) -> None:
        finished = [o for o in batch if o.status != "released"]
        released = [o.id for o in batch if o.status == "released"]
        if finished:
            rows = await self._io_db.fetch(
                queries.task_finish_batch, **self._finish_params(finished), worker_id=self.id
            )
            self._report_lost(finished, [r["id"] for r in rows])
            if any(o.status == TaskStatus.PENDING.value for o in finished):
                self._work_hint_local()
        if released:
            rows = await self._io_db.fetch(
                queries.task_release,
                ids=released,
                worker_id=self.id,
                reason="interrupted by worker shutdown; returned to pending",
            )
            self._report_lost([o for o in batch if o.status == "released"], [r["id"] for r in rows])

    def _report_lost(self, written: list[Outcome], written_ids: list[int]) -> None:
        done = set(written_ids)
        for outcome in written:
            if outcome.id not in done:
                log.warning(
                    "task %d: outcome %s not written: this worker no longer holds its lease",
                    outcome.id,
                    outcome.status,
                )

    def _work_hint_local(self) -> None:
        self._hint_generation += 1
        self._named_lanes_only = False  # this wake-up names no lane: try them all
        self._work_hint.set()

    # ----------------------------------------------------------------------------------------
    # Heartbeat, leases, sweep, config poll: one statement per tick
    # ----------------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        interval = min(self.settings.heartbeat_interval, self.settings.runtime_config_poll_interval)
        sweep_every = self.settings.sweep_interval
        now = self.clock()
        next_tick = now + interval
        next_sweep = now + random.uniform(0, sweep_every)  # spread the fleet's sweeps
        retry = _Backoff(base=0.2, cap=interval)
        while True:
            await asyncio.sleep(max(0.0, min(next_tick, next_sweep) - self.clock()))
            now = self.clock()
            sweep = now >= next_sweep - interval / 2
            try:
                rows = await self._io_db.fetch(
                    queries.worker_tick,
                    inflight=self.inflight,
                    strict_inflight=self.strict_inflight,
                    applied_version=self.applied_version,
                    worker_id=self.id,
                    held=self._held_ids(),
                    lease_ttl=self.settings.lease_ttl,
                    sweep=sweep,
                    sweep_lock_key=queries.SWEEP_LOCK_KEY,
                )
            except DATABASE_ERRORS as exc:
                self.metrics.heartbeat_failures.inc()
                delay = retry.next()
                log.warning("heartbeat failed (%s); retrying in %.2fs", exc, delay)
                next_tick = now + delay
                continue
            retry.reset()
            next_tick = now + interval
            if sweep:
                next_sweep = now + sweep_every
            await self._on_tick(rows)

    def _held_ids(self) -> list[int]:
        """Tasks this process holds: running, or finished with the outcome not yet written."""
        return [*self._running, *(o.id for o in self._outcomes)]

    async def _on_tick(self, rows: list[asyncpg.Record]) -> None:
        for row in rows:
            kind = row["kind"]
            if kind == "cancel":
                self._cancel(row["id"], "user")
            elif kind == "rescued":
                self.metrics.lease_rescues.labels(row["status"]).inc()
                log.warning("rescued task %d from an expired lease -> %s", row["id"], row["status"])
            elif kind == "config" and row["id"] > self.applied_version:
                self._schedule_config_refresh()
            elif kind == "control_pending":
                self._control_hint = True
                self._control_event.set()
                self._work_hint_local()
            elif kind == "registered" and row["id"] == 0 and self.status == "running":
                log.warning("worker row missing; registering again")
                await self._start_up()

    # ----------------------------------------------------------------------------------------
    # Notifications and runtime config
    # ----------------------------------------------------------------------------------------

    def _on_notification(self, message: protocol.Message) -> None:
        if isinstance(message, protocol.TaskReady):
            if message.control:
                self._control_hint = True
                self._control_event.set()
            self._hint_generation += 1
            self.planner.reset_dry(message.lanes)
            # Only while nothing else woke the loop (a general wake-up resets every lane).
            self._named_lanes_only = message.lanes is not None and (
                self._named_lanes_only or not self._work_hint.is_set()
            )
            self._work_hint.set()
        elif isinstance(message, protocol.ConfigUpdated):
            if message.version > self.applied_version:
                self._schedule_config_refresh()
        elif isinstance(message, protocol.Malformed):
            log.warning(
                "ignored malformed notification on %s (%s): %r",
                message.channel,
                message.reason,
                message.payload,
            )

    async def _on_listener_connect(self) -> None:
        # After every (re)connect: catch up on whatever was missed while not listening.
        self._hint_generation += 1
        self.planner.reset_dry()
        self._work_hint.set()
        if self.status == "running":
            self._schedule_config_refresh()

    def request_config_refresh(self) -> None:
        """Read the latest config version soon (the update task calls this after writing)."""
        self._schedule_config_refresh()

    def _schedule_config_refresh(self) -> None:
        if self._config_refresh is None or self._config_refresh.done():
            self._config_refresh = asyncio.create_task(self._refresh_config_safely())

    async def _refresh_config_safely(self) -> None:
        try:
            await self._refresh_config(ack=True)
        except DATABASE_ERRORS as exc:
            log.warning("reading the runtime config failed (%s); the next tick retries", exc)

    async def _refresh_config(self, *, ack: bool) -> None:
        """Read the latest version; if newer than the applied one, swap it in and record it."""
        async with self._config_lock:
            rows = await self._io_db.fetch(queries.runtime_config_latest)
            if not rows or rows[0]["version"] <= self.applied_version:
                return
            row = rows[0]
            try:
                config = config_from_payload(row["payload"])
            except ValueError as exc:
                log.error("runtime config version %d is unusable (%s); kept", row["version"], exc)
                return
            self._apply(config, row["version"])
            if ack:
                await self._io_db.fetch(
                    queries.worker_applied_config,
                    version=row["version"],
                    worker_id=self.id,
                    ack=protocol.config_ack_payload(row["request_id"], self.id, row["version"]),
                )
            log.info(
                "applied runtime config version %d: strict cap %d, weights %s",
                row["version"],
                self.planner.strict_cap,
                dict(config.label_weights) or "{}",
            )

    def _apply(self, config: RuntimeConfig, version: int) -> None:
        # One synchronous swap: the claim loop never sees half a config.
        self.planner.apply(config)
        self.applied_version = version
        self._hint_generation += 1
        self._work_hint.set()
        self._publish_config_metrics()
        self.config_applied.set()

    def _publish_config_metrics(self) -> None:
        self.metrics.config_version.set(self.applied_version)
        self.metrics.strict_cap.set(self.planner.strict_cap)

    def _publish_inflight(self) -> None:
        for lane, gauge in self._inflight_gauges.items():
            gauge.set(self._lane_counts[lane])
        self.metrics.strict_inflight.set(self._lane_counts[Lane.STRICT])


class _Timeout(Exception):
    """The task's own timeout expired."""
