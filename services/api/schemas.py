"""Request and response models of the task API (docs/reference.md#tasks): wire names.

Request models reject unknown fields, and their numbers are strict: ``"priority": "5"`` or
``"priority": true`` is a 422, not a silent coercion. The task envelope (:class:`TaskIn`) and
the rules that need the task registry (the type is registered, the payload fits the handler's
model) live in ``taskfleet.shared.submission``, shared with the Python enqueue path.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

# The submission rules live in one place, shared with the Python enqueue path; the names are
# re-exported here because the API's schema is where readers look for them.
from taskfleet.shared.submission import (
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_BIGINT,
    MAX_DELAY_SECONDS,
    MAX_INT32,
    MAX_LABEL_LENGTH,
    MAX_LABELS,
    MAX_PAYLOAD_BYTES,
    MAX_TIMEOUT_SECONDS,
    MAX_TYPE_LENGTH,
    MAX_UNIQUE_KEY_LENGTH,
    TaskIn,
)

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_BATCH",
    "MAX_BIGINT",
    "MAX_DELAY_SECONDS",
    "MAX_INT32",
    "MAX_LABELS",
    "MAX_LABEL_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_TIMEOUT_SECONDS",
    "MAX_TYPE_LENGTH",
    "MAX_UNIQUE_KEY_LENGTH",
    "TaskIn",
]


# Query filters go to Postgres as text, which cannot hold NUL.
NO_NUL = r"^[^\x00]*$"


class TaskBatchIn(BaseModel):
    """Up to 1,000 tasks, inserted in one transaction or not at all.

    Each item is validated by the route, in order, so that a 422 names the first bad task
    whatever the kind of its fault; the schema below still documents the item shape.
    """

    model_config = ConfigDict(extra="forbid")

    tasks: list[Annotated[Any, Field(json_schema_extra=TaskIn.model_json_schema())]] = Field(
        min_length=1, max_length=MAX_BATCH
    )


class TaskOut(BaseModel):
    """A task as stored."""

    id: int
    type: str
    payload: Any
    status: str
    priority: int
    weight: int
    labels: list[str]
    attempts: int
    max_attempts: int
    run_after: datetime
    timeout_seconds: float | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    lease_expires_at: datetime | None
    result: Any
    last_error: str | None
    unique_key: str | None
    cancel_requested: bool
    requires: list[str] = Field(
        description="The worker tags a worker must all have to claim it (empty: any worker)."
    )


class SubmittedTask(TaskOut):
    deduplicated: bool = Field(
        description="True when unique_key matched an unfinished task: this is that task and "
        "nothing was written."
    )


class TaskBatchOut(BaseModel):
    tasks: list[SubmittedTask]


class TaskPage(BaseModel):
    tasks: list[TaskOut]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next (older) page; null on the last page."
    )


class WaitedTask(TaskOut):
    finished: bool = Field(description="False when the wait timed out first.")


class WorkerOut(BaseModel):
    id: str
    hostname: str
    pid: int
    concurrency: int
    status: str
    started_at: datetime
    last_heartbeat: datetime
    heartbeat_interval: float
    applied_config_version: int
    inflight: int
    strict_inflight: int
    metrics_port: int | None
    task_types: list[str] = Field(
        description="The task types it has handlers for (it claims only those)."
    )
    tags: list[str] = Field(
        description="Its tags (TASKFLEET_WORKER_TAGS): it claims only tasks whose requires are "
        "all among them."
    )
    alive: bool


class WorkerList(BaseModel):
    workers: list[WorkerOut]


class ScheduleOut(BaseModel):
    """A schedule as stored, with when it fires next and when it last fired."""

    name: str
    type: str
    payload: Any
    cron: str | None
    every: str | None
    timezone: str | None = Field(description="The cron's time zone; null with every.")
    priority: int
    weight: int
    labels: list[str]
    max_attempts: int
    timeout_seconds: float | None
    requires: list[str]
    source: str = Field(
        description="api (PUT /schedules) or code (declared by a worker's task module)."
    )
    next_run_at: datetime = Field(description="The next slot: its task is enqueued then.")
    last_run_at: datetime | None = Field(
        description="The slot of the last task enqueued (after a downtime, the latest missed "
        "slot: one catch-up run); null before the first."
    )
    last_task_id: int | None = Field(description="The last task enqueued.")
    created_at: datetime
    updated_at: datetime


class ScheduleList(BaseModel):
    schedules: list[ScheduleOut]


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorList(BaseModel):
    """422 and 413 bodies: each broken rule, with the field it concerns."""

    detail: list[ErrorItem]


class ErrorMessage(BaseModel):
    """401, 403, 404, 409 and 503 bodies."""

    detail: str
