"""Periodic tasks: the rules a schedule must satisfy, its stored and wire forms.

``PUT /schedules/{name}`` and the schedules declared in code (``@task(..., schedule=...)``) are
validated here. The task fields a schedule carries (``type``, ``payload``, ``labels``,
``priority``, ``weight``, ``max_attempts``, ``timeout_seconds``) use the very types of
``taskfleet.shared.submission`` and its :func:`~taskfleet.shared.submission.check_submission`
(registered type, payload against the handler's model, size and encoding), so a schedule's
task obeys every rule a submitted task does; the timing (``cron`` or ``every``, ``timezone``)
is checked by ``taskfleet.shared.policy.schedules``. When each slot falls is that module's job;
firing is the worker's (``taskfleet.worker.scheduler``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from taskfleet.shared.policy.schedules import (
    DEFAULT_TIMEZONE,
    MAX_CRON_LENGTH,
    MAX_EVERY_LENGTH,
    MAX_TIMEZONE_LENGTH,
    ScheduleError,
    Timing,
    parse_every,
    parse_timezone,
    schedule_name_problem,
)
from taskfleet.shared.registry import TaskRegistry
from taskfleet.shared.submission import (
    LABELS_DESCRIPTION,
    MAX_ATTEMPTS_DESCRIPTION,
    MAX_LABELS,
    MAX_REQUIRES,
    PRIORITY_DESCRIPTION,
    TIMEOUT_DESCRIPTION,
    WEIGHT_DESCRIPTION,
    Label,
    Loc,
    MaxAttempts,
    Priority,
    Rejected,
    SubmittedType,
    TaskIn,
    TimeoutSeconds,
    Weight,
    _Storable,
    check_submission,
    error_item,
)

SOURCE_API = "api"
SOURCE_CODE = "code"

CronText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_CRON_LENGTH), _Storable]
EveryText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_EVERY_LENGTH), _Storable]
TimezoneText = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TIMEZONE_LENGTH), _Storable
]


class ScheduleIn(BaseModel):
    """A periodic task: what to enqueue (the task fields of ``POST /tasks``) and when."""

    model_config = ConfigDict(extra="forbid")

    type: SubmittedType = Field(description="A registered task type.")
    payload: dict[str, Any] = Field(
        default_factory=dict,
        description="The handler's parameters, validated against its model now and stored; "
        "at most 256 KiB as JSON.",
    )
    cron: CronText | None = Field(
        default=None,
        description="A cron expression: 5 fields (minute hour day-of-month month "
        "day-of-week), 6 with a leading seconds field, or @hourly, @daily, @weekly, @monthly, "
        "@yearly. Read in `timezone`. Exactly one of cron and every.",
    )
    every: EveryText | None = Field(
        default=None,
        description="A duration of whole seconds such as 30s, 5m, 1h30m, 1d (1s to 366d); the "
        "slots are its multiples since 1970-01-01T00:00Z. Exactly one of cron and every.",
    )
    timezone: TimezoneText | None = Field(
        default=None,
        description=f"The IANA time zone the cron expression is read in (default "
        f"{DEFAULT_TIMEZONE}); cron only.",
    )
    priority: Priority = Field(default=0, description=PRIORITY_DESCRIPTION)
    weight: Weight = Field(default=1, description=WEIGHT_DESCRIPTION)
    labels: list[Label] = Field(
        default_factory=list, max_length=MAX_LABELS, description=LABELS_DESCRIPTION
    )
    max_attempts: MaxAttempts = Field(default=3, description=MAX_ATTEMPTS_DESCRIPTION)
    timeout_seconds: TimeoutSeconds | None = Field(default=None, description=TIMEOUT_DESCRIPTION)
    requires: list[Label] = Field(
        default_factory=list,
        max_length=MAX_REQUIRES,
        description=f"Worker tags each fired task requires (at most {MAX_REQUIRES}): only a "
        "worker started with every one of them (TASKFLEET_WORKER_TAGS) claims it. Empty: any "
        "worker.",
    )


@dataclass(frozen=True)
class ScheduleSubmission:
    """A validated schedule, its payload encoded, its timing parsed."""

    schedule: ScheduleIn
    payload_json: str
    timing: Timing


def check_schedule_name(name: str, loc: Loc) -> None:
    """:class:`Rejected` (422) unless ``name`` is a usable schedule name (the rule:
    :func:`~taskfleet.shared.policy.schedules.schedule_name_problem`)."""
    if (problem := schedule_name_problem(name)) is not None:
        raise Rejected(422, [error_item(loc, problem, "invalid_name")])


def check_timing(schedule: ScheduleIn, loc: Loc) -> Timing:
    """The schedule's timing; :class:`Rejected` (422) naming the field of each broken rule."""
    errors: list[dict[str, Any]] = []
    if schedule.cron is None and schedule.every is None:
        errors.append(error_item((*loc, "cron"), "give cron or every", "missing"))
    elif schedule.cron is not None and schedule.every is not None:
        errors.append(
            error_item((*loc, "every"), "give cron or every, not both", "mutually_exclusive")
        )
    elif schedule.every is not None:
        try:
            parse_every(schedule.every)
        except ScheduleError as exc:
            errors.append(error_item((*loc, "every"), str(exc), "invalid_duration"))
        if schedule.timezone is not None:
            errors.append(
                error_item(
                    (*loc, "timezone"),
                    "applies to cron only (every counts from 1970-01-01T00:00Z)",
                    "not_applicable",
                )
            )
    if schedule.timezone is not None and schedule.cron is not None:
        try:
            parse_timezone(schedule.timezone)
        except ScheduleError as exc:
            errors.append(error_item((*loc, "timezone"), str(exc), "invalid_timezone"))
    if schedule.cron is not None and schedule.every is None:
        try:
            Timing.parse(cron=schedule.cron, every=None, timezone=None)
        except ScheduleError as exc:
            errors.append(error_item((*loc, "cron"), str(exc), "invalid_cron"))
    if errors:
        raise Rejected(422, errors)
    return stored_timing(schedule.cron, schedule.every, schedule.timezone)


