"""Task handlers: the ``@task`` decorator, the registry both services load, the demo handlers.

A handler is a function (async, or sync to be run in one of the worker's threads) taking an
instance of its pydantic parameter model, and optionally a second argument, its
:class:`~taskfleet.shared.context.TaskContext`; it returns something JSON-serialisable (stored as
the task's ``result``). The API validates submitted payloads against the same model.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import sysconfig
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from taskfleet.shared.errors import ConfigurationError
from taskfleet.shared.policy.backoff import BackoffPolicy
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.policy.schedules import (
    MAX_CRON_LENGTH,
    MAX_EVERY_LENGTH,
    MAX_TIMEZONE_LENGTH,
    ScheduleError,
    Timing,
    parse_timezone,
    schedule_name_problem,
)

Handler = Callable[..., Any] | Callable[..., Awaitable[Any]]
F = TypeVar("F", bound=Callable[..., Any])
#: Where an attempt runs: None is the worker's own process (async handlers on its event loop,
#: sync ones in its thread pool); "process" a child process of its own, killed at the timeout.
Isolation = Literal["process"] | None


class PermanentError(Exception):
    """Raise from a handler to fail the task at once, without further retries."""


class TaskParams(BaseModel):
    """Base for parameter models: unknown payload fields are rejected (a 422 at submission)."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class CodeSchedule:
    """A schedule declared with ``@task(..., schedule=...)`` or ``every=...``."""

    cron: str | None
    every: str | None
    timezone: str | None


@dataclass(frozen=True)
class TaskDefinition:
    name: str
    func: Handler
    params: type[BaseModel]
    is_async: bool
    backoff: BackoffPolicy | None
    internal: bool = False
    #: The handler takes a second argument, its TaskContext.
    takes_context: bool = False
    isolation: Isolation = None
    #: Declared as a periodic task: the workers upsert it as the schedule named after the type.
    schedule: CodeSchedule | None = None

    def validate(self, payload: Any) -> BaseModel:
        return self.params.model_validate(payload)


class TaskRegistry:
    """Task type name -> definition."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskDefinition] = {}

    def task(
        self,
        name: str,
        *,
        params: type[BaseModel],
        backoff: BackoffPolicy | None = None,
        internal: bool = False,
        isolation: Isolation = None,
        schedule: str | None = None,
        every: str | None = None,
        timezone: str | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function as the handler of task type ``name``.

        ``params``: the pydantic model the payload must satisfy. ``backoff``: retry backoff for
        this type (default: the worker's). ``internal``: not submittable over the API.
        ``isolation="process"``: run each attempt in a child process of its own, killed at the
        task's timeout or on cancel: the honest timeout for CPU-bound or hung code. The handler
        must be importable by its module path (a module-level function), and its result and
        payload travel as JSON.

        ``schedule="0 6 * * *"`` (a cron expression, read in ``timezone``, default UTC) or
        ``every="30s"``: also a periodic task, the schedule named after the type, enqueued with
        an empty payload (so ``params`` must accept ``{}``). Every worker that loads the module
        declares it at start; a schedule of the same name set over the API wins over it.
        """
        if not name or len(name) > 200:
            raise ValueError("a task name must be 1-200 characters")
        if name == RUNTIME_CONFIG_TASK_TYPE and not internal:
            raise ValueError(f"{RUNTIME_CONFIG_TASK_TYPE} is reserved")

        if isolation not in (None, "process"):
            raise ValueError('isolation must be None or "process"')
        code_schedule = _code_schedule(name, params, schedule, every, timezone)

        def register(func: F) -> F:
            if name in self._tasks and self._tasks[name].func is not func:
                raise ValueError(f"task type {name!r} is registered twice")
            if isolation == "process" and not _importable(func):
                raise ValueError(
                    f"task type {name!r}: a handler with isolation='process' must be a "
                    "module-level function (the child process imports it by its module path)"
                )
            self._tasks[name] = TaskDefinition(
                name=name,
                func=func,
                params=params,
                is_async=inspect.iscoroutinefunction(func),
                backoff=backoff,
                internal=internal,
                takes_context=_takes_context(name, func),
                isolation=isolation,
                schedule=code_schedule,
            )
            return func

        return register

    def get(self, name: str) -> TaskDefinition | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def runnable_types(self) -> list[str]:
        """The task types a worker with this registry runs (the internal ones excluded)."""
        return [name for name, d in sorted(self._tasks.items()) if not d.internal]

    def merge(self, other: TaskRegistry) -> None:
        for definition in other._tasks.values():
            existing = self._tasks.get(definition.name)
            if existing is not None and existing.func is not definition.func:
                raise ValueError(f"task type {definition.name!r} is registered twice")
            self._tasks[definition.name] = definition


