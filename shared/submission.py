"""The rules a new task must satisfy, and the insert that stores it: one home for every way in.

``POST /tasks``, ``POST /tasks/batch`` and the Python enqueue functions (``taskfleet.enqueue``
and friends, inside the caller's own transaction) all validate with :class:`TaskIn` and
:func:`check_submission`, and all insert through the named query ``task_insert_batch`` (or
``task_insert_one``, the same insert for a single task) driven by :func:`insert_steps`, so a rule
added here (or to those queries) applies to every path.

:func:`insert_steps` is written without I/O: it yields the named queries to run and receives
their rows, so the async drivers (SQLAlchemy's and asyncpg's) and the sync one (SQLAlchemy's)
share the deduplication loop instead of copying it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from taskfleet.shared import protocol
from taskfleet.shared import queries as q
from taskfleet.shared.policy.lanes import (
    CONTROL_PRIORITY,
    RUNTIME_CONFIG_TASK_TYPE,
    lane_for_priority,
)
from taskfleet.shared.registry import TaskRegistry

MAX_INT32 = 2_147_483_647
MAX_BIGINT = 9_223_372_036_854_775_807
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_LABELS = 32
MAX_LABEL_LENGTH = 128
MAX_REQUIRES = 32
MAX_TYPE_LENGTH = 200
MAX_UNIQUE_KEY_LENGTH = 200
MAX_BATCH = 1000
MAX_ATTEMPTS = 100
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
# Far enough for any real schedule, near enough that now() + delay never overflows a timestamptz.
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)

# Far beyond any real parameter object, and well inside what JSON encoders (the response's
# included) handle: deeper payloads could be stored and then not be served back.
MAX_PAYLOAD_DEPTH = 64

# A deduplicated task can finish between the insert that saw it and the read that fetches it;
# the insert is then simply tried again, a bounded number of times.
DEDUP_ATTEMPTS = 3

# An escaped NUL (\u0000) in JSON text, not preceded by an escaped backslash: jsonb rejects it.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

Loc = tuple[str | int, ...]
Row = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Refusals: a status code and the broken rules, each naming its field.


class Rejected(Exception):
    """A refusal with a status code and a list of ``{"loc", "msg", "type"}`` items."""

    def __init__(self, status_code: int, errors: Sequence[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.status_code = status_code
        self.errors = list(errors)


class UniqueKeyContention(Exception):
    """The task holding a ``unique_key`` kept finishing between the insert and the read."""

    message = "unique_key: the task holding this key kept changing state; retry the request"

    def __init__(self) -> None:
        super().__init__(self.message)


def error_item(loc: Loc, msg: str, type_: str) -> dict[str, Any]:
    return {"loc": list(loc), "msg": msg, "type": type_}


def pydantic_errors(
    errors: Iterable[ErrorDetails | dict[str, Any]], prefix: Loc = ()
) -> list[dict[str, Any]]:
    """Pydantic's error list as ours, each location under ``prefix``."""
    return [
        error_item((*prefix, *error["loc"]), str(error["msg"]), str(error["type"]))
        for error in errors
    ]


# --------------------------------------------------------------------------------------------
# The task envelope.


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


def _type_not_reserved(value: str) -> str:
    if value == RUNTIME_CONFIG_TASK_TYPE:
        raise PydanticCustomError(
            "reserved",
            "{type} is reserved for the runtime-config update: use PUT /runtime-config",
            {"type": RUNTIME_CONFIG_TASK_TYPE},
        )
    return value


def _priority_not_reserved(value: int) -> int:
    if value == CONTROL_PRIORITY:
        raise PydanticCustomError(
            "reserved",
            "priority {priority} is reserved for the control lane; use at most {highest}",
            {"priority": CONTROL_PRIORITY, "highest": CONTROL_PRIORITY - 1},
        )
    return value


