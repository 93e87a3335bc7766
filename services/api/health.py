"""Probes, no token needed: ``/healthz`` (the process is up) and ``/readyz`` (it can serve)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from taskfleet.api.database import DatabaseUnavailable
from taskfleet.api.deps import get_state
from taskfleet.shared import queries as q

# A readiness probe that hangs is worse than one that says no.
READY_TIMEOUT = 3.0

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is up (no database check)")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Ready: the database is reachable and its schema is at the code's head revision",
    responses={503: {"description": "Not ready, with the reason"}},
)
async def readyz(request: Request) -> JSONResponse:
    state = get_state(request)
    expected = state.head_revision
    try:
        if state.database is None:
            raise DatabaseUnavailable("the app is not started")
        async with asyncio.timeout(READY_TIMEOUT):
            rows = await state.database.fetch_all(q.schema_revision)
    except DatabaseUnavailable as exc:
        return _not_ready(exc.reason, expected)
    except TimeoutError:
        return _not_ready("database did not answer in time", expected)
    revisions = sorted(str(r["version_num"]) for r in rows)
    if revisions != [expected]:
        found = ", ".join(revisions) or "none"
        return _not_ready(f"schema is at revision {found}, expected {expected}", expected)
    return JSONResponse({"status": "ready", "schema_revision": expected})


def _not_ready(reason: str, expected: str) -> JSONResponse:
    body: dict[str, Any] = {
        "status": "unavailable",
        "reason": reason,
        "expected_revision": expected,
    }
    return JSONResponse(body, status_code=503)
