"""The worker's slots: one entry per running attempt, counted per lane."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.lanes import Lane
from taskfleet.worker.slots import Running, Slots


def test_two_attempts_with_the_same_task_and_attempt_number_each_hold_a_slot() -> None:
    # A task retried from attempt 0 while an earlier attempt's code still runs here (past its
    # timeout) is claimed again as attempt 1: the second add overwrote the first entry but
    # counted twice, and the first one's removal then found it was not its own: one slot was
    # lost for good.
    slots = Slots(2, WorkerMetrics.create(CollectorRegistry()))
    old = Running(7, "demo.sleep", Lane.NORMAL, None, 1, 3, None)
    new = Running(7, "demo.sleep", Lane.NORMAL, None, 1, 3, None)
    slots.add(old)
    slots.add(new)
    assert (slots.inflight, len(slots), slots.held()) == (2, 2, [(7, 1), (7, 1)])
    assert slots.of_task(7) == [old, new]
    assert slots.remove(old) is True
    assert slots.remove(old) is False  # once only
    assert slots.remove(new) is True
    assert (slots.inflight, slots.free) == (0, 2)
