"""The scheduler loop: one per worker process (docs/reference.md#scheduling).

Waits for a free slot, claims up to the free slots in one statement (carrying the outcomes
written since the last claim), hands each task to the executor, and repeats at once. It sleeps
only when a claim returns nothing: until a wake-up (a notification, a retry written, a config
applied), the poll interval, or shutdown. A busy worker sends no claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

import asyncpg

from taskfleet.shared import queries
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import LoopBackoff
from taskfleet.shared.policy.claim_plan import ClaimPlan, ClaimPlanner
from taskfleet.shared.policy.groups import GroupKey, group_name
from taskfleet.shared.policy.lanes import Lane
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.database import DATABASE_ERRORS, Database, rejected_statement
from taskfleet.worker.executor import Executor
from taskfleet.worker.outcomes import OutcomeWriter, finish_params, settle
from taskfleet.worker.slots import Running, Slots
from taskfleet.worker.wakeup import Flag, wait_any

log = logging.getLogger("taskfleet.worker")

#: A claim round trip takes milliseconds; one in flight this long is stuck (on a lock, or a
#: server that does not answer), and /readyz says so.
CLAIM_STALL_SECONDS = 5.0


class ClaimLoop:
    """Claims work into free slots. Other parts only hint at it (``hint_*``) or stop it."""

    def __init__(
        self,
        *,
        settings: WorkerSettings,
        worker_id: str,
        database: Database,
        planner: ClaimPlanner,
        slots: Slots,
        outcomes: OutcomeWriter,
        executor: Executor,
        metrics: WorkerMetrics,
        types: list[str],
        stop: asyncio.Event,
        clock: Callable[[], float] = time.monotonic,
        on_claimed: Callable[[int], None] | None = None,
    ) -> None:
        self._settings = settings
        #: Told how many tasks each claim took (the vacuum's counter; see vacuum.py).
        self._on_claimed = on_claimed
        self._worker_id = worker_id
        self._db = database
        self._planner = planner
        self._slots = slots
        self._outcomes = outcomes
        self._executor = executor
        self._metrics = metrics
        self._types = types
        self._stop = stop
        self._clock = clock
        self._work_hint = Flag()
        self._control_event = Flag()
        self._control_hint = False
        #: Every wake-up since the loop last slept named its lanes (notifications).
        self._named_lanes_only = False
        #: Bumped by every hint: a claim's shortfall is trusted only if none came meanwhile.
        self._hint_generation = 0
        #: The last claim's probe saw strict work that only the strict cap held back.
        self._strict_held_back = False
        self._last_dry_reset = 0.0
        #: Why claiming is paused (the schema is not the expected one), or None.
        self._paused: str | None = None
        self._resumed = Flag()
        #: When the claim statement in flight was sent (None: none in flight).
        self._in_flight_since: float | None = None
        #: Resolved when the claim in flight returns (None: none in flight).
        self._in_flight_done: asyncio.Future[None] | None = None
        #: The last claim failed (cleared by the next that succeeds).
        self._failing = False
        #: A claim in flight longer than this is stuck (readiness).
        self.stall_after = CLAIM_STALL_SECONDS
        #: When a fleet-wide rate limit that held work back gets its next token (clock time),
        #: or None: the loop asks again then, not at its poll interval.
        self._limit_retry_at: float | None = None
        #: The config under which the database said a label limit is active although the config
        #: has none (not applied here yet): claims use the limited statement until the next.
        self._limits_seen_under: object | None = None
        self._tags = list(settings.worker_tags)

    # ---------------------------------------------------------------- hints

    def hint_work(self) -> None:
        """This process made work claimable (a retry written, a config applied): claim soon."""
        self._hint_generation += 1
        self._named_lanes_only = False  # this wake-up names no lane: try them all
        self._work_hint.set()

    def on_task_ready(self, lanes: Iterable[str] | None, *, control: bool) -> None:
        """A wake-up notification: new work in ``lanes`` (None: any lane)."""
        if control:
            self.hint_control()
        self._hint_generation += 1
        self._planner.reset_dry(lanes)
        # Only while nothing else woke the loop (a general wake-up resets every lane).
        self._named_lanes_only = lanes is not None and (
            self._named_lanes_only or not self._work_hint.is_set()
        )
        self._work_hint.set()

    def hint_anywhere(self) -> None:
        """Anything may have been missed (a listener reconnect): every lane is worth a try."""
        self._hint_generation += 1
        self._named_lanes_only = False
        self._planner.reset_dry()
        self._work_hint.set()

    def hint_control(self) -> None:
        """A control-lane task waits: claim it even into a busy worker's spare slot."""
        self._control_hint = True
        self._control_event.set()

    def control_slot_freed(self) -> None:
        # A config task that arrived meanwhile (its wake-up came while the slot was busy) is
        # claimed now, not at the next poll.
        self._planner.reset_dry([Lane.CONTROL.value])
        self.hint_work()

    def wake(self) -> None:
        """Shutdown (after the stop event is set): end any wait."""
        self._work_hint.set()
        self._slots.freed.set()
        self._control_event.set()
        self._resumed.set()

    def pause(self, reason: str) -> None:
        """Claim nothing until resume() (outcomes still go out)."""
        self._paused = reason
        self._resumed.clear()

    def resume(self) -> None:
        if self._paused is not None:
            self._paused = None
            self._resumed.set()
            self.hint_anywhere()

    async def settled(self) -> None:
        """Return once the claim in flight now (planned under the config it was planned with)
        has returned; at once when none is. A config is applied only then: after its ACK, no
        claim planned before it can still start work it pauses or limits."""
        done = self._in_flight_done
        if done is not None:
            await asyncio.shield(done)

    def problem(self) -> str | None:
        """Why the loop is not making progress, or None (for /readyz)."""
        if self._paused is not None:
            return f"claiming is paused: {self._paused}"
        if self._failing:
            return "the last claim failed"
        since = self._in_flight_since
        if since is not None and self._clock() - since > self.stall_after:
            return f"a claim has been in flight for more than {self.stall_after:g}s"
        return None

    # ---------------------------------------------------------------- the loop

    async def run(self) -> None:
        retry = LoopBackoff()
        while not self._stop.is_set():
            if self._paused is not None:
                self._outcomes.claim_waiting()
                await self._wait_any(self._resumed, timeout=None)
                self._outcomes.claim_pending = True
                continue
            now = self._clock()
            if now - self._last_dry_reset >= self._settings.poll_interval:
                # Delayed tasks and retries become ready without a notification.
                self._planner.reset_dry()
                self._last_dry_reset = now
            elif self._limit_retry_at is not None and now >= self._limit_retry_at:
                # A rate limit's next token is due: work it held back may be claimable now.
                self._limit_retry_at = None
                self._planner.reset_dry([Lane.STRICT.value, Lane.NORMAL.value])
            free = self._slots.free
            control_free = self._slots.control_inflight == 0
            if free <= 0:
                if control_free and self._control_hint:
                    plan = ClaimPlan(control=1)
                else:
                    # Every slot is busy: only a freed slot or a control-lane task matters now.
                    # (A general wake-up must not wake this wait, or the loop would spin.)
                    self._slots.freed.clear()
                    self._control_event.clear()
                    self._outcomes.claim_waiting(slots_full=True)
                    await self._wait_any(self._slots.freed, self._control_event, timeout=None)
                    self._outcomes.claim_pending = True
                    continue
            else:
                plan = self._planner.plan(
                    free_slots=free,
                    strict_inflight=self._slots.strict_inflight,
                    control_free=control_free,
                )
            if plan.total == 0:
                # Nothing claimable now: sleep until a hint, the poll interval, or stop; and, when
                # strict work may be held back only by the cap (the cap is full and the strict
                # lane is not known to be empty), until a slot frees.
                self._outcomes.claim_waiting()
                events = [self._work_hint]
                if plan.probe_strict or self._strict_held_back:
                    self._slots.freed.clear()
                    events.append(self._slots.freed)
                timeout = self._settings.poll_interval
                if self._limit_retry_at is not None:
                    timeout = max(0.0, min(timeout, self._limit_retry_at - self._clock()))
                    self._limit_retry_at = None
                await self._wait_any(*events, timeout=timeout)
                self._outcomes.claim_pending = True
                self._work_hint.clear()
                if self._named_lanes_only:
                    # A wake-up that named its lanes already made them claimable: trying the
                    # others again would cost a claim per pickup (strict first, then normal).
                    # The others still get their poll: wake-ups naming one lane more often than
                    # the poll interval must not keep due work in another (delayed tasks, retries
                    # written elsewhere) waiting for ever.
                    self._named_lanes_only = False
                else:
                    self._planner.reset_dry()
                    self._last_dry_reset = self._clock()
                continue
            generation = self._hint_generation
            self._work_hint.clear()
            if plan.control:
                self._control_hint = False
            outcomes = self._outcomes.take_for_claim()
            self._in_flight_since = self._clock()
            done = self._in_flight_done = asyncio.get_running_loop().create_future()
            config = self._planner.config
            # With a label limit active, the claim that keeps the limits' accounting; without,
            # the plain one, which takes nothing limited (it answers limits_active instead).
            limited = bool(config.label_limits) or self._limits_seen_under is config
            if limited:
                query = queries.task_claim_limited
                if not plan.probes:
                    plan = replace(plan, probes=True)  # the limited claim always probes
            elif plan.probes:
                query = queries.task_claim
            elif plan.control or plan.strict or outcomes:
                query = queries.task_claim_steady
            else:
                query = queries.task_claim_normal
            try:
                rows = await self._claim(
                    done,
                    query,
                    **finish_params(outcomes),
                    control_limit=plan.control,
                    strict_limit=plan.strict,
                    group_keys=plan.group_keys,
                    group_limits=plan.group_limits,
                    probe_strict=plan.probe_strict,
                    probe_normal=plan.probe_normal,
                    worker_id=self._worker_id,
                    lease_ttl=self._settings.lease_ttl,
                    types=self._planner.claim_types(self._types),
                    tags=self._tags,
                    paused_labels=self._planner.paused_labels,
                )
            except asyncio.CancelledError:
                self._outcomes.put_back(outcomes)  # never drop an outcome, even now
                raise
            except DATABASE_ERRORS as exc:
                self._in_flight_since = None
                self._failing = True
                # Never drop an outcome. If the server refused the statement, one of them may
                # be at fault: they go out on their own, and the next claim carries none.
                self._outcomes.put_back(outcomes, refused=rejected_statement(exc))
                delay = retry.next()
                log.warning("claim failed (%s); retrying in %.2fs", first_line(exc), delay)
                self._outcomes.claim_waiting()
                await self._sleep(delay)
                self._outcomes.claim_pending = True
                continue
            retry.reset()
            self._outcomes.settled(outcomes)
            self._in_flight_since = None
            self._failing = False
            if outcomes:
                written = (
                    dict(
                        zip(
                            zip(rows[0]["finished_ids"], rows[0]["finished_attempts"], strict=True),
                            rows[0]["finished_statuses"],
                            strict=True,
                        )
                    )
                    if rows
                    else {}
                )
                settle(outcomes, written, self._metrics)
            claimed: Counter[tuple[Lane, GroupKey]] = Counter()
            for row in rows:
                if row["id"] is None:
                    continue
                running = self._start(row)
                claimed[(running.lane, running.group)] += 1
            metrics = self._metrics
            # One increment per series a claim moved, not per task.
            for (lane, group), n in claimed.items():
                metrics.series(
                    metrics.claims, lane.value, group_name(group) if lane is Lane.NORMAL else ""
                ).inc(n)
            metrics.series(metrics.claim_queries, "claimed" if claimed else "empty").inc()
            if claimed and self._on_claimed is not None:
                self._on_claimed(claimed.total())
            if rows and rows[0]["limits_active"] and not limited:
                # The database has a limit this worker's config does not show yet: claim again
                # at once with the accounting (nothing but control was taken; nothing is dry).
                self._limits_seen_under = config
                generation = -1
                self.hint_work()
            limit_wait = rows[0]["limit_wait_seconds"] if rows else None
            if limit_wait is not None:
                self._limit_retry_at = self._clock() + max(0.0, float(limit_wait))
            if plan.probe_strict:
                self._strict_held_back = bool(rows and rows[0]["strict_waiting"])
                if self._strict_held_back:
                    self._metrics.strict_saturation.inc()
            elif plan.strict:
                self._strict_held_back = False
            # Charged for what it got; a shortfall is trusted only if no new work was announced
            # meanwhile, and one caused by another worker's locks (contended) is not dryness.
            self._planner.observe(
                plan,
                claimed,
                normal_waiting=bool(rows and rows[0]["normal_waiting"]),
                contended=[g or None for g in rows[0]["contended_groups"]] if rows else (),
                strict_contended=bool(rows and rows[0]["strict_contended"]),
                shortfall_trusted=generation == self._hint_generation,
            )
            self._slots.publish()

    async def _claim(
        self, done: asyncio.Future[None], query: queries.Query, **params: object
    ) -> list[asyncpg.Record]:
        """Send one claim; ``done`` resolves when it returns, whatever the outcome."""
        try:
            return await self._db.fetch(query, **params)
        finally:
            self._in_flight_done = None
            done.set_result(None)

    def _start(self, row: asyncpg.Record) -> Running:
        lane, group = self._planner.classify(row["priority"], list(row["labels"]), row["group_key"])
        running = Running(
            id=row["id"],
            type=row["type"],
            lane=lane,
            group=group,
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            timeout=row["timeout"],
            labels=tuple(row["labels"]),
        )
        metrics = self._metrics
        metrics.series(metrics.task_wait, lane.value).observe(max(0.0, row["wait_seconds"] or 0.0))
        self._executor.start(running, row["payload"], cancel_requested=row["cancel_requested"])
        return running

    async def _wait_any(self, *flags: Flag, timeout: float | None) -> None:
        # The stop event is not among them: a stop sets it, then wake() sets every flag.
        if not self._stop.is_set():
            await wait_any(flags, timeout=timeout)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short by a stop request."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()
