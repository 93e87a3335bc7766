"""Request and response models of the task API (SPEC §3). Field names are the wire names.

Request models reject unknown fields, and their numbers are strict: ``"priority": "5"`` or
``"priority": true`` is a 422, not a silent coercion. Rules that need the task registry (the type
is registered, the payload fits the handler's model) are checked by the routes, which report them
in the same error shape.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, RUNTIME_CONFIG_TASK_TYPE

MAX_INT32 = 2_147_483_647
MAX_BIGINT = 9_223_372_036_854_775_807
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_LABELS = 32
MAX_LABEL_LENGTH = 128
MAX_TYPE_LENGTH = 200
MAX_UNIQUE_KEY_LENGTH = 200
MAX_BATCH = 1000
MAX_ATTEMPTS = 100
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
# Far enough for any real schedule, near enough that now() + delay never overflows a timestamptz.
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)


def _storable_text(value: str) -> str:
    # Postgres text cannot hold NUL, and an unpaired surrogate cannot be encoded as UTF-8: both
    # would fail in the database, after validation said yes.
    if "\x00" in value:
        raise PydanticCustomError("invalid_text", "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_text", "must be valid Unicode text") from None
    return value


# Length first (so the error says string_too_long), then what Postgres can store.
_Storable = AfterValidator(_storable_text)
TypeName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TYPE_LENGTH), _Storable]
Label = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL_LENGTH), _Storable]
UniqueKey = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_UNIQUE_KEY_LENGTH), _Storable
]
Int = Annotated[int, Strict()]
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class TaskIn(BaseModel):
    """One task to submit."""

    model_config = ConfigDict(extra="forbid")

    type: TypeName = Field(description="A registered task type.")
    payload: dict[str, Any] = Field(
        default_factory=dict,
        description="The handler's parameters, validated against its model; at most 256 KiB "
        "as JSON.",
    )
    priority: Annotated[Int, Field(ge=0, le=CONTROL_PRIORITY)] = Field(
        default=0,
        description="0: the weighted normal lane; > 0: the strict lane, higher first. "
        f"{CONTROL_PRIORITY} is reserved for the control lane.",
    )
    weight: Annotated[Int, Field(ge=1, le=MAX_INT32)] = Field(
        default=1, description="Order inside the task's normal-lane group, higher first."
    )
    labels: list[Label] = Field(
        default_factory=list,
        max_length=MAX_LABELS,
        description=f"At most {MAX_LABELS} non-empty labels of at most {MAX_LABEL_LENGTH} "
        "characters; the smallest configured one is the task's group.",
    )
    delay_seconds: Annotated[Seconds, Field(ge=0, le=MAX_DELAY_SECONDS)] | None = Field(
        default=None, description="Earliest start, relative to now. Not with run_at."
    )
    run_at: AwareDatetime | None = Field(
        default=None,
        description="Earliest start, an ISO 8601 time with an offset. Not with delay_seconds.",
    )
    max_attempts: Annotated[Int, Field(ge=1, le=MAX_ATTEMPTS)] = Field(
        default=3, description="Attempts before the task fails for good."
    )
    timeout_seconds: Annotated[Seconds, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] | None = Field(
        default=None, description="Each attempt is cancelled after this many seconds."
    )
    unique_key: UniqueKey | None = Field(
        default=None,
        description="While a task with this key is pending or running, submitting it again "
        "returns that task instead of a new one.",
    )

    @field_validator("type")
    @classmethod
    def _type_not_reserved(cls, value: str) -> str:
        if value == RUNTIME_CONFIG_TASK_TYPE:
            raise PydanticCustomError(
                "reserved",
                "{type} is reserved for the runtime-config update: use PUT /runtime-config",
                {"type": RUNTIME_CONFIG_TASK_TYPE},
            )
        return value

    @field_validator("priority")
    @classmethod
    def _priority_not_reserved(cls, value: int) -> int:
        if value == CONTROL_PRIORITY:
            raise PydanticCustomError(
                "reserved",
                "priority {priority} is reserved for the control lane; use at most {highest}",
                {"priority": CONTROL_PRIORITY, "highest": CONTROL_PRIORITY - 1},
            )
        return value

    @field_validator("run_at")
    @classmethod
    def _not_with_delay(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is None:
            return value
        if info.data.get("delay_seconds") is not None:
            raise PydanticCustomError(
                "mutually_exclusive", "give delay_seconds or run_at, not both"
            )
        # Bounded so the database can always store it (year 1 at +14:00 is year 0 in UTC).
        latest = datetime.now(UTC) + timedelta(seconds=MAX_DELAY_SECONDS)
        if not EARLIEST_RUN_AT <= value <= latest:
            raise PydanticCustomError(
                "out_of_range", "must be after 1970-01-01 and at most 10 years from now"
            )
        return value


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
    alive: bool


class WorkerList(BaseModel):
    workers: list[WorkerOut]


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