def stored_timing(cron: str | None, every: str | None, timezone: str | None) -> Timing:
    """The timing of a stored (already validated) schedule."""
    return Timing.parse(cron=cron, every=every, timezone=timezone)


def check_schedule(schedule: ScheduleIn, registry: TaskRegistry, loc: Loc) -> ScheduleSubmission:
    """Every rule a schedule must satisfy; :class:`Rejected` naming the field otherwise."""
    timing = check_timing(schedule, loc)
    task = TaskIn.model_construct(
        type=schedule.type,
        payload=schedule.payload,
        priority=schedule.priority,
        weight=schedule.weight,
        labels=schedule.labels,
        max_attempts=schedule.max_attempts,
        timeout_seconds=schedule.timeout_seconds,
        requires=schedule.requires,
    )
    submission = check_submission(task, registry, loc)
    return ScheduleSubmission(
        schedule=schedule, payload_json=submission.payload_json, timing=timing
    )


def schedule_params(
    name: str, submitted: ScheduleSubmission, *, source: str, next_run_at: datetime
) -> dict[str, Any]:
    """The parameters of ``schedule_put`` and ``schedule_declare``."""
    schedule = submitted.schedule
    return {
        "name": name,
        "type": schedule.type,
        "payload": submitted.payload_json,
        "cron": " ".join(schedule.cron.split()) if schedule.cron is not None else None,
        "every": schedule.every,
        "timezone": (schedule.timezone or DEFAULT_TIMEZONE) if schedule.cron is not None else None,
        "priority": schedule.priority,
        "weight": schedule.weight,
        "labels": list(schedule.labels),
        "max_attempts": schedule.max_attempts,
        "timeout": schedule.timeout_seconds,
        # A set: sorted, each tag once (as a submitted task's).
        "requires": sorted(set(schedule.requires)),
        "source": source,
        "next_run_at": next_run_at,
    }


def schedule_out(row: Mapping[str, Any]) -> dict[str, Any]:
    """A schedules row (the named queries' schedule columns) in its wire form."""
    payload = row["payload"]
    return {
        "name": row["name"],
        "type": row["type"],
        "payload": json.loads(payload) if isinstance(payload, str) else payload,
        "cron": row["cron"],
        "every": row["every"],
        "timezone": row["timezone"],
        "priority": row["priority"],
        "weight": row["weight"],
        "labels": list(row["labels"]),
        "max_attempts": row["max_attempts"],
        "timeout_seconds": row["timeout"],
        "requires": list(row["requires"]),
        "source": row["source"],
        "next_run_at": row["next_run_at"],
        "last_run_at": row["last_run_at"],
        "last_task_id": row["last_task_id"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def undeclared_types(registry: TaskRegistry) -> list[str]:
    """The registry's task types that declare no schedule: a code schedule still stored under
    one of these names was removed from the code (a code schedule is named after its type)."""
    return sorted(
        name
        for name in registry.names()
        if (definition := registry.get(name)) is not None and definition.schedule is None
    )


def code_schedules(registry: TaskRegistry) -> list[tuple[str, ScheduleSubmission]]:
    """The schedules the registry's ``@task(..., schedule=... | every=...)`` declare, each
    named after its task type, with an empty payload and the default task fields."""
    declared: list[tuple[str, ScheduleSubmission]] = []
    for name in registry.names():
        definition = registry.get(name)
        if definition is None or definition.schedule is None:
            continue
        spec = definition.schedule
        schedule = ScheduleIn(type=name, cron=spec.cron, every=spec.every, timezone=spec.timezone)
        declared.append(
            (
                name,
                ScheduleSubmission(
                    schedule=schedule,
                    payload_json="{}",
                    timing=stored_timing(spec.cron, spec.every, spec.timezone),
                ),
            )
        )
    return declared
