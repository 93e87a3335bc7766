"""Task routes (SPEC §3): submit one or a batch, read, list, cancel, wait."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from taskfleet.api.auth import require_role
from taskfleet.api.database import Database, Row, fetch_all, fetch_one
from taskfleet.api.deps import get_database, get_metrics, get_registry, get_shutdown
from taskfleet.api.errors import ApiError, Loc, error_item, pydantic_errors
from taskfleet.api.routing import guarded_route
from taskfleet.api.schemas import (
    MAX_BATCH,
    MAX_BIGINT,
    MAX_LABEL_LENGTH,
    MAX_PAYLOAD_BYTES,
    MAX_TYPE_LENGTH,
    ErrorList,
    ErrorMessage,
    SubmittedTask,
    TaskBatchIn,
    TaskBatchOut,
    TaskIn,
    TaskOut,
    TaskPage,
    WaitedTask,
)
from taskfleet.api.shutdown import Shutdown
from taskfleet.shared import protocol
from taskfleet.shared import queries as q
from taskfleet.shared.metrics import ApiMetrics
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE, lane_for_priority
from taskfleet.shared.registry import TaskRegistry
from taskfleet.shared.schema import FINISHED_STATUSES, TaskStatus

# A task's body is its payload plus a bounded envelope (type, 32 labels of 128 characters, a
# unique key, numbers): 16 KiB covers it with room to spare, so the payload limit is what bites.
ENVELOPE_BYTES = 16 * 1024
TASK_BODY_LIMIT = MAX_PAYLOAD_BYTES + ENVELOPE_BYTES
BATCH_BODY_LIMIT = MAX_BATCH * TASK_BODY_LIMIT

# /wait polls the row, first often (a quick task returns quickly), then every half second.
WAIT_FIRST_POLL = 0.02
WAIT_MAX_POLL = 0.5
WAIT_MAX_TIMEOUT = 300.0

# A deduplicated task can finish between the insert that saw it and the read that fetches it;
# the insert is then simply tried again, a bounded number of times.
DEDUP_ATTEMPTS = 3

# Far beyond any real parameter object, and well inside what JSON encoders (the response's
# included) handle: deeper payloads could be stored and then not be served back.
MAX_PAYLOAD_DEPTH = 64

# An escaped NUL (\u0000) in JSON text, not preceded by an escaped backslash: jsonb rejects it.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

# Query filters go to Postgres as text, which cannot hold NUL.
NO_NUL = r"^[^\x00]*$"

SUBMIT = Depends(require_role("submit"))
ADMIN = Depends(require_role("admin"))

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorMessage},
    403: {"model": ErrorMessage},
    422: {"model": ErrorList},
    503: {"model": ErrorMessage},
}

router = APIRouter(route_class=guarded_route(TASK_BODY_LIMIT), tags=["tasks"])
batch_router = APIRouter(route_class=guarded_route(BATCH_BODY_LIMIT), tags=["tasks"])


@dataclass(frozen=True)
class _Submission:
    """A validated task, with its payload already encoded as the JSON text to store."""

    task: TaskIn
    payload_json: str


def _nests_deeper_than(value: Any, limit: int) -> bool:
    # Iterative: a payload nested thousands deep must not exhaust Python's stack here.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def _encode_payload(payload: Mapping[str, Any], loc: Loc) -> str:
    if _nests_deeper_than(payload, MAX_PAYLOAD_DEPTH):
        raise ApiError(
            422,
            [error_item(loc, f"nests deeper than {MAX_PAYLOAD_DEPTH} levels", "too_deep")],
        )
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # before ValueError, its base class
        raise ApiError(
            422,
            [error_item(loc, "must be valid Unicode text (unpaired surrogate)", "invalid_json")],
        ) from None
    except ValueError:  # NaN or Infinity (Python's JSON parser accepts them; JSON does not)
        raise ApiError(
            422, [error_item(loc, "must not contain NaN or Infinity", "invalid_json")]
        ) from None
    if size > MAX_PAYLOAD_BYTES:
        raise ApiError(
            413,
            [
                error_item(
                    loc,
                    f"payload is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES} bytes",
                    "too_large",
                )
            ],
        )
    if _ESCAPED_NUL.search(text):
        raise ApiError(
            422, [error_item(loc, "must not contain NUL characters (\\u0000)", "invalid_json")]
        )
    return text


def _check_submission(task: TaskIn, registry: TaskRegistry, loc: Loc) -> _Submission:
    """The checks that need the registry, and the payload's size and encoding."""
    payload_json = _encode_payload(task.payload, (*loc, "payload"))
    definition = registry.get(task.type)
    if definition is None or definition.internal:
        submittable = [
            name
            for name in registry.names()
            if (known := registry.get(name)) is not None and not known.internal
        ]
        raise ApiError(
            422,
            [
                error_item(
                    (*loc, "type"),
                    "not a registered task type; registered types: " + ", ".join(submittable),
                    "unknown_task_type",
                )
            ],
        )
    try:
        definition.validate(task.payload)
    except ValidationError as exc:
        raise ApiError(422, pydantic_errors(exc.errors(), (*loc, "payload"))) from None
    return _Submission(task=task, payload_json=payload_json)


