"""taskfleet: a Postgres-backed task system.

This module is the public Python API; everything under ``taskfleet.*`` that is not re-exported
here, or documented in ``taskfleet.client``, ``taskfleet.errors``, ``taskfleet.models``,
``taskfleet.config_events`` and ``taskfleet.testing``, is internal and may change between
releases (``taskfleet.shared``, ``taskfleet.api``, ``taskfleet.worker``, ``taskfleet.cli``).

Write a handler::

    from taskfleet import PermanentError, TaskContext, TaskParams, task

    class SendEmail(TaskParams):
        to: str

    @task("email.send", params=SendEmail)
    async def send_email(params: SendEmail, ctx: TaskContext) -> dict:
        ...  # ctx: task id, attempt, deadline, cancellation (the second argument is optional)

Submit over HTTP with :class:`Client` / :class:`AsyncClient`, or inside your own database
transaction with :func:`enqueue` (asyncpg, SQLAlchemy async) and :func:`enqueue_sync`
(SQLAlchemy). ``import taskfleet`` stays cheap: the client and the enqueue functions (and with
them httpx, asyncpg and SQLAlchemy) are imported on first use.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING, Any

from taskfleet.shared.context import TaskContext
from taskfleet.shared.registry import PermanentError, TaskParams, task

if TYPE_CHECKING:
    from taskfleet.client import AsyncClient, Client
    from taskfleet.enqueuing import enqueue, enqueue_many, enqueue_many_sync, enqueue_sync
    from taskfleet.errors import (
        ApiError,
        Conflict,
        Forbidden,
        InvalidRequest,
        NotFound,
        PayloadTooLarge,
        Unauthorized,
        Unavailable,
        WaitTimeout,
    )
    from taskfleet.models import Task, TaskStatus

try:
    __version__ = _distribution_version("taskfleet")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

# Public name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "AsyncClient": "taskfleet.client",
    "Client": "taskfleet.client",
    "enqueue": "taskfleet.enqueuing",
    "enqueue_many": "taskfleet.enqueuing",
    "enqueue_many_sync": "taskfleet.enqueuing",
    "enqueue_sync": "taskfleet.enqueuing",
    "ApiError": "taskfleet.errors",
    "Conflict": "taskfleet.errors",
    "Forbidden": "taskfleet.errors",
    "InvalidRequest": "taskfleet.errors",
    "NotFound": "taskfleet.errors",
    "PayloadTooLarge": "taskfleet.errors",
    "Unauthorized": "taskfleet.errors",
    "Unavailable": "taskfleet.errors",
    "WaitTimeout": "taskfleet.errors",
    "Task": "taskfleet.models",
    "TaskStatus": "taskfleet.models",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'taskfleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "PermanentError",
    "Task",
    "TaskContext",
    "TaskParams",
    "TaskStatus",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "__version__",
    "enqueue",
    "enqueue_many",
    "enqueue_many_sync",
    "enqueue_sync",
    "task",
]
