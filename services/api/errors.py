"""Error responses: always JSON, always naming the field and the rule.

Validation problems (422) and oversized bodies (413) answer ``{"detail": [{"loc", "msg",
"type"}, ...]}``; other refusals (401, 403, 404, 409, 503) answer ``{"detail": "<why>"}``. The
submitted value is never echoed back: it may be large, or not even encodable.
"""

from __future__ import annotations

import logging

import asyncpg
import psycopg
import sqlalchemy.exc
from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from taskfleet.api.database import DatabaseUnavailable, unavailable_reason
from taskfleet.shared.submission import Loc, Rejected, error_item, pydantic_errors

log = logging.getLogger(__name__)

# One home for refusals and their error items, shared with the Python enqueue path.
ApiError = Rejected
__all__ = ["ApiError", "Loc", "error_item", "install_error_handlers", "pydantic_errors"]


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = pydantic_errors(exc.errors())
    content_type = request.headers.get("content-type")
    if not _is_json(content_type) and any(e["loc"] == ["body"] for e in errors):
        # The body was not read as JSON at all (curl -d sends a form): say so, not that the
        # body "should be a valid dictionary".
        got = f"got {content_type!r}" if content_type else "none was sent"
        errors = [
            error_item(
                ("header", "content-type"),
                f"must be application/json ({got}): the body is a JSON object",
                "content_type",
            )
        ]
    return JSONResponse(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": errors}
    )


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON (application/json or
    application/*+json, parameters aside)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(status_code=exc.status_code, content={"detail": exc.errors})


def _unavailable(reason: str) -> JSONResponse:
    return JSONResponse(
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        content={"detail": "database unavailable", "reason": reason},
        headers={"Retry-After": "1"},
    )


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DatabaseUnavailable)
    log.warning("%s %s: %s", request.method, request.url.path, exc.reason)
    return _unavailable(exc.reason)


async def _maybe_database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # A safety net for routes that use the engine directly: connection-level failures are a
    # 503; anything else is a bug and is re-raised, to be logged and answered with a 500.
    reason = unavailable_reason(exc)
    if reason is None:
        raise exc
    log.warning("%s %s: %s (%s)", request.method, request.url.path, reason, type(exc).__name__)
    return _unavailable(reason)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(DatabaseUnavailable, _database_unavailable)
    app.add_exception_handler(sqlalchemy.exc.SQLAlchemyError, _maybe_database_unavailable)
    app.add_exception_handler(OSError, _maybe_database_unavailable)
    # The same net for the drivers' own errors (Database.autocommit() runs statements on them
    # and translates them itself; this catches one raised anywhere else).
    app.add_exception_handler(asyncpg.PostgresError, _maybe_database_unavailable)
    app.add_exception_handler(asyncpg.InterfaceError, _maybe_database_unavailable)
    app.add_exception_handler(psycopg.Error, _maybe_database_unavailable)
