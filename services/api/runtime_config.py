"""Runtime config routes (docs/reference.md#runtime-config): change the fleet's config and
follow it converge.

``PUT /runtime-config`` validates the body, enqueues one control-lane ``updateWorkerRuntimeConfig``
task (or attaches to the one already there for the same ``requestID``) and then streams what the
database says (``config_stream.py``), in the form the ``Accept`` header asks for
(``negotiation.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import JSONResponse, Response

from taskfleet.api.auth import require_role
from taskfleet.api.config_stream import (
    enqueued_event,
    excluded_json,
    final_event,
    read_snapshot,
    request_location,
    respond,
)
from taskfleet.api.config_submit import submit_config
from taskfleet.api.database import Database, fetch_all, fetch_one
from taskfleet.api.deps import get_database, get_settings, get_state
from taskfleet.api.errors import ApiError, error_item
from taskfleet.api.negotiation import JSON, JSONL, NDJSON, SSE, negotiate, not_acceptable
from taskfleet.api.routing import read_body
from taskfleet.shared import queries
from taskfleet.shared.policy.lanes import Lane
from taskfleet.shared.policy.runtime_config import (
    MAX_REQUEST_ID_LENGTH,
    RuntimeConfig,
    RuntimeConfigError,
    config_from_payload,
    normalise_runtime_config,
    patch_payload,
)
from taskfleet.shared.settings import ApiSettings
from taskfleet.shared.storable import text_problem

#: A config body is small: at most 1000 labels of at most 128 characters, plus a few fields.
MAX_BODY_BYTES = 1 << 20
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 3600.0

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


def _first_issue(exc: RuntimeConfigError) -> str:
    if not exc.issues:
        return str(exc)
    issue = exc.issues[0]
    return f"{'.'.join(str(part) for part in issue.loc)}: {issue.msg}"


async def _change_config(
    request: Request,
    database: Database,
    request_id: str,
    payload: dict[str, Any],
    *,
    wait: bool,
    timeout: float,
    check_payload: bool,
) -> Response:
    media_type = negotiate(request.headers.get("accept")) if wait else JSON
    if media_type is None:
        raise not_acceptable()
    submitted = await submit_config(database, request_id, payload, check_payload=check_payload)
    if not submitted.deduplicated:
        # Committed: one control-lane task inserted (an attached retry inserted nothing).
        get_state(request).metrics.submitted.labels(Lane.CONTROL.value).inc()
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
    state = get_state(request)
    return await respond(
        request, database, media_type, first, timeout, state.shutdown, state.config_signals
    )


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
                        "pausedLabels": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1, "maxLength": 128},
                            "description": "A pending task carrying any of these labels is "
                            "not claimed until the label is resumed.",
                        },
                        "pausedTypes": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1, "maxLength": 200},
                            "description": "Task types not claimed until resumed (never "
                            "updateWorkerRuntimeConfig).",
                        },
                        "pausedLanes": {
                            "type": "array",
                            "items": {"type": "string", "enum": ["strict", "normal"]},
                            "description": "Whole lanes not claimed until resumed; the control "
                            "lane can never be paused.",
                        },
                        "labelLimits": {
                            "type": "object",
                            "maxProperties": 100,
                            "description": "Fleet-wide limits per label: running tasks "
                            "(maxInFlight) and start rate (ratePerSecond, a token bucket of "
                            "at most one second's worth).",
                            "additionalProperties": {
                                "type": "object",
                                "additionalProperties": False,
                                "minProperties": 1,
                                "properties": {
                                    "maxInFlight": {
                                        "type": "integer",
                                        "minimum": 1,
                                        "maximum": 1000000,
                                    },
                                    "ratePerSecond": {
                                        "type": "number",
                                        "exclusiveMinimum": 0,
                                        "maximum": 1000000,
                                    },
                                },
                            },
                        },
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
    409: {
        "description": "The requestID was already used for a different config; or (PATCH) the "
        "latest version breaks a rule, so there is nothing to merge into."
    },
    422: {"description": "A rule of the runtime config is broken; nothing was enqueued."},
    413: {"description": "The body is larger than 1 MiB."},
}
#: What every route here can also answer: auth (admin role) and an unreachable database.
_COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "No valid bearer token."},
    403: {"description": "The token's role is not admin."},
    503: {
        "description": "The database is unavailable, or (a blocking request) the API is "
        "shutting down: retry after Retry-After, or follow the Location."
    },
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
    ``labelWeights``, ``requestID``, ``notifyInterval``, ``listenTimeout``, ``pausedLabels``,
    ``pausedTypes``, ``pausedLanes``, ``labelLimits`` (docs/reference.md#runtime-config). An
    omitted field takes its default (nothing paused, no limit).
    """
    body = await _json_object(request)
    config = _normalise(body, default_max_strict_percentage=settings.default_max_strict_percentage)
    return await _change_config(
        request,
        database,
        config.request_id,
        config.to_payload(),
        wait=wait,
        timeout=timeout,
        check_payload=True,
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

    The merge is made by the update task, against the version that is latest when it writes the
    new one (in the same transaction), so concurrent PATCHes compose. The body is checked here
    against the latest version too, for a 422 now rather than a failed change later. A new
    ``requestID`` is generated unless one is given.
    """
    body = await _json_object(request)
    latest = await database.fetch_one(queries.runtime_config_latest)
    if latest is None:
        config = _normalise(
            body, default_max_strict_percentage=settings.default_max_strict_percentage
        )
    else:
        try:
            base = config_from_payload(latest["payload"])
        except RuntimeConfigError as exc:
            # Stored by an older version under looser rules: nothing to merge into.
            raise ApiError(
                status.HTTP_409_CONFLICT,
                [
                    error_item(
                        ("body",),
                        f"the latest config version ({latest['version']}) breaks a rule "
                        f"({_first_issue(exc)}): PUT a whole config instead of a PATCH",
                        "conflict",
                    )
                ],
            ) from None
        config = _normalise(body, base=base)
    return await _change_config(
        request,
        database,
        config.request_id,
        patch_payload(config.request_id, body),
        wait=wait,
        timeout=timeout,
        check_payload=False,
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
        422: {"description": "The request id is not storable text, or longer than 200."},
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
    if (problem := text_problem(request_id)) is not None:
        raise ApiError(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            [error_item(("path", "request_id"), f"must not contain {problem}", "invalid_text")],
        )
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        # No request can have it; and the 404's message would echo all of it back.
        raise ApiError(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            [
                error_item(
                    ("path", "request_id"),
                    f"must be at most {MAX_REQUEST_ID_LENGTH} characters",
                    "string_too_long",
                )
            ],
        )
    snapshot = await read_snapshot(database, request_id, None)
    if snapshot.task is None and snapshot.version is None:
        raise _not_found(request_id)
    task_id = int(snapshot.task["id"]) if snapshot.task is not None else None
    if watch:
        media_type = negotiate(request.headers.get("accept"))
        if media_type is None:
            raise not_acceptable()
        first = enqueued_event(request_id, task_id, deduplicated=True)
        state = get_state(request)
        return await respond(
            request, database, media_type, first, timeout, state.shutdown, state.config_signals
        )
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
        # The outcome's (as decided), else the workers left out so far.
        "excluded": (
            final["excluded"]
            if final is not None and "excluded" in final
            else excluded_json(snapshot.excluded)
        ),
        "outcome": final["event"] if final is not None else None,
        "final": final,
        "payload": snapshot.task["payload"] if snapshot.task is not None else None,
    }
    return JSONResponse(document)
