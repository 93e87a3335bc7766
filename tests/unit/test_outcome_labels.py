"""An attempt's outcome is counted as the status its fenced write gave it
(``taskfleet.worker.outcomes``): a retry or a release of a task whose cancel was requested is
written, and counted, cancelled; an outcome the database did not write is not counted."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from taskfleet.shared.metrics import OUTCOMES, WorkerMetrics
from taskfleet.worker.outcomes import RELEASED, Outcome, settle


@pytest.mark.parametrize(
    ("status", "written", "label"),
    [
        ("completed", "completed", "completed"),
        ("failed", "failed", "failed"),
        ("cancelled", "cancelled", "cancelled"),
        ("pending", "pending", "retried"),
        ("pending", "cancelled", "cancelled"),
        (RELEASED, "pending", "released"),
        (RELEASED, "cancelled", "cancelled"),
    ],
)
def test_the_label_is_what_was_written(status: str, written: str, label: str) -> None:
    assert Outcome(1, 1, status, type="demo.echo").label(written) == label
    assert label in OUTCOMES


def _settled(written: list[Outcome], statuses: dict[tuple[int, int], str]) -> dict[str, float]:
    """settle() on a fresh registry: the outcome counter of demo.echo, by outcome label."""
    registry = CollectorRegistry()
    metrics = WorkerMetrics.create(registry)
    metrics.initialise(types=["demo.echo"], channels=[])
    settle(written, statuses, metrics)
    labels = {"type": "demo.echo"}
    return {
        outcome: registry.get_sample_value(
            "taskfleet_task_outcomes_total", {**labels, "outcome": outcome}
        )
        or 0.0
        for outcome in ("completed", "failed", "retried")
    }


def test_only_written_outcomes_are_counted_once() -> None:
    recorded: list[int] = []
    written = Outcome(1, 1, "completed", type="demo.echo", on_written=lambda: recorded.append(1))
    lost = Outcome(2, 1, "completed", type="demo.echo", on_written=lambda: recorded.append(2))
    counts = _settled([written, lost], {(1, 1): "completed"})
    assert (counts["completed"], counts["failed"], recorded) == (1.0, 0.0, [1])


def test_of_two_attempts_of_one_task_only_the_one_written_is_counted() -> None:
    # This worker lost attempt 1's lease and claimed attempt 2; both outcomes went out in one
    # statement, whose fence wrote attempt 2 only. Keyed by task id alone, both were counted
    # (as attempt 2's status) and attempt 1's hook ran for a completion that was refused.
    recorded: list[int] = []
    old = Outcome(7, 1, "pending", type="demo.echo", on_written=lambda: recorded.append(1))
    new = Outcome(7, 2, "completed", type="demo.echo", on_written=lambda: recorded.append(2))
    counts = _settled([old, new], {(7, 2): "completed"})
    assert (counts["completed"], counts["retried"], recorded) == (1.0, 0.0, [2])
