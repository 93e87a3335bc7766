"""Runtime config endpoints (SPEC §6, §7): change the fleet's config and follow it converge.

``PUT /runtime-config`` validates the body, enqueues one control-lane ``updateWorkerRuntimeConfig``
task (or attaches to the one already there for the same ``requestID``) and then reports what the
database says: the version once the task has written it, the alive workers' applied versions as
they move, and one final outcome. The API never talks to the workers, and keeps no state between
polls, so any replica can serve a stream, and a client that lost one re-attaches with
``GET /runtime-config/requests/{request_id}?watch=true``.

Each poll borrows one pooled connection for a few short statements and gives it back; an open
stream holds no connection while it waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import JSONResponse, Response, StreamingResponse

from taskfleet.api.auth import require_role
from taskfleet.api.database import Database, DatabaseUnavailable, Row, fetch_all, fetch_one
from taskfleet.api.deps import get_database, get_settings
from taskfleet.api.errors import ApiError, error_item
from taskfleet.api.routing import read_body
from taskfleet.shared import db, protocol, queries
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.policy.runtime_config import (
    RuntimeConfig,
    RuntimeConfigError,
    config_from_payload,
    normalise_runtime_config,
)
from taskfleet.shared.settings import ApiSettings

log = logging.getLogger("taskfleet.api.runtime_config")

#: Attempts of the update task: it only fails on a database error, and a retry is idempotent.
UPDATE_TASK_MAX_ATTEMPTS = 10
#: A config body is small: at most 1000 labels of at most 128 characters, plus a few fields.
MAX_BODY_BYTES = 1 << 20
#: Polling of the database while a stream waits: quick right after a change, backing off to the
#: ceiling while nothing moves.
POLL_MIN_SECONDS = 0.02
POLL_MAX_SECONDS = 0.2
POLL_GROWTH = 1.5
#: A progress event goes out at least this often, changed or not (SPEC §7), so that clients and
#: proxies can tell a quiet stream from a dead one.
PROGRESS_HEARTBEAT_SECONDS = 15.0
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 3600.0

NDJSON = "application/x-ndjson"
JSONL = "application/jsonl"
SSE = "text/event-stream"
JSON = "application/json"
#: What a config request can answer with, in the server's order of preference.
OFFERED = (NDJSON, JSONL, SSE, JSON)

Event = dict[str, Any]
FINAL_EVENTS = frozenset({"converged", "superseded", "timeout", "failed"})

router = APIRouter(
    prefix="/runtime-config",
    tags=["runtime config"],
    dependencies=[Depends(require_role("admin"))],
)

TimeoutParam = Query(
    DEFAULT_TIMEOUT_SECONDS,
    gt=0,
    le=MAX_TIMEOUT_SECONDS,
    allow_inf_nan=False,
    description="Seconds to wait for the outcome (default 60, at most 3600). The config task "
    "goes on after a timeout.",
)


# --------------------------------------------------------------------------------------------
# Content negotiation


def _media_ranges(accept: str) -> list[tuple[str, str, float]]:
    ranges: list[tuple[str, str, float]] = []
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media, _, subtype = fields[0].lower().partition("/")
        if not media or not subtype:
            continue
        q = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        ranges.append((media, subtype, q))
    return ranges


def negotiate(accept: str | None) -> str | None:
    """The offered media type the ``Accept`` header prefers, or None when it accepts none.

    Each offer takes the quality of the most specific range that matches it; ties go to the
    more specific match, then to the server's order (NDJSON first), so ``*/*`` means NDJSON.
    """
    if accept is None or not accept.strip():
        return NDJSON
    ranges = _media_ranges(accept)
    best: tuple[float, int, int] | None = None
    chosen: str | None = None
    for order, offer in enumerate(OFFERED):
        media, _, subtype = offer.partition("/")
        match: tuple[int, float] | None = None
        for r_media, r_subtype, q in ranges:
            if r_media == media and r_subtype == subtype:
                specificity = 2
            elif r_media == media and r_subtype == "*":
                specificity = 1
            elif r_media == "*" and r_subtype == "*":
                specificity = 0
            else:
                continue
            if match is None or specificity > match[0]:
                match = (specificity, q)
        if match is None or match[1] <= 0:
            continue
        rank = (match[1], match[0], -order)
        if best is None or rank > best:
            best, chosen = rank, offer
    return chosen


def _not_acceptable() -> ApiError:
    return ApiError(
        status.HTTP_406_NOT_ACCEPTABLE,
        [
            error_item(
                ("header", "accept"),
                "must accept one of " + ", ".join(OFFERED) + " (or leave Accept out)",
                "not_acceptable",
            )
        ],
    )


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


async def read_snapshot(database: Database, request_id: str, version: int | None) -> Snapshot:
    """Read the request's state, on one connection borrowed for this poll only."""
    async with database.transaction() as conn:
        task = await fetch_one(conn, queries.runtime_config_request_task, request_id=request_id)
        if version is None:
            row = await fetch_one(conn, queries.runtime_config_by_request, request_id=request_id)
            version = int(row["version"]) if row is not None else None
        if version is None:
            alive = await fetch_all(conn, queries.runtime_config_alive_applied)
            return Snapshot(
                task=task,
                version=None,
                latest=None,
                alive_workers=len(alive),
                applied_workers=0,
                lagging=tuple(str(w["id"]) for w in alive),
                seconds_since_insert=None,
            )
        state = await fetch_one(conn, queries.runtime_config_convergence, version=version)
    assert state is not None  # an aggregate always returns its one row
    since = state["seconds_since_insert"]
    return Snapshot(
        task=task,
        version=version,
        latest=int(state["latest"]),
        alive_workers=int(state["alive_workers"]),
        applied_workers=int(state["applied_workers"]),
        lagging=tuple(str(w) for w in state["lagging"]),
        seconds_since_insert=float(since) if since is not None else None,
    )


