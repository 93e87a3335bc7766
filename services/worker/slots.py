"""The worker's slots: which tasks this process is running, counted per lane.

One home for the bookkeeping the claim loop (free slots, strict in flight), the heartbeat (held
leases), the executor (start, finish) and the gauges all read. Counting is incremental, so the
claim loop's every pass is O(1).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from taskfleet.shared.context import TaskContext
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.groups import GroupKey
from taskfleet.shared.policy.lanes import Lane
from taskfleet.worker.wakeup import Flag


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
    #: The attempt's coroutine has begun (a task cancelled before its first step never runs
    #: its own clean-up, so it is not cancelled then: it sees ``cancel_reason`` when it starts).
    started: bool = False
    #: The handler's context (its cancellation signal is set on cancel, timeout, shutdown).
    context: TaskContext | None = None
    #: Code of the attempt that cannot be stopped at once (a blocking handler's thread, or an
    #: async handler left running past its timeout or cancel): it keeps its slot until done.
    thread: asyncio.Future[Any] | None = None
    labels: tuple[str, ...] = ()

    @property
    def thread_running(self) -> bool:
        return self.thread is not None and not self.thread.done()

    @property
    def key(self) -> tuple[int, int]:
        return (self.id, self.attempts)


#: A slot's key: (task id, attempt). The same task can be here twice, when this worker lost the
#: lease of one attempt and claimed the next: each keeps its own slot until its code returns.
SlotKey = tuple[int, int]


class Slots:
    """Running attempts, with per-lane counts kept alongside. Each attempt is its own entry,
    even when two share a (task id, attempt): a task retried from attempt 0 (``POST
    /tasks/{id}/retry``) while an earlier attempt's code still runs here, past its timeout or
    its cancel, is claimed again as attempt 1 beside it."""

    def __init__(self, concurrency: int, metrics: WorkerMetrics) -> None:
        self.concurrency = concurrency
        #: By the Running's identity (it is in the dict while it lives).
        self._running: dict[int, Running] = {}
        self._lane_counts: Counter[Lane] = Counter({lane: 0 for lane in Lane})
        #: Set whenever a slot frees (the claim loop waits on it when every slot is busy).
        self.freed = Flag()
        self._metrics = metrics
        self._inflight_gauges = {lane: metrics.inflight.labels(lane.value) for lane in Lane}
        #: What the gauges were last set to (None: never): publish() sets only what changed.
        self._published: dict[Lane, int | None] = dict.fromkeys(Lane)
        metrics.concurrency.set(concurrency)

    def add(self, running: Running) -> None:
        if self._running.setdefault(id(running), running) is running:
            self._lane_counts[running.lane] += 1

    def remove(self, running: Running) -> bool:
        """Free ``running``'s slot; False when it was not held."""
        held = self._running.pop(id(running), None) is running
        if held:
            self._lane_counts[running.lane] -= 1
        self.freed.set()
        return held

    def of_task(self, task_id: int) -> list[Running]:
        """Every attempt of ``task_id`` running here (usually one)."""
        return [r for r in self._running.values() if r.id == task_id]

    def all(self) -> list[Running]:
        return list(self._running.values())

    def held(self) -> list[SlotKey]:
        """(task id, attempt) of every attempt held (the heartbeat vouches for them)."""
        return [r.key for r in self._running.values()]

    @property
    def threads_running(self) -> int:
        """Attempts whose blocking handler's thread still runs."""
        return sum(1 for r in self._running.values() if r.thread_running)

    def __len__(self) -> int:
        return len(self._running)

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
    def free(self) -> int:
        return self.concurrency - self.inflight

    def publish(self) -> None:
        """The in-flight gauges, as the counts are now (called at every claim and every freed
        slot: only a count that changed since the last call is written)."""
        published = self._published
        for lane, gauge in self._inflight_gauges.items():
            count = self._lane_counts[lane]
            if published[lane] != count:
                published[lane] = count
                gauge.set(count)
                if lane is Lane.STRICT:
                    self._metrics.strict_inflight.set(count)
