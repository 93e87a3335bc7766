"""The task registry: the ``@task`` decorator and the demo handlers."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from taskfleet.shared.policy.backoff import BackoffPolicy
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.registry import TaskParams, TaskRegistry, load_registry


class Params(TaskParams):
    n: int = 0


def test_decorator_registers_sync_and_async_handlers() -> None:
    registry = TaskRegistry()
    policy = BackoffPolicy(base=2.0)

    @registry.task("t.sync", params=Params, backoff=policy)
    def sync_handler(params: Params) -> int:
        return params.n

    @registry.task("t.async", params=Params)
    async def async_handler(params: Params) -> int:
        return params.n

    assert sync_handler(Params(n=3)) == 3  # the decorator returns the function itself
    definition = registry.get("t.sync")
    assert definition is not None
    assert definition.func is sync_handler
    assert definition.params is Params
    assert not definition.is_async
    assert definition.backoff is policy
    assert not definition.internal
    async_definition = registry.get("t.async")
    assert async_definition is not None and async_definition.is_async
    assert registry.names() == ["t.async", "t.sync"]
    assert registry.get("t.missing") is None


def test_runtime_config_task_type_is_reserved() -> None:
    registry = TaskRegistry()
    assert RUNTIME_CONFIG_TASK_TYPE == "updateWorkerRuntimeConfig"
    with pytest.raises(ValueError, match="reserved"):
        registry.task(RUNTIME_CONFIG_TASK_TYPE, params=Params)
    assert registry.get(RUNTIME_CONFIG_TASK_TYPE) is None


def test_runtime_config_task_type_may_be_registered_internally() -> None:
    registry = TaskRegistry()

    @registry.task(RUNTIME_CONFIG_TASK_TYPE, params=Params, internal=True)
    async def update(params: Params) -> None:
        return None

    definition = registry.get(RUNTIME_CONFIG_TASK_TYPE)
    assert definition is not None and definition.internal


def test_registering_a_type_twice_is_refused() -> None:
    registry = TaskRegistry()

    @registry.task("t.dup", params=Params)
    def first(params: Params) -> None:
        return None

    with pytest.raises(ValueError, match="registered twice"):

        @registry.task("t.dup", params=Params)
        def second(params: Params) -> None:
            return None

    definition = registry.get("t.dup")
    assert definition is not None and definition.func is first


def test_registering_the_same_function_again_is_harmless() -> None:
    registry = TaskRegistry()

    def handler(params: Params) -> None:
        return None

    registry.task("t.same", params=Params)(handler)
    registry.task("t.same", params=Params)(handler)
    assert registry.names() == ["t.same"]


@pytest.mark.parametrize("name", ["", "x" * 201])
def test_task_names_must_be_1_to_200_characters(name: str) -> None:
    with pytest.raises(ValueError):
        TaskRegistry().task(name, params=Params)


def test_merge_refuses_conflicting_handlers() -> None:
    one, two = TaskRegistry(), TaskRegistry()
    one.task("t.x", params=Params)(lambda params: 1)
    two.task("t.x", params=Params)(lambda params: 2)
    with pytest.raises(ValueError, match="registered twice"):
        one.merge(two)


def test_load_registry_includes_the_demo_handlers() -> None:
    registry = load_registry([])
    assert {"demo.echo", "demo.sleep", "demo.fail", "demo.cpu"} <= set(registry.names())
    cpu = registry.get("demo.cpu")
    sleep = registry.get("demo.sleep")
    assert cpu is not None and not cpu.is_async  # runs in a thread
    assert sleep is not None and sleep.is_async
    control = registry.get(RUNTIME_CONFIG_TASK_TYPE)
    assert control is None or control.internal  # never submittable as a user task


def test_load_registry_returns_independent_registries() -> None:
    first = load_registry([])
    first.task("t.only_here", params=Params)(lambda params: None)
    assert "t.only_here" not in load_registry([]).names()


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("demo.echo", {"value": 1, "extra": True}),
        ("demo.sleep", {"seconds": 1, "extra": True}),
        ("demo.fail", {"message": "x", "extra": True}),
        ("demo.cpu", {"iterations": 1, "extra": True}),
    ],
)
def test_demo_param_models_reject_unknown_fields(name: str, payload: dict[str, Any]) -> None:
    definition = load_registry([]).get(name)
    assert definition is not None
    with pytest.raises(ValidationError):
        definition.validate(payload)
    payload.pop("extra")
    assert isinstance(definition.validate(payload), BaseModel)


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("demo.sleep", {"seconds": -1}),
        ("demo.sleep", {}),
        ("demo.cpu", {"iterations": -1}),
        ("demo.cpu", {"iterations": "many"}),
        ("demo.fail", {"permanent": "maybe"}),
    ],
)
def test_demo_param_models_reject_bad_values(name: str, payload: dict[str, Any]) -> None:
    definition = load_registry([]).get(name)
    assert definition is not None
    with pytest.raises(ValidationError):
        definition.validate(payload)


def test_demo_cpu_handler_is_deterministic() -> None:
    definition = load_registry([]).get("demo.cpu")
    assert definition is not None
    params = definition.validate({"iterations": 1000})
    first = definition.func(params)
    assert first == definition.func(params)
    assert first["iterations"] == 1000


def test_a_handler_may_take_its_context_as_a_second_argument() -> None:
    from taskfleet import TaskContext

    registry = TaskRegistry()

    @registry.task("t.plain", params=Params)
    def plain(params: Params) -> int:
        return params.n

    @registry.task("t.with_context", params=Params)
    async def with_context(params: Params, ctx: TaskContext) -> int:
        return ctx.attempt

    plain_definition = registry.get("t.plain")
    context_definition = registry.get("t.with_context")
    assert plain_definition is not None and not plain_definition.takes_context
    assert context_definition is not None and context_definition.takes_context

    with pytest.raises(ValueError, match="optionally its TaskContext"):

        @registry.task("t.three", params=Params)
        def three(params: Params, ctx: TaskContext, extra: int) -> int:
            return extra


def test_process_isolation_needs_a_module_level_handler() -> None:
    registry = TaskRegistry()
    with pytest.raises(ValueError, match="module-level function"):

        @registry.task("t.local", params=Params, isolation="process")
        def local(params: Params) -> int:  # a function inside a function: not importable
            return params.n

    with pytest.raises(ValueError, match="isolation"):
        registry.task("t.bad", params=Params, isolation="thread")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# @task(..., schedule=... | every=...): periodic tasks declared in code


class _NoParams(TaskParams):
    pass


class _Required(TaskParams):
    n: int


def test_a_scheduled_task_carries_its_schedule() -> None:
    registry = TaskRegistry()

    @registry.task("report.daily", params=_NoParams, schedule="0 6 * * *", timezone="Europe/Paris")
    async def daily(params: _NoParams) -> None:
        return None

    @registry.task("tick", params=_NoParams, every="30s")
    async def tick(params: _NoParams) -> None:
        return None

    definition = registry.get("report.daily")
    assert definition is not None and definition.schedule is not None
    assert (definition.schedule.cron, definition.schedule.timezone) == ("0 6 * * *", "Europe/Paris")
    tick_definition = registry.get("tick")
    assert tick_definition is not None and tick_definition.schedule is not None
    assert tick_definition.schedule.every == "30s"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "0 6 * *"}, "schedule="),
        ({"schedule": "0 6 * * *", "timezone": "Nowhere/City"}, "timezone="),
        ({"every": "0s"}, "every="),
        ({"schedule": "0 6 * * *", "every": "1h"}, "not both"),
        ({"every": "1h", "timezone": "UTC"}, "cron"),
        ({"timezone": "UTC"}, "timezone="),
    ],
)
def test_a_bad_schedule_fails_at_declaration(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TaskRegistry().task("report.daily", params=_NoParams, **kwargs)


def test_a_scheduled_task_must_accept_an_empty_payload() -> None:
    with pytest.raises(ValueError, match="empty payload"):
        TaskRegistry().task("report.daily", params=_Required, every="1h")
