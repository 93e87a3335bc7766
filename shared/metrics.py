"""Prometheus metric definitions (docs/reference.md#metrics). Built per process on a registry
passed in.

The seven ``anclax_*`` names are Anclax's, exactly, so Anclax dashboards and alerts work.
The rest are taskfleet's own. No label takes task ids, worker ids or versions as values.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
                "Expired leases swept by this worker, by outcome (pending again, or failed).",
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

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ApiMetrics:
        r = registry
        return cls(
            queue_depth=Gauge(
                "taskfleet_queue_depth",
                "Pending tasks by lane and normal-lane group (from Postgres at scrape time).",
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
                "Tasks accepted over the API, by lane (deduplicated submissions excluded).",
                ["lane"],
                registry=r,
            ),
        )
