"""The runtime-config writer: the ``updateWorkerRuntimeConfig`` control-lane task (SPEC §6).

1. validate and normalise again; 2. insert the version (or find it by request id: retries are
idempotent); 3. NOTIFY ``up_config``; 4. loop until superseded (a newer version exists) or
converged (no alive worker below the version), re-notifying every notifyInterval and waiting up
to listenTimeout for ACKs, which only make the next check come sooner. The database decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import asyncpg

from taskfleet.shared import db, protocol, queries
from taskfleet.shared.policy.runtime_config import RuntimeConfigError, normalise_runtime_config
from taskfleet.shared.registry import PermanentError
from taskfleet.worker.regroup import finish_regrouping, start_regrouping

if TYPE_CHECKING:
    from taskfleet.worker.worker import Worker

log = logging.getLogger("taskfleet.worker.config")


async def _fetch(conn: asyncpg.Connection, query: queries.Query, **params: Any) -> asyncpg.Record:
    sql, args = query.positional(params)
    return await conn.fetchrow(sql, *args, timeout=30)


async def run_config_update(worker: Worker, task_id: int, payload: Any) -> dict[str, Any]:
    settings = worker.settings
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
        worker.metrics.notifications.labels(channel, "malformed" if malformed else "ok").inc()
        if isinstance(message, protocol.ConfigAck):
            acked.set()
        else:
            log.warning("ignored malformed ACK: %r", raw[:200])

    conn = await db.connect(settings.listen_url, application_name="taskfleet-config-writer")
    regrouping: asyncio.Task[None] | None = None
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
        # This worker applies it at once too, not at its own next notification or tick.
        worker.request_config_refresh()
        regrouping = start_regrouping(settings.database_url)
        last_notify = time.monotonic()
        while True:
            acked.clear()
            state = await _fetch(conn, queries.runtime_config_convergence, version=version)
            lagging = list(state["lagging"])
            worker.metrics.lagging_workers.set(len(lagging))
            if state["latest"] > version:
                worker.metrics.superseded.inc()
                worker.metrics.lagging_workers.set(0)
                return {
                    "outcome": "superseded",
                    "version": version,
                    "superseded_by": int(state["latest"]),
                }
            if not lagging:
                seconds = float(state["seconds_since_insert"] or 0.0)
                worker.metrics.convergence_seconds.observe(seconds)
                return {
                    "outcome": "converged",
                    "version": version,
                    "seconds": round(seconds, 6),
                    "alive_workers": int(state["alive_workers"]),
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
        if regrouping is not None:
            await finish_regrouping(regrouping)
