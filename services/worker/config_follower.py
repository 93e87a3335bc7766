"""Following the runtime config (docs/reference.md#runtime-config): the reader side.

On a notification, a tick that saw a newer version, a listener reconnect, or the writer's own
request, read the latest version; if it is newer than the applied one, swap it into the planner
at once (one synchronous step: the claim loop never sees half a config), then, once a claim
planned under the previous version and still in flight has returned, record it in the worker
row (only ever raised) and acknowledge it: an acknowledged pause holds from then on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from taskfleet.shared import protocol, queries
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.claim_plan import ClaimPlanner
from taskfleet.shared.policy.runtime_config import RuntimeConfig, config_from_payload
from taskfleet.worker.database import DATABASE_ERRORS, Database

log = logging.getLogger("taskfleet.worker")


class ConfigFollower:
    def __init__(
        self,
        *,
        worker_id: str,
        database: Database,
        planner: ClaimPlanner,
        metrics: WorkerMetrics,
        on_applied: Callable[[], None],
        claims_settled: Callable[[], Awaitable[None]],
    ) -> None:
        self._worker_id = worker_id
        self._db = database
        self._planner = planner
        self._metrics = metrics
        self._on_applied = on_applied
        self._claims_settled = claims_settled
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None
        self.applied_version = 0
        #: Set every time a config version is applied (tests wait on it).
        self.applied = asyncio.Event()
        self._publish()

    def newer_version_seen(self, version: int) -> None:
        """A notification or a tick named ``version``: read it if it is news."""
        if version > self.applied_version:
            self.schedule_refresh()

    def schedule_refresh(self) -> None:
        """Read the latest version soon, in the background (one read at a time)."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._refresh_safely())

    def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()

    async def _refresh_safely(self) -> None:
        try:
            await self.refresh(ack=True)
        except DATABASE_ERRORS as exc:
            log.warning("reading the runtime config failed (%s); the next tick retries", exc)

    async def refresh(self, *, ack: bool) -> None:
        """Read the latest version; if newer than the applied one, swap it in and record it."""
        async with self._lock:
            rows = await self._db.fetch(queries.runtime_config_latest)
            if not rows or rows[0]["version"] <= self.applied_version:
                return
            row = rows[0]
            try:
                config = config_from_payload(row["payload"])
            except ValueError as exc:
                log.error("runtime config version %d is unusable (%s); kept", row["version"], exc)
                return
            await self._apply(config, row["version"])
            if ack:
                await self._db.fetch(
                    queries.worker_applied_config,
                    version=row["version"],
                    worker_id=self._worker_id,
                    ack=protocol.config_ack_payload(
                        row["request_id"], self._worker_id, row["version"]
                    ),
                )
            log.info(
                "applied runtime config version %d: strict cap %d, weights %s",
                row["version"],
                self._planner.strict_cap,
                dict(config.label_weights) or "{}",
            )

    async def _apply(self, config: RuntimeConfig, version: int) -> None:
        self._planner.apply(config)
        # The claim counters of the groups this config names exist from now on, at zero.
        self._metrics.initialise_groups(config.label_weights)
        # Applied (and acknowledged) only once a claim planned under the previous version and
        # still in flight has returned: it could yet start work this version pauses or limits.
        await self._claims_settled()
        self.applied_version = version
        self._on_applied()
        self._publish()
        self.applied.set()

    def _publish(self) -> None:
        self._metrics.config_version.set(self.applied_version)
        self._metrics.strict_cap.set(self._planner.strict_cap)
