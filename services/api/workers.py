"""The fleet view: ``GET /workers``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from taskfleet.api.auth import require_role
from taskfleet.api.database import Database
from taskfleet.api.deps import get_database
from taskfleet.api.routing import guarded_route
from taskfleet.api.schemas import ErrorMessage, WorkerList
from taskfleet.shared import queries as q

router = APIRouter(route_class=guarded_route(), tags=["workers"])


@router.get(
    "/workers",
    response_model=WorkerList,
    dependencies=[Depends(require_role("admin"))],
    responses={
        401: {"model": ErrorMessage},
        403: {"model": ErrorMessage},
        503: {"model": ErrorMessage},
    },
    summary="Every worker row, alive ones first, with alive computed",
)
async def list_workers(
    database: Annotated[Database, Depends(get_database)],
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    # alive: online and a heartbeat within 3 x the worker's own heartbeat interval (SQL side).
    rows = await database.fetch_all(q.worker_list, limit=limit)
    return {"workers": [dict(row) for row in rows]}