# The task fields a schedule shares with a submitted task: one type (and one rule) each.
SubmittedType = Annotated[TypeName, AfterValidator(_type_not_reserved)]
Priority = Annotated[Int, Field(ge=0, le=CONTROL_PRIORITY), AfterValidator(_priority_not_reserved)]
Weight = Annotated[Int, Field(ge=1, le=MAX_INT32)]
MaxAttempts = Annotated[Int, Field(ge=1, le=MAX_ATTEMPTS)]
TimeoutSeconds = Annotated[Seconds, Field(gt=0, le=MAX_TIMEOUT_SECONDS)]
PRIORITY_DESCRIPTION = (
    "0: the weighted normal lane; > 0: the strict lane, higher first. "
    f"{CONTROL_PRIORITY} is reserved for the control lane."
)
WEIGHT_DESCRIPTION = "Order inside the task's normal-lane group, higher first."
LABELS_DESCRIPTION = (
    f"At most {MAX_LABELS} non-empty labels of at most {MAX_LABEL_LENGTH} "
    "characters; the smallest configured one is the task's group."
)
MAX_ATTEMPTS_DESCRIPTION = "Attempts before the task fails for good."
TIMEOUT_DESCRIPTION = "Each attempt is cancelled after this many seconds."


def _not_a_number(value: Any) -> Any:
    # JSON has no time type: a time is an ISO 8601 string. Pydantic would read a number as Unix
    # seconds, or as milliseconds past 2e10, which the documented schema does not allow.
    if isinstance(value, int | float):
        raise PydanticCustomError(
            "datetime_type", "must be an ISO 8601 time with an offset, e.g. 2026-12-01T14:00:00Z"
        )
    return value


class TaskIn(BaseModel):
    """One task to submit."""

    model_config = ConfigDict(extra="forbid")

    type: SubmittedType = Field(description="A registered task type.")
    payload: dict[str, Any] = Field(
        default_factory=dict,
        description="The handler's parameters, validated against its model; at most 256 KiB "
        "as JSON.",
    )
    priority: Priority = Field(default=0, description=PRIORITY_DESCRIPTION)
    weight: Weight = Field(default=1, description=WEIGHT_DESCRIPTION)
    labels: list[Label] = Field(
        default_factory=list, max_length=MAX_LABELS, description=LABELS_DESCRIPTION
    )
    delay_seconds: Annotated[Seconds, Field(ge=0, le=MAX_DELAY_SECONDS)] | None = Field(
        default=None, description="Earliest start, relative to now. Not with run_at."
    )
    run_at: Annotated[AwareDatetime, BeforeValidator(_not_a_number)] | None = Field(
        default=None,
        description="Earliest start, an ISO 8601 time with an offset. Not with delay_seconds.",
    )
    max_attempts: MaxAttempts = Field(default=3, description=MAX_ATTEMPTS_DESCRIPTION)
    timeout_seconds: TimeoutSeconds | None = Field(default=None, description=TIMEOUT_DESCRIPTION)
    requires: list[Label] = Field(
        default_factory=list,
        max_length=MAX_REQUIRES,
        description=f"Worker tags (at most {MAX_REQUIRES}, each 1 to {MAX_LABEL_LENGTH} "
        "characters): only a worker started with every one of them (TASKFLEET_WORKER_TAGS) "
        "claims the task. Empty: any worker.",
    )
    unique_key: UniqueKey | None = Field(
        default=None,
        description="While a task with this key is pending or running, submitting it again "
        "returns that task instead of a new one.",
    )

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


# --------------------------------------------------------------------------------------------
# The checks that need more than the envelope: the payload's encoding and the registry.


@dataclass(frozen=True)
class Submission:
    """A validated task, with its payload already encoded as the JSON text to store."""

    task: TaskIn
    payload_json: str


