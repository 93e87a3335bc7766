"""Periodic tasks (docs/reference.md#schedules): set, read, list and delete schedules.

The workers fire them (``taskfleet.worker.scheduler``); this file only stores the definition,
validated by the rules in ``taskfleet.shared.schedules`` (the task fields by those of a submitted
task). Reading needs the submit role, like reading tasks; writing needs admin.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response, status

from taskfleet.api.auth import require_role
from taskfleet.api.database import Database, fetch_all, fetch_one
from taskfleet.api.deps import get_database, get_registry
from taskfleet.api.routing import guarded_route
from taskfleet.api.schemas import NO_NUL, ErrorList, ErrorMessage, ScheduleList, ScheduleOut
from taskfleet.shared import queries as q
from taskfleet.shared.policy.schedules import MAX_SCHEDULE_NAME_LENGTH, next_slot
from taskfleet.shared.registry import TaskRegistry
from taskfleet.shared.schedules import (
    SOURCE_API,
    ScheduleIn,
    check_schedule,
    check_schedule_name,
    schedule_out,
    schedule_params,
)
from taskfleet.shared.submission import MAX_PAYLOAD_BYTES

# A schedule's body is its payload plus a bounded envelope, as a task's.
SCHEDULE_BODY_LIMIT = MAX_PAYLOAD_BYTES + 16 * 1024

SUBMIT = Depends(require_role("submit"))
ADMIN = Depends(require_role("admin"))

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorMessage},
    403: {"model": ErrorMessage},
    422: {"model": ErrorList},
    503: {"model": ErrorMessage},
}

router = APIRouter(route_class=guarded_route(SCHEDULE_BODY_LIMIT), tags=["schedules"])

ScheduleName = Annotated[
    str,
    Path(
        description="1-200 characters, no slash or control character; a schedule declared in "
        "code is named after its task type.",
        max_length=MAX_SCHEDULE_NAME_LENGTH,
    ),
]


def _not_found(name: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"schedule {name!r} not found")


@router.put(
    "/schedules/{name}",
    response_model=ScheduleOut,
    dependencies=[ADMIN],
    responses={
        201: {"model": ScheduleOut, "description": "Created"},
        413: {"model": ErrorList},
        **_ERRORS,
    },
    summary="Create or replace a schedule (a periodic task)",
)
async def put_schedule(
    name: ScheduleName,
    schedule: ScheduleIn,
    response: Response,
    database: Annotated[Database, Depends(get_database)],
    registry: Annotated[TaskRegistry, Depends(get_registry)],
) -> dict[str, Any]:
    """Replaces the whole definition. A changed timing (`cron`, `every`, `timezone`) starts at
    its next slot from now; an unchanged one keeps its `next_run_at`. A schedule declared in code
    and set here becomes an API schedule: the workers no longer overwrite it."""
    check_schedule_name(name, ("path", "name"))
    submitted = check_schedule(schedule, registry, ("body",))
    async with database.transaction() as conn:
        (now_row,) = await fetch_all(conn, q.database_now)
        params = schedule_params(
            name,
            submitted,
            source=SOURCE_API,
            next_run_at=next_slot(submitted.timing, now_row["now"]),
        )
        row = await fetch_one(conn, q.schedule_put, **params)
    assert row is not None
    if row["created"]:
        response.status_code = status.HTTP_201_CREATED
    response.headers["Location"] = f"/schedules/{quote(name, safe='')}"
    return schedule_out(row)


@router.get(
    "/schedules",
    response_model=ScheduleList,
    dependencies=[SUBMIT],
    responses=_ERRORS,
    summary="List the schedules by name, with next_run_at and last_run_at",
)
async def list_schedules(
    database: Annotated[Database, Depends(get_database)],
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    after: Annotated[
        str | None,
        Query(
            max_length=MAX_SCHEDULE_NAME_LENGTH,
            pattern=NO_NUL,
            description="Only the schedules whose name sorts after this one, in the listing's "
            "order: the last name of a full page asks for the next page.",
        ),
    ] = None,
) -> dict[str, Any]:
    rows = await database.fetch_all(q.schedule_list, limit=limit, after=after)
    return {"schedules": [schedule_out(row) for row in rows]}


@router.get(
    "/schedules/{name}",
    response_model=ScheduleOut,
    dependencies=[SUBMIT],
    responses={404: {"model": ErrorMessage}, **_ERRORS},
    summary="Read a schedule",
)
async def get_schedule(
    name: ScheduleName, database: Annotated[Database, Depends(get_database)]
) -> dict[str, Any]:
    check_schedule_name(name, ("path", "name"))
    row = await database.fetch_one(q.schedule_get, name=name)
    if row is None:
        raise _not_found(name)
    return schedule_out(row)


@router.delete(
    "/schedules/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[ADMIN],
    responses={404: {"model": ErrorMessage}, **_ERRORS},
    summary="Delete a schedule (its tasks already enqueued stay)",
)
async def delete_schedule(
    name: ScheduleName, database: Annotated[Database, Depends(get_database)]
) -> Response:
    """A schedule declared in code comes back when a worker that declares it starts: remove
    it from the code too."""
    check_schedule_name(name, ("path", "name"))
    async with database.autocommit() as conn:
        deleted = await fetch_all(conn, q.schedule_delete, name=name)
    if not deleted:
        raise _not_found(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
