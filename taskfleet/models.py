"""What the client returns: tasks, workers, the runtime config, as typed pydantic models.

Unknown fields in the API's answers are ignored, so a newer server does not break an older
client.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, field_validator

from taskfleet.shared.statuses import TaskStatus

__all__ = [
    "AppliedVersion",
    "FinishedCounts",
    "GroupStats",
    "LaneStats",
    "RuntimeConfig",
    "Schedule",
    "ScheduleFields",
    "Task",
    "TaskFields",
    "TaskFilter",
    "TaskSpec",
    "TaskStats",
    "TaskStatus",
    "Worker",
]


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Task(_Answer):
    """A task as stored. ``deduplicated`` is true when a submission's ``unique_key`` matched an
    unfinished task: this is that task, and nothing new was written."""

    id: int
    type: str
    payload: dict[str, Any]
    status: TaskStatus
    priority: int
    weight: int
    labels: list[str]
    attempts: int
    max_attempts: int
    run_after: datetime
    timeout_seconds: float | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker_id: str | None = None
    lease_expires_at: datetime | None = None
    result: Any = None
    last_error: str | None = None
    unique_key: str | None = None
    cancel_requested: bool = False
    requires: list[str] = []
    deduplicated: bool = False

    @field_validator("payload", mode="before")
    @classmethod
    def _decode_payload(cls, value: Any) -> Any:
        # A driver without a jsonb codec (plain asyncpg) hands jsonb over as its JSON text.
        return json.loads(value) if isinstance(value, str | bytes) else value

    @property
    def finished(self) -> bool:
        """True once the task is completed, failed or cancelled."""
        return self.status.finished


class Worker(_Answer):
    """A registered worker process; ``alive`` means online with a recent heartbeat."""

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
    metrics_port: int | None = None
    task_types: list[str] = []
    tags: list[str] = []
    alive: bool


class AppliedVersion(_Answer):
    """The config version one alive worker has applied."""

    id: str
    applied_config_version: int
    up_to_date: bool


class RuntimeConfig(_Answer):
    """The latest runtime config (version 0: the defaults, before any change) and how far the
    alive workers are with it."""

    version: int
    request_id: str | None = None
    payload: dict[str, Any]
    created_at: datetime | None = None
    alive_workers: int
    applied_workers: int
    lagging: list[str]
    workers: list[AppliedVersion]


class Schedule(_Answer):
    """A periodic task: what it enqueues, when (``cron`` in ``timezone``, or ``every``), the
    next slot and the last one run. ``source``: ``api`` or ``code`` (declared by a worker's
    task module)."""

    name: str
    type: str
    payload: dict[str, Any]
    cron: str | None = None
    every: str | None = None
    timezone: str | None = None
    priority: int
    weight: int
    labels: list[str]
    max_attempts: int
    timeout_seconds: float | None = None
    requires: list[str] = []
    source: str
    next_run_at: datetime
    last_run_at: datetime | None = None
    last_task_id: int | None = None
    created_at: datetime
    updated_at: datetime


class ScheduleFields(TypedDict, total=False):
    """The optional fields of a schedule (``PUT /schedules/{name}``): its timing, one of
    ``cron`` (with ``timezone``) or ``every``, and the task fields of its tasks."""

    cron: str
    every: str
    timezone: str
    priority: int
    weight: int
    labels: list[str]
    max_attempts: int
    timeout_seconds: float
    requires: list[str]


class TaskFields(TypedDict, total=False):
    """The optional fields of a new task (the same as ``POST /tasks`` takes)."""

    priority: int
    weight: int
    labels: list[str]
    delay_seconds: float
    run_at: datetime
    max_attempts: int
    timeout_seconds: float
    unique_key: str
    requires: list[str]


class TaskSpec(TaskFields):
    """One task of a batch: its ``type``, ``payload`` and any of :class:`TaskFields`."""

    type: str
    payload: NotRequired[dict[str, Any]]


class TaskFilter(TypedDict, total=False):
    """Which tasks ``retry_many`` / ``cancel_many`` act on: those matching every field given.

    At least one of ``ids``, ``type``, ``labels``, ``created_before``, ``created_after`` is
    needed, or ``all=True``. ``labels``: tasks carrying all of them. ``status``: retry takes
    ``failed`` and/or ``cancelled`` (default failed), cancel ``pending`` and/or ``running``
    (default pending)."""

    ids: list[int]
    type: str
    labels: list[str]
    status: list[TaskStatus | str]
    created_before: datetime
    created_after: datetime
    all: bool


class LaneStats(_Answer):
    """One lane of :class:`TaskStats`."""

    pending: int
    pending_exact: bool
    running: int
    oldest_ready_seconds: float


class GroupStats(_Answer):
    """One normal-lane group of :class:`TaskStats`."""

    group: str
    weight: int
    pending: int
    ready: int
    oldest_ready_seconds: float


class FinishedCounts(_Answer):
    completed: int
    failed: int
    cancelled: int


class TaskStats(_Answer):
    """``GET /tasks/stats``: tasks per status (``estimated`` lists those past the exact-count
    limit), per lane and per group, and the recent outcomes."""

    by_status: dict[str, int]
    estimated: list[str]
    lanes: dict[str, LaneStats]
    groups: list[GroupStats]
    sample_complete: bool
    finished_last_minute: FinishedCounts
    failed_last_hour: int
    #: The finished counts that reached the API's counting limit and stopped there.
    finished_capped: list[str] = []
    config_version: int
