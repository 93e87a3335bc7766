"""The client's calls without I/O: what to send, whether a failure may be retried, how an answer
is read. :mod:`taskfleet.client` sends them, blocking or async, with the same rules."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from taskfleet.errors import ApiError, InvalidRequest, error_from_detail
from taskfleet.models import Schedule, ScheduleFields, TaskFields, TaskFilter, TaskSpec

#: Seconds to connect, write, or wait for a pool slot.
CONNECT_TIMEOUT = 10.0
#: Slack added to a server-side wait (``?timeout=``) before the client gives up reading. The
#: config stream sends a progress event at least every 15 s, so this also covers its gaps.
READ_SLACK = 30.0
#: Longest single ``GET /tasks/{id}/wait``; a longer wait is several calls, so the client never
#: depends on how long the server lets one call block.
WAIT_CHUNK = 60.0
#: After the server answered a wait before the time it was asked to wait (it is shutting down,
#: say): the pause before asking again, so a client never asks in a tight loop.
EARLY_ANSWER_PAUSE = 0.5


def pause_before_asking_again(sent: float, asked: float, deadline: float) -> float | None:
    """After a wait answered with an unfinished task: how long to pause before asking again
    (0 when the server waited as asked), or None when the caller's deadline has passed.
    Monotonic clock times."""
    now = time.monotonic()
    if now >= deadline:
        return None
    if now - sent >= asked:
        return 0.0
    return min(EARLY_ANSWER_PAUSE, deadline - now)


#: Retries of a retryable call, after the first try.
RETRIES = 3
BACKOFF_FIRST = 0.25
BACKOFF_MAX = 4.0

_CONFIG_WIRE_NAMES = {
    "max_strict_percentage": "maxStrictPercentage",
    "default_weight": "defaultWeight",
    "label_weights": "labelWeights",
    "labels": "labels",
    "weights": "weights",
    "notify_interval": "notifyInterval",
    "listen_timeout": "listenTimeout",
    "paused_labels": "pausedLabels",
    "paused_types": "pausedTypes",
    "paused_lanes": "pausedLanes",
    "label_limits": "labelLimits",
}


@dataclass(frozen=True)
class Call:
    """One HTTP request. ``idempotent``: sending it twice has the effect of sending it once, so
    a dropped connection or a 503 may be retried."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    idempotent: bool = False
    read_timeout: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def timeout(self, default: httpx.Timeout) -> httpx.Timeout:
        if self.read_timeout is None:
            return default
        return httpx.Timeout(default.connect, read=self.read_timeout)


def build_request(
    http: httpx.Client | httpx.AsyncClient, call: Call, default_timeout: httpx.Timeout
) -> httpx.Request:
    """The request for ``call``. A body JSON cannot carry (a NaN or infinite number) is an
    :class:`InvalidRequest` naming the field, as the API would answer, and nothing is sent."""
    try:
        return http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.body,
            headers=call.headers,
            timeout=call.timeout(default_timeout),
        )
    except ValueError:
        where = _non_finite(call.body)
        if where is None:
            raise
        raise InvalidRequest(
            422,
            "must be a finite number (JSON has no NaN or Infinity)",
            field=".".join(where) or None,
        ) from None


def _non_finite(value: Any) -> list[str] | None:
    """The path to the first NaN or infinite float in ``value``, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else []
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if (where := _non_finite(item)) is not None:
            return [str(key), *where]
    return None


def format_seconds(seconds: float) -> str:
    return f"{round(seconds, 3):g}"


def http_timeout(read: float) -> httpx.Timeout:
    """The client's timeouts; ``ValueError`` unless ``read`` is a finite number > 0."""
    if isinstance(read, bool) or not isinstance(read, (int, float)) or not 0 < read < math.inf:
        raise ValueError(f"timeout must be a number of seconds greater than 0, got {read!r}")
    return httpx.Timeout(CONNECT_TIMEOUT, read=read)


def check_retries(retries: int) -> int:
    """``retries`` as given; ``ValueError`` unless it is an integer >= 0."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer 0 or more, got {retries!r}")
    return retries


def retry_delay(attempt: int) -> float:
    """Seconds before retry number ``attempt`` (0-based): exponential, with jitter so a fleet of
    clients does not come back in step."""
    base: float = min(BACKOFF_MAX, BACKOFF_FIRST * 2**attempt)
    return base * random.uniform(0.5, 1.0)


def may_retry_error(call: Call, exc: httpx.TransportError) -> bool:
    """A connection that could not be opened sent nothing, so any call may be tried again; a
    failure after sending only for an idempotent call."""
    return call.idempotent or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)


def may_retry_status(call: Call, status: int) -> bool:
    return call.idempotent and status == 503


def decode(response: httpx.Response) -> Any:
    """The answer's JSON, or the :class:`ApiError` subclass its status calls for."""
    if not response.is_success:
        raise error_for(response)
    if response.status_code == 204:  # No Content (a delete)
        return None
    try:
        return response.json()
    except ValueError:
        raise ApiError(response.status_code, "the answer is not JSON") from None


