"""WorkerMetrics.series: the worker's per-task metric lookups, cached, must be the registry's
own series (a cached child that the registry no longer exports would count into nothing)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.lanes import Lane
from taskfleet.worker.slots import Running, Slots


def _metrics() -> tuple[CollectorRegistry, WorkerMetrics]:
    registry = CollectorRegistry()
    return registry, WorkerMetrics.create(registry)


def test_a_series_is_the_labelled_child_and_counts_into_the_registry() -> None:
    registry, metrics = _metrics()
    child = metrics.series(metrics.outcomes, "demo.echo", "completed")
    assert child is metrics.outcomes.labels("demo.echo", "completed")
    assert metrics.series(metrics.outcomes, "demo.echo", "completed") is child
    child.inc()
    metrics.series(metrics.outcomes, "demo.echo", "completed").inc()
    labels = {"type": "demo.echo", "outcome": "completed"}
    assert registry.get_sample_value("taskfleet_task_outcomes_total", labels) == 2


def test_series_of_different_metrics_with_the_same_values_are_apart() -> None:
    registry, metrics = _metrics()
    metrics.series(metrics.task_wait, Lane.NORMAL.value).observe(0.5)
    metrics.series(metrics.task_duration, Lane.NORMAL.value).observe(2.0)
    wait = metrics.series(metrics.task_wait, Lane.NORMAL.value)
    duration = metrics.series(metrics.task_duration, Lane.NORMAL.value)
    assert wait is not duration
    assert registry.get_sample_value("taskfleet_task_wait_seconds_sum", {"lane": "normal"}) == 0.5
    assert (
        registry.get_sample_value("taskfleet_task_duration_seconds_sum", {"lane": "normal"}) == 2.0
    )


def test_published_gauges_follow_every_change_of_the_slots() -> None:
    registry, metrics = _metrics()
    slots = Slots(4, metrics)

    def inflight(lane: Lane) -> float | None:
        return registry.get_sample_value("taskfleet_worker_inflight_tasks", {"lane": lane.value})

    def running(task_id: int, lane: Lane) -> Running:
        return Running(
            id=task_id, type="demo.echo", lane=lane, group=None, attempts=1,
            max_attempts=3, timeout=None,
        )  # fmt: skip

    slots.publish()
    assert [inflight(lane) for lane in Lane] == [0, 0, 0]
    a, b = running(1, Lane.STRICT), running(2, Lane.NORMAL)
    slots.add(a)
    slots.add(b)
    slots.publish()
    assert (inflight(Lane.STRICT), inflight(Lane.NORMAL)) == (1, 1)
    assert registry.get_sample_value("anclax_worker_strict_inflight") == 1
    slots.remove(a)
    slots.publish()
    assert (inflight(Lane.STRICT), inflight(Lane.NORMAL)) == (0, 1)
    assert registry.get_sample_value("anclax_worker_strict_inflight") == 0
    slots.publish()  # nothing changed: the same values
    slots.remove(b)
    slots.publish()
    assert inflight(Lane.NORMAL) == 0
