"""``GET /tasks/stats`` (docs/reference.md#task-statistics): what the queue holds, cheaply.

Every figure comes from a statement that reads a bounded number of index entries or rows,
whatever the table holds (docs/operations.md#task-statistics has the cost of each):

- counts per status are exact up to :data:`COUNT_LIMIT`; past it, the planner's estimate
  (``pg_class.reltuples`` x the status' share in ``pg_stats``), listed in ``estimated``;
- pending and running per lane are exact up to the same limit (``pending_exact`` says so);
- the wait of the oldest due task per lane, and the pending tasks per normal-lane group, are read
  from the oldest :data:`SAMPLE_LIMIT` pending tasks: the whole backlog while it is shorter
  (``sample_complete``);
- finished in the last minute and failed in the last hour are ranges of the
  ``(status, finished_at)`` index.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from taskfleet.api.auth import require_role
from taskfleet.api.database import Database, Row, fetch_all, fetch_one
from taskfleet.api.deps import get_database
from taskfleet.api.routing import guarded_route
from taskfleet.api.schemas import ErrorMessage
from taskfleet.shared import queries as q
from taskfleet.shared.policy.groups import DEFAULT_GROUP
from taskfleet.shared.policy.lanes import Lane
from taskfleet.shared.policy.runtime_config import config_from_payload
from taskfleet.shared.statuses import TaskStatus

log = logging.getLogger(__name__)

#: Exact counting stops here; past it a count is the planner's estimate (or this lower bound).
COUNT_LIMIT = 10_000
#: Pending tasks read, oldest first, for the per-group figures and the oldest waits.
SAMPLE_LIMIT = 10_000


class LaneStats(BaseModel):
    pending: int = Field(description="Pending tasks (due or scheduled later).")
    pending_exact: bool = Field(
        description=f"False when there are more than {COUNT_LIMIT:,} and pending is that bound."
    )
    running: int
    oldest_ready_seconds: float = Field(
        description="Seconds the longest-waiting due task has waited since it became due "
        "(0 when none is due)."
    )


class GroupStats(BaseModel):
    group: str = Field(description="A configured label, or default.")
    weight: int = Field(description="Its weight in the current runtime config.")
    pending: int
    ready: int = Field(description="Pending tasks that are due now.")
    oldest_ready_seconds: float


class FinishedStats(BaseModel):
    completed: int
    failed: int
    cancelled: int


class TaskStats(BaseModel):
    """The queue at a glance (docs/reference.md#task-statistics)."""

    by_status: dict[str, int] = Field(description="Tasks per status.")
    estimated: list[str] = Field(
        description=f"Statuses with more than {COUNT_LIMIT:,} tasks, whose count in by_status "
        "is the planner's estimate (never below that bound)."
    )
    lanes: dict[str, LaneStats] = Field(description="control, strict and normal.")
    groups: list[GroupStats] = Field(
        description="Normal-lane groups: every configured label and default, in rotation order."
    )
    sample_complete: bool = Field(
        description=f"True when the oldest-wait and group figures cover every pending task; "
        f"false when they cover the oldest {SAMPLE_LIMIT:,}."
    )
    finished_last_minute: FinishedStats
    failed_last_hour: int
    finished_capped: list[str] = Field(
        description=f"The finished counts that reached {COUNT_LIMIT:,} and stopped there: "
        "completed, failed and cancelled (of finished_last_minute), failed_last_hour."
    )
    config_version: int = Field(description="The runtime config version the groups come from.")


def _weights(payload: Mapping[str, Any] | None) -> tuple[dict[str, int], int]:
    """(label weights, default weight) of a stored config; none configured when unreadable."""
    if payload is None:
        return {}, 1
    try:
        config = config_from_payload(payload)
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("stats: the latest runtime config payload is unreadable")
        return {}, 1
    return dict(config.label_weights), config.default_weight


def _estimate(status: str, counted: int, estimates: Row | None, limit: int) -> int:
    if estimates is not None and estimates["reltuples"] and estimates["statuses"]:
        shares = dict(zip(estimates["statuses"], estimates["shares"] or [], strict=False))
        if status in shares:
            return max(limit, round(float(estimates["reltuples"]) * float(shares[status])))
    return min(counted, limit)


async def read_stats(
    database: Database, *, count_limit: int = COUNT_LIMIT, sample_limit: int = SAMPLE_LIMIT
) -> dict[str, Any]:
    """The document ``GET /tasks/stats`` answers."""
    statuses = [s.value for s in TaskStatus]
    async with database.transaction() as conn:
        latest = await fetch_one(conn, q.runtime_config_latest)
        label_weights, default_weight = _weights(latest["payload"] if latest else None)
        # One more than the limit tells "exactly the limit" from "past it".
        counts = await fetch_all(
            conn, q.task_stats_status_counts, statuses=statuses, limit=count_limit + 1
        )
        over = {r["status"] for r in counts if r["counted"] > count_limit}
        estimates = await fetch_one(conn, q.task_stats_status_estimates) if over else None
        lanes = await fetch_one(conn, q.task_stats_lanes, limit=count_limit + 1)
        sample = await fetch_all(conn, q.task_stats_pending_sample, limit=sample_limit)
        finished = await fetch_one(conn, q.task_stats_finished, limit=count_limit + 1)
    assert lanes is not None and finished is not None  # aggregates: always one row

    by_status = {
        r["status"]: (
            _estimate(r["status"], r["counted"], estimates, count_limit)
            if r["status"] in over
            else int(r["counted"])
        )
        for r in counts
    }
    sampled = sum(int(r["pending"]) for r in sample)
    oldest: dict[str, float] = {}
    groups: dict[str, dict[str, Any]] = {
        name: {
            "group": name,
            "weight": weight,
            "pending": 0,
            "ready": 0,
            "oldest_ready_seconds": 0.0,
        }
        for name, weight in [*sorted(label_weights.items()), (DEFAULT_GROUP, default_weight)]
    }
    for r in sample:
        seconds = float(r["oldest_ready_seconds"])
        oldest[r["lane"]] = max(oldest.get(r["lane"], 0.0), seconds)
        if r["lane"] == Lane.NORMAL.value:
            group = groups.get(r["grp"] or DEFAULT_GROUP)
            if group is None:
                # A grouping newer than the config read above (a change landed in between).
                continue
            group["pending"] += int(r["pending"])
            group["ready"] += int(r["ready"])
            group["oldest_ready_seconds"] = max(group["oldest_ready_seconds"], seconds)
    lane_stats = {}
    for lane in Lane:
        pending = int(lanes[f"{lane.value}_pending"])
        lane_stats[lane.value] = {
            "pending": min(pending, count_limit),
            "pending_exact": pending <= count_limit,
            "running": int(lanes[f"{lane.value}_running"]),
            "oldest_ready_seconds": oldest.get(lane.value, 0.0),
        }
    return {
        "by_status": by_status,
        "estimated": sorted(over),
        "lanes": lane_stats,
        "groups": list(groups.values()),
        "sample_complete": sampled < sample_limit,
        "finished_last_minute": {
            s: min(int(finished[f"{s}_last_minute"]), count_limit)
            for s in ("completed", "failed", "cancelled")
        },
        "failed_last_hour": min(int(finished["failed_last_hour"]), count_limit),
        "finished_capped": [
            name
            for name, column in (
                ("completed", "completed_last_minute"),
                ("failed", "failed_last_minute"),
                ("cancelled", "cancelled_last_minute"),
                ("failed_last_hour", "failed_last_hour"),
            )
            if int(finished[column]) > count_limit
        ],
        "config_version": int(latest["version"]) if latest else 0,
    }


router = APIRouter(route_class=guarded_route(), tags=["tasks"])


@router.get(
    "/tasks/stats",
    response_model=TaskStats,
    dependencies=[Depends(require_role("submit"))],
    responses={
        401: {"model": ErrorMessage},
        403: {"model": ErrorMessage},
        503: {"model": ErrorMessage},
    },
    summary="Counts per status, lane and group, oldest waits, recent outcomes",
)
async def task_stats(database: Annotated[Database, Depends(get_database)]) -> dict[str, Any]:
    return await read_stats(database)
