"""The worker process's supervisor: builds the parts, starts and stops them, drains.

The parts, one job each (docs/architecture.md has the picture):
- ``claim_loop.py``: the one scheduler loop; claims into free slots.
- ``executor.py``: runs each claimed attempt and turns it into an outcome.
- ``outcomes.py``: the outcome queue and the finish loop that writes it.
- ``heartbeat.py``: one statement per tick (worker row = the leases, sweep, cancels, config).
- ``pruner.py``: retention: deletes finished tasks and old rows in bounded batches.
- ``vacuum.py``: vacuums the tasks table when the dead entries the claims walk pile up.
- ``config_follower.py``: reads and applies new runtime config versions.
- ``config_update.py``: the control-lane task that writes a version and follows convergence.
- ``listener.py``: LISTEN on a dedicated connection, reconnecting with backoff.
- ``slots.py``: which tasks this process runs, per lane.
- ``scheduler.py``: declares the task modules' schedules, fires the due ones (periodic tasks).

This file owns only the life cycle: start-up (LISTEN, config, registration), the loops, the
stop request, the drain, and what /readyz reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from taskfleet.shared import db, protocol, queries
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.migrations import head_revision, known_revisions, schema_problem
from taskfleet.shared.policy.backoff import BackoffPolicy, LoopBackoff
from taskfleet.shared.policy.claim_plan import ClaimPlanner
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.policy.outcome_path import outcomes_at_once
from taskfleet.shared.registry import TaskRegistry
from taskfleet.shared.schema import WorkerStatus
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.claim_loop import ClaimLoop
from taskfleet.worker.config_follower import ConfigFollower
from taskfleet.worker.config_update import ConfigWriter
from taskfleet.worker.database import (
    CLIENT_TIMEOUT_MARGIN,
    DATABASE_ERRORS,
    STATEMENT_TIMEOUT,
    Database,
)
from taskfleet.worker.executor import Executor
from taskfleet.worker.heartbeat import Heartbeat, TickHandlers, TickState
from taskfleet.worker.invocation import HandlerRunner
from taskfleet.worker.listener import Listener
from taskfleet.worker.outcomes import OutcomeWriter
from taskfleet.worker.pruner import Pruner
from taskfleet.worker.readiness import ReadinessInputs, not_ready_reasons
from taskfleet.worker.scheduler import Scheduler
from taskfleet.worker.slots import Slots
from taskfleet.worker.stopping import RECANCEL_SECONDS, stop_tasks
from taskfleet.worker.vacuum import Vacuumer, direct_connect

log = logging.getLogger("taskfleet.worker")

#: Exit code of a worker that refused to start because its id belongs to a live worker.
EXIT_DUPLICATE_ID = 2
#: Exit code of a worker whose settings do not fit the database it reaches (a pooler refusing
#: session settings): 2, as every taskfleet command whose setting is wrong.
EXIT_BAD_SETTING = 2
#: How often a worker waiting for a usable schema at start-up looks again (seconds).
SCHEMA_RECHECK_SECONDS = 2.0
#: After the drain timeout interrupted the attempts still running: how long they are given to end
#: (cancelled again every RECANCEL_SECONDS) before one that ignores its cancel is left behind.
INTERRUPTED_GRACE = 5.0


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
        #: The task types this worker has handlers for: it registers them and claims only
        #: them (and the control task, which every worker runs).
        self.task_types = registry.runnable_types()
        self.metrics.initialise(
            types=[*self.task_types, RUNTIME_CONFIG_TASK_TYPE], channels=protocol.CHANNELS
        )
        self.status = "starting"
        self.metrics_port: int | None = None
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        #: The process's exit code once run() returns: 0, or 2 when the worker id was taken or
        #: the database refused the connection's settings (a pooler, see db.pooler_refusal).
        self.exit_code = 0
        #: Attempts still running at exit because their handler ignored every cancel.
        self.attempts_abandoned = 0
        #: The schema revision this code was written for, and why the database's is not usable
        #: (None while it is).
        self.expected_revision = head_revision()
        self._known_revisions = known_revisions()
        self.schema_problem: str | None = None
        self._stop = asyncio.Event()
        self._force_stop = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        #: Work that outlives the task that started it (a config change's re-grouping).
        self._background: set[asyncio.Task[None]] = set()
        #: Set once registered and claiming; tests and /readyz wait on it.
        self.ready = asyncio.Event()

        url = settings.database_url
        sync = settings.synchronous_commit
        pooled = settings.pooled
        self.listener = Listener(
            settings.listen_url,
            channels=(queries.TASK_READY_CHANNEL, protocol.CONFIG_CHANNEL),
            on_message=self._on_notification,
            on_connect=self._on_listener_connect,
            metrics=self.metrics,
            synchronous_commit=sync,
            statement_timeout=STATEMENT_TIMEOUT,
            # The claims run their generic plan (db.session_settings says why), here too: behind
            # a pooler they run on this connection (below).
            generic_plans=True,
        )
        if pooled:
            # Behind a transaction-mode pooler the claims run on the direct LISTEN connection:
            # prepared, one round trip, and no NOTIFY herd queueing in the pooler (every
            # idle worker claims at each wake-up; through PgBouncer, two round trips each).
            self._claim_db = Database(
                settings.listen_url,
                "taskfleet-worker-listen",
                synchronous_commit=sync,
                borrow=self.listener.connection,
            )
        else:
            self._claim_db = Database(
                url, "taskfleet-worker-claim", synchronous_commit=sync, generic_plans=True
            )
        self._io_db = Database(url, "taskfleet-worker-io", synchronous_commit=sync, pooled=pooled)
        # The heartbeat on a connection of its own, bounded well inside the lease: a slow
        # finish or config read must never cost the leases of everything running here.
        self._tick_db = Database(
            url,
            "taskfleet-worker-tick",
            synchronous_commit=sync,
            statement_timeout=min(STATEMENT_TIMEOUT, max(settings.lease_ttl / 2, 2.0)),
            pooled=pooled,
        )

        self.slots = Slots(settings.concurrency, self.metrics)
        self.outcomes = OutcomeWriter(
            self._io_db,
            self.id,
            self.metrics,
            on_retry_written=lambda: self.claim_loop.hint_work(),
            concurrency=settings.concurrency,
        )
        self.config = ConfigFollower(
            worker_id=self.id,
            # Behind a pooler on the LISTEN session too: every worker reads and ACKs each
            # version at the same moment, and through the pooler that herd queued like the
            # claims' did (convergence waits for the slowest ACK).
            database=self._claim_db if pooled else self._io_db,
            planner=self.planner,
            metrics=self.metrics,
            on_applied=lambda: self.claim_loop.hint_work(),
            claims_settled=lambda: self.claim_loop.settled(),
        )
        # A thread for every slot, the control slot included: every slot can run a blocking
        # handler at once.
        self.handlers = HandlerRunner(threads=settings.concurrency + 1)
        self.executor = Executor(
            registry=registry,
            worker_id=self.id,
            handlers=self.handlers,
            slots=self.slots,
            outcomes=self.outcomes,
            metrics=self.metrics,
            backoff=BackoffPolicy(base=settings.retry_base, cap=settings.retry_cap),
            run_control=ConfigWriter(
                settings, self.metrics, self.config.schedule_refresh, self._keep
            ),
            on_control_slot_freed=lambda: self.claim_loop.control_slot_freed(),
            clock=clock,
        )
        self.claim_loop = ClaimLoop(
            settings=settings,
            worker_id=self.id,
            database=self._claim_db,
            planner=self.planner,
            slots=self.slots,
            outcomes=self.outcomes,
            executor=self.executor,
            metrics=self.metrics,
            types=[*self.task_types, RUNTIME_CONFIG_TASK_TYPE],
            stop=self._stop,
            clock=clock,
            on_claimed=lambda tasks: self.vacuumer.claimed(tasks),
        )
        self.heartbeat = Heartbeat(
            settings=settings,
            worker_id=self.id,
            owner=(self.hostname, self.pid),
            database=self._tick_db,
            metrics=self.metrics,
            state=self._tick_state,
            handlers=TickHandlers(
                cancel=lambda task_id: self.executor.cancel(task_id, "user"),
                latest_config=self.config.newer_version_seen,
                control_pending=self._control_pending,
                unregistered=self._unregistered,
                schema_revisions=self._schema_seen,
                prune_due=lambda: self.pruner.due(),
                schedule_wait=lambda wait: self.scheduler.next_due_in(wait),
                peers=self._fleet_seen,
            ),
            clock=clock,
        )
        # Retention on a connection of its own, opened the first time something is due.
        self._prune_db = Database(
            url, "taskfleet-worker-prune", synchronous_commit=sync, pooled=pooled
        )
        self.pruner = Pruner(
            policy=settings.retention,
            database=self._prune_db,
            metrics=self.metrics,
            budget=settings.sweep_interval,
            clock=clock,
        )
        # Its statistics read on the pruner's connection; VACUUM on a direct one of its own.
        self.vacuumer = Vacuumer(
            policy=settings.vacuum,
            stats=self._prune_db,
            connect=direct_connect(settings.listen_url),
            metrics=self.metrics,
            clock=clock,
        )
        self.scheduler = Scheduler(
            database=self._io_db, registry=registry, metrics=self.metrics, sleep=self._sleep
        )
        self._scheduler_loop: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------------------------------
    # What others read
    # ----------------------------------------------------------------------------------------

    @property
    def applied_version(self) -> int:
        return self.config.applied_version

    @property
    def config_applied(self) -> asyncio.Event:
        """Set every time a config version is applied (tests wait on it)."""
        return self.config.applied

    @property
    def inflight(self) -> int:
        """Running tasks in the regular slots (the control slot excluded)."""
        return self.slots.inflight

    @property
    def strict_inflight(self) -> int:
        return self.slots.strict_inflight

    @property
    def control_inflight(self) -> int:
        return self.slots.control_inflight

    @property
    def handler_threads_running(self) -> int:
        """Blocking handlers whose thread still runs (after a timeout, cancel, or drain)."""
        return self.slots.threads_running

    def not_ready_reasons(self) -> list[str]:
        """For /readyz: empty when ready, else why not (readiness.py says what ready is)."""
        return not_ready_reasons(
            ReadinessInputs(
                status=self.status,
                connections_failing={
                    "claim": self._claim_db.failing,
                    "outcomes": self._io_db.failing,
                    "heartbeat": self._tick_db.failing,
                },
                listen_enabled=self.settings.listen_enabled,
                listener_connected=self.listener.connected.is_set(),
                schema_problem=self.schema_problem,
                claim_problem=self.claim_loop.problem(),
            )
        )

    @property
    def healthy(self) -> bool:
        return not self.not_ready_reasons()

    def request_config_refresh(self) -> None:
        """Read the latest config version soon."""
        self.config.schedule_refresh()

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
            asyncio.create_task(self.claim_loop.run(), name="claim-loop"),
            asyncio.create_task(self.outcomes.run(), name="finish-loop"),
            asyncio.create_task(self.heartbeat.run(), name="tick-loop"),
            asyncio.create_task(self.pruner.run(), name="prune-loop"),
            asyncio.create_task(self.vacuumer.run(), name="vacuum-loop"),
        ]
        self._scheduler_loop = asyncio.create_task(self.scheduler.run(), name="scheduler")
        self._loops.append(self._scheduler_loop)
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
        self.outcomes.stopping()
        self.claim_loop.wake()

    async def _start_up(self) -> bool:
        """Read the config and register; False when stopped first or the id is taken."""
        retry = LoopBackoff(base=0.2, cap=5.0)
        #: The heartbeat of the live row that holds our id, when we first saw it.
        held_since: datetime | None = None
        while not self._stop.is_set():
            try:
                if not self._schema_usable(await self._schema_revisions()):
                    # Nothing is registered or claimed on a schema this code was not written
                    # for; /readyz says why. Checked again until it is usable.
                    await self._sleep(SCHEMA_RECHECK_SECONDS)
                    continue
                await self.config.refresh(ack=False)
                if await self._register():
                    return True
                (owner,) = await self._io_db.fetch(queries.worker_get, id=self.id) or [None]
            except DATABASE_ERRORS as exc:
                refusal = db.pooler_refusal(exc)
                if refusal is not None:
                    # A setting is wrong: retrying cannot help. Exit (a supervisor shows the
                    # crash loop) instead of looking alive while claiming nothing.
                    log.error("worker %s cannot start: %s", self.id, refusal)
                    self.exit_code = EXIT_BAD_SETTING
                    return False
                delay = retry.next()
                log.warning(
                    "start-up failed (database unavailable: %s); retrying in %.2fs",
                    first_line(exc),
                    delay,
                )
                await self._sleep(delay)
                continue
            if owner is None:
                continue  # deleted meanwhile: register again
            if held_since is not None and owner["last_heartbeat"] > held_since:
                # Its heartbeat moved on: another process lives under this id.
                self._refuse_duplicate(owner)
                return False
            held_since = held_since or owner["last_heartbeat"]
            # A dead process's row stays "alive" for up to 3 heartbeats: check again soon.
            await self._sleep(min(1.0, float(owner["heartbeat_interval"]) / 2))
        return False

    async def _schema_revisions(self) -> list[str]:
        try:
            rows = await self._io_db.fetch(queries.schema_revision)
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return []  # not migrated at all
        return sorted(str(r["version_num"]) for r in rows)

    def _schema_usable(self, found: list[str]) -> bool:
        """Record whether the schema is the one this code expects; log each change once."""
        problem = schema_problem(found, head=self.expected_revision, known=self._known_revisions)
        if problem != self.schema_problem:
            if problem is not None:
                log.error("worker %s claims nothing: %s", self.id, problem)
            elif self.schema_problem is not None:
                log.info("worker %s: the schema is at revision %s again", self.id, found[0])
            self.schema_problem = problem
        return problem is None

    def _schema_seen(self, found: list[str]) -> None:
        """Every tick: pause claiming while the schema is not the expected one."""
        if self._schema_usable(found):
            self.claim_loop.resume()
        else:
            assert self.schema_problem is not None
            self.claim_loop.pause(self.schema_problem)

    async def _register(self) -> bool:
        rows = await self._io_db.fetch(
            queries.worker_register,
            id=self.id,
            hostname=self.hostname,
            pid=self.pid,
            concurrency=self.settings.concurrency,
            heartbeat_interval=self.settings.heartbeat_interval,
            lease_ttl=self.settings.lease_ttl,
            applied_config_version=self.applied_version,
            metrics_port=self.metrics_port,
            task_types=self.task_types,
            tags=list(self.settings.worker_tags),
        )
        if rows:
            self._fleet_seen(int(rows[0]["other_live_workers"]))
        return bool(rows)

    def _refuse_duplicate(self, owner: Any) -> None:
        self.exit_code = EXIT_DUPLICATE_ID
        log.error(
            "worker id %r is already in use by a live worker (host %s, pid %s, last heartbeat "
            "%.1fs ago): give this worker another --worker-id (TASKFLEET_WORKER_ID), or stop "
            "the other one",
            self.id,
            owner["hostname"],
            owner["pid"],
            owner["heartbeat_age"],
        )

    async def _drain(self) -> None:
        """Stop claiming, let running tasks finish within drain_timeout, give the rest back."""
        self.status = "draining"
        self.ready.clear()
        if self._scheduler_loop is not None:
            # A draining worker enqueues nothing more: the others fire the next slots.
            await stop_tasks([self._scheduler_loop])
        log.info("draining: %d task(s) running", len(self.slots))
        claim_loop = self._loops[0] if self._loops else None
        if claim_loop is not None:
            # Let a claim in flight finish: its statement writes the outcomes it carries and
            # claims rows, and cancelling it midway would lose track of both. The loop ends at
            # its next look at the stop request (its waits end at once); a second stop request
            # or the statement timeout bounds the wait.
            force = asyncio.create_task(self._force_stop.wait())
            await asyncio.wait(
                [claim_loop, force],
                timeout=STATEMENT_TIMEOUT + CLIENT_TIMEOUT_MARGIN,
                return_when=asyncio.FIRST_COMPLETED,
            )
            force.cancel()
            await stop_tasks([claim_loop])
        with contextlib.suppress(Exception):
            await self._set_status(WorkerStatus.DRAINING)
        running = [r.task for r in self.slots.all() if r.task is not None]
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
            unfinished = self.executor.interrupt_all()
            if unfinished:
                log.warning("drain timeout: returning %d task(s) to pending", unfinished)
            await self._await_interrupted(all_done)
        # Write every outcome (retrying through database blips, bounded).
        deadline = self.clock() + max(5.0, self.settings.drain_timeout)
        while self.outcomes.busy and self.clock() < deadline:
            self.outcomes.kick()
            await asyncio.sleep(0.02)
        # The heartbeat first, and not by a cancel: a tick cut off mid-statement could still
        # commit on the server after the row is marked offline below (it says draining).
        self.heartbeat.stop()
        if len(self._loops) > 2:
            await asyncio.wait([self._loops[2]], timeout=self._tick_db.statement_bound)
        await stop_tasks(self._loops[1:])
        if len(self.outcomes):
            log.error("could not write %d outcome(s); their leases will expire", len(self.outcomes))
        with contextlib.suppress(Exception):
            await self._set_status(WorkerStatus.OFFLINE)
        await self._close()
        self.status = "stopped"
        log.info("worker %s stopped", self.id)

    async def _await_interrupted(self, all_done: asyncio.Future[Any]) -> None:
        """Wait for the attempts just interrupted to end, cancelling again those that have not
        (a cancel can be lost), for at most INTERRUPTED_GRACE seconds or until a second stop
        request. A handler that swallows every cancel is left running: its attempt writes no
        outcome, the process exits without waiting for it (run_worker_process), and its lease
        expires then, so the sweep returns the task to the queue, as for a blocking handler
        whose thread outlives the drain."""
        deadline = self.clock() + INTERRUPTED_GRACE
        while not all_done.done() and not self._force_stop.is_set():
            left = deadline - self.clock()
            if left <= 0:
                break
            force = asyncio.create_task(self._force_stop.wait())
            await asyncio.wait(
                [all_done, force],
                timeout=min(RECANCEL_SECONDS, left),
                return_when=asyncio.FIRST_COMPLETED,
            )
            force.cancel()
            for running in self.slots.all():
                if running.task is not None and not running.task.done() and running.started:
                    running.task.cancel()
        stuck = [r for r in self.slots.all() if r.task is not None and not r.task.done()]
        self.attempts_abandoned = len(stuck)
        if stuck:
            log.error(
                "%d task(s) ignore their cancel (%s): left running; their leases expire when "
                "this process exits and the sweep returns them to the queue",
                len(stuck),
                ", ".join(str(r.id) for r in stuck[:10]),
            )
        else:
            await all_done

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _close(self) -> None:
        # Unfinished re-grouping is left to the lease sweeps of the workers that stay.
        await stop_tasks(self._background)
        self.handlers.shutdown()
        self.config.close()
        await self.listener.stop()
        await self._claim_db.close()
        await self._io_db.close()
        await self._tick_db.close()
        await self._prune_db.close()

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
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    # ----------------------------------------------------------------------------------------
    # Routing what the heartbeat and the listener learn
    # ----------------------------------------------------------------------------------------

    def _tick_state(self) -> TickState:
        return TickState(
            status=(
                WorkerStatus.DRAINING if self.status == "draining" else WorkerStatus.ONLINE
            ).value,
            inflight=self.inflight,
            strict_inflight=self.strict_inflight,
            applied_version=self.applied_version,
            # Running, or finished with the outcome not yet written: the lease stays ours.
            held=[*self.slots.held(), *self.outcomes.held()],
        )

    def _fleet_seen(self, other_live_workers: int) -> None:
        """At registration and every tick: a lone worker writes its outcomes at once."""
        at_once = outcomes_at_once(other_live_workers)
        if at_once != self.outcomes.at_once:
            log.info(
                "%s other live worker(s): outcomes are written %s",
                other_live_workers,
                "at once, while the next claim runs" if at_once else "with the next claim",
            )
            self.outcomes.write_at_once(at_once)

    def _control_pending(self) -> None:
        self.claim_loop.hint_control()
        self.claim_loop.hint_work()

    async def _unregistered(self) -> None:
        if self.status == "running":
            log.warning("worker row missing or taken over; registering again")
            if not await self._start_up() and self.exit_code == EXIT_DUPLICATE_ID:
                self.request_stop()

    def _on_notification(self, message: protocol.Message) -> None:
        if isinstance(message, protocol.TaskReady):
            self.claim_loop.on_task_ready(message.lanes, control=message.control)
        elif isinstance(message, protocol.ConfigUpdated):
            self.config.newer_version_seen(message.version)
        elif isinstance(message, protocol.Malformed):
            log.warning(
                "ignored malformed notification on %s (%s): %r",
                message.channel,
                message.reason,
                message.payload,
            )

    async def _on_listener_connect(self) -> None:
        # After every (re)connect: catch up on whatever was missed while not listening.
        self.claim_loop.hint_anywhere()
        if self.status == "running":
            self.config.schedule_refresh()
