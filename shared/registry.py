"""Task handlers: the ``@task`` decorator, the registry both services load, the demo handlers.

A handler is a function (async, or sync to be run in a thread) taking one argument, an instance
of its pydantic parameter model, and returning something JSON-serialisable (stored as the task's
``result``). The API validates submitted payloads against the same model.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from taskfleet.shared.policy.backoff import BackoffPolicy
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE

Handler = Callable[[Any], Any] | Callable[[Any], Awaitable[Any]]
F = TypeVar("F", bound=Callable[..., Any])


class PermanentError(Exception):
    """Raise from a handler to fail the task at once, without further retries."""


class TaskParams(BaseModel):
    """Base for parameter models: unknown payload fields are rejected (a 422 at submission)."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class TaskDefinition:
    name: str
    func: Handler
    params: type[BaseModel]
    is_async: bool
    backoff: BackoffPolicy | None
    internal: bool = False

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
    ) -> Callable[[F], F]:
        """Register the decorated function as the handler of task type ``name``.

        ``params``: the pydantic model the payload must satisfy. ``backoff``: retry backoff for
        this type (default: the worker's). ``internal``: not submittable over the API.
        """
        if not name or len(name) > 200:
            raise ValueError("a task name must be 1-200 characters")
        if name == RUNTIME_CONFIG_TASK_TYPE and not internal:
            raise ValueError(f"{RUNTIME_CONFIG_TASK_TYPE} is reserved")

        def register(func: F) -> F:
            if name in self._tasks and self._tasks[name].func is not func:
                raise ValueError(f"task type {name!r} is registered twice")
            self._tasks[name] = TaskDefinition(
                name=name,
                func=func,
                params=params,
                is_async=inspect.iscoroutinefunction(func),
                backoff=backoff,
                internal=internal,
            )
            return func

        return register

    def get(self, name: str) -> TaskDefinition | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def merge(self, other: TaskRegistry) -> None:
        for definition in other._tasks.values():
            existing = self._tasks.get(definition.name)
            if existing is not None and existing.func is not definition.func:
                raise ValueError(f"task type {definition.name!r} is registered twice")
            self._tasks[definition.name] = definition


#: The registry user modules register into with ``@task(...)``.
default_registry = TaskRegistry()
task = default_registry.task


def load_registry(modules: Iterable[str]) -> TaskRegistry:
    """A registry with the demo handlers plus everything ``modules`` register on import."""
    import taskfleet.shared.demo_tasks  # noqa: F401  (registers the demo handlers)

    for module in modules:
        importlib.import_module(module)
    registry = TaskRegistry()
    registry.merge(default_registry)
    return registry
