"""The route class of the task API: authorise first, then read the body within a size limit.

FastAPI reads and parses a request body before it solves any dependency. Left at that, an
anonymous client could make the API buffer a batch-sized body and would learn how its input is
validated before hearing that it is not allowed in. So this route class checks the route's
:class:`~taskfleet.api.auth.RoleRequirement` dependencies first (they run again as ordinary
dependencies afterwards, cheaply), then reads the body itself, refusing it with a JSON 413 as
soon as the declared ``Content-Length`` or the bytes actually received pass the limit, before
any parsing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope

from taskfleet.api.auth import RoleRequirement
from taskfleet.api.errors import ApiError, error_item

_FASTAPI_BODY_PARSE_ERROR = "There was an error parsing the body"


class _BufferedRequest(Request):
    """A request whose body has already been read (within the limit)."""

    def __init__(self, scope: Scope, receive: Receive, body: bytes) -> None:
        super().__init__(scope, receive)
        self._buffered_body = body

    async def body(self) -> bytes:
        return self._buffered_body


def body_too_large(limit: int, loc: tuple[str | int, ...] = ("body",)) -> ApiError:
    return ApiError(
        413,
        [error_item(loc, f"request body is larger than the limit of {limit} bytes", "too_large")],
    )


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise body_too_large(limit)
    return bytes(body)


class GuardedRoute(APIRoute):
    """A route that authorises before the body is read, and limits the body's size."""

    max_body_bytes: int | None = None

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        requirements = [
            d.dependency for d in self.dependencies if isinstance(d.dependency, RoleRequirement)
        ]
        limit = self.max_body_bytes
        reads_body = self.body_field is not None

        async def guarded_handler(request: Request) -> Response:
            for requirement in requirements:
                requirement.authorize(request)
            if reads_body and limit is not None:
                body = await read_body(request, limit)
                request = _BufferedRequest(request.scope, request.receive, body)
            try:
                return await handler(request)
            except HTTPException as exc:
                # FastAPI answers a body json.loads cannot take for a reason other than syntax
                # (not UTF-8, nested past the recursion limit) with a bare 400; say which rule.
                if not reads_body or exc.detail != _FASTAPI_BODY_PARSE_ERROR:
                    raise
                raise ApiError(
                    422,
                    [error_item(("body",), _parse_failure(await request.body()), "json_invalid")],
                ) from exc

        return guarded_handler


def guarded_route(max_body_bytes: int | None = None) -> type[GuardedRoute]:
    """A :class:`GuardedRoute` class whose routes accept bodies up to ``max_body_bytes``."""
    return type(
        f"GuardedRoute{max_body_bytes or ''}", (GuardedRoute,), {"max_body_bytes": max_body_bytes}
    )


def _parse_failure(body: bytes) -> str:
    """Which rule a body broke that FastAPI's JSON parsing refused with a bare 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "must be UTF-8 encoded JSON"
    try:
        json.loads(text)
    except RecursionError:
        return "must be JSON nested at most a few hundred levels deep"
    except ValueError as exc:
        if "digits" in str(exc):
            return "integers must have at most 4300 digits"
        return f"must be valid JSON: {exc}"
    return "must be valid JSON"
