"""The runtime-config writer: the ``updateWorkerRuntimeConfig`` control-lane task
(docs/reference.md#runtime-config).

1. validate and normalise again; 2. insert the version (or find it by request id: retries are
idempotent); 3. NOTIFY ``up_config``; 4. loop until the fleet has an outcome for it (the rule in
``shared/policy/convergence.py``: superseded or converged, or timeout once
TASKFLEET_RUNTIME_CONFIG_DEADLINE has passed), re-notifying every notifyInterval and waiting
for ACKs, which only make the next check come sooner. The database decides.

The task's result is the change's one stored answer (the API's stream and request document
report it), so the task looks again the moment the answer can change: on an ACK, or when the
first lagging worker's heartbeat expires; listenTimeout only bounds the wait. Its metrics
(convergence time, superseded, excluded workers) are recorded once the database accepted the
task's completion: a run whose completion is refused (its lease lost) counts nothing.
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
from taskfleet.shared.policy.convergence import (
    Converged,
    Decision,
    Superseded,
    TimedOut,
    decide,
    next_check_seconds,
    view_from_row,
)
from taskfleet.shared.policy.runtime_config import (
    RuntimeConfig,
    RuntimeConfigError,
    config_from_payload,
    resolve_update,
)
from taskfleet.shared.registry import PermanentError
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.outcomes import ControlResult
from taskfleet.worker.regroup import start_regrouping

log = logging.getLogger("taskfleet.worker.config")


@dataclass(frozen=True)
class ConfigWriter:
    """What the update task needs of the worker running it."""

    settings: WorkerSettings
    metrics: WorkerMetrics
    #: Apply the written version on this worker at once (not at its next notification).
    refresh_local: Callable[[], None]
    #: Hand over work that goes on after the task (the re-grouping): the worker stops it when
    #: it stops. The task's outcome is the change's answer and must not wait for it.
    keep: Callable[[asyncio.Task[None]], None]

    async def __call__(self, task_id: int, payload: Any) -> ControlResult:
        return await run_config_update(self, task_id, payload)


async def _fetch(conn: asyncpg.Connection, query: queries.Query, **params: Any) -> asyncpg.Record:
    sql, args = query.positional(params)
    return await conn.fetchrow(sql, *args, timeout=30)


async def _write_version(
    conn: asyncpg.Connection, payload: dict[str, Any], request_id: str, settings: WorkerSettings
) -> tuple[int, RuntimeConfig]:
    """Insert the request's version (or find it: a retry of the task reuses it); its number and
    config. Under the write lock, from reading the latest version to inserting the next, so a
    PATCH merges into the version it replaces and concurrent PATCHes compose."""
    async with conn.transaction():
        await _fetch(
            conn, queries.runtime_config_write_lock, lock_key=queries.CONFIG_WRITE_LOCK_KEY
        )
        existing = await _fetch(conn, queries.runtime_config_by_request, request_id=request_id)
        if existing is not None:
            return int(existing["version"]), config_from_payload(existing["payload"])
        latest = await _fetch(conn, queries.runtime_config_latest)
        try:
            config = resolve_update(
                payload,
                latest=latest["payload"] if latest is not None else None,
                default_max_strict_percentage=settings.default_max_strict_percentage,
            )
        except RuntimeConfigError as exc:
            raise PermanentError(f"invalid runtime config: {exc}") from exc
        row = await _fetch(
            conn,
            queries.runtime_config_insert,
            request_id=request_id,
            payload=db.dumps(config.to_payload()),
        )
        return int(row["version"]), config


def _record(metrics: WorkerMetrics, decision: Decision) -> Callable[[], None]:
    """The metrics of ``decision``, to be recorded once its task's completion is written."""

    def record() -> None:
        if isinstance(decision, Superseded):
            metrics.superseded.inc()
            return
        if isinstance(decision, Converged):
            metrics.convergence_seconds.observe(decision.seconds or 0.0)
        for excluded in decision.excluded:
            metrics.excluded_workers.labels(excluded.reason).inc()

    return record


