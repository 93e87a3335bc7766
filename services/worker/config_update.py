"""The runtime-config writer: the ``updateWorkerRuntimeConfig`` control-lane task
(docs/reference.md#runtime-config).

1. validate and normalise again; 2. insert the version (or find it by request id: retries are
idempotent); 3. NOTIFY ``up_config``; 4. loop until the fleet has an outcome for it (the rule in
``shared/policy/convergence.py``: superseded or converged), re-notifying every notifyInterval
and waiting up to listenTimeout for ACKs, which only make the next check come sooner. The
database decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from taskfleet.shared import db, protocol, queries
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.convergence import FleetView, Superseded, decide
from taskfleet.shared.policy.runtime_config import RuntimeConfigError, normalise_runtime_config
from taskfleet.shared.registry import PermanentError
from taskfleet.shared.settings import WorkerSettings

log = logging.getLogger("taskfleet.worker.config")


@dataclass(frozen=True)
class ConfigWriter:
    """What the update task needs of the worker running it."""

    settings: WorkerSettings
    metrics: WorkerMetrics
    #: Apply the written version on this worker at once (not at its next notification).
    refresh_local: Callable[[], None]

    async def __call__(self, task_id: int, payload: Any) -> dict[str, Any]:
        return await run_config_update(self, task_id, payload)


async def _fetch(conn: asyncpg.Connection, query: queries.Query, **params: Any) -> asyncpg.Record:
    sql, args = query.positional(params)
    return await conn.fetchrow(sql, *args, timeout=30)


async def run_config_update(writer: ConfigWriter, task_id: int, payload: Any) -> dict[str, Any]:
    settings, metrics = writer.settings, writer.metrics
    try:
        config = normalise_runtime_config(
            payload if isinstance(payload, dict) else {},
            default_max_strict_percentage=settings.default_max_strict_percentage,
            generate_request_id=False,
        )
    except RuntimeConfigError as exc:
        raise PermanentError(f"invalid runtime config: {exc}") from exc
    if not config.request_id:
        raise PermanentError("invalid runtime config: requestID is missing")

    acked = asyncio.Event()

    def on_ack(_conn: object, _pid: int, channel: str, raw: str) -> None:
        message = protocol.parse(channel, raw)
        malformed = isinstance(message, protocol.Malformed)
        metrics.notifications.labels(channel, "malformed" if malformed else "ok").inc()
        if isinstance(message, protocol.ConfigAck):
            acked.set()
        else:
            log.warning("ignored malformed ACK: %r", raw[:200])

    conn = await db.connect(settings.listen_url, application_name="taskfleet-config-writer")
    try:
        if settings.listen_enabled:
            # ACKs only shorten the wait; with LISTEN disabled the loop simply polls.
            await conn.add_listener(protocol.CONFIG_ACK_CHANNEL, on_ack)
        row = await _fetch(
            conn,
            queries.runtime_config_insert,
            request_id=config.request_id,
            payload=db.dumps(config.to_payload()),
        )
        version = int(row["version"])
        up_config = protocol.config_updated_payload(config.request_id, version)
        log.info("task %d: runtime config version %d written; notifying", task_id, version)
        await _fetch(conn, queries.notify, channel=protocol.CONFIG_CHANNEL, payload=up_config)
        writer.refresh_local()
        last_notify = time.monotonic()
        while True:
            acked.clear()
            state = await _fetch(conn, queries.runtime_config_convergence, version=version)
            lagging = list(state["lagging"])
            metrics.lagging_workers.set(len(lagging))
            since = state["seconds_since_insert"]
            decision = decide(
                FleetView(
                    version=version,
                    latest=int(state["latest"]),
                    alive_workers=int(state["alive_workers"]),
                    lagging=lagging,
                    seconds_since_insert=float(since) if since is not None else None,
                )
            )
            if isinstance(decision, Superseded):
                metrics.superseded.inc()
                metrics.lagging_workers.set(0)
                return {
                    "outcome": "superseded",
                    "version": version,
                    "superseded_by": decision.superseded_by,
                }
            if decision is not None:
                seconds = decision.seconds or 0.0
                metrics.convergence_seconds.observe(seconds)
                return {
                    "outcome": "converged",
                    "version": version,
                    "seconds": seconds,
                    "alive_workers": decision.alive_workers,
                }
            now = time.monotonic()
            if now - last_notify >= config.notify_interval:
                await _fetch(
                    conn, queries.notify, channel=protocol.CONFIG_CHANNEL, payload=up_config
                )
                last_notify = now
            until_notify = config.notify_interval - (time.monotonic() - last_notify)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    acked.wait(), max(0.005, min(config.listen_timeout, until_notify))
                )
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)
        if not conn.is_closed():
            conn.terminate()