def progress_event(snapshot: Snapshot) -> Event:
    return {
        "event": "progress",
        "version": snapshot.version,
        "alive_workers": snapshot.alive_workers,
        "applied_workers": snapshot.applied_workers,
        "lagging": list(snapshot.lagging),
    }


def _int_or(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def final_event(snapshot: Snapshot) -> Event | None:
    """The request's outcome, when it has one.

    The update task's result decides when the task has finished; while it runs, the database
    may decide already, by the worker's own rule: a newer version means superseded (checked
    first), no alive worker below the version means converged.
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
                return {"event": "converged", "version": version, "seconds": seconds}
            if outcome == "superseded":
                return {
                    "event": "superseded",
                    "version": version,
                    "superseded_by": _int_or(result.get("superseded_by"), snapshot.latest),
                }
            return {
                "event": "failed",
                "error": f"update task {task['id']} completed with an unknown outcome {outcome!r}",
            }
        if task_status in ("failed", "cancelled"):
            error = task["last_error"] or f"update task {task['id']} was {task_status}"
            return {"event": "failed", "error": str(error)}
    if snapshot.version is None or snapshot.latest is None:
        return None
    if snapshot.latest > snapshot.version:
        return {
            "event": "superseded",
            "version": snapshot.version,
            "superseded_by": snapshot.latest,
        }
    if not snapshot.lagging:
        seconds = snapshot.seconds_since_insert
        return {
            "event": "converged",
            "version": snapshot.version,
            "seconds": round(seconds, 6) if seconds is not None else None,
        }
    return None


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
) -> AsyncIterator[Event]:
    """The events of one config request, ``first`` (the ``enqueued`` event) first, then
    ``version``, ``progress`` whenever the fleet moves (or every heartbeat), one final event.

    Stops early, without a final event, when ``gone()`` says the client left.
    """
    yield first
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    version: int | None = None
    last: Snapshot | None = None
    last_progress: Event | None = None
    last_progress_at = loop.time()
    interval = POLL_MIN_SECONDS
    while True:
        changed = False
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
        if now >= deadline:
            yield {
                "event": "timeout",
                "version": version,
                "lagging": list(last.lagging) if last is not None else [],
            }
            return
        if gone is not None and await gone():
            return
        interval = POLL_MIN_SECONDS if changed else min(interval * POLL_GROWTH, POLL_MAX_SECONDS)
        await asyncio.sleep(min(interval, max(deadline - loop.time(), 0.0)))


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


def request_location(request_id: str) -> str:
    return f"/runtime-config/requests/{quote(request_id, safe='')}"


async def _respond(
    request: Request,
    database: Database,
    media_type: str,
    first: Event,
    timeout: float,
) -> Response:
    request_id = str(first["request_id"])
    if media_type == JSON:
        events = [
            event
            async for event in watch_request(
                database, request_id, first, timeout=timeout, gone=request.is_disconnected
            )
        ]
        final = events[-1] if events and events[-1]["event"] in FINAL_EVENTS else None
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
        async for event in watch_request(database, request_id, first, timeout=timeout):
            yield encode(event)

    return StreamingResponse(body(), media_type=media_type, headers=_STREAM_HEADERS)


# --------------------------------------------------------------------------------------------
# Enqueueing


def _body_error(msg: str, type_: str) -> ApiError:
    return ApiError(status.HTTP_422_UNPROCESSABLE_CONTENT, [error_item(("body",), msg, type_)])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await read_body(request, MAX_BODY_BYTES)
    if not raw.strip():
        raise _body_error("body must be a JSON object", "missing")
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _body_error(f"body is not valid JSON: {exc}", "json_invalid") from None
    if not isinstance(body, dict):
        raise _body_error("body must be a JSON object", "dict_type")
    return body


def _normalise(body: Mapping[str, Any], **kwargs: Any) -> RuntimeConfig:
    try:
        return normalise_runtime_config(body, **kwargs)
    except RuntimeConfigError as exc:
        raise ApiError(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            [error_item(("body", *issue.loc), issue.msg, "value_error") for issue in exc.issues],
        ) from None


@dataclass(frozen=True)
class Submitted:
    request_id: str
    task_id: int | None
    #: True when the request id was known already: this request attached to it.
    deduplicated: bool


def _unique_key(request_id: str) -> str:
    return f"runtime-config:{request_id}"


async def submit_config(
    database: Database, config: RuntimeConfig, *, check_payload: bool
) -> Submitted:
    """Enqueue the update task for ``config``, or attach to the one its request id has.

    One request id is one version: a retry while the task is unfinished is deduplicated by the
    task's unique key, and a request id that already has a version or a finished task is
    attached to. With ``check_payload`` (a PUT), reusing a request id for a different config is
    a 409: attaching would report the outcome of a config the client did not send.
    """
    request_id = config.request_id
    payload = config.to_payload()
    async with database.transaction() as conn:
        existing = await fetch_one(conn, queries.runtime_config_request_task, request_id=request_id)
        stored = existing["payload"] if existing is not None else None
        if existing is None:
            row = await fetch_one(conn, queries.runtime_config_by_request, request_id=request_id)
            stored = row["payload"] if row is not None else None
        if stored is None:
            rows = await fetch_all(
                conn,
                queries.task_insert_batch,
                types=[RUNTIME_CONFIG_TASK_TYPE],
                payloads=[db.dumps(payload)],
                priorities=[CONTROL_PRIORITY],
                weights=[1],
                labels=["[]"],
                max_attempts=[UPDATE_TASK_MAX_ATTEMPTS],
                delays=[None],
                run_ats=[None],
                timeouts=[None],
                unique_keys=[_unique_key(request_id)],
                wake_hint=protocol.CONTROL_HINT,
            )
            if not rows[0]["deduplicated"]:
                return Submitted(request_id, int(rows[0]["id"]), deduplicated=False)
            # A concurrent request with the same id enqueued it first.
            existing = await fetch_one(
                conn, queries.task_get_unfinished_by_unique_key, unique_key=_unique_key(request_id)
            ) or await fetch_one(conn, queries.runtime_config_request_task, request_id=request_id)
            stored = existing["payload"] if existing is not None else None
    if check_payload and stored is not None and stored != payload:
        raise ApiError(
            status.HTTP_409_CONFLICT,
            [
                error_item(
                    ("body", "requestID"),
                    f"request id {request_id!r} was already used for a different config; "
                    "use a new requestID (or leave it out) for a new change",
                    "conflict",
                )
            ],
        )
    task_id = int(existing["id"]) if existing is not None else None
    return Submitted(request_id, task_id, deduplicated=True)


async def _change_config(
    request: Request,
    database: Database,
    config: RuntimeConfig,
    *,
    wait: bool,
    timeout: float,
    check_payload: bool,
) -> Response:
    media_type = negotiate(request.headers.get("accept")) if wait else JSON
    if media_type is None:
        raise _not_acceptable()
    submitted = await submit_config(database, config, check_payload=check_payload)
    if not wait:
        return JSONResponse(
            {
                "task_id": submitted.task_id,
                "request_id": submitted.request_id,
                "deduplicated": submitted.deduplicated,
            },
            status_code=status.HTTP_202_ACCEPTED,
            headers={"Location": request_location(submitted.request_id)},
        )
    first = enqueued_event(submitted.request_id, submitted.task_id, submitted.deduplicated)
    return await _respond(request, database, media_type, first, timeout)


#: The body as documented in the OpenAPI schema; it is read and validated by
#: ``normalise_runtime_config``, the same code the update task and the workers run.
_CONFIG_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "maxStrictPercentage": {"type": "integer", "minimum": 0, "maximum": 100},
                        "defaultWeight": {"type": "integer", "minimum": 1},
                        "labels": {"type": "array", "items": {"type": "string", "minLength": 1}},
                        "weights": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                        "labelWeights": {
                            "type": "object",
                            "additionalProperties": {"type": "integer", "minimum": 1},
                        },
                        "requestID": {"type": "string", "minLength": 1, "maxLength": 200},
                        "notifyInterval": {"type": "string", "examples": ["1s", "500ms"]},
                        "listenTimeout": {"type": "string", "examples": ["2s"]},
                    },
                }
            }
        },
    }
}

_CHANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The progress events, as NDJSON (default), SSE, or one JSON document "
        "(Accept: application/json) once the outcome is known.",
        "content": {NDJSON: {}, JSONL: {}, SSE: {}, JSON: {}},
    },
    202: {"description": "?wait=false: enqueued; follow the Location."},
    406: {"description": "The Accept header allows none of the offered types."},
    409: {"description": "The requestID was already used for a different config."},
    422: {"description": "A rule of SPEC §6 is broken; nothing was enqueued."},
    413: {"description": "The body is larger than 1 MiB."},
}
#: What every route here can also answer: auth (admin role) and an unreachable database.
_COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "No valid bearer token."},
    403: {"description": "The token's role is not admin."},
    503: {"description": "The database is unavailable."},
}
_CHANGE_RESPONSES.update(_COMMON_RESPONSES)


@router.put("", responses=_CHANGE_RESPONSES, openapi_extra=_CONFIG_BODY)
async def put_runtime_config(
    request: Request,
    wait: bool = Query(True, description="false: answer 202 at once instead of following it."),
    timeout: float = TimeoutParam,
    database: Database = Depends(get_database),
    settings: ApiSettings = Depends(get_settings),
) -> Response:
    """Replace the whole runtime config and follow the fleet until it converges.

    Body: ``maxStrictPercentage``, ``defaultWeight``, ``labels`` + ``weights`` or
    ``labelWeights``, ``requestID``, ``notifyInterval``, ``listenTimeout`` (SPEC §6). An omitted
    field takes its default.
    """
    body = await _json_object(request)
    config = _normalise(body, default_max_strict_percentage=settings.default_max_strict_percentage)
    return await _change_config(
        request, database, config, wait=wait, timeout=timeout, check_payload=True
    )


@router.patch("", responses=_CHANGE_RESPONSES, openapi_extra=_CONFIG_BODY)
async def patch_runtime_config(
    request: Request,
    wait: bool = Query(True, description="false: answer 202 at once instead of following it."),
    timeout: float = TimeoutParam,
    database: Database = Depends(get_database),
    settings: ApiSettings = Depends(get_settings),
) -> Response:
    """Merge the given fields into the latest version's config, and follow it like a PUT.

    The merge is made here, against the version that is latest now; a new ``requestID`` is
    generated unless one is given.
    """
    body = await _json_object(request)
    latest = await database.fetch_one(queries.runtime_config_latest)
    if latest is None:
        config = _normalise(
            body, default_max_strict_percentage=settings.default_max_strict_percentage
        )
    else:
        config = _normalise(body, base=config_from_payload(latest["payload"]))
    return await _change_config(
        request, database, config, wait=wait, timeout=timeout, check_payload=False
    )


# --------------------------------------------------------------------------------------------
# Reading


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@router.get("", responses=_COMMON_RESPONSES)
async def get_runtime_config(
    database: Database = Depends(get_database),
    settings: ApiSettings = Depends(get_settings),
) -> dict[str, Any]:
    """The latest version (0 with the fleet defaults before the first change), its payload, and
    the version each alive worker has applied."""
    async with database.transaction() as conn:
        latest = await fetch_one(conn, queries.runtime_config_latest)
        alive = await fetch_all(conn, queries.runtime_config_alive_applied)
    if latest is None:
        defaults = normalise_runtime_config(
            {},
            default_max_strict_percentage=settings.default_max_strict_percentage,
            generate_request_id=False,
        ).to_payload()
        defaults.pop("requestID")
        version, request_id, payload, created_at = 0, None, defaults, None
    else:
        version = int(latest["version"])
        request_id, payload = latest["request_id"], latest["payload"]
        created_at = _iso(latest["created_at"])
    workers = [
        {
            "id": w["id"],
            "applied_config_version": int(w["applied_config_version"]),
            "up_to_date": int(w["applied_config_version"]) >= version,
        }
        for w in alive
    ]
    return {
        "version": version,
        "request_id": request_id,
        "payload": payload,
        "created_at": created_at,
        "alive_workers": len(workers),
        "applied_workers": sum(1 for w in workers if w["up_to_date"]),
        "lagging": [w["id"] for w in workers if not w["up_to_date"]],
        "workers": workers,
    }


def _not_found(request_id: str) -> ApiError:
    return ApiError(
        status.HTTP_404_NOT_FOUND,
        [
            error_item(
                ("path", "request_id"), f"no runtime config request {request_id!r}", "not_found"
            )
        ],
    )


@router.get(
    # A request id is any string: one with a slash in it arrives decoded into the path.
    "/requests/{request_id:path}",
    responses={
        200: {
            "description": "The request's status; with ?watch=true its events (NDJSON or SSE).",
            "content": {JSON: {}, NDJSON: {}, JSONL: {}, SSE: {}},
        },
        404: {"description": "No task and no version has this request id."},
        **_COMMON_RESPONSES,
    },
)
async def get_runtime_config_request(
    request: Request,
    request_id: str,
    watch: bool = Query(False, description="true: stream the events, as PUT does."),
    timeout: float = TimeoutParam,
    database: Database = Depends(get_database),
) -> Response:
    """A config request's status: its task, its version, the alive fleet, and the outcome once
    there is one. ``?watch=true`` re-attaches to its event stream."""
    snapshot = await read_snapshot(database, request_id, None)
    if snapshot.task is None and snapshot.version is None:
        raise _not_found(request_id)
    task_id = int(snapshot.task["id"]) if snapshot.task is not None else None
    if watch:
        media_type = negotiate(request.headers.get("accept"))
        if media_type is None:
            raise _not_acceptable()
        first = enqueued_event(request_id, task_id, deduplicated=True)
        return await _respond(request, database, media_type, first, timeout)
    final = final_event(snapshot)
    document: dict[str, Any] = {
        "request_id": request_id,
        "task_id": task_id,
        "task_status": snapshot.task["status"] if snapshot.task is not None else None,
        "version": snapshot.version,
        "latest_version": snapshot.latest,
        "alive_workers": snapshot.alive_workers,
        "applied_workers": snapshot.applied_workers,
        "lagging": list(snapshot.lagging),
        "outcome": final["event"] if final is not None else None,
        "final": final,
        "payload": snapshot.task["payload"] if snapshot.task is not None else None,
    }
    return JSONResponse(document)
