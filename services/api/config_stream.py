"""Following one runtime-config request: its events, as the database tells them
(docs/reference.md#config-events).

The stream reports what the database says: the version once the update task has written it, the
alive workers' applied versions as they move (and the workers left out), and one final outcome:
the update task's decision, read from its result, so that the stream, the request document, the
task and the worker's convergence histogram report one answer
(``shared/policy/convergence.py``). The API never talks to the workers and keeps no state between
polls, so any replica can serve a stream, and a client that lost one re-attaches with
``GET /runtime-config/requests/{request_id}?watch=true``.

Each poll borrows one pooled connection for a few short statements and gives it back; an open
stream holds no connection while it waits. Between polls it waits for the fleet to move
(:mod:`taskfleet.api.config_signals`: a version announced, a worker's ACK), or for its poll
interval when no notification comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from taskfleet.api.config_signals import ConfigSignals
from taskfleet.api.database import Database, DatabaseUnavailable, Row, fetch_all, fetch_one
from taskfleet.api.negotiation import JSON, SSE
from taskfleet.api.shutdown import Shutdown
from taskfleet.shared import queries
from taskfleet.shared.policy.convergence import (
    NO_ALIVE_WORKER,
    Converged,
    Excluded,
    FleetView,
    Superseded,
    TimedOut,
    decide,
    view_from_row,
)

log = logging.getLogger("taskfleet.api.runtime_config")

#: Polling of the database while a stream waits: quick right after a change, backing off to the
#: ceiling while nothing moves.
POLL_MIN_SECONDS = 0.02
POLL_MAX_SECONDS = 0.2
POLL_GROWTH = 1.5
#: How long after the database shows a change's outcome the stream keeps polling quickly for
#: the update task's result (it normally comes within milliseconds, without a notification).
OUTCOME_IMMINENT_SECONDS = 2.0
#: That quick polling: from this pause, growing by POLL_GROWTH, up to IMMINENT_POLL_MAX_SECONDS.
IMMINENT_POLL_MIN_SECONDS = 0.002
IMMINENT_POLL_MAX_SECONDS = 0.02
#: A progress event goes out at least this often, changed or not, so that clients and proxies
#: can tell a quiet stream from a dead one.
PROGRESS_HEARTBEAT_SECONDS = 15.0

Event = dict[str, Any]
FINAL_EVENTS = frozenset({"converged", "superseded", "timeout", "failed"})


# --------------------------------------------------------------------------------------------
# What the database says about one request


@dataclass(frozen=True)
class Snapshot:
    """One poll's view of a config request: its task, its version and the alive fleet.

    Before the version exists, ``lagging`` lists every alive worker (none has it yet).
    """

    task: Row | None
    version: int | None
    latest: int | None
    alive_workers: int
    applied_workers: int
    lagging: tuple[str, ...]
    seconds_since_insert: float | None
    #: Workers left out: alive after the version was written, not any more, behind it.
    excluded: tuple[Excluded, ...] = ()

    def view(self) -> FleetView | None:
        if self.version is None or self.latest is None:
            return None
        return FleetView(
            version=self.version,
            latest=self.latest,
            alive_workers=self.alive_workers,
            applied_workers=self.applied_workers,
            lagging=self.lagging,
            seconds_since_insert=self.seconds_since_insert,
            excluded=self.excluded,
        )


async def read_snapshot(database: Database, request_id: str, version: int | None) -> Snapshot:
    """Read the request's state, on one connection borrowed for this poll only."""
    async with database.transaction() as conn:
        task = await fetch_one(conn, queries.runtime_config_request_task, request_id=request_id)
        if version is None:
            row = await fetch_one(conn, queries.runtime_config_by_request, request_id=request_id)
            version = int(row["version"]) if row is not None else None
        if version is None:
            alive = await fetch_all(conn, queries.runtime_config_alive_applied)
            latest = await fetch_one(conn, queries.runtime_config_latest)
            # A finished task that wrote no version asks nothing of the fleet.
            finished = task is not None and task["status"] in ("completed", "failed", "cancelled")
            return Snapshot(
                task=task,
                version=None,
                latest=int(latest["version"]) if latest is not None else 0,
                alive_workers=len(alive),
                applied_workers=0,
                lagging=() if finished else tuple(str(w["id"]) for w in alive),
                seconds_since_insert=None,
            )
        state = await fetch_one(conn, queries.runtime_config_convergence, version=version)
    assert state is not None  # an aggregate always returns its one row
    view = view_from_row(version, state)
    return Snapshot(
        task=task,
        version=version,
        latest=view.latest,
        alive_workers=view.alive_workers,
        applied_workers=view.applied_workers,
        lagging=tuple(view.lagging),
        seconds_since_insert=view.seconds_since_insert,
        excluded=tuple(view.excluded),
    )


def excluded_json(excluded: tuple[Excluded, ...]) -> list[dict[str, str]]:
    return [e.to_json() for e in excluded]


def progress_event(snapshot: Snapshot) -> Event:
    return {
        "event": "progress",
        "version": snapshot.version,
        "alive_workers": snapshot.alive_workers,
        "applied_workers": snapshot.applied_workers,
        "lagging": list(snapshot.lagging),
        "excluded": excluded_json(snapshot.excluded),
    }


