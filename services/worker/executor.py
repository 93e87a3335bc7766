"""Running attempts: each claimed task in its own coroutine, its handler called once, what
happened mapped to an :class:`Outcome` (retry rules applied) and queued for the writer. The
outcome is counted by the writer once the database accepted it (``outcomes.settle``), not here.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from taskfleet.shared.context import make_context
from taskfleet.shared.errors import error_text, first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import BackoffPolicy
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE, Lane
from taskfleet.shared.registry import PermanentError, TaskRegistry
from taskfleet.shared.schema import TaskStatus
from taskfleet.shared.storable import UnstorableResult, cap_text, encode_result, escape_text
from taskfleet.worker.invocation import AttemptTimeout, HandlerRunner
from taskfleet.worker.isolation import ChildFailed
from taskfleet.worker.outcomes import RELEASED, ControlResult, Outcome, OutcomeWriter
from taskfleet.worker.slots import Running, Slots

log = logging.getLogger("taskfleet.worker")

MAX_ERROR_CHARS = 8000

#: Runs the control-lane task (the runtime-config writer): (task id, payload) -> its result, and
#: what to record once the database accepted the task's completion.
ControlRunner = Callable[[int, Any], Awaitable[ControlResult]]


def storable_error(message: str) -> str:
    """An error text Postgres can store: NULs and lone surrogates escaped, the size capped with a
    note saying how much was cut (the start and the end, where the handler's words are, kept)."""
    return cap_text(escape_text(message), MAX_ERROR_CHARS)


class Executor:
    """Starts attempts into slots and turns each into an outcome."""

    def __init__(
        self,
        *,
        registry: TaskRegistry,
        worker_id: str,
        handlers: HandlerRunner,
        slots: Slots,
        outcomes: OutcomeWriter,
        metrics: WorkerMetrics,
        backoff: BackoffPolicy,
        run_control: ControlRunner,
        on_control_slot_freed: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._worker_id = worker_id
        self._handlers = handlers
        self._slots = slots
        self._outcomes = outcomes
        self._metrics = metrics
        self._backoff = backoff
        self._run_control = run_control
        self._on_control_slot_freed = on_control_slot_freed
        self._clock = clock
        #: Retries held back until the attempt's code has ended, by the Running's identity.
        self._deferred: dict[int, Outcome] = {}

    def start(self, running: Running, payload: Any, *, cancel_requested: bool) -> None:
        """Take a slot for ``running`` and run its attempt in a coroutine of its own."""
        self._slots.add(running)
        running.task = asyncio.create_task(
            self._execute(running, payload), name=f"task-{running.id}"
        )
        if cancel_requested:
            self._interrupt(running, "user")

    def cancel(self, task_id: int, reason: str) -> None:
        """Interrupt every attempt of ``task_id`` running here (a cancel request)."""
        for running in self._slots.of_task(task_id):
            if reason == "user" and self._deferred.pop(id(running), None) is not None:
                # Its attempt ended (timed out) but its code still runs, holding back the
                # retry: a cancelled task never runs again, so the cancel is written now.
                running.cancel_reason = reason
                self._outcomes.put(
                    Outcome(
                        running.id,
                        running.attempts,
                        TaskStatus.CANCELLED.value,
                        error="cancelled",
                        type=running.type,
                    )
                )
            elif running.cancel_reason is None:
                self._interrupt(running, reason)

    def interrupt_all(self) -> int:
        """Drain timeout: interrupt every attempt still running (each is given back)."""
        unfinished = [r for r in self._slots.all() if r.task is not None and not r.task.done()]
        for running in unfinished:
            self._interrupt(running, "shutdown")
        return len(unfinished)

    @staticmethod
    def _interrupt(running: Running, reason: str) -> None:
        if running.task is None or running.task.done():
            return
        running.cancel_reason = reason
        if running.context is not None:
            running.context.cancellation.set(reason)
        if running.started:
            running.task.cancel()
        # Not started yet: cancelling now would skip its clean-up (the slot would never be
        # freed); it sees the reason on its first step instead.

    async def _execute(self, running: Running, payload: Any) -> None:
        running.started = True
        started = self._clock()
        outcome: Outcome | None
        try:
            if running.cancel_reason is not None:
                raise asyncio.CancelledError
            outcome = await self._attempt(running, payload)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if running.cancel_reason is None and (task is None or task.cancelling() == 0):
                # Nobody cancelled this attempt: the handler's own CancelledError (a future it
                # awaited was cancelled elsewhere). A failure like any other exception, retried
                # by its rules; given back uncounted it would run again at once, for ever.
                outcome = self._failure(running, exc, permanent=False)
            else:
                if task is not None:
                    task.uncancel()
                outcome = self._interrupted(running)
        finally:
            if running.thread_running:
                # A blocking handler's thread goes on after its timeout or cancel: the attempt
                # keeps its slot until the thread returns (the worker never runs more handlers
                # than its concurrency).
                assert running.thread is not None
                running.thread.add_done_callback(lambda done: self._free(running, done))
            else:
                self._free(running, None)
        metrics = self._metrics
        metrics.series(metrics.task_duration, running.lane.value).observe(self._clock() - started)
        if outcome is None:
            return
        if outcome.status == TaskStatus.PENDING.value and running.thread_running:
            # A retry while its thread still runs would let the next attempt (here or on
            # another worker) run beside it: the task stays ours, running, until the thread
            # returns. (If this process exits first, its lease expires and the sweep returns it.)
            # A cancel meanwhile replaces it (cancel()).
            assert running.thread is not None
            self._deferred[id(running)] = outcome
            running.thread.add_done_callback(lambda _: self._put_deferred(running))
            return
        self._outcomes.put(outcome)

    def _put_deferred(self, running: Running) -> None:
        outcome = self._deferred.pop(id(running), None)
        if outcome is not None:
            self._outcomes.put(outcome)

    def _interrupted(self, running: Running) -> Outcome | None:
        """The outcome of an attempt interrupted by a cancel request or the drain timeout."""
        if running.cancel_reason == "user":
            return Outcome(
                running.id,
                running.attempts,
                TaskStatus.CANCELLED.value,
                error="cancelled",
                type=running.type,
            )
        if running.thread_running:
            # Its code still runs: giving the task back now would let another worker run it
            # at the same time. It stays ours until this process exits (taking the thread with
            # it); then its lease expires and the sweep returns it to the queue.
            log.warning(
                "task %d: its handler's thread still runs at shutdown; not given back: it is "
                "rescued when its lease expires, after this process exits",
                running.id,
            )
            return None
        return Outcome(
            running.id,
            running.attempts,
            RELEASED,
            error="interrupted by worker shutdown",
            type=running.type,
        )

    def _free(self, running: Running, thread: asyncio.Future[Any] | None) -> None:
        if thread is not None and not thread.cancelled():
            thread.exception()  # retrieved: what it raised was recorded (or is moot) by now
        self._slots.remove(running)
        if running.lane is Lane.CONTROL:
            self._on_control_slot_freed()
        self._slots.publish()

    async def _attempt(self, running: Running, payload: Any) -> Outcome:
        """Run the handler once; map what happened to an outcome (retry rules applied)."""
        on_written = None
        try:
            result = await self._invoke(running, payload)
            if isinstance(result, ControlResult):
                on_written = result.on_written
                result = result.result
        except PermanentError as exc:
            return self._failure(running, exc, permanent=True)
        except BaseExceptionGroup as exc:
            # A TaskGroup's errors: permanent if one of them is (a retry would meet it again).
            permanent = exc.subgroup(PermanentError) is not None
            return self._failure(running, exc, permanent=permanent)
        except AttemptTimeout as exc:
            return self._failure(running, exc, permanent=False)
        except ChildFailed as exc:
            return self._failure(running, exc, permanent=exc.permanent)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too
            # Whatever a handler raises fails its attempt, never the worker: sys.exit() in a
            # handler (or raised in its thread) ended the event loop, and the process with it.
            return self._failure(running, exc, permanent=False)
        try:
            encoded = encode_result(result)
        except UnstorableResult as exc:
            return self._failure(running, PermanentError(str(exc)), permanent=True)
        return Outcome(
            running.id,
            running.attempts,
            TaskStatus.COMPLETED.value,
            result=encoded,
            type=running.type,
            on_written=on_written,
        )

    async def _invoke(self, running: Running, payload: Any) -> Any:
        if running.type == RUNTIME_CONFIG_TASK_TYPE:
            return await self._run_control(running.id, payload)
        definition = self._registry.get(running.type)
        if definition is None or definition.internal:
            raise PermanentError(
                f"no handler for task type {running.type!r} on worker {self._worker_id}"
            )
        if definition.takes_context or definition.isolation is not None:
            # Only for the handlers that read it: a context is two locks and a clock read,
            # paid per attempt on the hot path.
            running.context = make_context(
                task_id=running.id,
                type=running.type,
                attempt=running.attempts,
                max_attempts=running.max_attempts,
                labels=running.labels,
                worker_id=self._worker_id,
                timeout=running.timeout,
                now=datetime.now(UTC),
            )
        return await self._handlers.call(definition, payload, running, running.context)

    def _failure(self, running: Running, exc: BaseException, *, permanent: bool) -> Outcome:
        if isinstance(exc, ChildFailed):
            message = str(exc)  # the traceback, as the child process formatted it
        elif isinstance(exc, (PermanentError, AttemptTimeout)) and not exc.__cause__:
            message = f"{type(exc).__name__}: {error_text(exc)}"
        else:
            message = "".join(traceback.format_exception(exc))
        message = storable_error(message)
        definition = self._registry.get(running.type)
        policy = (definition.backoff if definition else None) or self._backoff
        if not permanent and running.attempts < running.max_attempts:
            outcome = Outcome(
                running.id,
                running.attempts,
                TaskStatus.PENDING.value,
                error=message,
                retry_in=policy.delay(running.attempts),
                type=running.type,
            )
        else:
            outcome = Outcome(
                running.id,
                running.attempts,
                TaskStatus.FAILED.value,
                error=message,
                type=running.type,
            )
        self._log_failure(running, exc, outcome, permanent=permanent)
        return outcome

    def _log_failure(
        self, running: Running, exc: BaseException, outcome: Outcome, *, permanent: bool
    ) -> None:
        """Every failed attempt at WARNING (a retry follows) or ERROR (the task failed for
        good), one line with the error's first line; the full text at DEBUG. The fields go as
        ``extra`` too, for structured (JSON) logs."""
        retried = outcome.status == TaskStatus.PENDING.value
        if isinstance(exc, ChildFailed):
            error = _last_line(str(exc))  # "SomeError: its message", from the child
        else:
            error = f"{type(exc).__name__}: {first_line(exc)}"
        fields = {
            "task_id": running.id,
            "task_type": running.type,
            "attempt": running.attempts,
            "max_attempts": running.max_attempts,
            "worker_id": self._worker_id,
            "outcome": "retried" if retried else "failed",
            "error": escape_text(error),
        }
        if retried:
            fields["retry_in_seconds"] = round(outcome.retry_in, 3)
            log.warning(
                "task %d (%s) attempt %d of %d failed: %s; retrying in %.2fs",
                running.id,
                running.type,
                running.attempts,
                running.max_attempts,
                fields["error"],
                outcome.retry_in,
                extra=fields,
            )
        else:
            if permanent:
                why = "a permanent error"
            else:
                why = f"attempt {running.attempts} of {running.max_attempts}"
            log.error(
                "task %d (%s) failed for good (%s): %s",
                running.id,
                running.type,
                why,
                fields["error"],
                extra=fields,
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "task %d attempt %d: %s", running.id, running.attempts, outcome.error, extra=fields
            )


def _last_line(text: str) -> str:
    """A formatted traceback's last line: the exception and its message."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text
