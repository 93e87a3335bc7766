"""Bulk actions (docs/reference.md#bulk-actions): ``POST /tasks/retry`` and ``POST /tasks/cancel``.

Both take the same filter body and apply the single-task rule of ``POST /tasks/{id}/retry`` or
``POST /tasks/{id}/cancel`` (the same SQL fragments, in ``taskfleet.shared.queries``) to every
task that matches. They work in batches of :data:`BATCH_SIZE` rows, one short transaction each,
walking the ``(status, id DESC)`` index newest first: no statement locks more than one batch, so
claims, finishes and submissions go on meanwhile. A task that changes state while the walk is
under way is judged by its state when its batch reaches it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import sqlalchemy.exc
from fastapi import APIRouter, Depends
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from taskfleet.api.auth import require_role
from taskfleet.api.database import Database, fetch_one
from taskfleet.api.deps import get_database
from taskfleet.api.errors import ApiError, error_item
from taskfleet.api.routing import guarded_route
from taskfleet.api.schemas import MAX_BIGINT, ErrorList, ErrorMessage
from taskfleet.shared import queries as q
from taskfleet.shared.submission import Int, Label, TypeName

log = logging.getLogger(__name__)

#: Rows one statement changes (and locks) at most.
BATCH_SIZE = 1000
#: Ids one filter may name.
MAX_IDS = 10_000
#: Labels one filter may name (a task carries at most 32, so more could never match).
MAX_FILTER_LABELS = 32
#: A batch that hits a deadlock or a unique_key taken meanwhile is tried again this often.
BATCH_ATTEMPTS = 3
#: A filter body: up to 10,000 ids and a few short fields.
BODY_LIMIT = 1 << 20

# SQLSTATEs worth a second try of the same batch: a deadlock with a worker's multi-row update,
# a serialization failure, a unique_key that an unfinished task took between check and update.
_RETRYABLE_SQLSTATES = ("40P01", "40001", "23505")

Status = Literal["pending", "running", "completed", "failed", "cancelled"]

RETRY_STATUSES: tuple[Status, ...] = ("failed", "cancelled")
CANCEL_STATUSES: tuple[Status, ...] = ("pending", "running")


def _time_text(value: Any) -> Any:
    # JSON has no time type: a time is an ISO 8601 string. Pydantic would take a number as Unix
    # seconds, which the documented schema does not allow.
    if not isinstance(value, str):
        raise PydanticCustomError(
            "datetime_type", "must be an ISO 8601 time with an offset, e.g. 2026-12-01T14:00:00Z"
        )
    return value


def _storable_time(value: datetime) -> datetime:
    # Its offset can carry a time of year 1 or 9999 outside Python's range once it is in UTC,
    # which is how it is sent to Postgres (it answered 500).
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise PydanticCustomError(
            "out_of_range", "must be between the years 1 and 9999 once in UTC"
        ) from None
    return value


TimeText = Annotated[AwareDatetime, BeforeValidator(_time_text), AfterValidator(_storable_time)]


class TaskFilter(BaseModel):
    """Which tasks a bulk action applies to: those matching every field given.

    At least one of ``ids``, ``type``, ``labels``, ``created_before`` and ``created_after`` is
    needed, or ``"all": true`` to act on every task in the ``status`` list: an empty filter is
    refused, so that a forgotten field never retries or cancels the whole queue.
    """

    model_config = ConfigDict(extra="forbid")

    ids: list[Annotated[Int, Field(ge=1, le=MAX_BIGINT)]] | None = Field(
        default=None, min_length=1, max_length=MAX_IDS, description="Task ids."
    )
    type: TypeName | None = Field(default=None, description="The task type.")
    labels: list[Label] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_FILTER_LABELS,
        description="Tasks carrying all of these labels.",
    )
    status: list[Status] | None = Field(
        default=None,
        min_length=1,
        description="Statuses to act on. Retry: failed and/or cancelled (default failed). "
        "Cancel: pending and/or running (default pending; a running task is cancelled by its "
        "worker at its next heartbeat).",
    )
    created_before: TimeText | None = Field(
        default=None, description="Created before this time (ISO 8601 with an offset)."
    )
    created_after: TimeText | None = Field(
        default=None, description="Created at or after this time (ISO 8601 with an offset)."
    )
    all: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="true: act on every task in the statuses, unfiltered."
    )

    @model_validator(mode="after")
    def _not_empty(self) -> TaskFilter:
        narrowing = (self.ids, self.type, self.labels, self.created_before, self.created_after)
        if not self.all and all(value is None for value in narrowing):
            raise PydanticCustomError(
                "empty_filter",
                "give at least one of ids, type, labels, created_before, created_after, or "
                '"all": true to act on every task in the statuses',
            )
        if (
            self.created_before is not None
            and self.created_after is not None
            and self.created_after >= self.created_before
        ):
            raise PydanticCustomError(
                "empty_range", "created_after must be earlier than created_before"
            )
        return self

    def statuses(self, allowed: Sequence[Status], default: Status) -> list[Status]:
        """The statuses to walk, in the order given; 422 naming the field for one the action
        does not apply to."""
        chosen = list(dict.fromkeys(self.status or [default]))
        for index, status in enumerate(chosen):
            if status not in allowed:
                raise ApiError(
                    422,
                    [
                        error_item(
                            ("body", "status", index),
                            f"must be one of {', '.join(allowed)} for this action; it is {status}",
                            "status_not_allowed",
                        )
                    ],
                )
        return chosen


class Retried(BaseModel):
    retried: int = Field(description="Tasks put back to pending.")


class Cancelled(BaseModel):
    cancelled: int = Field(
        description="Tasks cancelled (pending ones) or flagged for cancellation (running ones, "
        "interrupted by their worker at its next heartbeat)."
    )


def _params(task_filter: TaskFilter) -> dict[str, Any]:
    return {
        "ids": task_filter.ids,
        "type": task_filter.type,
        "labels": task_filter.labels,
        "created_before": task_filter.created_before,
        "created_after": task_filter.created_after,
    }


async def apply_in_batches(
    database: Database,
    query: q.Query,
    task_filter: TaskFilter,
    statuses: Sequence[Status],
    *,
    batch_size: int = BATCH_SIZE,
) -> int:
    """Run ``query`` (``task_retry_batch`` or ``task_cancel_batch``) over every matching task,
    one batch per transaction; the number of tasks it changed."""
    params = _params(task_filter)
    changed = 0
    for status in statuses:
        before_id: int | None = None
        while True:
            row = await _one_batch(database, query, status, before_id, batch_size, params)
            changed += int(row["changed"])
            if int(row["scanned"]) < batch_size:
                break
            before_id = int(row["last_id"])
    return changed


async def _one_batch(
    database: Database,
    query: q.Query,
    status: str,
    before_id: int | None,
    batch_size: int,
    params: dict[str, Any],
) -> dict[str, Any]:
    for attempt in range(1, BATCH_ATTEMPTS + 1):
        try:
            async with database.transaction() as conn:
                row = await fetch_one(
                    conn, query, status=status, before_id=before_id, batch=batch_size, **params
                )
            assert row is not None  # aggregates: always one row
            return row
        except sqlalchemy.exc.DBAPIError as exc:
            code = getattr(getattr(exc, "orig", None), "sqlstate", None)
            if code not in _RETRYABLE_SQLSTATES or attempt == BATCH_ATTEMPTS:
                raise
            log.info("%s: batch below id %s hit %s; trying it again", query.name, before_id, code)
    raise AssertionError("unreachable")  # pragma: no cover


_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorMessage},
    403: {"model": ErrorMessage},
    413: {"model": ErrorList},
    422: {"model": ErrorList, "description": "An empty filter, or a rule of a field broken."},
    503: {"model": ErrorMessage},
}

router = APIRouter(route_class=guarded_route(BODY_LIMIT), tags=["tasks"])
ADMIN = Depends(require_role("admin"))


@router.post(
    "/tasks/retry",
    response_model=Retried,
    dependencies=[ADMIN],
    responses=_RESPONSES,
    summary="Run every matching failed (or cancelled) task again, from attempt 0",
)
async def retry_tasks(
    task_filter: TaskFilter, database: Annotated[Database, Depends(get_database)]
) -> dict[str, int]:
    """The rule of ``POST /tasks/{id}/retry`` for every task matching the filter (``status``
    defaults to ``["failed"]``). A task whose ``unique_key`` an unfinished task holds is left
    as it is; of several matching tasks with the same key, only the newest is retried."""
    statuses = task_filter.statuses(RETRY_STATUSES, "failed")
    retried = await apply_in_batches(database, q.task_retry_batch, task_filter, statuses)
    return {"retried": retried}


@router.post(
    "/tasks/cancel",
    response_model=Cancelled,
    dependencies=[ADMIN],
    responses=_RESPONSES,
    summary="Cancel every matching pending (or running) task",
)
async def cancel_tasks(
    task_filter: TaskFilter, database: Annotated[Database, Depends(get_database)]
) -> dict[str, int]:
    """The rule of ``POST /tasks/{id}/cancel`` for every task matching the filter (``status``
    defaults to ``["pending"]``; ``"running"`` flags running tasks, which their workers
    interrupt at their next heartbeat). The runtime-config update task is never bulk-cancelled."""
    statuses = task_filter.statuses(CANCEL_STATUSES, "pending")
    cancelled = await apply_in_batches(database, q.task_cancel_batch, task_filter, statuses)
    return {"cancelled": cancelled}
