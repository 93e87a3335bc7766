"""Bad input, every time: a 4xx with a JSON body naming the field and the rule, and nothing
written (docs/reference.md#http-api). Every case below checks the table is still empty
afterwards."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from taskfleet.api.app import create_app
from taskfleet.shared.settings import ApiSettings
from tests.integration.conftest import count_tasks

ADMIN = "admin-token-0123456789"
KIB = 1024


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(database_url=database_url, api_tokens=f"admin:{ADMIN}", db_pool_size=2)
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://api",
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as c,
    ):
        yield c


def echo(**fields: Any) -> dict[str, Any]:
    return {"type": "demo.echo", **fields}


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


# (body, expected loc of the first error, expected error type)
BAD_TASKS: list[Any] = [
    pytest.param({}, ["body", "type"], "missing", id="type missing"),
    pytest.param({"type": ""}, ["body", "type"], "string_too_short", id="type empty"),
    pytest.param({"type": "t" * 201}, ["body", "type"], "string_too_long", id="type too long"),
    pytest.param({"type": 5}, ["body", "type"], "string_type", id="type not a string"),
    pytest.param(
        {"type": "no.such.type"}, ["body", "type"], "unknown_task_type", id="type unknown"
    ),
    pytest.param(
        {"type": "updateWorkerRuntimeConfig"}, ["body", "type"], "reserved", id="type reserved"
    ),
    pytest.param(echo(payload=[1]), ["body", "payload"], "dict_type", id="payload not object"),
    pytest.param(
        {"type": "demo.sleep", "payload": {"seconds": "soon"}},
        ["body", "payload", "seconds"],
        "float_parsing",
        id="payload field of the wrong type",
    ),
    pytest.param(
        {"type": "demo.sleep"},
        ["body", "payload", "seconds"],
        "missing",
        id="payload field missing",
    ),
    pytest.param(
        {"type": "demo.sleep", "payload": {"seconds": -1}},
        ["body", "payload", "seconds"],
        "greater_than_equal",
        id="payload field out of range",
    ),
    pytest.param(
        echo(payload={"value": 1, "extra": 2}),
        ["body", "payload", "extra"],
        "extra_forbidden",
        id="payload unknown field",
    ),
    pytest.param(
        echo(priority=2147483647), ["body", "priority"], "reserved", id="priority reserved"
    ),
    pytest.param(
        echo(priority=2147483648),
        ["body", "priority"],
        "less_than_equal",
        id="priority above int32",
    ),
    pytest.param(echo(priority=-1), ["body", "priority"], "greater_than_equal", id="priority<0"),
    pytest.param(echo(priority="5"), ["body", "priority"], "int_type", id="priority string"),
    pytest.param(echo(priority=True), ["body", "priority"], "int_type", id="priority bool"),
    pytest.param(echo(priority=1.5), ["body", "priority"], "int_type", id="priority float"),
    pytest.param(echo(weight=0), ["body", "weight"], "greater_than_equal", id="weight 0"),
    pytest.param(
        echo(weight=2147483648), ["body", "weight"], "less_than_equal", id="weight above int32"
    ),
    pytest.param(
        echo(labels=[f"l{i}" for i in range(33)]), ["body", "labels"], "too_long", id="33 labels"
    ),
    pytest.param(echo(labels=[""]), ["body", "labels", 0], "string_too_short", id="label empty"),
    pytest.param(
        echo(labels=["ok", "x" * 129]),
        ["body", "labels", 1],
        "string_too_long",
        id="label too long",
    ),
    pytest.param(echo(labels=[7]), ["body", "labels", 0], "string_type", id="label not string"),
    pytest.param(echo(labels="a"), ["body", "labels"], "list_type", id="labels not a list"),
    pytest.param(
        echo(labels=["a\u0000b"]), ["body", "labels", 0], "invalid_text", id="label with NUL"
    ),
    pytest.param(
        echo(requires=[f"t{i}" for i in range(33)]), ["body", "requires"], "too_long", id="33 tags"
    ),
    pytest.param(echo(requires=[""]), ["body", "requires", 0], "string_too_short", id="tag empty"),
    pytest.param(
        echo(requires=["gpu", "x" * 129]),
        ["body", "requires", 1],
        "string_too_long",
        id="tag too long",
    ),
    pytest.param(echo(requires="gpu"), ["body", "requires"], "list_type", id="requires a string"),
    pytest.param(
        echo(requires=["g\u0000"]), ["body", "requires", 0], "invalid_text", id="tag with NUL"
    ),
    pytest.param(
        echo(delay_seconds=5, run_at="2030-01-01T00:00:00Z"),
        ["body", "run_at"],
        "mutually_exclusive",
        id="delay and run_at",
    ),
    pytest.param(
        echo(delay_seconds=-1), ["body", "delay_seconds"], "greater_than_equal", id="delay<0"
    ),
    pytest.param(
        echo(delay_seconds=1e12), ["body", "delay_seconds"], "less_than_equal", id="delay huge"
    ),
    pytest.param(
        echo(run_at="2030-01-01T00:00:00"),
        ["body", "run_at"],
        "timezone_aware",
        id="run_at without offset",
    ),
    pytest.param(
        # Pydantic read a number as Unix seconds (and one past 2e10 as milliseconds).
        echo(run_at=1893456000),
        ["body", "run_at"],
        "datetime_type",
        id="run_at a number",
    ),
    pytest.param(
        echo(run_at="tomorrow"),
        ["body", "run_at"],
        "datetime_from_date_parsing",
        id="run_at not a time",
    ),
    pytest.param(
        echo(run_at="0001-01-01T00:00:00+14:00"),
        ["body", "run_at"],
        "out_of_range",
        id="run_at before 1970",
    ),
    pytest.param(
        echo(run_at="9999-12-31T23:59:59-14:00"),
        ["body", "run_at"],
        "out_of_range",
        id="run_at past 10 years",
    ),
    pytest.param(
        echo(payload={"value": nested(65)}),
        ["body", "payload"],
        "too_deep",
        id="payload nested too deep",
    ),
    pytest.param(
        echo(max_attempts=0), ["body", "max_attempts"], "greater_than_equal", id="attempts 0"
    ),
    pytest.param(
        echo(max_attempts=101), ["body", "max_attempts"], "less_than_equal", id="attempts 101"
    ),
    pytest.param(
        echo(timeout_seconds=0), ["body", "timeout_seconds"], "greater_than", id="timeout 0"
    ),
    pytest.param(
        echo(timeout_seconds=7 * 86400 + 1),
        ["body", "timeout_seconds"],
        "less_than_equal",
        id="timeout over 7 days",
    ),
    pytest.param(
        echo(unique_key=""), ["body", "unique_key"], "string_too_short", id="unique_key empty"
    ),
    pytest.param(
        echo(unique_key="k" * 201),
        ["body", "unique_key"],
        "string_too_long",
        id="unique_key too long",
    ),
    pytest.param(echo(bogus=1), ["body", "bogus"], "extra_forbidden", id="unknown field"),
]


@pytest.mark.parametrize(
    ("body", "loc", "error_type"),
    [
        *BAD_TASKS,
        pytest.param([echo()], ["body"], "model_attributes_type", id="body not an object"),
    ],
)
async def test_bad_task_is_422_naming_field_and_rule(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    body: Any,
    loc: list[Any],
    error_type: str,
) -> None:
    response = await client.post("/tasks", json=body)

    assert response.status_code == 422, response.text
    first = response.json()["detail"][0]
    assert (first["loc"], first["type"]) == (loc, error_type)
    assert first["msg"]
    assert await count_tasks(conn) == 0


# The batch validates each item with the same model and checks: one case of each kind of fault
# (the model, the registry, the handler's payload model, a cross-field rule) shows the index.
BATCH_CASES = {
    "type missing",
    "type unknown",
    "type reserved",
    "payload field of the wrong type",
    "payload unknown field",
    "priority reserved",
    "label too long",
    "delay and run_at",
    "unknown field",
}


@pytest.mark.parametrize(
    ("body", "loc", "error_type"), [p for p in BAD_TASKS if p.id in BATCH_CASES]
)
async def test_bad_task_in_a_batch_is_422_naming_its_index(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    body: Any,
    loc: list[Any],
    error_type: str,
) -> None:
    response = await client.post("/tasks/batch", json={"tasks": [echo(), echo(), body]})

    assert response.status_code == 422, response.text
    first = response.json()["detail"][0]
    assert first["loc"] == ["body", "tasks", 2, *loc[1:]]
    assert first["type"] == error_type
    assert await count_tasks(conn) == 0


@pytest.mark.parametrize(
    ("content_type", "got"),
    [
        ("text/plain", "got 'text/plain'"),
        # What curl -d sends unless told otherwise.
        ("application/x-www-form-urlencoded", "got 'application/x-www-form-urlencoded'"),
        (None, "none was sent"),
    ],
)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tasks", b'{"type": "demo.echo"}'),
        ("POST", "/tasks/batch", b'{"tasks": [{"type": "demo.echo"}]}'),
        ("PUT", "/schedules/nightly", b'{"type": "demo.echo", "every": "1h"}'),
    ],
)
async def test_a_json_body_sent_under_another_content_type_names_the_header(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    method: str,
    path: str,
    body: bytes,
    content_type: str | None,
    got: str,
) -> None:
    # It said "body: Input should be a valid dictionary or object to extract fields from" of a
    # body that is one: the body was never read as JSON.
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = await client.request(method, path, content=body, headers=headers)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["header", "content-type"]
    assert error["msg"].startswith(f"must be application/json ({got})")
    assert error["type"] == "content_type"
    assert await count_tasks(conn) == 0
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.schedules") == 0


async def test_a_json_body_that_is_not_an_object_is_still_named_as_the_body(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/tasks", content=b"[1]", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body"]


async def test_reserved_priority_says_why(client: httpx.AsyncClient) -> None:
    response = await client.post("/tasks", json=echo(priority=2147483647))
    assert "reserved for the control lane" in response.json()["detail"][0]["msg"]


async def test_unknown_type_lists_the_registered_types(client: httpx.AsyncClient) -> None:
    response = await client.post("/tasks", json={"type": "demo.nope"})
    msg = response.json()["detail"][0]["msg"]
    assert "demo.echo" in msg and "demo.sleep" in msg
    assert "updateWorkerRuntimeConfig" not in msg


async def test_the_limits_themselves_are_accepted(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    response = await client.post(
        "/tasks",
        json=echo(
            priority=2147483646,
            weight=2147483647,
            labels=[f"{i:03d}" + "x" * 125 for i in range(32)],
            payload={"value": nested(63)},  # 64 levels with the payload object itself
            max_attempts=100,
            timeout_seconds=7 * 86400,
            unique_key="k" * 200,
            delay_seconds=0,
            requires=[f"{i:03d}" + "t" * 125 for i in range(32)],
        ),
    )
    assert response.status_code == 201, response.text
    assert response.json()["priority"] == 2147483646
    assert len(response.json()["requires"]) == 32
    assert await count_tasks(conn) == 1


# ---------------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------------


async def test_300_kib_payload_is_413(client: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    response = await client.post("/tasks", json=echo(payload={"value": "x" * (300 * KIB)}))

    assert response.status_code == 413
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body"]
    assert detail[0]["type"] == "too_large"
    assert await count_tasks(conn) == 0


async def test_payload_over_256_kib_in_a_body_under_the_limit_is_413_naming_payload(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    response = await client.post("/tasks", json=echo(payload={"value": "x" * (260 * KIB)}))

    assert response.status_code == 413
    assert response.json()["detail"][0]["loc"] == ["body", "payload"]
    assert await count_tasks(conn) == 0


async def test_payload_just_under_256_kib_is_accepted(client: httpx.AsyncClient) -> None:
    value = "x" * (256 * KIB - len('{"value":""}'))
    response = await client.post("/tasks", json=echo(payload={"value": value}))
    assert response.status_code == 201
    assert len(response.json()["payload"]["value"]) == len(value)


async def test_streamed_body_over_the_limit_is_413(
    client: httpx.AsyncClient,
) -> None:
    async def endless() -> AsyncIterator[bytes]:
        yield b'{"type": "demo.echo", "payload": {"value": "'
        while True:
            yield b"x" * (64 * KIB)

    # Streamed without a Content-Length: the count of bytes received stops it.
    response = await client.post(
        "/tasks", content=endless(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413


async def test_batch_payload_over_256_kib_is_413_naming_its_index(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    tasks = [echo(), echo(payload={"value": "x" * (300 * KIB)}), echo()]

    response = await client.post("/tasks/batch", json={"tasks": tasks})

    assert response.status_code == 413
    assert response.json()["detail"][0]["loc"] == ["body", "tasks", 1, "payload"]
    assert await count_tasks(conn) == 0


async def test_batch_of_several_large_payloads_is_accepted(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    tasks = [echo(payload={"value": "x" * (200 * KIB)}) for _ in range(3)]
    response = await client.post("/tasks/batch", json={"tasks": tasks})
    assert response.status_code == 201
    assert await count_tasks(conn) == 3


# ---------------------------------------------------------------------------------------------
# Malformed bodies and the batch envelope
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "loc", "error_type"),
    [
        pytest.param(b'{"type": "demo.echo"', ["body", 20], "json_invalid", id="truncated JSON"),
        pytest.param(b"\xff\xfe{}", ["body", 0], "json_invalid", id="not UTF-8"),
        pytest.param(
            b'{"type": "demo.echo", "payload": {"value": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
            ["body"],
            "json_invalid",
            id="nested past the parser's limit",
        ),
        pytest.param(
            b'{"type": "demo.echo", "payload": {"value": NaN}}',
            ["body", "payload"],
            "invalid_json",
            id="NaN in payload",
        ),
        pytest.param(
            b'{"type": "demo.echo", "payload": {"value": "a\\u0000b"}}',
            ["body", "payload"],
            "invalid_json",
            id="NUL in payload",
        ),
        pytest.param(
            b'{"type": "demo.echo", "payload": {"value": "\\ud800"}}',
            ["body", "payload"],
            "invalid_json",
            id="lone surrogate in payload",
        ),
        pytest.param(
            b'{"type": "demo.echo", "unique_key": "\\ud800"}',
            ["body", "unique_key"],
            "string_unicode",
            id="lone surrogate in unique_key",
        ),
        pytest.param(
            b'{"type": "demo.echo", "delay_seconds": Infinity}',
            ["body", "delay_seconds"],
            "finite_number",
            id="infinite delay",
        ),
    ],
)
async def test_malformed_body_is_422(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    raw: bytes,
    loc: list[Any],
    error_type: str,
) -> None:
    response = await client.post(
        "/tasks", content=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    first = response.json()["detail"][0]
    assert (first["loc"], first["type"]) == (loc, error_type)
    assert await count_tasks(conn) == 0


async def test_payload_encoding_errors_say_which_rule(client: httpx.AsyncClient) -> None:
    async def msg(raw: bytes) -> str:
        response = await client.post(
            "/tasks", content=raw, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 422
        return str(response.json()["detail"][0]["msg"])

    assert "surrogate" in await msg(b'{"type": "demo.echo", "payload": {"value": "\\ud800"}}')
    assert "NaN" in await msg(b'{"type": "demo.echo", "payload": {"value": -Infinity}}')
    assert "NUL" in await msg(b'{"type": "demo.echo", "payload": {"\\u0000": 1}}')


async def test_escaped_backslash_before_u0000_is_not_a_nul(client: httpx.AsyncClient) -> None:
    # The JSON string "\\u0000" is a backslash followed by "u0000": six ordinary characters.
    raw = json.dumps(echo(payload={"value": "\\u0000"})).encode()
    response = await client.post(
        "/tasks", content=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201, response.text
    assert response.json()["payload"] == {"value": "\\u0000"}


@pytest.mark.parametrize(
    ("body", "loc", "error_type"),
    [
        pytest.param({"tasks": []}, ["body", "tasks"], "too_short", id="empty"),
        pytest.param({}, ["body", "tasks"], "missing", id="no tasks field"),
        pytest.param({"tasks": {"type": "demo.echo"}}, ["body", "tasks"], "list_type", id="obj"),
        pytest.param(
            {"tasks": [echo()], "extra": 1}, ["body", "extra"], "extra_forbidden", id="extra"
        ),
        pytest.param(
            {"tasks": [echo(), 5]}, ["body", "tasks", 1], "model_type", id="item not an object"
        ),
    ],
)
async def test_bad_batch_envelope_is_422(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    body: Any,
    loc: list[Any],
    error_type: str,
) -> None:
    response = await client.post("/tasks/batch", json=body)
    assert response.status_code == 422, response.text
    first = response.json()["detail"][0]
    assert (first["loc"], first["type"]) == (loc, error_type)
    assert await count_tasks(conn) == 0


# ---------------------------------------------------------------------------------------------
# Path and query parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "loc"),
    [
        ("GET", "/tasks/0", ["path", "id"]),
        ("GET", "/tasks/-3", ["path", "id"]),
        ("GET", "/tasks/abc", ["path", "id"]),
        ("GET", "/tasks/9223372036854775808", ["path", "id"]),
        ("POST", "/tasks/0/cancel", ["path", "id"]),
        ("GET", "/tasks/1/wait?timeout=-1", ["query", "timeout"]),
        ("GET", "/tasks/1/wait?timeout=301", ["query", "timeout"]),
        ("GET", "/tasks/1/wait?timeout=nan", ["query", "timeout"]),
        ("GET", "/tasks?limit=0", ["query", "limit"]),
        ("GET", "/tasks?limit=1001", ["query", "limit"]),
        ("GET", "/tasks?status=done", ["query", "status"]),
        ("GET", "/tasks?cursor=0", ["query", "cursor"]),
        ("GET", "/tasks?cursor=abc", ["query", "cursor"]),
        ("GET", "/tasks?type=", ["query", "type"]),
        ("GET", "/tasks?label=a%00b", ["query", "label"]),
        ("GET", "/workers?limit=0", ["query", "limit"]),
    ],
)
async def test_bad_path_or_query_parameter_is_422(
    client: httpx.AsyncClient, method: str, url: str, loc: list[str]
) -> None:
    response = await client.request(method, url)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == loc