def _nests_deeper_than(value: Any, limit: int) -> bool:
    # Iterative: a payload nested thousands deep must not exhaust Python's stack here.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def encode_payload(payload: Mapping[str, Any], loc: Loc) -> str:
    """The payload as the JSON text to store; :class:`Rejected` (413 or 422) when it cannot be."""
    if _nests_deeper_than(payload, MAX_PAYLOAD_DEPTH):
        raise Rejected(
            422,
            [error_item(loc, f"nests deeper than {MAX_PAYLOAD_DEPTH} levels", "too_deep")],
        )
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # before ValueError, its base class
        raise Rejected(
            422,
            [error_item(loc, "must be valid Unicode text (unpaired surrogate)", "invalid_json")],
        ) from None
    except ValueError:  # NaN or Infinity (Python's JSON parser accepts them; JSON does not)
        raise Rejected(
            422, [error_item(loc, "must not contain NaN or Infinity", "invalid_json")]
        ) from None
    if size > MAX_PAYLOAD_BYTES:
        raise Rejected(
            413,
            [
                error_item(
                    loc,
                    f"payload is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES} bytes",
                    "too_large",
                )
            ],
        )
    if _ESCAPED_NUL.search(text):
        raise Rejected(
            422, [error_item(loc, "must not contain NUL characters (\\u0000)", "invalid_json")]
        )
    return text


def check_submission(
    task: TaskIn, registry: TaskRegistry, loc: Loc, *, require_registered: bool = True
) -> Submission:
    """The checks that need the registry, and the payload's size and encoding.

    A registered type's payload is validated against its handler's model. An unregistered type
    is refused when ``require_registered`` (the API, which loads every task module); otherwise
    (enqueue from an application that does not import the handler) it is stored unvalidated.
    """
    payload_json = encode_payload(task.payload, (*loc, "payload"))
    definition = registry.get(task.type)
    if definition is None and not require_registered:
        return Submission(task=task, payload_json=payload_json)
    if definition is None or definition.internal:
        submittable = [
            name
            for name in registry.names()
            if (known := registry.get(name)) is not None and not known.internal
        ]
        raise Rejected(
            422,
            [
                error_item(
                    (*loc, "type"),
                    "not a registered task type; registered types: " + ", ".join(submittable),
                    "unknown_task_type",
                )
            ],
        )
    try:
        definition.validate(task.payload)
    except ValidationError as exc:
        raise Rejected(422, pydantic_errors(exc.errors(), (*loc, "payload"))) from None
    return Submission(task=task, payload_json=payload_json)


# --------------------------------------------------------------------------------------------
# The insert: task_insert_batch (or _one) with its deduplication loop, written without I/O.


def insert_params(submissions: Sequence[Submission]) -> dict[str, Any]:
    """The parameters of ``task_insert_batch`` for these tasks (one statement, one NOTIFY)."""
    tasks = [s.task for s in submissions]
    return {
        "types": [t.type for t in tasks],
        "payloads": [s.payload_json for s in submissions],
        "priorities": [t.priority for t in tasks],
        "weights": [t.weight for t in tasks],
        "labels": [json.dumps(t.labels, ensure_ascii=False) for t in tasks],
        "max_attempts": [t.max_attempts for t in tasks],
        "delays": [t.delay_seconds for t in tasks],
        "run_ats": [t.run_at for t in tasks],
        "timeouts": [t.timeout_seconds for t in tasks],
        "unique_keys": [t.unique_key for t in tasks],
        "requires": [json.dumps(t.requires, ensure_ascii=False) for t in tasks],
        "wake_hint": protocol.wake_hint(lane_for_priority(t.priority).value for t in tasks),
    }


def insert_one_params(submission: Submission) -> dict[str, Any]:
    """The parameters of ``task_insert_one`` for this task."""
    task = submission.task
    return {
        "type": task.type,
        "payload": submission.payload_json,
        "priority": task.priority,
        "weight": task.weight,
        "labels": list(task.labels),
        "max_attempts": task.max_attempts,
        "delay": task.delay_seconds,
        "run_at": task.run_at,
        "timeout": task.timeout_seconds,
        "unique_key": task.unique_key,
        "requires": list(task.requires),
        "wake_hint": protocol.wake_hint([lane_for_priority(task.priority).value]),
    }


