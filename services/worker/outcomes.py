"""Writing finished attempts: the outcome queue and the finish loop.

A finished attempt becomes an :class:`Outcome` in the queue. Outcomes ride along with the next
claim when the claim loop is about to claim anyway (one round trip for both); otherwise the finish
loop writes everything queued in one statement. A worker that is alone in the fleet writes them
at once instead, while its next claim runs (``at_once``: policy/outcome_path.py says why); a
claim then carries only what arrived while the finish loop was writing. "At once" gathers for a
moment while the worker is busy (:data:`LINGER_SECONDS`): one statement then carries several
claims' outcomes. Nothing is dropped: a failed write puts the batch back and is retried with
backoff.

An outcome is counted (``taskfleet_task_outcomes_total``) when, and only when, the database
accepted its write: the statements are fenced by (id, worker, attempt, status running) and
return what they wrote (:func:`settle`). An attempt whose lease was lost meanwhile (the task was
rescued and runs elsewhere) is not counted here: its real outcome is counted where it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from taskfleet.shared import queries
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import LoopBackoff
from taskfleet.shared.schema import TaskStatus
from taskfleet.shared.storable import escape_text
from taskfleet.worker.database import DATABASE_ERRORS, Database, rejected_statement

log = logging.getLogger("taskfleet.worker")

#: The status of a drain release: given back to pending, the attempt not counted.
RELEASED = "released"

#: A lone worker writes its outcomes on their own (``at_once``), but not in one statement per
#: claim while it is busy: the finish loop gathers them for up to this long after the first, or
#: until :data:`LINGER_CLAIMS` claims' worth are queued. Two statements for every ten tasks cost a
#: drain's two cores more than the claims could spare; one statement for several claims' outcomes
#: let the claims run alone (docs/benchmarks.md, "A lone worker's outcomes gathered"). Nothing
#: waits once the worker has nothing to claim: an idle worker's outcome is written at once, and so
#: is a runtime-config task's, a refused one, and everything at shutdown.
LINGER_SECONDS = 0.005
#: ... or until this many times the worker's concurrency are queued (at most LINGER_MAX_QUEUED).
LINGER_CLAIMS = 5
LINGER_MAX_QUEUED = 1000


@dataclass(frozen=True)
class Outcome:
    """A finished attempt waiting to be written."""

    id: int
    #: The attempt this is the outcome of: the write is fenced by it.
    attempt: int
    status: str  # completed | failed | cancelled | pending (retry) | released (drain)
    result: str | None = None
    error: str | None = None
    retry_in: float = 0.0
    #: A statement carrying it was refused: write it on its own, never with a claim.
    alone: bool = False
    #: The task's type (the ``type`` label of the outcome counter).
    type: str = field(kw_only=True)
    #: Called once the database accepted the write (the control task's metrics).
    on_written: Callable[[], None] | None = field(default=None, kw_only=True, compare=False)

    def label(self, written_status: str) -> str:
        """The ``outcome`` label of this attempt, written with ``written_status`` (a retry or
        a release of a task whose cancel was requested is written cancelled): completed,
        retried, failed, cancelled or released."""
        if written_status == TaskStatus.PENDING.value:
            return RELEASED if self.status == RELEASED else "retried"
        return written_status


@dataclass(frozen=True)
class ControlResult:
    """What the control task (the runtime-config writer) returns: its result, and what to
    record once the database has accepted the task's completion (never before: a completion
    refused because the lease was lost records nothing)."""

    result: dict[str, Any]
    on_written: Callable[[], None] | None = field(default=None, compare=False)


def finish_params(outcomes: list[Outcome]) -> dict[str, list[Any]]:
    """The ``fin_*`` parameters of ``task_finish_batch`` and ``task_claim``."""
    return {
        "fin_ids": [o.id for o in outcomes],
        "fin_attempts": [o.attempt for o in outcomes],
        "fin_statuses": [o.status for o in outcomes],
        "fin_results": [o.result for o in outcomes],
        "fin_errors": [o.error for o in outcomes],
        "fin_retry_in": [o.retry_in for o in outcomes],
    }


class OutcomeWriter:
    """The queue of outcomes and the loop that writes them."""

    def __init__(
        self,
        database: Database,
        worker_id: str,
        metrics: WorkerMetrics,
        *,
        on_retry_written: Callable[[], None],
        concurrency: int = 1,
    ) -> None:
        self._db = database
        self._worker_id = worker_id
        self._metrics = metrics
        self._on_retry_written = on_retry_written
        self._queue: list[Outcome] = []
        #: (task id, attempt) of the outcomes in a statement in flight (the finish loop's, or
        #: a claim carrying them): still this worker's leases until the statement returns.
        self._writing: set[tuple[int, int]] = set()
        self._event = asyncio.Event()
        #: A batch is being written by the finish loop (drain waits for it).
        self._flushing = False
        #: True while the claim loop will claim soon (outcomes can ride along with the claim).
        self.claim_pending = True
        #: The claim loop waits for a slot to free (claim_waiting(slots_full=True)).
        self._slots_full = False
        #: Write outcomes at once rather than with the next claim (policy/outcome_path.py).
        self.at_once = False
        #: While at once and busy: how long the first outcome waits for more, and how many
        #: make the statement go out without waiting longer (LINGER_SECONDS, LINGER_CLAIMS).
        self.linger = LINGER_SECONDS
        self.linger_target = max(1, min(LINGER_MAX_QUEUED, LINGER_CLAIMS * concurrency))
        self._stopping = False

    # ---------------------------------------------------------------- the queue

    def put(self, outcome: Outcome) -> None:
        self._queue.append(outcome)
        if self.at_once and not self._stopping:
            # The first starts the finish loop's gathering; enough, one that must not wait (the
            # runtime-config task's: its ACK waits for this write), or an idle claim loop ends it.
            if (
                len(self._queue) == 1
                or len(self._queue) >= self.linger_target
                or outcome.on_written is not None
                or not self._claiming
            ):
                self._event.set()
            return
        if self.at_once or not self.claim_pending or self._stopping:
            # Otherwise it rides the next claim; a claim loop that goes to wait instead says so
            # (claim_waiting), which wakes the finish loop then.
            self._event.set()

    def put_back(self, outcomes: list[Outcome], *, refused: bool = False) -> None:
        """Outcomes a failed statement carried: first in line again, never dropped. ``refused``:
        the server refused the statement itself, so one of them may be at fault; the finish
        loop writes them one by one, apart from the claims."""
        if refused:
            outcomes = [replace(o, alone=True) for o in outcomes]
            self._event.set()
        self._queue[:0] = outcomes
        self.settled(outcomes)

    def take_for_claim(self) -> list[Outcome]:
        """Outcomes to write with the next claim (drain releases go by ``task_release``). The
        caller hands them back: :meth:`settled` once the claim returned, else :meth:`put_back`.
        Written at once, they are left to the finish loop unless it is busy writing others."""
        if self.at_once and not self._flushing:
            return []
        taken = [o for o in self._queue if o.status != RELEASED and not o.alone]
        if taken:
            self._queue = [o for o in self._queue if o.status == RELEASED or o.alone]
            self._writing.update((o.id, o.attempt) for o in taken)
        return taken

    def settled(self, outcomes: list[Outcome]) -> None:
        """The statement that carried ``outcomes`` returned: they are no longer in flight."""
        self._writing.difference_update((o.id, o.attempt) for o in outcomes)

    def claim_waiting(self, *, slots_full: bool = False) -> None:
        """The claim loop is about to wait: what it would have carried goes out on its own.
        ``slots_full``: it waits for a slot to free, which a finishing task brings soon: outcomes
        written at once go on gathering (nothing is written sooner by stopping now)."""
        self.claim_pending = False
        self._slots_full = slots_full
        if self._queue and not (slots_full and self.at_once):
            self._event.set()

    @property
    def _claiming(self) -> bool:
        """The claim loop is claiming, or waits only for a slot to free: outcomes written at
        once may gather for a moment (more are coming)."""
        return self.claim_pending or self._slots_full

    def held(self) -> list[tuple[int, int]]:
        """(task id, attempt) finished here whose outcome is not written yet, queued or in a
        statement in flight: the lease stays ours until that statement has returned (a sweep
        that ran meanwhile took a task whose outcome was on its way)."""
        return [*((o.id, o.attempt) for o in self._queue), *self._writing]

    @property
    def busy(self) -> bool:
        """Outcomes queued or being written (by the finish loop or a claim)."""
        return bool(self._queue) or self._flushing or bool(self._writing)

    def __len__(self) -> int:
        return len(self._queue)

    def stopping(self) -> None:
        """Shutdown: write at once, no more waiting for a claim to carry them."""
        self._stopping = True
        self._event.set()

    def kick(self) -> None:
        self._event.set()

    def write_at_once(self, at_once: bool) -> None:
        """From now on, write outcomes at once (True) or let the next claim carry them."""
        self.at_once = at_once
        if at_once and self._queue:
            self._event.set()

    # ---------------------------------------------------------------- writing

    async def run(self) -> None:
        retry = LoopBackoff(base=0.05, cap=2.0)
        while True:
            await self._event.wait()
            self._event.clear()
            if (
                self.at_once
                and self._claiming
                and not self._stopping
                and 0 < len(self._queue) < self.linger_target
            ):
                # Gathering: until enough are queued, the worker goes idle, a stop, or the
                # linger is up (each of which sets the event).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.linger):
                        await self._event.wait()
                self._event.clear()
            alone = any(o.alone for o in self._queue)
            if not self._queue or (
                self.claim_pending and not self.at_once and not self._stopping and not alone
            ):
                # The claim loop is about to claim: the outcomes ride along in that statement.
                continue
            batch, self._queue = self._queue, []
            in_flight = list(batch)
            self._writing.update((o.id, o.attempt) for o in in_flight)
            self._flushing = True
            try:
                if alone:
                    await self._write_one_by_one(batch)
                else:
                    await self._write(batch)
                retry.reset()
            except DATABASE_ERRORS as exc:
                # ``batch`` is what was not written (one by one, the rest of it).
                if rejected_statement(exc):
                    # One outcome the server refuses must never block the others: split.
                    self._queue[:0] = [replace(o, alone=True) for o in batch]
                    self._event.set()
                    continue
                # Never drop an outcome: put it back and try again.
                self._queue[:0] = batch
                delay = retry.next()
                log.warning(
                    "writing %d outcome(s) failed (%s); retrying in %.2fs",
                    len(batch),
                    first_line(exc),
                    delay,
                )
                await asyncio.sleep(delay)
                self._event.set()
            except BaseException:
                # A cancel (shutdown): what was not written stays queued, never dropped.
                self._queue[:0] = batch
                raise
            finally:
                self._flushing = False
                self.settled(in_flight)

    async def _write_one_by_one(self, batch: list[Outcome]) -> None:
        """Each outcome in a statement of its own; one the server refuses is written as a
        failure saying why, so the task ends and its slot's lease is not held for nothing. When
        it raises, ``batch`` is left holding the outcomes not written yet."""
        for index, outcome in enumerate(batch):
            try:
                try:
                    await self._write([replace(outcome, alone=False)])
                except DATABASE_ERRORS as exc:
                    if not rejected_statement(exc):
                        raise
                    log.error(
                        "task %d: the database refused its outcome %s (%s); failing it",
                        outcome.id,
                        outcome.status,
                        exc,
                    )
                    try:
                        await self._write([refused_outcome(outcome, exc)])
                    except DATABASE_ERRORS as again:
                        if not rejected_statement(again):
                            raise
                        # Nothing more to try: the lease expires and the sweep ends it.
                        log.error("task %d: the failure was refused too (%s)", outcome.id, again)
            except BaseException:
                del batch[:index]
                raise

    async def _write(self, batch: list[Outcome]) -> None:
        finished = [o for o in batch if o.status != RELEASED]
        released = [o for o in batch if o.status == RELEASED]
        if finished:
            rows = await self._db.fetch(
                queries.task_finish_batch, **finish_params(finished), worker_id=self._worker_id
            )
            settle(finished, {(r["id"], r["attempt"]): r["status"] for r in rows}, self._metrics)
            if any(o.status == TaskStatus.PENDING.value for o in finished):
                self._on_retry_written()
        if released:
            rows = await self._db.fetch(
                queries.task_release,
                ids=[o.id for o in released],
                attempts=[o.attempt for o in released],
                worker_id=self._worker_id,
                reason="interrupted by worker shutdown; returned to pending",
            )
            settle(released, {(r["id"], r["attempt"]): r["status"] for r in rows}, self._metrics)


def refused_outcome(outcome: Outcome, exc: BaseException) -> Outcome:
    """What is written instead of an outcome the database refused: a failure, with the reason."""
    sqlstate = getattr(exc, "sqlstate", None) or "?"
    first_line = escape_text(str(exc)).splitlines()[0] if str(exc) else type(exc).__name__
    return Outcome(
        outcome.id,
        outcome.attempt,
        TaskStatus.FAILED.value,
        type=outcome.type,
        error=f"the database refused this attempt's outcome ({outcome.status}): "
        f"SQLSTATE {sqlstate}: {first_line}",
    )


def settle(
    written: list[Outcome], statuses: dict[tuple[int, int], str], metrics: WorkerMetrics
) -> None:
    """After a statement wrote outcomes: count each one the database accepted (``statuses``:
    the status it wrote, by task id and attempt), once, as what was written, and log the ones it
    did not write (the lease had moved on). By attempt: one statement can carry the outcomes of
    two attempts of one task (this worker lost the first's lease and claimed the next), and only
    the current one is written."""
    counted: Counter[tuple[str, str]] = Counter()
    accepted: list[Outcome] = []
    for outcome in written:
        status = statuses.get((outcome.id, outcome.attempt))
        if status is not None:
            counted[(outcome.type, outcome.label(status))] += 1
            accepted.append(outcome)
        else:
            log.warning(
                "task %d: outcome %s not written: this worker no longer holds its lease",
                outcome.id,
                outcome.status,
            )
    # One increment per series, not per outcome (each takes the counter's lock).
    for (task_type, label), n in counted.items():
        metrics.series(metrics.outcomes, task_type, label).inc(n)
    for outcome in accepted:
        if outcome.on_written is not None:
            outcome.on_written()