def _code_schedule(
    name: str,
    params: type[BaseModel],
    cron: str | None,
    every: str | None,
    timezone: str | None,
) -> CodeSchedule | None:
    """The declared schedule, checked now: a bad one fails at import, not at the first slot."""
    if cron is None and every is None:
        if timezone is not None:
            raise ValueError(f"task type {name!r}: timezone= goes with schedule= (a cron)")
        return None
    if cron is not None and every is not None:
        raise ValueError(f"task type {name!r}: give schedule= (a cron) or every=, not both")
    if every is not None and timezone is not None:
        raise ValueError(f"task type {name!r}: timezone= applies to schedule= (a cron) only")
    # The API's length rules too: the worker declares it through them, and a schedule they
    # refuse kept every worker loading it from firing any schedule at all.
    for field, text, limit in (
        ("schedule", cron, MAX_CRON_LENGTH),
        ("every", every, MAX_EVERY_LENGTH),
        ("timezone", timezone, MAX_TIMEZONE_LENGTH),
    ):
        if text is not None and not 1 <= len(text) <= limit:
            raise ValueError(f"task type {name!r}: {field}= must be 1 to {limit} characters")
    checks: list[tuple[str, Callable[[], object]]] = [
        ("timezone", lambda: timezone is None or parse_timezone(timezone)),
        (
            "every" if every is not None else "schedule",
            lambda: Timing.parse(cron=cron, every=every, timezone=None),
        ),
    ]
    for field, check in checks:
        try:
            check()
        except ScheduleError as exc:
            raise ValueError(f"task type {name!r}: {field}= {exc}") from None
    try:
        params.model_validate({})
    except Exception:
        raise ValueError(
            f"task type {name!r}: a scheduled task is enqueued with an empty payload, and its "
            "params model does not accept {}: give every field a default"
        ) from None
    if (problem := schedule_name_problem(name)) is not None:
        raise ValueError(
            f"task type {name!r}: a scheduled type names its schedule, which {problem}"
        )
    return CodeSchedule(cron=cron, every=every, timezone=timezone)


def _takes_context(name: str, func: Callable[..., Any]) -> bool:
    """Whether ``func`` takes (params) or (params, context)."""
    required = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(required) not in (1, 2):
        raise ValueError(
            f"task type {name!r}: a handler takes its parameters, and optionally its "
            f"TaskContext (it has {len(required)} required positional parameters)"
        )
    return len(required) == 2


def _importable(func: Callable[..., Any]) -> bool:
    qualname = getattr(func, "__qualname__", "")
    return bool(getattr(func, "__module__", None)) and qualname.isidentifier()


#: The registry user modules register into with ``@task(...)``.
default_registry = TaskRegistry()
task = default_registry.task


def load_registry(modules: Iterable[str]) -> TaskRegistry:
    """A registry with the demo handlers plus everything ``modules`` register on import."""
    import taskfleet.shared.demo_tasks  # noqa: F401  (registers the demo handlers)

    for module in modules:
        import_task_module(module)
    registry = TaskRegistry()
    registry.merge(default_registry)
    return registry


def import_task_module(module: str) -> None:
    """Import a module named in ``TASKFLEET_TASK_MODULES``; :class:`ConfigurationError` naming it
    (and, when it is not found, the import path searched) when it cannot be imported."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            raise ConfigurationError(
                f"TASKFLEET_TASK_MODULES: no module named {module!r} "
                f"(searched {', '.join(_searched_path())}): run taskfleet from the folder that "
                "contains it, add that folder to PYTHONPATH, or install the package"
            ) from exc
        raise ConfigurationError(
            f"TASKFLEET_TASK_MODULES: importing {module!r} failed: {exc} (a module it imports is "
            "not installed)"
        ) from exc
    except Exception as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raise ConfigurationError(
            f"TASKFLEET_TASK_MODULES: importing {module!r} failed: "
            f"{type(exc).__name__}: {first_line} (taskfleet -v shows the traceback)"
        ) from exc


def _searched_path() -> list[str]:
    """The folders on ``sys.path``, less the standard library's (they hold no user module)."""
    paths = sysconfig.get_paths()
    stdlib = {paths["stdlib"], paths["platstdlib"]}
    searched = []
    for entry in sys.path:
        if entry in stdlib or entry.endswith("lib-dynload") or not os.path.isdir(entry or "."):
            continue
        searched.append(entry or ".")
    return searched