def _insert_params(submissions: Sequence[_Submission]) -> dict[str, Any]:
    tasks = [s.task for s in submissions]
    return {
        "types": [t.type for t in tasks],
        "payloads": [s.payload_json for s in submissions],
        "priorities": [t.priority for t in tasks],
        "weights": [t.weight for t in tasks],
        "labels": [json.dumps(t.labels, ensure_ascii=False) for t in tasks],
        "max_attempts": [t.max_attempts for t in tasks],
        "delays": [t.delay_seconds for t in tasks],
        "run_ats": [t.run_at for t in tasks],
        "timeouts": [t.timeout_seconds for t in tasks],
        "unique_keys": [t.unique_key for t in tasks],
        "wake_hint": protocol.wake_hint(lane_for_priority(t.priority).value for t in tasks),
    }


def task_out(row: Mapping[str, Any]) -> dict[str, Any]:
    """A task row (the named queries' task columns) in its wire form."""
    return {
        "id": row["id"],
        "type": row["type"],
        "payload": row["payload"],
        "status": row["status"],
        "priority": row["priority"],
        "weight": row["weight"],
        "labels": list(row["labels"]),
        "attempts": row["attempts"],
        "max_attempts": row["max_attempts"],
        "run_after": row["run_after"],
        "timeout_seconds": row["timeout"],
        "created_at": row["created_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "worker_id": row["worker_id"],
        "lease_expires_at": row["lease_expires_at"],
        "result": row["result"],
        "last_error": row["last_error"],
        "unique_key": row["unique_key"],
        "cancel_requested": row["cancel_requested"],
    }


async def _insert(
    conn: AsyncConnection, submissions: Sequence[_Submission]
) -> list[tuple[Row, bool]]:
    """Insert the tasks in one statement (one NOTIFY); for each, its row and whether it was
    deduplicated onto an unfinished task with the same unique_key."""
    results: list[tuple[Row, bool] | None] = [None] * len(submissions)
    todo = list(range(len(submissions)))
    for _ in range(DEDUP_ATTEMPTS):
        rows = await fetch_all(
            conn, q.task_insert_batch, **_insert_params([submissions[i] for i in todo])
        )
        vanished: list[int] = []
        for index, row in zip(todo, rows, strict=True):
            if not row["deduplicated"]:
                results[index] = (row, False)
                continue
            existing = await fetch_one(
                conn, q.task_get_unfinished_by_unique_key, unique_key=row["input_unique_key"]
            )
            if existing is None:  # it finished in between: its key is free again
                vanished.append(index)
            else:
                results[index] = (existing, True)
        if not vanished:
            break
        todo = vanished
    else:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            "unique_key: the task holding this key kept changing state; retry the request",
        )
    return [r for r in results if r is not None]


def _count_submitted(metrics: ApiMetrics, inserted: Sequence[tuple[Row, bool]]) -> None:
    for row, deduplicated in inserted:
        if not deduplicated:
            metrics.submitted.labels(lane=lane_for_priority(row["priority"]).value).inc()


@router.post(
    "/tasks",
    status_code=status.HTTP_201_CREATED,
    response_model=SubmittedTask,
    dependencies=[SUBMIT],
    responses={
        200: {"model": SubmittedTask, "description": "Deduplicated onto an unfinished task"},
        413: {"model": ErrorList},
        **_ERRORS,
    },
    summary="Submit a task",
)
async def create_task(
    task: TaskIn,
    response: Response,
    database: Annotated[Database, Depends(get_database)],
    registry: Annotated[TaskRegistry, Depends(get_registry)],
    metrics: Annotated[ApiMetrics, Depends(get_metrics)],
) -> dict[str, Any]:
    submission = _check_submission(task, registry, ("body",))
    # One task is one INSERT statement (its NOTIFY included): atomic without BEGIN/COMMIT.
    async with database.autocommit() as conn:
        inserted = await _insert(conn, [submission])
    _count_submitted(metrics, inserted)
    row, deduplicated = inserted[0]
    if deduplicated:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/tasks/{row['id']}"
    return {**task_out(row), "deduplicated": deduplicated}


