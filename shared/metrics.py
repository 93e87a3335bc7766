"""Prometheus metric definitions (docs/reference.md#metrics). Built per process on a registry
passed in.

The seven ``anclax_*`` names are Anclax's, exactly, so Anclax dashboards and alerts work.
The rest are taskfleet's own. No label takes task ids, worker ids or versions as values.

Every counter moves once per real event, in the process that made it happen, and only once the
database accepted it (docs/operations.md#metrics says what one increment means). Every label
combination a dashboard or an alert reads exists at zero from start-up (``initialise``), so
``rate()`` and ``increase()`` see the first event too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from taskfleet.shared.policy.convergence import DRAINING, HEARTBEAT_EXPIRED, OFFLINE
from taskfleet.shared.policy.groups import DEFAULT_GROUP
from taskfleet.shared.policy.lanes import Lane
from taskfleet.shared.policy.retention import PRUNED_KINDS

#: ``taskfleet_task_outcomes_total{outcome}``: how an attempt ended, as written.
OUTCOMES = ("completed", "retried", "failed", "cancelled", "released")
#: ``taskfleet_lease_rescues_total{outcome}``: the status a rescued task was given (cancelled:
#: its cancel had been requested).
RESCUE_OUTCOMES = ("pending", "failed", "cancelled")
#: ``taskfleet_worker_claim_queries_total{result}``.
CLAIM_RESULTS = ("claimed", "empty")
#: ``taskfleet_worker_notifications_total{result}``.
NOTIFICATION_RESULTS = ("ok", "malformed")
#: ``taskfleet_runtime_config_excluded_workers_total{reason}``.
EXCLUSION_REASONS = (HEARTBEAT_EXPIRED, DRAINING, OFFLINE)
#: ``taskfleet_schedule_runs_total{kind}``: a slot fired on time, or one run for missed slots.
SCHEDULE_RUN_KINDS = ("on_time", "catch_up")
#: The ``group`` label of the control and strict lanes.
NO_GROUP = ""

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
)
CONVERGENCE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)


@dataclass(frozen=True)
class WorkerMetrics:
    strict_inflight: Gauge
    strict_cap: Gauge
    strict_saturation: Counter
    config_version: Gauge
    lagging_workers: Gauge
    convergence_seconds: Histogram
    superseded: Counter
    claims: Counter
    claim_queries: Counter
    task_duration: Histogram
    task_wait: Histogram
    outcomes: Counter
    inflight: Gauge
    concurrency: Gauge
    listener_connected: Gauge
    listener_reconnects: Counter
    lease_rescues: Counter
    heartbeat_failures: Counter
    notifications: Counter
    schedule_runs: Counter
    pruned: Counter
    excluded_workers: Counter
    vacuums: Counter
    #: Labelled series already looked up, by (metric, label values): see :meth:`series`.
    _series: dict[tuple[object, ...], object] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def series(self, metric: _Metric, *values: str) -> _Metric:
        """``metric.labels(*values)``, looked up once. The worker moves a few series per task
        (claims, wait, duration, outcome); ``labels()`` validates and locks on every call, a
        measurable share of a no-op task's cost. A series is never removed (see
        :meth:`initialise_groups`), so a cached one stays the registry's."""
        key = (id(metric), *values)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = metric.labels(*values)
        return found  # type: ignore[return-value]

    def initialise(self, *, types: Iterable[str], channels: Iterable[str]) -> None:
        """Every known label combination at zero: lanes, outcomes of every task type this worker
        runs, rescue outcomes, claim results, notification channels, exclusion reasons, and the
        default group (configured groups: :meth:`initialise_groups`, on every config)."""
        for lane in Lane:
            self.task_duration.labels(lane.value)
            self.task_wait.labels(lane.value)
            self.inflight.labels(lane.value)
        self.claims.labels(Lane.CONTROL.value, NO_GROUP)
        self.claims.labels(Lane.STRICT.value, NO_GROUP)
        self.initialise_groups(())
        for task_type in types:
            for outcome in OUTCOMES:
                self.outcomes.labels(task_type, outcome)
        for outcome in RESCUE_OUTCOMES:
            self.lease_rescues.labels(outcome)
        for result in CLAIM_RESULTS:
            self.claim_queries.labels(result)
        for channel in channels:
            for result in NOTIFICATION_RESULTS:
                self.notifications.labels(channel, result)
        for reason in EXCLUSION_REASONS:
            self.excluded_workers.labels(reason)
        for kind in SCHEDULE_RUN_KINDS:
            self.schedule_runs.labels(kind)

    def initialise_groups(self, groups: Iterable[str]) -> None:
        """The normal lane's claim counters of ``groups`` (and the default group) at zero; a
        series once created stays (a counter never goes away)."""
        for group in (DEFAULT_GROUP, *groups):
            self.claims.labels(Lane.NORMAL.value, group)

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WorkerMetrics:
        r = registry
        return cls(
            strict_inflight=Gauge(
                "anclax_worker_strict_inflight", "Running strict-lane tasks.", registry=r
            ),
            strict_cap=Gauge("anclax_worker_strict_cap", "Current strict cap.", registry=r),
            strict_saturation=Counter(
                "anclax_worker_strict_saturation",
                "Claim rounds where strict work waited because the strict cap was full.",
                registry=r,
            ),
            config_version=Gauge(
                "anclax_worker_runtime_config_version",
                "Applied runtime config version.",
                registry=r,
            ),
            lagging_workers=Gauge(
                "anclax_runtime_config_lagging_workers",
                "Alive workers behind the target version (set by the worker running the update "
                "task).",
                registry=r,
            ),
            convergence_seconds=Histogram(
                "anclax_runtime_config_convergence_seconds",
                "Time from version insert to convergence of the alive fleet.",
                buckets=CONVERGENCE_BUCKETS,
                registry=r,
            ),
            superseded=Counter(
                "anclax_runtime_config_superseded",
                "Runtime config updates superseded by a newer version.",
                registry=r,
            ),
            claims=Counter(
                "taskfleet_worker_claimed_tasks",
                "Tasks claimed, by lane and normal-lane group.",
                ["lane", "group"],
                registry=r,
            ),
            claim_queries=Counter(
                "taskfleet_worker_claim_queries",
                "Claim round trips, by whether they returned tasks.",
                ["result"],
                registry=r,
            ),
            task_duration=Histogram(
                "taskfleet_task_duration_seconds",
                "Handler run time per attempt, by lane.",
                ["lane"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            ),
            task_wait=Histogram(
                "taskfleet_task_wait_seconds",
                "Time from enqueue (or run_after) to start, by lane.",
                ["lane"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            ),
            outcomes=Counter(
                "taskfleet_task_outcomes",
                "Attempt outcomes by task type: completed, retried, failed, cancelled, released.",
                ["type", "outcome"],
                registry=r,
            ),
            inflight=Gauge(
                "taskfleet_worker_inflight_tasks", "Running tasks, by lane.", ["lane"], registry=r
            ),
            concurrency=Gauge(
                "taskfleet_worker_concurrency",
                "Configured task slots (control slot excluded).",
                registry=r,
            ),
            listener_connected=Gauge(
                "taskfleet_worker_listener_connected",
                "1 while the LISTEN connection is up.",
                registry=r,
            ),
            listener_reconnects=Counter(
                "taskfleet_worker_listener_reconnects",
                "LISTEN connection re-establishments after a loss.",
                registry=r,
            ),
            lease_rescues=Counter(
                "taskfleet_lease_rescues",
                "Expired leases swept by this worker, by outcome (pending again, failed, or "
                "cancelled when a cancel was requested).",
                ["outcome"],
                registry=r,
            ),
            heartbeat_failures=Counter(
                "taskfleet_worker_heartbeat_failures",
                "Heartbeat statements that failed (retried with backoff).",
                registry=r,
            ),
            notifications=Counter(
                "taskfleet_worker_notifications",
                "Notifications received, by channel and whether they parsed.",
                ["channel", "result"],
                registry=r,
            ),
            pruned=_pruned_counter(r),
            vacuums=Counter(
                "taskfleet_worker_vacuums",
                "VACUUMs of taskfleet.tasks this worker ran to clear the dead index entries the "
                "claims walk (TASKFLEET_VACUUM_DEAD_ROWS).",
                registry=r,
            ),
            excluded_workers=Counter(
                "taskfleet_runtime_config_excluded_workers",
                "Workers left out of a decided runtime config change, by reason (heartbeat "
                "expired, draining, offline): each was alive after the version was written and "
                "stopped counting before it applied it.",
                ["reason"],
                registry=r,
            ),
            schedule_runs=Counter(
                "taskfleet_schedule_runs",
                "Tasks this worker enqueued from schedules, by kind (on_time; or catch_up: one "
                "run for several missed slots).",
                ["kind"],
                registry=r,
            ),
        )


@dataclass(frozen=True)
class ApiMetrics:
    queue_depth: Gauge
    queue_oldest: Gauge
    queue_unrunnable: Gauge
    queue_paused: Gauge
    label_in_flight: Gauge
    label_max_in_flight: Gauge
    label_rate: Gauge
    label_tokens: Gauge
    workers_alive: Gauge
    config_latest_version: Gauge
    config_applied_workers: Gauge
    submitted: Counter

    def initialise(self) -> None:
        """Every lane's submission counter at zero."""
        for lane in Lane:
            self.submitted.labels(lane.value)

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ApiMetrics:
        r = registry
        metrics = cls(
            queue_depth=Gauge(
                "taskfleet_queue_depth",
                "Pending tasks by lane and normal-lane group (from Postgres; exact up to 1,000, "
                "the planner's estimate past it).",
                ["lane", "group"],
                registry=r,
            ),
            queue_oldest=Gauge(
                "taskfleet_queue_oldest_ready_age_seconds",
                "Age of the oldest pending task that is ready to run, by lane and group.",
                ["lane", "group"],
                registry=r,
            ),
            queue_unrunnable=Gauge(
                "taskfleet_queue_unrunnable_tasks",
                "Pending tasks no alive worker can run, by reason (unknown_type: no alive "
                "worker has a handler for the type; missing_tags: no alive worker has every tag "
                "the task requires).",
                ["reason"],
                registry=r,
            ),
            queue_paused=Gauge(
                "taskfleet_queue_paused_tasks",
                "Pending tasks held by the runtime config's pausedLabels, pausedTypes or "
                "pausedLanes (not counted in the oldest ready age).",
                registry=r,
            ),
            label_in_flight=Gauge(
                "taskfleet_label_limit_in_flight",
                "Running tasks counted under a fleet-wide label limit (labelLimits), by label.",
                ["label"],
                registry=r,
            ),
            label_max_in_flight=Gauge(
                "taskfleet_label_limit_max_in_flight",
                "A label's fleet-wide maxInFlight (labelLimits), by label.",
                ["label"],
                registry=r,
            ),
            label_rate=Gauge(
                "taskfleet_label_limit_rate_per_second",
                "A label's fleet-wide ratePerSecond (labelLimits), by label.",
                ["label"],
                registry=r,
            ),
            label_tokens=Gauge(
                "taskfleet_label_limit_tokens",
                "Tokens in a rate-limited label's bucket now (at most one second's worth).",
                ["label"],
                registry=r,
            ),
            workers_alive=Gauge(
                "taskfleet_workers_alive", "Alive workers (online, heartbeat fresh).", registry=r
            ),
            config_latest_version=Gauge(
                "taskfleet_runtime_config_latest_version",
                "Latest runtime config version written.",
                registry=r,
            ),
            config_applied_workers=Gauge(
                "taskfleet_runtime_config_applied_workers",
                "Alive workers that applied the latest runtime config version.",
                registry=r,
            ),
            submitted=Counter(
                "taskfleet_tasks_submitted",
                "Tasks the API inserted, by lane, runtime config updates (control) included "
                "(deduplicated submissions excluded).",
                ["lane"],
                registry=r,
            ),
        )
        metrics.initialise()
        return metrics


def _pruned_counter(registry: CollectorRegistry) -> Counter:
    counter = Counter(
        "taskfleet_pruned",
        "Rows deleted by retention, by status: completed, failed, cancelled (finished tasks), "
        "worker (offline worker rows), runtime_config (old config versions).",
        ["status"],
        registry=registry,
    )
    # Every series from the start: a dashboard's rate() has a zero to start from.
    for kind in PRUNED_KINDS:
        counter.labels(status=kind)
    return counter
