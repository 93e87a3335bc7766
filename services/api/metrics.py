"""``GET /metrics``: HTTP metrics plus queue and fleet gauges read from Postgres.

The gauges are a snapshot, refreshed by a scrape that finds it older than
:data:`SNAPSHOT_MAX_AGE` (the scrapes in between answer from it, after one trivial statement
that shows the database still answers), under a lock (a refresh clears
and refills labelled series; two interleaved ones would expose a half-filled set). A refresh
reads a bounded number of index entries and rows however deep the backlog
(docs/operations.md#metrics-at-depth): each lane's and group's depth is exact up to
:data:`DEPTH_LIMIT` and the planner's estimate past it; the oldest waits come from the oldest
:data:`SAMPLE_LIMIT` pending tasks. If the database cannot be read within a few seconds the
scrape still answers: the database-derived series are dropped, so stale numbers cannot pass for
current ones, and ``taskfleet_api_database_up`` says 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware
from starlette.middleware import Middleware
from starlette.requests import Request

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
#: Seconds a snapshot of the database-derived gauges is served before a scrape refreshes it.
SNAPSHOT_MAX_AGE = 5.0
#: A lane's or group's depth is counted exactly up to this many tasks; past it, estimated.
DEPTH_LIMIT = 1_000
#: Pending tasks read, oldest first, for the oldest-wait gauges (and unknown types per type).
SAMPLE_LIMIT = 1_000


class QueueGauges:
    """Refreshes :class:`ApiMetrics`' database-derived gauges."""

    def __init__(
        self,
        metrics: ApiMetrics,
        registry: CollectorRegistry,
        *,
        max_age: float = SNAPSHOT_MAX_AGE,
        depth_limit: int = DEPTH_LIMIT,
        sample_limit: int = SAMPLE_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self._max_age = max_age
        self._depth_limit = depth_limit
        self._sample_limit = sample_limit
        self._clock = clock
        #: When the current snapshot was read (None: there is none).
        self._read_at: float | None = None
        self.database_up = Gauge(
            "taskfleet_api_database_up",
            "1 when the last /metrics scrape could read Postgres, else 0.",
            registry=registry,
        )
        self._lock = asyncio.Lock()

    async def refresh(self, database: Database | None) -> None:
        """Read the gauges again unless the snapshot is younger than the maximum age; a young
        snapshot is served only while the database still answers (one trivial statement), so
        numbers read before an outage never pass for current ones."""
        fresh = self._read_at is not None and self._clock() - self._read_at < self._max_age
        try:
            if database is None:
                raise DatabaseUnavailable("the app is not started")
            async with asyncio.timeout(REFRESH_TIMEOUT):
                if fresh:
                    await database.fetch_all(q.schema_revision)
                    return
                await self._read(database)
            self.database_up.set(1)
        except (DatabaseUnavailable, TimeoutError) as exc:
            log.warning("metrics: queue gauges not refreshed: %s", exc or "timed out")
            self._clear()
            self.database_up.set(0)
            self._read_at = None  # read them all again as soon as the database answers
            return
        self._read_at = self._clock()

    async def _read(self, database: Database) -> None:
        async with database.transaction() as conn:
            latest = await fetch_one(conn, q.runtime_config_latest)
            config = _config(latest["payload"] if latest else {})
            configured = sorted(config.label_weights)
            alive = await fetch_all(conn, q.runtime_config_alive_applied)
            # Every lane and configured group is a series, zero when empty: a dashboard shows
            # 0, not "no data", and an alert on depth does not go quiet when the queue drains.
            series = [(Lane.CONTROL.value, NO_GROUP), (Lane.STRICT.value, NO_GROUP)]
            series += [(Lane.NORMAL.value, g) for g in (DEFAULT_GROUP, *configured)]
            # One more than the limit tells "exactly the limit" from "past it".
            depths = await fetch_all(
                conn,
                q.metrics_queue_depth,
                lanes=[lane for lane, _ in series],
                group_keys=[_group_key(lane, group) for lane, group in series],
                limit=self._depth_limit + 1,
            )
            oldest = await fetch_all(
                conn,
                q.metrics_oldest_ready,
                limit=self._sample_limit,
                paused_labels=list(config.paused_labels),
                paused_types=list(config.paused_types),
                paused_lanes=list(config.paused_lanes),
            )
            unrunnable = await fetch_all(conn, q.metrics_unrunnable, limit=self._depth_limit + 1)
            limits = await fetch_all(conn, q.label_limit_stats)
        latest_version = int(latest["version"]) if latest else 0
        self._clear()
        labels = {(lane, _group_key(lane, group)): group for lane, group in series}
        for row in depths:
            group = labels[(row["lane"], row["group_key"])]
            depth = int(row["counted"])
            if depth > self._depth_limit:
                depth = max(self._depth_limit, int(row["estimate"] or 0))
            self.metrics.queue_depth.labels(lane=row["lane"], group=group).set(depth)
            self.metrics.queue_oldest.labels(lane=row["lane"], group=group).set(0)
        paused = 0
        for row in oldest:
            paused += int(row["paused"])
            known = labels.get((row["lane"], row["group_key"]))
            # A group key no longer configured is not claimable as such; a series whose sampled
            # tasks are all paused or not due yet stays at 0.
            if known is not None and row["oldest_ready_seconds"] is not None:
                self.metrics.queue_oldest.labels(lane=row["lane"], group=known).set(
                    row["oldest_ready_seconds"]
                )
        self.metrics.queue_paused.set(paused)
        for row in unrunnable:
            self.metrics.queue_unrunnable.labels(reason=row["reason"]).set(
                min(int(row["tasks"]), self._depth_limit)
            )
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


def _group_key(lane: str, group: str) -> str:
    """The stored group key of a series: '' for the default group and the other lanes."""
    return group if lane == Lane.NORMAL.value and group != DEFAULT_GROUP else ""


def _config(payload: Mapping[str, Any]) -> RuntimeConfig:
    try:
        return config_from_payload(payload)
    except (ValueError, TypeError, KeyError, AttributeError):
        # A stored config is written by the update task after validation; if one is unreadable
        # anyway, the depth is still worth reporting, all in the default group.
        log.warning("metrics: the latest runtime config payload is unreadable")
        return RuntimeConfig()


#: How many (method, path) pairs _RouteNameCache remembers: the fixed routes' are a few dozen;
#: the bound only stops a client inventing methods from growing it.
ROUTE_NAME_CACHE_SIZE = 256


class _RouteNameCache(PrometheusInstrumentatorMiddleware):
    """The instrumentator's middleware, naming a request's route once per fixed path.

    To label a request with its route's template (``/tasks/{id}``, not ``/tasks/17``) the
    instrumentator matches the path against every route of the app, on every request: 4-5 % of
    the API's busy samples under a stream of ``POST /tasks`` (profiled). A path that names a
    route without parameters (``/tasks``, ``/runtime-config``) always resolves the same way for
    one method, so that answer is kept; a templated one is resolved every time, as before."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fixed: dict[tuple[str, str], tuple[str, bool]] = {}

    def _get_handler(self, request: Request) -> tuple[str, bool]:
        key = (request.scope["method"], request.scope["path"])
        found = self._fixed.get(key)
        if found is None:
            found = super()._get_handler(request)
            name, templated = found
            if templated and name == key[1] and len(self._fixed) < ROUTE_NAME_CACHE_SIZE:
                self._fixed[key] = found
        return found


def install_metrics(app: FastAPI, state: ApiState) -> None:
    """HTTP request metrics on the app's own registry, and the /metrics route (no token)."""
    Instrumentator(
        registry=state.metrics_registry,
        excluded_handlers=["/metrics"],
        # A streamed PUT /runtime-config lasts until the fleet converges (up to ?timeout=):
        # its duration is time to the first event, or it would swamp the latency histogram.
        should_exclude_streaming_duration=True,
    ).instrument(app)
    app.user_middleware = [
        Middleware(_RouteNameCache, *m.args, **m.kwargs)
        if cast(Any, m.cls) is PrometheusInstrumentatorMiddleware
        else m
        for m in app.user_middleware
    ]
    gauges = QueueGauges(state.metrics, state.metrics_registry)

    @app.get("/metrics", response_class=Response, tags=["operations"], summary="Prometheus metrics")
    async def metrics() -> Response:
        body = await gauges.render(state.database, state.metrics_registry)
        return Response(content=body, media_type=CONTENT_TYPE_LATEST)