def result_of(decision: Decision) -> dict[str, Any]:
    """The update task's result for ``decision``: the stored answer the API reports."""
    if isinstance(decision, Superseded):
        return {
            "outcome": "superseded",
            "version": decision.version,
            "superseded_by": decision.superseded_by,
        }
    excluded = [e.to_json() for e in decision.excluded]
    if isinstance(decision, Converged):
        return {
            "outcome": "converged",
            "version": decision.version,
            "seconds": decision.seconds or 0.0,
            "alive_workers": decision.alive_workers,
            "excluded": excluded,
        }
    result: dict[str, Any] = {
        "outcome": "timeout",
        "version": decision.version,
        "lagging": list(decision.lagging),
        "alive_workers": decision.alive_workers,
        "excluded": excluded,
    }
    if decision.reason is not None:
        result["reason"] = decision.reason
    return result


async def run_config_update(writer: ConfigWriter, task_id: int, payload: Any) -> ControlResult:
    settings, metrics = writer.settings, writer.metrics
    request_id = payload.get("requestID") if isinstance(payload, dict) else None
    if not isinstance(request_id, str) or not request_id:
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
    regrouping: asyncio.Task[None] | None = None
    try:
        if settings.listen_enabled:
            # ACKs only shorten the wait; with LISTEN disabled the loop simply polls.
            await conn.add_listener(protocol.CONFIG_ACK_CHANNEL, on_ack)
        version, config = await _write_version(conn, payload, request_id, settings)
        up_config = protocol.config_updated_payload(request_id, version)
        log.info("task %d: runtime config version %d written; notifying", task_id, version)
        await _fetch(conn, queries.notify, channel=protocol.CONFIG_CHANNEL, payload=up_config)
        writer.refresh_local()
        # Pending tasks whose group a change of the configured labels moves: re-grouped in
        # the background, in bounded steps, while the fleet converges.
        regrouping = start_regrouping(settings.database_url, pooled=settings.pooled)
        last_notify = time.monotonic()
        deadline = last_notify + settings.runtime_config_deadline
        while True:
            acked.clear()
            state = await _fetch(conn, queries.runtime_config_convergence, version=version)
            view = view_from_row(version, state)
            metrics.lagging_workers.set(len(view.lagging))
            decision = decide(view, deadline_passed=time.monotonic() >= deadline)
            if isinstance(decision, TimedOut):
                log.warning(
                    "task %d: runtime config version %d not applied by every alive worker "
                    "within %gs; giving the control slot back (lagging: %s)",
                    task_id,
                    version,
                    settings.runtime_config_deadline,
                    ", ".join(decision.lagging) or decision.reason,
                )
            if decision is not None:
                if not isinstance(decision, Superseded) and decision.excluded:
                    log.warning(
                        "task %d: runtime config version %d %s without %s",
                        task_id,
                        version,
                        decision.kind,
                        ", ".join(f"{e.id} ({e.reason})" for e in decision.excluded),
                    )
                return ControlResult(result_of(decision), _record(metrics, decision))
            now = time.monotonic()
            if now - last_notify >= config.notify_interval:
                await _fetch(
                    conn, queries.notify, channel=protocol.CONFIG_CHANNEL, payload=up_config
                )
                last_notify = now
            wait = next_check_seconds(
                listen_timeout=config.listen_timeout,
                until_notify=config.notify_interval - (time.monotonic() - last_notify),
                lagging_expire_in=view.lagging_expire_in,
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await acked.wait()
    finally:
        # Decided, failed or interrupted: this worker rolls nothing out any more (a gauge left
        # at the last count would report lagging workers until its next config change).
        metrics.lagging_workers.set(0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)
        if not conn.is_closed():
            conn.terminate()
        if regrouping is not None:
            # It goes on, bounded by its budget, after the outcome is reported.
            writer.keep(regrouping)