def _excluded_of(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """The ``excluded`` list a task result stored (an older task stored none)."""
    stored = result.get("excluded")
    if not isinstance(stored, list):
        return []
    return [
        {"id": str(e["id"]), "reason": str(e["reason"])}
        for e in stored
        if isinstance(e, Mapping) and "id" in e and "reason" in e
    ]


def _int_or(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def final_event(snapshot: Snapshot) -> Event | None:
    """The request's outcome, when it has one: the update task's result, once the task has
    finished. While the task is unfinished there is none yet, even when the database already
    shows convergence: the task decides, at once, and its answer (its time, who it left out) is
    the one every report gives. The API decides by the same rule
    (``shared/policy/convergence.py``) only for a version no update task follows any more.
    """
    task = snapshot.task
    if task is not None:
        task_status = task["status"]
        if task_status == "completed":
            result = task["result"] if isinstance(task["result"], Mapping) else {}
            version = _int_or(result.get("version"), snapshot.version)
            outcome = result.get("outcome")
            if outcome == "converged":
                seconds = result.get("seconds")
                if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                    seconds = snapshot.seconds_since_insert
                return {
                    "event": "converged",
                    "version": version,
                    "seconds": seconds,
                    "excluded": _excluded_of(result),
                }
            if outcome == "superseded":
                return {
                    "event": "superseded",
                    "version": version,
                    "superseded_by": _int_or(result.get("superseded_by"), snapshot.latest),
                }
            if outcome == "timeout":
                # The update task's own deadline passed (TASKFLEET_RUNTIME_CONFIG_DEADLINE).
                lagging = result.get("lagging")
                event: Event = {
                    "event": "timeout",
                    "version": version,
                    "lagging": list(lagging) if isinstance(lagging, list) else [],
                    "alive_workers": _int_or(result.get("alive_workers"), None),
                    "excluded": _excluded_of(result),
                }
                if isinstance(result.get("reason"), str):
                    event["reason"] = result["reason"]
                return event
            return {
                "event": "failed",
                "error": f"update task {task['id']} completed with an unknown outcome {outcome!r}",
            }
        if task_status == "failed":
            error = task["last_error"] or f"update task {task['id']} failed"
            return {"event": "failed", "error": str(error)}
        if task_status == "cancelled" and snapshot.version is None:
            # Earlier versions let the update task be cancelled (now refused with a 409).
            return {
                "event": "failed",
                "error": f"update task {task['id']} was cancelled before it wrote a version: "
                "nothing changed",
            }
        if task_status != "cancelled":
            # Pending or running: the update task decides, and says so in its result.
            return None
        # Cancelled after writing its version: the version is out there, and the fleet decides
        # what became of it, by the same rule.
    view = snapshot.view()
    if view is None:
        return None
    decision = decide(view)
    if isinstance(decision, Superseded):
        return {
            "event": "superseded",
            "version": decision.version,
            "superseded_by": decision.superseded_by,
        }
    if isinstance(decision, Converged):
        return {
            "event": "converged",
            "version": decision.version,
            "seconds": decision.seconds,
            "excluded": excluded_json(decision.excluded),
        }
    return None


def timeout_event(snapshot: Snapshot | None, version: int | None) -> Event:
    """The stream's own deadline (``?timeout=``) passed before an outcome; the config task goes
    on. Says so when no worker is alive (nothing can converge then)."""
    view = snapshot.view() if snapshot is not None else None
    if view is not None:
        decision = decide(view, deadline_passed=True)
        if isinstance(decision, TimedOut):
            event: Event = {
                "event": "timeout",
                "version": decision.version,
                "lagging": list(decision.lagging),
                "alive_workers": decision.alive_workers,
                "excluded": excluded_json(decision.excluded),
            }
            if decision.reason is not None:
                event["reason"] = decision.reason
            return event
    alive = snapshot.alive_workers if snapshot is not None else None
    event = {
        "event": "timeout",
        "version": version,
        "lagging": list(snapshot.lagging) if snapshot is not None else [],
        "alive_workers": alive,
        "excluded": excluded_json(snapshot.excluded) if snapshot is not None else [],
    }
    if alive == 0:
        event["reason"] = NO_ALIVE_WORKER
    return event


def enqueued_event(request_id: str, task_id: int | None, deduplicated: bool) -> Event:
    return {
        "event": "enqueued",
        "task_id": task_id,
        "request_id": request_id,
        "deduplicated": deduplicated,
    }


async def watch_request(
    database: Database,
    request_id: str,
    first: Event,
    *,
    timeout: float,
    gone: Callable[[], Awaitable[bool]] | None = None,
    shutdown: Shutdown | None = None,
    signals: ConfigSignals | None = None,
) -> AsyncIterator[Event]:
    """The events of one config request, ``first`` (the ``enqueued`` event) first, then
    ``version``, ``progress`` whenever the fleet moves (or every heartbeat), one final event.

    Stops early, without a final event, when ``gone()`` says the client left or the server
    begins to stop (the client re-attaches by the request id). With ``signals``, a notification
    on the config channels ends each wait between polls early.
    """
    yield first
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    version: int | None = None
    last: Snapshot | None = None
    last_progress: Event | None = None
    last_progress_at = loop.time()
    interval = POLL_MIN_SECONDS
    #: When the database first showed the outcome the update task has not written yet.
    decided_at: float | None = None
    #: The last pause was a quick one, waiting for that outcome.
    imminent = False
    while True:
        changed = False
        # Before the read: a notification during it still ends the wait after it.
        moved = signals.next_change() if signals is not None else None
        try:
            snapshot: Snapshot | None = await read_snapshot(database, request_id, version)
        except DatabaseUnavailable as exc:
            # Mid-stream the status line is long sent: keep trying until the deadline.
            log.warning("runtime config request %s: %s; retrying", request_id, exc.reason)
            snapshot = None
        now = loop.time()
        if snapshot is not None:
            last = snapshot
            if version is None and snapshot.version is not None:
                version = snapshot.version
                changed = True
                yield {"event": "version", "version": version}
            progress = progress_event(snapshot)
            final = final_event(snapshot)
            # Before the version exists, the fleet's state only matters when nobody is alive to
            # write it: say so rather than stay silent until the timeout.
            worth_telling = version is not None or (snapshot.alive_workers == 0 and final is None)
            heartbeat_due = final is None and now - last_progress_at >= PROGRESS_HEARTBEAT_SECONDS
            if (worth_telling and progress != last_progress) or heartbeat_due:
                changed = changed or progress != last_progress
                last_progress, last_progress_at = progress, now
                yield progress
            if final is not None:
                yield final
                return
            view = snapshot.view()
            if view is None or decide(view) is None:
                decided_at = None
            else:
                decided_at = now if decided_at is None else decided_at
        if now >= deadline:
            yield timeout_event(last, version)
            return
        if gone is not None and await gone():
            return
        if decided_at is not None and now - decided_at < OUTCOME_IMMINENT_SECONDS:
            # The database shows the outcome; the update task is about to write its result,
            # which no notification announces: look again within milliseconds (for a while: a
            # task that does not come, its worker gone, is waited for at the usual pace).
            interval = (
                min(interval * POLL_GROWTH, IMMINENT_POLL_MAX_SECONDS)
                if imminent
                else IMMINENT_POLL_MIN_SECONDS
            )
            imminent = True
        else:
            imminent = False
            interval = (
                POLL_MIN_SECONDS if changed else min(interval * POLL_GROWTH, POLL_MAX_SECONDS)
            )
        pause = min(interval, max(deadline - loop.time(), 0.0))
        if shutdown is None:
            await _pause(pause, moved)
        elif shutdown.started or await shutdown.sleep(pause, wake=moved):
            return


async def _pause(seconds: float, wake: asyncio.Event | None) -> None:
    """Up to ``seconds``; less when ``wake`` is set."""
    if wake is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()


# --------------------------------------------------------------------------------------------
# Responses


def _ndjson_line(event: Event) -> bytes:
    return (json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _sse_message(event: Event) -> bytes:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['event']}\ndata: {data}\n\n".encode()


_STREAM_HEADERS = {
    "Cache-Control": "no-cache",
    # nginx and friends buffer responses unless told not to; a buffered stream is no stream.
    "X-Accel-Buffering": "no",
}


def _shutting_down(request_id: str) -> JSONResponse:
    return JSONResponse(
        {
            "detail": "the API is shutting down; the config change goes on: follow it with "
            f"GET {request_location(request_id)}?watch=true"
        },
        status_code=503,
        headers={"Retry-After": "1", "Location": request_location(request_id)},
    )


def request_location(request_id: str) -> str:
    return f"/runtime-config/requests/{quote(request_id, safe='')}"


async def respond(
    request: Request,
    database: Database,
    media_type: str,
    first: Event,
    timeout: float,
    shutdown: Shutdown | None = None,
    signals: ConfigSignals | None = None,
) -> Response:
    request_id = str(first["request_id"])
    if media_type == JSON:
        events = [
            event
            async for event in watch_request(
                database,
                request_id,
                first,
                timeout=timeout,
                gone=request.is_disconnected,
                shutdown=shutdown,
                signals=signals,
            )
        ]
        final = events[-1] if events and events[-1]["event"] in FINAL_EVENTS else None
        if final is None and shutdown is not None and shutdown.started:
            return _shutting_down(request_id)
        document: dict[str, Any] = {
            "request_id": request_id,
            "task_id": first["task_id"],
            "outcome": final["event"] if final is not None else None,
        }
        if final is not None:
            document.update({k: v for k, v in final.items() if k != "event"})
        document["events"] = events
        return JSONResponse(document)
    encode = _sse_message if media_type == SSE else _ndjson_line

    async def body() -> AsyncIterator[bytes]:
        # Starlette cancels this generator when the client disconnects.
        async for event in watch_request(
            database, request_id, first, timeout=timeout, shutdown=shutdown, signals=signals
        ):
            yield encode(event)

    return StreamingResponse(body(), media_type=media_type, headers=_STREAM_HEADERS)
