"""taskfleet: a Postgres-backed task system.

This module is the public Python API; everything under ``taskfleet.*`` that is not re-exported
here (``taskfleet.shared``, ``taskfleet.api``, ``taskfleet.worker``, ``taskfleet.cli``) is internal
and may change between releases.

Write a handler::

    from taskfleet import PermanentError, TaskContext, TaskParams, task

    class SendEmail(TaskParams):
        to: str

    @task("email.send", params=SendEmail)
    async def send_email(params: SendEmail, ctx: TaskContext) -> dict:
        ...  # ctx: task id, attempt, deadline, cancellation (the second argument is optional)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

from taskfleet.shared.context import TaskContext
from taskfleet.shared.registry import PermanentError, TaskParams, task

try:
    __version__ = _distribution_version("taskfleet")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["PermanentError", "TaskContext", "TaskParams", "__version__", "task"]