@batch_router.post(
    "/tasks/batch",
    status_code=status.HTTP_201_CREATED,
    response_model=TaskBatchOut,
    dependencies=[SUBMIT],
    responses={413: {"model": ErrorList}, **_ERRORS},
    summary="Submit up to 1,000 tasks, all or nothing",
)
async def create_tasks(
    batch: TaskBatchIn,
    database: Annotated[Database, Depends(get_database)],
    registry: Annotated[TaskRegistry, Depends(get_registry)],
    metrics: Annotated[ApiMetrics, Depends(get_metrics)],
) -> dict[str, Any]:
    # Item by item, in order, so the error names the first bad task whatever its fault.
    submissions: list[_Submission] = []
    for index, raw in enumerate(batch.tasks):
        loc: Loc = ("body", "tasks", index)
        try:
            task = TaskIn.model_validate(raw)
        except ValidationError as exc:
            raise ApiError(422, pydantic_errors(exc.errors(), loc)) from None
        submissions.append(_check_submission(task, registry, loc))
    async with database.transaction() as conn:
        inserted = await _insert(conn, submissions)
    _count_submitted(metrics, inserted)
    return {"tasks": [{**task_out(row), "deduplicated": dedup} for row, dedup in inserted]}


TaskId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="The task id.")]


def _not_found(task_id: int) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"task {task_id} not found")


@router.get(
    "/tasks/{id}",
    response_model=TaskOut,
    dependencies=[SUBMIT],
    responses={404: {"model": ErrorMessage}, **_ERRORS},
    summary="Read a task",
)
async def get_task(
    id: TaskId, database: Annotated[Database, Depends(get_database)]
) -> dict[str, Any]:
    row = await database.fetch_one(q.task_get, id=id)
    if row is None:
        raise _not_found(id)
    return task_out(row)


@router.get(
    "/tasks",
    response_model=TaskPage,
    dependencies=[SUBMIT],
    responses=_ERRORS,
    summary="List tasks, newest first",
)
async def list_tasks(
    database: Annotated[Database, Depends(get_database)],
    status_: Annotated[TaskStatus | None, Query(alias="status")] = None,
    type_: Annotated[
        str | None,
        Query(alias="type", min_length=1, max_length=MAX_TYPE_LENGTH, pattern=NO_NUL),
    ] = None,
    label: Annotated[
        str | None, Query(min_length=1, max_length=MAX_LABEL_LENGTH, pattern=NO_NUL)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        int | None,
        Query(ge=1, le=MAX_BIGINT, description="next_cursor of the previous page."),
    ] = None,
) -> dict[str, Any]:
    rows = await database.fetch_all(
        q.task_list,
        status=status_.value if status_ is not None else None,
        type=type_,
        label=label,
        before_id=cursor,
        limit=limit + 1,  # one more than asked says whether another page exists
    )
    page = rows[:limit]
    next_cursor = str(page[-1]["id"]) if len(rows) > limit else None
    return {"tasks": [task_out(r) for r in page], "next_cursor": next_cursor}


@router.post(
    "/tasks/{id}/cancel",
    response_model=TaskOut,
    dependencies=[ADMIN],
    responses={404: {"model": ErrorMessage}, 409: {"model": ErrorMessage}, **_ERRORS},
    summary="Cancel a task (pending: at once; running: the worker interrupts it; a "
    "runtime-config update: 409, PUT a new config instead)",
)
async def cancel_task(
    id: TaskId, database: Annotated[Database, Depends(get_database)]
) -> dict[str, Any]:
    async with database.transaction() as conn:
        row = await fetch_one(conn, q.task_cancel, id=id)
        if row is None:
            row = await fetch_one(conn, q.task_get, id=id)
            if row is None:
                raise _not_found(id)
            if row["type"] == RUNTIME_CONFIG_TASK_TYPE:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    f"task {id} is a runtime-config update and cannot be cancelled: PUT a new "
                    "config instead (it supersedes this one)",
                )
            raise HTTPException(status.HTTP_409_CONFLICT, f"task {id} is already {row['status']}")
    return task_out(row)


@router.get(
    "/tasks/{id}/wait",
    response_model=WaitedTask,
    dependencies=[SUBMIT],
    responses={404: {"model": ErrorMessage}, **_ERRORS},
    summary="Wait until a task is finished or the timeout passes (or the server stops: then "
    "the task as it is, finished false)",
)
async def wait_task(
    id: TaskId,
    request: Request,
    database: Annotated[Database, Depends(get_database)],
    shutdown: Annotated[Shutdown, Depends(get_shutdown)],
    timeout: Annotated[
        float, Query(ge=0, le=WAIT_MAX_TIMEOUT, allow_inf_nan=False, description="Seconds.")
    ] = 30.0,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    interval = WAIT_FIRST_POLL
    while True:
        # A connection per poll, never held while sleeping: waiters do not drain the pool.
        row = await database.fetch_one(q.task_get, id=id)
        if row is None:
            raise _not_found(id)
        finished = row["status"] in FINISHED_STATUSES
        remaining = deadline - loop.time()
        if finished or remaining <= 0 or shutdown.started or await request.is_disconnected():
            # At shutdown: the task as it is now (finished false), not a cut-off connection.
            return {**task_out(row), "finished": finished}
        await shutdown.sleep(min(interval, remaining))
        interval = min(interval * 2, WAIT_MAX_POLL)