def insert_statement(submissions: Sequence[Submission]) -> tuple[q.Query, dict[str, Any]]:
    """The statement that inserts these tasks, and its parameters: ``task_insert_one`` for a
    single task (a quarter less server time), else ``task_insert_batch``."""
    if len(submissions) == 1:
        return q.task_insert_one, insert_one_params(submissions[0])
    return q.task_insert_batch, insert_params(submissions)


#: Yields (named query, parameters), is sent the query's rows, returns each task's row and
#: whether it was deduplicated onto an unfinished task with the same unique_key.
InsertSteps = Generator[tuple[q.Query, dict[str, Any]], list[Row], list[tuple[Row, bool]]]


def insert_steps(submissions: Sequence[Submission]) -> InsertSteps:
    """Insert the tasks in one statement (one NOTIFY); for each, its row and whether it was
    deduplicated. Raises :class:`UniqueKeyContention` if a key's holder keeps finishing, after
    deleting the rows it inserted (the statement's transaction is the caller's)."""
    results: list[tuple[Row, bool] | None] = [None] * len(submissions)
    todo = list(range(len(submissions)))
    for _ in range(DEDUP_ATTEMPTS):
        rows = yield insert_statement([submissions[i] for i in todo])
        vanished: list[int] = []
        for index, row in zip(todo, rows, strict=True):
            if not row["deduplicated"]:
                results[index] = (row, False)
                continue
            found = yield (
                q.task_get_unfinished_by_unique_key,
                {"unique_key": row["input_unique_key"]},
            )
            if not found:  # it finished in between: its key is free again
                vanished.append(index)
            else:
                results[index] = (found[0], True)
        if not vanished:
            break
        todo = vanished
    else:
        # Nothing may stay written: in the caller's own transaction (``enqueue_many``) a caught
        # Conflict followed by a commit would otherwise keep part of the batch.
        written = [r[0]["id"] for r in results if r is not None and not r[1]]
        if written:
            yield q.task_delete_own_inserts, {"ids": written}
        raise UniqueKeyContention()
    return [r for r in results if r is not None]


async def run_insert(
    fetch_all: Callable[[q.Query, dict[str, Any]], Awaitable[list[Row]]],
    submissions: Sequence[Submission],
) -> list[tuple[Row, bool]]:
    """Drive :func:`insert_steps` with an async ``fetch_all(query, params) -> rows``."""
    steps = insert_steps(submissions)
    try:
        query, params = next(steps)
        while True:
            query, params = steps.send(await fetch_all(query, params))
    except StopIteration as done:
        result: list[tuple[Row, bool]] = done.value
        return result


def run_insert_sync(
    fetch_all: Callable[[q.Query, dict[str, Any]], list[Row]],
    submissions: Sequence[Submission],
) -> list[tuple[Row, bool]]:
    """Drive :func:`insert_steps` with a blocking ``fetch_all(query, params) -> rows``."""
    steps = insert_steps(submissions)
    try:
        query, params = next(steps)
        while True:
            query, params = steps.send(fetch_all(query, params))
    except StopIteration as done:
        result: list[tuple[Row, bool]] = done.value
        return result


def task_out(row: Mapping[str, Any]) -> dict[str, Any]:
    """A task row (the named queries' task columns) in its wire form."""
    return {
        "id": row["id"],
        "type": row["type"],
        "payload": row["payload"],
        "status": row["status"],
        "priority": row["priority"],
        "weight": row["weight"],
        "labels": list(row["labels"]),
        "attempts": row["attempts"],
        "max_attempts": row["max_attempts"],
        "run_after": row["run_after"],
        "timeout_seconds": row["timeout"],
        "created_at": row["created_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "worker_id": row["worker_id"],
        "lease_expires_at": row["lease_expires_at"],
        "result": row["result"],
        "last_error": row["last_error"],
        "unique_key": row["unique_key"],
        "cancel_requested": row["cancel_requested"],
        "requires": list(row["requires"]),
    }
