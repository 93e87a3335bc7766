"""Task routes (docs/reference.md#tasks): submit one or a batch, read, list, cancel, retry,
wait."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any

import sqlalchemy.exc
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status
from pydantic import ValidationError

from taskfleet.api.auth import require_role
from taskfleet.api.database import Connection, Database, Row, fetch_all, fetch_one
from taskfleet.api.deps import (
    Submitting,
    get_database,
    get_shutdown,
    get_submitting,
)
from taskfleet.api.errors import ApiError, Loc, pydantic_errors
from taskfleet.api.routing import guarded_route
from taskfleet.api.schemas import (
    MAX_BATCH,
    MAX_BIGINT,
    MAX_LABEL_LENGTH,
    MAX_PAYLOAD_BYTES,
    MAX_TYPE_LENGTH,
    NO_NUL,
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
from taskfleet.shared import queries as q
from taskfleet.shared.metrics import ApiMetrics
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE, lane_for_priority
from taskfleet.shared.schema import FINISHED_STATUSES, TaskStatus
from taskfleet.shared.submission import (
    Submission,
    UniqueKeyContention,
    check_submission,
    run_insert,
    task_out,
)

# A task's body is its payload plus a bounded envelope (type, 32 labels of 128 characters, a
# unique key, numbers): 16 KiB covers it with room to spare, so the payload limit is what bites.
ENVELOPE_BYTES = 16 * 1024
TASK_BODY_LIMIT = MAX_PAYLOAD_BYTES + ENVELOPE_BYTES
BATCH_BODY_LIMIT = MAX_BATCH * TASK_BODY_LIMIT

# /wait polls the row, first often (a quick task returns quickly), then every half second.
WAIT_FIRST_POLL = 0.02
WAIT_MAX_POLL = 0.5
WAIT_MAX_TIMEOUT = 300.0

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


async def _insert(
    database: Database, conn: Connection, submissions: Sequence[Submission]
) -> list[tuple[Row, bool]]:
    """Insert the tasks in one statement (one NOTIFY); for each, its row and whether it was
    deduplicated onto an unfinished task with the same unique_key."""

    async def run(query: q.Query, params: dict[str, Any]) -> list[Row]:
        statement = await database.routed(conn, query)
        if statement is not query:  # its server-side function, behind a pooler
            params = {**params, q.SYNCHRONOUS_COMMIT_PARAM: "on"}
        return await fetch_all(conn, statement, **params)

    try:
        return await run_insert(run, submissions)
    except UniqueKeyContention as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, exc.message) from None


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
    submitting: Annotated[Submitting, Depends(get_submitting)],
) -> dict[str, Any]:
    database = submitting.database
    submission = check_submission(task, submitting.registry, ("body",))
    # One task is one INSERT statement (its NOTIFY included): atomic without BEGIN/COMMIT.
    async with database.autocommit() as conn:
        inserted = await _insert(database, conn, [submission])
    _count_submitted(submitting.metrics, inserted)
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
    batch: TaskBatchIn, submitting: Annotated[Submitting, Depends(get_submitting)]
) -> dict[str, Any]:
    database, registry = submitting.database, submitting.registry
    # Item by item, in order, so the error names the first bad task whatever its fault.
    submissions: list[Submission] = []
    for index, raw in enumerate(batch.tasks):
        loc: Loc = ("body", "tasks", index)
        try:
            task = TaskIn.model_validate(raw)
        except ValidationError as exc:
            raise ApiError(422, pydantic_errors(exc.errors(), loc)) from None
        submissions.append(check_submission(task, registry, loc))
    async with database.transaction() as conn:
        inserted = await _insert(database, conn, submissions)
    _count_submitted(submitting.metrics, inserted)
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
    worker: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            pattern=NO_NUL,
            description="The id of the worker that ran (or runs) the task's last attempt.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        int | None,
        Query(ge=1, le=MAX_BIGINT, description="next_cursor of the previous page."),
    ] = None,
    bodies: Annotated[
        bool,
        Query(
            description="false: each task's payload and result are null, not even read (a "
            "listing that shows neither, such as the console's, of tasks with large ones)."
        ),
    ] = True,
) -> dict[str, Any]:
    rows = await database.fetch_all(
        q.task_list,
        bodies=bodies,
        status=status_.value if status_ is not None else None,
        type=type_,
        label=label,
        worker=worker,
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


@router.post(
    "/tasks/{id}/retry",
    response_model=TaskOut,
    dependencies=[ADMIN],
    responses={404: {"model": ErrorMessage}, 409: {"model": ErrorMessage}, **_ERRORS},
    summary="Run a failed or cancelled task again, from attempt 0",
)
async def retry_task(
    id: TaskId, database: Annotated[Database, Depends(get_database)]
) -> dict[str, Any]:
    """A ``failed`` or ``cancelled`` task goes back to ``pending`` with its attempts at 0, due
    now; its ``last_error`` stays until the next attempt ends. Any other status is a 409."""
    try:
        async with database.transaction() as conn:
            row = await fetch_one(conn, q.task_retry, id=id)
            if row is None:
                row = await fetch_one(conn, q.task_get, id=id)
                if row is None:
                    raise _not_found(id)
                if row["type"] == RUNTIME_CONFIG_TASK_TYPE:
                    reason = "a runtime-config task is not retried: PUT /runtime-config again"
                else:
                    reason = (
                        f"only a failed or cancelled task can be retried; it is {row['status']}"
                    )
                raise HTTPException(status.HTTP_409_CONFLICT, f"task {id}: {reason}")
    except sqlalchemy.exc.IntegrityError:
        # Its unique_key is held by another unfinished task: two would break the key's promise.
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"task {id}: its unique_key is held by another pending or running task",
        ) from None
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
