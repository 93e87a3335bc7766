"""The exceptions of taskfleet's Python API.

An answer the API refuses becomes an :class:`ApiError` subclass chosen by its status code, with
the API's own message and the field it concerns. The enqueue functions, which apply the same
rules inside your transaction, raise the same classes (``InvalidRequest`` for a bad field,
``PayloadTooLarge`` for a payload over 256 KiB), so one ``except`` serves both paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskfleet.models import Task

# Where a field error's location starts with where it was sent, not what it is.
_LOCATION_ROOTS = ("body", "query", "path")


class ApiError(Exception):
    """The API (or the same rules applied by ``enqueue``) refused a request.

    ``status``: the HTTP status code. ``message``: the API's message (for a field error, the
    first broken rule). ``field``: the dotted path of the field that message is about (e.g.
    ``payload.to``, ``tasks.3.priority``), or ``None``. ``errors``: every ``{"loc", "msg",
    "type"}`` item the API returned (empty for a plain message).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        field: str | None = None,
        errors: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.status = status
        self.message = message
        self.field = field
        self.errors = [dict(e) for e in errors]
        where = f"{field}: " if field else ""
        super().__init__(f"HTTP {status}: {where}{message}")


class Unauthorized(ApiError):
    """401: no token, or a token the API does not know."""


class Forbidden(ApiError):
    """403: the token's role may not do this (cancel, retry, workers and config need admin)."""


class NotFound(ApiError):
    """404: no such task (or config request)."""


class Conflict(ApiError):
    """409: the task's status does not allow it (e.g. cancelling a finished task), or a
    ``requestID`` already used for a different config."""


class PayloadTooLarge(ApiError):
    """413: the payload is over 256 KiB as JSON (or the body over its limit)."""


class InvalidRequest(ApiError):
    """422: a field breaks a rule; ``field`` and ``message`` say which and how."""


class Unavailable(ApiError):
    """503: the API cannot reach its database (after the client's retries, where it retries)."""


class WaitTimeout(TimeoutError):
    """``wait`` gave up before the task finished. ``task`` is the task as last seen."""

    def __init__(self, task: Task, waited: float) -> None:
        self.task = task
        self.waited = waited
        super().__init__(f"task {task.id} is still {task.status} after waiting {waited:g}s")


_BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    503: Unavailable,
}


def field_path(loc: Sequence[object]) -> str | None:
    """A location as a dotted path without its leading ``body``/``query``/``path``."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATION_ROOTS:
        parts = parts[1:]
    return ".".join(parts) or None


def error_from_detail(status: int, detail: object) -> ApiError:
    """The exception for an error answer whose body's ``detail`` is ``detail``."""
    cls = _BY_STATUS.get(status, ApiError)
    if isinstance(detail, list) and detail and all(isinstance(i, dict) for i in detail):
        first = detail[0]
        loc = first.get("loc")
        return cls(
            status,
            str(first.get("msg", "invalid request")),
            field=field_path(loc) if isinstance(loc, list) else None,
            errors=detail,
        )
    if isinstance(detail, str):
        return cls(status, detail)
    return cls(status, "no message" if detail is None else str(detail))