def error_for(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()[:500] or response.reason_phrase
        return error_from_detail(response.status_code, text)
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return error_from_detail(response.status_code, detail)


def _wire(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def task_body(type: str, payload: Mapping[str, Any] | None, fields: TaskFields) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type, "payload": dict(payload or {})}
    body.update({k: _wire(v) for k, v in fields.items() if v is not None})
    return body


def submit(type: str, payload: Mapping[str, Any] | None, fields: TaskFields) -> Call:
    # With a unique_key, sending it again returns the same unfinished task: safe to retry.
    return Call(
        "POST",
        "/tasks",
        body=task_body(type, payload, fields),
        idempotent=fields.get("unique_key") is not None,
    )


def submit_many(tasks: Iterable[TaskSpec]) -> Call:
    bodies = []
    for spec in tasks:
        fields = {k: v for k, v in spec.items() if k not in ("type", "payload")}
        bodies.append(task_body(spec["type"], spec.get("payload"), fields))  # type: ignore[arg-type]
    keyed = bool(bodies) and all(b.get("unique_key") is not None for b in bodies)
    return Call("POST", "/tasks/batch", body={"tasks": bodies}, idempotent=keyed)


#: Schedules asked for per page by the clients' schedules(): the API's largest page.
SCHEDULE_PAGE = 10_000


def list_schedules(after: str | None) -> Call:
    params = {"limit": str(SCHEDULE_PAGE)}
    if after is not None:
        params["after"] = after
    return Call("GET", "/schedules", params=params, idempotent=True)


def add_schedule_page(found: list[Schedule], doc: Any) -> str | None:
    """Add a ``GET /schedules`` answer to ``found``; the ``after`` of the next page, or None
    when this was the last one."""
    page = doc["schedules"]
    if page and found and page[0]["name"] == found[0].name:
        return None  # an API without ``after`` answered the first page again
    found.extend(Schedule.model_validate(s) for s in page)
    return found[-1].name if len(page) == SCHEDULE_PAGE else None


def _schedule_path(name: str) -> str:
    return "/schedules/" + quote(name, safe="")


def set_schedule(
    name: str, type: str, payload: Mapping[str, Any] | None, fields: ScheduleFields
) -> Call:
    # A PUT of the whole definition: sending it twice has the effect of sending it once.
    body: dict[str, Any] = {"type": type, "payload": dict(payload or {})}
    body.update({k: v for k, v in fields.items() if v is not None})
    return Call("PUT", _schedule_path(name), body=body, idempotent=True)


def get_schedule(name: str) -> Call:
    return Call("GET", _schedule_path(name), idempotent=True)


def delete_schedule(name: str) -> Call:
    return Call("DELETE", _schedule_path(name))


def wait(task_id: int, chunk: float) -> Call:
    return Call(
        "GET",
        f"/tasks/{task_id}/wait",
        params={"timeout": format_seconds(chunk)},
        idempotent=True,
        read_timeout=chunk + READ_SLACK,
    )


def list_page(
    status: str | None,
    type: str | None,
    label: str | None,
    limit: int,
    cursor: str | None,
    worker: str | None = None,
) -> Call:
    params = {"status": status, "type": type, "label": label, "worker": worker, "cursor": cursor}
    query = {k: v for k, v in params.items() if v is not None}
    query["limit"] = str(limit)
    return Call("GET", "/tasks", params=query, idempotent=True)


_FILTER_FIELDS = frozenset(TaskFilter.__annotations__)


def bulk(action: str, task_filter: TaskFilter) -> Call:
    """``POST /tasks/retry`` or ``POST /tasks/cancel`` with the filter body (not retried: a
    repeat after a lost answer would act on what the first call changed)."""
    unknown = sorted(set(task_filter) - _FILTER_FIELDS)
    if unknown:
        known = ", ".join(sorted(_FILTER_FIELDS))
        raise TypeError(f"unknown filter field(s) {', '.join(unknown)}; known: {known}")
    body: dict[str, Any] = {}
    fields: Mapping[str, Any] = task_filter
    for name, value in fields.items():
        if value is None:
            continue
        if name == "status":
            # One status or several; TaskStatus members are str too.
            statuses = [value] if isinstance(value, str) else list(value)
            value = [str(getattr(s, "value", s)) for s in statuses]
        body[name] = _wire(value)
    return Call("POST", f"/tasks/{action}", body=body)


def config_body(fields: Mapping[str, Any], request_id: str) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(_CONFIG_WIRE_NAMES))
    if unknown:
        known = ", ".join(sorted(_CONFIG_WIRE_NAMES))
        raise TypeError(f"unknown runtime-config field(s) {', '.join(unknown)}; known: {known}")
    body = {_CONFIG_WIRE_NAMES[k]: v for k, v in fields.items() if v is not None}
    body["requestID"] = request_id
    return body


def change_config(body: Mapping[str, Any], patch: bool, timeout: float) -> Call:
    # The requestID makes it idempotent: one request id is one version, however often it is sent.
    return Call(
        "PATCH" if patch else "PUT",
        "/runtime-config",
        params={"timeout": format_seconds(timeout)},
        body=dict(body),
        idempotent=True,
        read_timeout=timeout + READ_SLACK,
        headers={"Accept": "application/x-ndjson"},
    )


def watch_config(request_id: str, timeout: float) -> Call:
    return Call(
        "GET",
        # One path segment whatever it holds: "r1?x" must not become a query, "a/../b" a path.
        "/runtime-config/requests/" + quote(request_id, safe=""),
        params={"watch": "true", "timeout": format_seconds(timeout)},
        idempotent=True,
        read_timeout=timeout + READ_SLACK,
        headers={"Accept": "application/x-ndjson"},
    )
