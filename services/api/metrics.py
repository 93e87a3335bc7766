"""``GET /metrics``: HTTP metrics plus queue and fleet gauges read from Postgres at scrape time.

The gauges are refreshed right before each scrape, under a lock (a refresh clears and refills
labelled series; two interleaved ones would expose a half-filled set). If the database cannot be
read within a few seconds the scrape still answers: the database-derived series are dropped, so
stale numbers cannot pass for current ones, and ``taskfleet_api_database_up`` says 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_fastapi_instrumentator import Instrumentator

from taskfleet.api.database import Database, DatabaseUnavailable, fetch_all, fetch_one
from taskfleet.api.deps import ApiState
from taskfleet.shared import queries as q
from taskfleet.shared.metrics import ApiMetrics
from taskfleet.shared.policy.lanes import Lane
from taskfleet.shared.policy.runtime_config import RuntimeConfig, config_from_payload

log = logging.getLogger(__name__)

# Prometheus' default scrape timeout is 10 s; answer well inside it even when Postgres hangs.
REFRESH_TIMEOUT = 3.0
NO_GROUP = ""  # the group label of the control and strict lanes
DEFAULT_GROUP = "default"


class QueueGauges:
    """Refreshes :class:`ApiMetrics`' database-derived gauges."""

    def __init__(self, metrics: ApiMetrics, registry: CollectorRegistry) -> None:
        self.metrics = metrics
        self.database_up = Gauge(
            "taskfleet_api_database_up",
            "1 when the last /metrics scrape could read Postgres, else 0.",
            registry=registry,
        )
        self._lock = asyncio.Lock()

    async def refresh(self, database: Database | None) -> None:
        try:
            if database is None:
                raise DatabaseUnavailable("the app is not started")
            async with asyncio.timeout(REFRESH_TIMEOUT):
                await self._read(database)
            self.database_up.set(1)
        except (DatabaseUnavailable, TimeoutError) as exc:
            log.warning("metrics: queue gauges not refreshed: %s", exc or "timed out")
            self._clear()
            self.database_up.set(0)

    async def _read(self, database: Database) -> None:
        async with database.transaction() as conn:
            latest = await fetch_one(conn, q.runtime_config_latest)
            config = _config(latest["payload"] if latest else {})
            configured = sorted(config.label_weights)
            alive = await fetch_all(conn, q.runtime_config_alive_applied)
            stats = await fetch_all(
                conn,
                q.task_queue_stats,
                paused_labels=list(config.paused_labels),
                paused_types=list(config.paused_types),
                paused_lanes=list(config.paused_lanes),
            )
            unrunnable = await fetch_all(conn, q.task_unrunnable_counts)
            limits = await fetch_all(conn, q.label_limit_stats)
        latest_version = int(latest["version"]) if latest else 0
        self._clear()
        # Every lane and configured group gets a series, zero when empty: a dashboard shows 0,
        # not "no data", and an alert on depth does not go quiet when the queue drains.
        zero_series = [(Lane.CONTROL.value, NO_GROUP), (Lane.STRICT.value, NO_GROUP)]
        zero_series += [(Lane.NORMAL.value, g) for g in (DEFAULT_GROUP, *configured)]
        for lane, group in zero_series:
            self.metrics.queue_depth.labels(lane=lane, group=group).set(0)
            self.metrics.queue_oldest.labels(lane=lane, group=group).set(0)
        paused = 0
        for row in stats:
            group = row["grp"] if row["grp"] is not None else NO_GROUP
            paused += int(row["paused"])
            self.metrics.queue_depth.labels(lane=row["lane"], group=group).set(row["depth"])
            self.metrics.queue_oldest.labels(lane=row["lane"], group=group).set(
                row["oldest_ready_seconds"]
            )
        self.metrics.queue_paused.set(paused)
        for row in unrunnable:
            self.metrics.queue_unrunnable.labels(reason=row["reason"]).set(row["tasks"])
        for row in limits:
            label = row["label"]
            self.metrics.label_in_flight.labels(label=label).set(row["in_flight"])
            if row["max_in_flight"] is not None:
                self.metrics.label_max_in_flight.labels(label=label).set(row["max_in_flight"])
            if row["rate_per_second"] is not None:
                self.metrics.label_rate.labels(label=label).set(row["rate_per_second"])
                self.metrics.label_tokens.labels(label=label).set(row["tokens"])
        self.metrics.workers_alive.set(len(alive))
        self.metrics.config_latest_version.set(latest_version)
        self.metrics.config_applied_workers.set(
            sum(1 for w in alive if w["applied_config_version"] >= latest_version)
        )

    def _clear(self) -> None:
        self.metrics.queue_depth.clear()
        self.metrics.queue_oldest.clear()
        self.metrics.queue_unrunnable.clear()
        self.metrics.label_in_flight.clear()
        self.metrics.label_max_in_flight.clear()
        self.metrics.label_rate.clear()
        self.metrics.label_tokens.clear()

    async def render(self, database: Database | None, registry: CollectorRegistry) -> bytes:
        async with self._lock:
            await self.refresh(database)
            return generate_latest(registry)


def _config(payload: Mapping[str, Any]) -> RuntimeConfig:
    try:
        return config_from_payload(payload)
    except (ValueError, TypeError, KeyError, AttributeError):
        # A stored config is written by the update task after validation; if one is unreadable
        # anyway, the depth is still worth reporting, all in the default group.
        log.warning("metrics: the latest runtime config payload is unreadable")
        return RuntimeConfig()


def install_metrics(app: FastAPI, state: ApiState) -> None:
    """HTTP request metrics on the app's own registry, and the /metrics route (no token)."""
    Instrumentator(
        registry=state.metrics_registry,
        excluded_handlers=["/metrics"],
        # A streamed PUT /runtime-config lasts until the fleet converges (up to ?timeout=):
        # its duration is time to the first event, or it would swamp the latency histogram.
        should_exclude_streaming_duration=True,
    ).instrument(app)
    gauges = QueueGauges(state.metrics, state.metrics_registry)

    @app.get("/metrics", response_class=Response, tags=["operations"], summary="Prometheus metrics")
    async def metrics() -> Response:
        body = await gauges.render(state.database, state.metrics_registry)
        return Response(content=body, media_type=CONTENT_TYPE_LATEST)
