"""Hostile input against the real API: nothing lost, nothing written, never a 500
(docs/reference.md#http-api).

Three layers, all against ``create_app`` under a real uvicorn (``apiserver.running_api``) and a
real Postgres database of this module's own:

- **Every operation of the app's own OpenAPI document**, fuzzed by schemathesis (valid and
  invalid parameters and bodies, derandomized): no 5xx, every status code documented, every body
  and header as documented, invalid input rejected, and nothing written on any 4xx.
- **Raw bodies for ``POST /tasks`` and ``POST /tasks/batch``**, from hypothesis strategies of
  our own: what a schema-driven generator never sends (NaN and Infinity literals, duplicate keys,
  bytes that are not UTF-8, an empty body, a form or text content type). Never a 5xx; every 4xx
  names a field; nothing written on any 4xx.
- **The limits of docs/reference.md#http-api**, each at its boundary, on ``/tasks`` and on an item
  of ``/tasks/batch`` alike.

"Nothing written" is checked on the rows themselves: a fingerprint of every task row (its whole
text, hashed), the config versions and the worker rows, read before and after each request. No
worker runs here, so nothing else writes.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from taskfleet.api import runtime_config as runtime_config_api
from taskfleet.api.app import create_app
from taskfleet.api.schemas import MAX_LABEL_LENGTH, MAX_LABELS, MAX_PAYLOAD_BYTES
from taskfleet.api.tasks import TASK_BODY_LIMIT
from taskfleet.shared import db
from taskfleet.shared.settings import ApiSettings
from tests import pg
from tests.integration.apiserver import RunningApi, running_api

ADMIN_TOKEN = "fuzz-admin-token-5b1f0c"
SUBMIT_TOKEN = "fuzz-submit-token-9e2d41"
TOKENS = f"admin:{ADMIN_TOKEN},submit:{SUBMIT_TOKEN}"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

#: Per operation (schemathesis) and per raw-body property (hypothesis). With derandomize, the
#: same examples every run: CI stays stable, and a failure reproduces.
MAX_EXAMPLES = 200
#: Long waits (a config stream, /wait) are cut to this many seconds: the fuzz is about input.
SHORT_WAIT = 0.05
#: Bound on one HTTP request: nothing here should take long; a hang must fail, not stall CI.
REQUEST_TIMEOUT = 30.0

FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


def _openapi_document() -> dict[str, Any]:
    # Building the app connects nothing (the lifespan does): the document is the app's own.
    app = create_app(
        ApiSettings(database_url="postgresql://unused@127.0.0.1/unused", api_tokens=TOKENS)
    )
    return app.openapi()


schema = schemathesis.openapi.from_dict(_openapi_document())
schema.config.generation.update(
    deterministic=True,
    # The token is always sent (below): the auth matrix, not the fuzz, tests its absence.
    with_security_parameters=False,
    # Unknown query parameters are ignored, as HTTP APIs do; unknown body fields are what
    # matter, and they are generated anyway (additionalProperties: false is negated).
    allow_extra_parameters=False,
)
# A body past its limit is refused with 413, which is as much a rejection as a 422.
schema.config.checks.negative_data_rejection.expected_statuses = [
    str(status) for status in (400, 401, 403, 404, 405, 406, 409, 413, 415, 422)
]

#: What every response must satisfy. Left out, on purpose: positive_data_acceptance (the
#: registry's task types and payload models, equal-length labels/weights and the like cannot be
#: said in JSON Schema, so a schema-valid body can rightly be a 422), unsupported_method and
#: allow_header_conformance (Starlette answers a path shared by two templates, such as GET
#: /tasks/batch = GET /tasks/{id}, by the matching route), ignored_auth (test_auth_matrix.py).
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]

#: Operations whose every 4xx must name a field (docs/reference.md#http-api: "a JSON body that names
#: the field").
SUBMISSIONS = {("POST", "/tasks"), ("POST", "/tasks/batch")}


# --------------------------------------------------------------------------------------------
# Fixtures: one database, one server and one probe for the whole module


class RowProbe:
    """Reads what the API could have written, from a connection of its own (own event loop, so
    the sync tests below can use it between requests)."""

    FINGERPRINT = """
        SELECT (SELECT count(*) FROM taskfleet.tasks) AS tasks,
               (SELECT coalesce(sum(hashtext(t::text)::bigint), 0) FROM taskfleet.tasks t)
                   AS task_rows,
               (SELECT count(*) FROM taskfleet.worker_runtime_configs) AS configs,
               (SELECT count(*) FROM taskfleet.workers) AS workers,
               (SELECT coalesce(sum(hashtext(s::text)::bigint), 0) FROM taskfleet.schedules s)
                   AS schedules
    """

    def __init__(self, url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._conn: asyncpg.Connection = self._loop.run_until_complete(
            db.connect(url, application_name="taskfleet-fuzz-probe")
        )

    def fingerprint(self) -> tuple[int, ...]:
        row = self._loop.run_until_complete(self._conn.fetchrow(self.FINGERPRINT))
        return tuple(int(v) for v in row.values())

    def close(self) -> None:
        self._loop.run_until_complete(self._conn.close())
        self._loop.close()


@pytest.fixture(scope="module")
def module_database(test_databases: pg.TestDatabases) -> Iterator[str]:
    url = test_databases.create()
    yield url
    test_databases.drop(url)


@pytest.fixture(scope="module")
def api(module_database: str) -> Iterator[RunningApi]:
    settings_ = ApiSettings(database_url=module_database, api_tokens=TOKENS, db_pool_size=4)
    with running_api(settings_) as running:
        yield running


@pytest.fixture(scope="module")
def probe(module_database: str) -> Iterator[RowProbe]:
    row_probe = RowProbe(module_database)
    yield row_probe
    row_probe.close()


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


@pytest.fixture(scope="module")
def client(api: RunningApi) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, headers=ADMIN, timeout=REQUEST_TIMEOUT) as http:
        yield http


# --------------------------------------------------------------------------------------------
# Helpers


def names_a_field(body: Any) -> bool:
    """An error body of the documented shape whose every item names a location and a rule."""
    if not isinstance(body, dict) or not isinstance(body.get("detail"), list):
        return False
    items = body["detail"]
    return bool(items) and all(
        isinstance(item, dict)
        and isinstance(item.get("loc"), list)
        and len(item["loc"]) >= 1
        and item["loc"][0] in ("body", "query", "path", "header")
        and isinstance(item.get("msg"), str)
        and item["msg"] != ""
        and isinstance(item.get("type"), str)
        for item in items
    )


def _is_long_wait(value: Any) -> bool:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(seconds) and seconds > SHORT_WAIT


def bound_waits(case: Any) -> None:
    """Cut a valid, long ``timeout`` (or its default) to SHORT_WAIT; invalid ones stay."""
    if not any(p.name == "timeout" for p in case.operation.query):
        return
    query = dict(case.query or {})
    if "timeout" not in query or _is_long_wait(query["timeout"]):
        query["timeout"] = SHORT_WAIT
        case.query = query


def _config_body_with_null(case: Any) -> bool:
    return (
        case.path == "/runtime-config"
        and isinstance(case.body, dict)
        and any(value is None for value in case.body.values())
    )


def assert_refusal_wrote_nothing(
    status: int, before: tuple[int, ...], after: tuple[int, ...], what: str
) -> None:
    if 400 <= status < 500:
        assert after == before, f"{what} answered {status} but wrote: {before} -> {after}"


# --------------------------------------------------------------------------------------------
# 1. Every operation of the OpenAPI document


@schema.parametrize()
@FUZZ_SETTINGS
def test_every_operation_conforms_to_its_documentation(
    case: Any, api: RunningApi, session: requests.Session, probe: RowProbe
) -> None:
    if _config_body_with_null(case):
        # Known: null is taken as "not given" where the document says non-null types; proven
        # on its own by test_runtime_config_nulls_match_the_documented_schema, kept out of
        # here so that it does not hide whatever else the fuzz finds on these operations.
        reject()
    bound_waits(case)
    before = probe.fingerprint()
    response = case.call(base_url=api.url, session=session, headers=ADMIN, timeout=REQUEST_TIMEOUT)
    after = probe.fingerprint()
    status = response.status_code
    what = f"{case.method} {case.formatted_path}"
    assert status < 500, f"{what}: {status} {response.text[:500]}"
    assert_refusal_wrote_nothing(status, before, after, what)
    if status in (413, 422) or ((case.method, case.path) in SUBMISSIONS and status >= 400):
        assert names_a_field(response.json()), f"{what}: {status} {response.text[:500]}"
    case.validate_response(
        response,
        checks=CHECKS,
        headers=ADMIN,
        transport_kwargs={"base_url": api.url, "session": session, "headers": ADMIN},
    )


# --------------------------------------------------------------------------------------------
# 2. Raw bodies for the two submission endpoints

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**31 - 2, max_value=2**80)
    | st.integers(min_value=-(2**80), max_value=-1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["demo.echo", "updateWorkerRuntimeConfig", "", "\x00", "\ud800", "é" * 129])
)
json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)

#: Each field: mostly plausible, sometimes anything at all.
TASK_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(["demo.echo", "demo.sleep", "demo.fail", "demo.cpu", "nope"]),
    "payload": st.fixed_dictionaries(
        {}, optional={"value": json_values, "seconds": json_values, "iterations": json_values}
    ),
    "priority": st.sampled_from([0, 1, 2**31 - 2, 2**31 - 1, 2**31, -1, 2**63, 10**30]),
    "weight": st.sampled_from([0, 1, 7, 2**31 - 1, 2**31, -5]),
    "labels": st.lists(st.text(max_size=130), max_size=34),
    "delay_seconds": st.sampled_from([0, 0.5, -1, 1e30, 10**9]),
    "run_at": st.sampled_from(
        ["2030-01-01T00:00:00Z", "2020-01-01T00:00:00", "0001-01-01T00:00:00+14:00", "soon", ""]
    ),
    "max_attempts": st.sampled_from([0, 1, 100, 101, 2**40]),
    "timeout_seconds": st.sampled_from([0, 0.001, 10, -1, 1e300]),
    "unique_key": st.text(max_size=210),
}
_field_values = {name: strategy | json_values for name, strategy in TASK_FIELDS.items()}


@st.composite
def raw_objects(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> str:
    """A JSON object's text, written by hand: keys may repeat (the last one wins in Python,
    the first in some other parsers), NaN and Infinity are written as the bare literals, and
    text is escaped or raw (a raw lone surrogate becomes bytes that are not UTF-8)."""
    names = draw(st.lists(st.sampled_from([*fields, "extra", "Type", ""]), max_size=8))
    ascii_only = draw(st.booleans())
    members = []
    for name in names:
        value = draw(fields.get(name, json_values))
        encoded = json.dumps(value, allow_nan=True, ensure_ascii=ascii_only)
        members.append(f"{json.dumps(name)}:{encoded}")
    return "{" + ",".join(members) + "}"


task_texts = raw_objects(_field_values)


@st.composite
def batch_texts(draw: st.DrawFn) -> str:
    items = draw(st.lists(task_texts | json_values.map(json.dumps), max_size=5))
    text = '{"tasks":[' + ",".join(items) + "]"
    if draw(st.booleans()):
        text += ',"tasks":' + draw(json_values.map(json.dumps))
    if draw(st.booleans()):
        text += ',"extra":1'
    return text + "}"


def _bodies(objects: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    encoded = objects.map(lambda text: text.encode("utf-8", "surrogatepass"))
    return st.one_of(
        encoded,
        # Cut short, or followed by garbage.
        st.tuples(encoded, st.integers(min_value=0, max_value=200)).map(lambda t: t[0][: t[1]]),
        encoded.map(lambda body: body + b"}{"),
        json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
        st.binary(max_size=64),
        st.sampled_from([b"", b" ", b"null", b"[]", b"{}", b"\xef\xbb\xbf{}", b"[" * 5000]),
    )


CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/vnd.api+json",
        "",
        None,
    ]
)


def _post_raw(
    client: httpx.Client, probe: RowProbe, path: str, body: bytes, content_type: str | None
) -> httpx.Response:
    headers = {"Content-Type": content_type} if content_type is not None else {}
    before = probe.fingerprint()
    response = client.post(path, content=body, headers=headers)
    after = probe.fingerprint()
    what = f"POST {path} {body[:200]!r} ({content_type})"
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:500]}"
    assert_refusal_wrote_nothing(response.status_code, before, after, what)
    if response.status_code >= 400:
        assert names_a_field(response.json()), f"{what}: {response.text[:500]}"
    else:
        written = after[0] - before[0]
        tasks = response.json()["tasks"] if path.endswith("batch") else [response.json()]
        assert written == sum(1 for t in tasks if not t["deduplicated"]), what
    return response


@FUZZ_SETTINGS
@given(body=_bodies(task_texts), content_type=CONTENT_TYPES)
def test_raw_task_bodies_never_500_and_refusals_write_nothing(
    client: httpx.Client, probe: RowProbe, body: bytes, content_type: str | None
) -> None:
    _post_raw(client, probe, "/tasks", body, content_type)


@FUZZ_SETTINGS
@given(body=_bodies(batch_texts()), content_type=CONTENT_TYPES)
def test_raw_batch_bodies_never_500_and_refusals_write_nothing(
    client: httpx.Client, probe: RowProbe, body: bytes, content_type: str | None
) -> None:
    _post_raw(client, probe, "/tasks/batch", body, content_type)


RAW_CASES = [
    pytest.param(b"", "application/json", id="empty body"),
    pytest.param(b"", None, id="empty body, no content type"),
    pytest.param(b'{"type":"demo.echo"}', "text/plain", id="JSON sent as text/plain"),
    pytest.param(b"type=demo.echo", "application/x-www-form-urlencoded", id="a form"),
    pytest.param(b'{"type":"demo.echo","payload":{"x":NaN}}', None, id="NaN in the payload"),
    pytest.param(b'{"type":"demo.echo","payload":{"x":-Infinity}}', None, id="-Infinity"),
    pytest.param(b'{"type":"demo.echo","payload":{"x":1e999}}', None, id="1e999 overflows"),
    pytest.param(b'{"type":"demo.echo","priority":NaN}', None, id="NaN priority"),
    pytest.param(b'{"type":"demo.echo","weight":Infinity}', None, id="Infinity weight"),
    pytest.param(b'{"type":"demo.echo","delay_seconds":NaN}', None, id="NaN delay"),
    pytest.param(b'{"type":"demo.echo","timeout_seconds":Infinity}', None, id="Infinity timeout"),
    pytest.param(
        b'{"type":"demo.echo","type":"updateWorkerRuntimeConfig"}', None, id="duplicate type key"
    ),
    pytest.param(b'{"type":"demo.echo","payload":{"value":"\\ud800"}}', None, id="lone surrogate"),
    pytest.param(b'{"type":"demo.echo","payload":{"value":"\\u0000"}}', None, id="escaped NUL"),
    pytest.param(b'{"type":"demo.echo","labels":["a\\u0000"]}', None, id="NUL in a label"),
    pytest.param(b'{"type":"demo.echo\\u0000"}', None, id="NUL in the type"),
    pytest.param(
        b'{"type":"demo.echo","payload":' + b"[" * 3000 + b"]" * 3000 + b"}",
        None,
        id="payload nested 3000 deep",
    ),
    pytest.param(b"[" * 100_000, None, id="100k open brackets"),
    pytest.param(b"\xff\xfe\x00{", None, id="not UTF-8"),
    pytest.param(b"null", None, id="null"),
    pytest.param(b'"demo.echo"', None, id="a string"),
]


@pytest.mark.parametrize("path", ["/tasks", "/tasks/batch"])
@pytest.mark.parametrize(("body", "content_type"), RAW_CASES)
def test_known_hostile_bodies_are_named_refusals(
    client: httpx.Client, probe: RowProbe, path: str, body: bytes, content_type: str | None
) -> None:
    if path == "/tasks/batch" and body.startswith(b'{"type"'):
        body = b'{"tasks":[{"type":"demo.echo"},' + body + b"]}"
    response = _post_raw(client, probe, path, body, content_type or "application/json")
    assert response.status_code == 422, response.text[:500]
    loc = response.json()["detail"][0]["loc"]
    if path == "/tasks/batch" and loc[:2] == ["body", "tasks"]:
        # An item's fault names that item, not the good one before it. (A body refused as a
        # whole, such as one too deep to parse or sent as text/plain, names the body.)
        assert loc[2] == 1, response.text


def test_an_overlong_integer_literal_is_refused_naming_the_right_rule(
    client: httpx.Client, probe: RowProbe
) -> None:
    # Python's int() refuses more than 4300 digits; the body is flat, valid UTF-8 JSON otherwise.
    body = b'{"type":"demo.echo","priority":' + b"9" * 5000 + b"}"
    response = _post_raw(client, probe, "/tasks", body, "application/json")
    assert response.status_code == 422
    msg = response.json()["detail"][0]["msg"].lower()
    assert any(word in msg for word in ("digit", "integer", "number")), (
        f"a 5000-digit number is refused as {msg!r}: the rule named is not the one broken"
    )


# --------------------------------------------------------------------------------------------
# 3. docs/reference.md#http-api limits, at their boundaries, on /tasks and on an item of
# /tasks/batch alike

OK = 201


def _echo(**fields: Any) -> dict[str, Any]:
    return {"type": "demo.echo", **fields}


def _payload_of_json_size(size: int) -> dict[str, Any]:
    # {"value":"xxx..."} compact: 12 bytes around the string.
    payload = {"value": "x" * (size - 12)}
    assert len(json.dumps(payload, separators=(",", ":")).encode()) == size
    return payload


LIMITS = [
    pytest.param(
        _echo(payload=_payload_of_json_size(MAX_PAYLOAD_BYTES)),
        OK,
        None,
        id="payload exactly 256 KiB",
    ),
    pytest.param(
        _echo(payload=_payload_of_json_size(MAX_PAYLOAD_BYTES + 1)),
        413,
        "payload",
        id="payload 256 KiB + 1",
    ),
    pytest.param(_echo(labels=[f"l{i}" for i in range(MAX_LABELS)]), OK, None, id="32 labels"),
    pytest.param(
        _echo(labels=[f"l{i}" for i in range(MAX_LABELS + 1)]), 422, "labels", id="33 labels"
    ),
    pytest.param(_echo(labels=["x" * MAX_LABEL_LENGTH]), OK, None, id="label of 128"),
    pytest.param(_echo(labels=["é" * MAX_LABEL_LENGTH]), OK, None, id="label of 128 non-ASCII"),
    pytest.param(_echo(labels=["x" * (MAX_LABEL_LENGTH + 1)]), 422, "labels", id="label of 129"),
    pytest.param(_echo(labels=[""]), 422, "labels", id="empty label"),
    pytest.param(_echo(labels=["ok", ""]), 422, "labels", id="empty second label"),
    pytest.param(_echo(priority=2_147_483_646), OK, None, id="priority 2147483646"),
    pytest.param(_echo(priority=2_147_483_647), 422, "priority", id="priority 2147483647"),
    pytest.param(_echo(priority=-1), 422, "priority", id="priority -1"),
    pytest.param(_echo(priority=2**31), 422, "priority", id="priority 2**31"),
    pytest.param(_echo(priority=2**63), 422, "priority", id="priority 2**63"),
    pytest.param(_echo(weight=0), 422, "weight", id="weight 0"),
    pytest.param(_echo(weight=1), OK, None, id="weight 1"),
    pytest.param(_echo(max_attempts=0), 422, "max_attempts", id="max_attempts 0"),
    pytest.param(_echo(max_attempts=1), OK, None, id="max_attempts 1"),
    pytest.param(_echo(timeout_seconds=0), 422, "timeout_seconds", id="timeout_seconds 0"),
    pytest.param(_echo(timeout_seconds=0.001), OK, None, id="timeout_seconds 0.001"),
    pytest.param(
        _echo(delay_seconds=5, run_at="2030-01-01T00:00:00Z"),
        422,
        None,
        id="delay_seconds with run_at",
    ),
    pytest.param(
        _echo(run_at="2030-01-01T00:00:00Z", delay_seconds=5),
        422,
        None,
        id="run_at with delay_seconds",
    ),
    pytest.param(_echo(surprise=1), 422, "surprise", id="unknown field"),
    pytest.param(_echo(Type="demo.echo"), 422, "Type", id="unknown field differing in case"),
    pytest.param({"type": "updateWorkerRuntimeConfig"}, 422, "type", id="reserved type"),
    pytest.param(
        {"type": "updateWorkerRuntimeConfig", "priority": 2_147_483_647},
        422,
        None,
        id="reserved type at the control priority",
    ),
]


def _submit(
    client: httpx.Client, endpoint: str, task: dict[str, Any]
) -> tuple[httpx.Response, tuple[str | int, ...]]:
    """Send ``task`` alone to /tasks, or second in a batch after a good one; the response and
    the location prefix its errors must carry."""
    if endpoint == "single":
        return client.post("/tasks", json=task), ("body",)
    batch = {"tasks": [_echo(payload={"value": "good"}), task]}
    return client.post("/tasks/batch", json=batch), ("body", "tasks", 1)


@pytest.mark.parametrize("endpoint", ["single", "batch"])
@pytest.mark.parametrize(("task", "status", "field"), LIMITS)
def test_spec_limits_hold_on_tasks_and_batch_items(
    client: httpx.Client,
    probe: RowProbe,
    endpoint: str,
    task: dict[str, Any],
    status: int,
    field: str | None,
) -> None:
    before = probe.fingerprint()
    response, prefix = _submit(client, endpoint, task)
    after = probe.fingerprint()
    assert response.status_code == status, response.text[:500]
    if status == OK:
        assert after[0] - before[0] == (1 if endpoint == "single" else 2)
        return
    # All or nothing: the good task before the bad one is not written either.
    assert after == before
    assert names_a_field(response.json()), response.text[:500]
    locs = [tuple(item["loc"]) for item in response.json()["detail"]]
    assert all(loc[: len(prefix)] == prefix for loc in locs), locs
    if field is not None:
        assert any(loc[len(prefix)] == field for loc in locs if len(loc) > len(prefix)), locs


@pytest.mark.parametrize(
    ("method", "path", "limit"),
    [
        ("POST", "/tasks", TASK_BODY_LIMIT),
        ("PUT", "/runtime-config", runtime_config_api.MAX_BODY_BYTES),
        ("PATCH", "/runtime-config", runtime_config_api.MAX_BODY_BYTES),
        # /tasks/batch: its limit is 1,000 task bodies (~272 MB), too big to send in a test.
    ],
)
def test_a_body_past_its_limit_is_a_documented_413_naming_the_body(
    client: httpx.Client, probe: RowProbe, method: str, path: str, limit: int
) -> None:
    body = b'{"type":"demo.echo","payload":{"value":"' + b"x" * limit + b'"}}'
    before = probe.fingerprint()
    response = client.request(
        method,
        path,
        params={"wait": "false"} if path == "/runtime-config" else None,
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert probe.fingerprint() == before
    assert response.status_code == 413, response.text[:300]
    assert response.json()["detail"][0]["loc"] == ["body"]
    documented = _openapi_document()["paths"][path][method.lower()]["responses"]
    assert "413" in documented, f"{method} {path} answers 413, documents {sorted(documented)}"


def test_unknown_top_level_fields_are_refused_on_every_body(
    client: httpx.Client, probe: RowProbe
) -> None:
    """Whatever the API does with an unknown field, it does everywhere: a 422 naming it."""
    before = probe.fingerprint()
    refusals = {
        "POST /tasks": client.post("/tasks", json=_echo(surprise=1)),
        "POST /tasks/batch item": client.post(
            "/tasks/batch", json={"tasks": [_echo(), _echo(surprise=1)]}
        ),
        "POST /tasks/batch": client.post("/tasks/batch", json={"tasks": [_echo()], "surprise": 1}),
        "PUT /runtime-config": client.put(
            "/runtime-config", params={"wait": "false"}, json={"surprise": 1}
        ),
        "PATCH /runtime-config": client.patch(
            "/runtime-config", params={"wait": "false"}, json={"surprise": 1}
        ),
    }
    assert probe.fingerprint() == before
    for what, response in refusals.items():
        assert response.status_code == 422, (what, response.text)
        locs = [item["loc"] for item in response.json()["detail"]]
        assert any(loc[-1] == "surprise" for loc in locs), (what, locs)


CONFIG_FIELDS = [
    "maxStrictPercentage",
    "defaultWeight",
    "labels",
    "weights",
    "labelWeights",
    "requestID",
    "notifyInterval",
    "listenTimeout",
]


def _documents_null(field_schema: dict[str, Any]) -> bool:
    types = field_schema.get("type")
    return field_schema.get("nullable") is True or (isinstance(types, list) and "null" in types)


def test_runtime_config_nulls_match_the_documented_schema(
    client: httpx.Client, probe: RowProbe
) -> None:
    """A field the OpenAPI document types as non-null is refused when sent as null (or the
    document says null is allowed): a client built from the document must not be surprised,
    and a typo'd client sending null must not silently reset a field to its default."""
    document = _openapi_document()
    surprises = []
    for method in ("PUT", "PATCH"):
        operation = document["paths"]["/runtime-config"][method.lower()]
        properties = operation["requestBody"]["content"]["application/json"]["schema"]["properties"]
        for field in CONFIG_FIELDS:
            before = probe.fingerprint()
            response = client.request(
                method, "/runtime-config", params={"wait": "false"}, json={field: None}
            )
            if _documents_null(properties[field]):
                continue
            if response.status_code != 422 or probe.fingerprint() != before:
                surprises.append(
                    f"{method} {{{field!r}: null}} -> {response.status_code} (documented type "
                    f"{properties[field].get('type')!r})"
                )
    assert not surprises, "null accepted where the document says it is not:\n" + "\n".join(
        surprises
    )


# --------------------------------------------------------------------------------------------
# 4. What Postgres cannot store, in every string field of every route: NUL and lone surrogates
#    (a JSON escape: a raw lone surrogate is not UTF-8, refused before any field is read)

HOSTILE_TEXT = {"NUL": "a\\u0000b", "surrogate": "a\\ud800b", "low surrogate": "\\udfff"}


def _config(field_json: str) -> bytes:
    return ("{" + field_json + "}").encode()


#: (id, method, path, query, body): "<S>" stands for the hostile text (already JSON-escaped in
#: bodies, percent-encoded in paths and queries), ``loc`` the location a 422 must name.
STRING_FIELDS: list[tuple[str, str, str, dict[str, str] | None, str | None, list[str | int]]] = [
    ("task type", "POST", "/tasks", None, '{"type":"<S>"}', ["body", "type"]),
    (
        "task label",
        "POST",
        "/tasks",
        None,
        '{"type":"demo.echo","labels":["<S>"]}',
        ["body", "labels", 0],
    ),
    (
        "task unique_key",
        "POST",
        "/tasks",
        None,
        '{"type":"demo.echo","unique_key":"<S>"}',
        ["body", "unique_key"],
    ),
    (
        "task payload value",
        "POST",
        "/tasks",
        None,
        '{"type":"demo.echo","payload":{"value":"<S>"}}',
        ["body", "payload"],
    ),
    (
        "task payload key",
        "POST",
        "/tasks",
        None,
        '{"type":"demo.echo","payload":{"value":{"<S>":1}}}',
        ["body", "payload"],
    ),
    (
        "task run_at",
        "POST",
        "/tasks",
        None,
        '{"type":"demo.echo","run_at":"<S>"}',
        ["body", "run_at"],
    ),
    (
        "batch item type",
        "POST",
        "/tasks/batch",
        None,
        '{"tasks":[{"type":"demo.echo"},{"type":"<S>"}]}',
        ["body", "tasks", 1, "type"],
    ),
    (
        "batch item label",
        "POST",
        "/tasks/batch",
        None,
        '{"tasks":[{"type":"demo.echo"},{"type":"demo.echo","labels":["<S>"]}]}',
        ["body", "tasks", 1, "labels", 0],
    ),
    (
        "batch item unique_key",
        "POST",
        "/tasks/batch",
        None,
        '{"tasks":[{"type":"demo.echo"},{"type":"demo.echo","unique_key":"<S>"}]}',
        ["body", "tasks", 1, "unique_key"],
    ),
    ("list type filter", "GET", "/tasks", {"type": "<S>"}, None, ["query", "type"]),
    ("list label filter", "GET", "/tasks", {"label": "<S>"}, None, ["query", "label"]),
    ("list status filter", "GET", "/tasks", {"status": "<S>"}, None, ["query", "status"]),
    ("list cursor", "GET", "/tasks", {"cursor": "<S>"}, None, ["query", "cursor"]),
    ("task id", "GET", "/tasks/<S>", None, None, ["path", "id"]),
    ("cancel id", "POST", "/tasks/<S>/cancel", None, None, ["path", "id"]),
    ("wait id", "GET", "/tasks/<S>/wait", None, None, ["path", "id"]),
    ("wait timeout", "GET", "/tasks/1/wait", {"timeout": "<S>"}, None, ["query", "timeout"]),
    ("workers limit", "GET", "/workers", {"limit": "<S>"}, None, ["query", "limit"]),
    (
        "config label",
        "PUT",
        "/runtime-config",
        {"wait": "false"},
        '{"labels":["<S>"],"weights":[1]}',
        ["body", "labels", 0],
    ),
    (
        "config labelWeights key",
        "PUT",
        "/runtime-config",
        {"wait": "false"},
        '{"labelWeights":{"<S>":1}}',
        ["body", "labelWeights"],
    ),
    (
        "config requestID",
        "PUT",
        "/runtime-config",
        {"wait": "false"},
        '{"requestID":"<S>"}',
        ["body", "requestID"],
    ),
    (
        "config notifyInterval",
        "PUT",
        "/runtime-config",
        {"wait": "false"},
        '{"notifyInterval":"<S>"}',
        ["body", "notifyInterval"],
    ),
    (
        "config listenTimeout",
        "PUT",
        "/runtime-config",
        {"wait": "false"},
        '{"listenTimeout":"<S>"}',
        ["body", "listenTimeout"],
    ),
    (
        "patch label",
        "PATCH",
        "/runtime-config",
        {"wait": "false"},
        '{"labels":["<S>"],"weights":[1]}',
        ["body", "labels", 0],
    ),
    (
        "patch labelWeights key",
        "PATCH",
        "/runtime-config",
        {"wait": "false"},
        '{"labelWeights":{"<S>":1}}',
        ["body", "labelWeights"],
    ),
    (
        "patch requestID",
        "PATCH",
        "/runtime-config",
        {"wait": "false"},
        '{"requestID":"<S>"}',
        ["body", "requestID"],
    ),
    (
        "schedule name put",
        "PUT",
        "/schedules/<S>",
        None,
        '{"type":"demo.echo","every":"1m"}',
        ["path", "name"],
    ),
    ("schedule name get", "GET", "/schedules/<S>", None, None, ["path", "name"]),
    ("schedule name delete", "DELETE", "/schedules/<S>", None, None, ["path", "name"]),
    ("schedule type", "PUT", "/schedules/s", None, '{"type":"<S>","every":"1m"}', ["body", "type"]),
    (
        "schedule cron",
        "PUT",
        "/schedules/s",
        None,
        '{"type":"demo.echo","cron":"<S>"}',
        ["body", "cron"],
    ),
    (
        "schedule every",
        "PUT",
        "/schedules/s",
        None,
        '{"type":"demo.echo","every":"<S>"}',
        ["body", "every"],
    ),
    (
        "schedule timezone",
        "PUT",
        "/schedules/s",
        None,
        '{"type":"demo.echo","cron":"0 6 * * *","timezone":"<S>"}',
        ["body", "timezone"],
    ),
    (
        "schedule label",
        "PUT",
        "/schedules/s",
        None,
        '{"type":"demo.echo","every":"1m","labels":["<S>"]}',
        ["body", "labels", 0],
    ),
    (
        "schedule payload",
        "PUT",
        "/schedules/s",
        None,
        '{"type":"demo.echo","every":"1m","payload":{"value":"<S>"}}',
        ["body", "payload"],
    ),
    ("schedules limit", "GET", "/schedules", {"limit": "<S>"}, None, ["query", "limit"]),
    ("config wait", "PUT", "/runtime-config", {"wait": "<S>"}, "{}", ["query", "wait"]),
    ("config timeout", "PUT", "/runtime-config", {"timeout": "<S>"}, "{}", ["query", "timeout"]),
    ("request id", "GET", "/runtime-config/requests/<S>", None, None, ["path", "request_id"]),
    (
        "request watch",
        "GET",
        "/runtime-config/requests/r1",
        {"watch": "<S>"},
        None,
        ["query", "watch"],
    ),
]

_PERCENT = {"NUL": "a%00b", "surrogate": "a%ED%A0%80b", "low surrogate": "%ED%BF%BF"}


@pytest.mark.parametrize("kind", list(HOSTILE_TEXT))
@pytest.mark.parametrize(
    ("method", "path", "query", "body", "loc"),
    [pytest.param(*case[1:], id=case[0]) for case in STRING_FIELDS],
)
def test_nul_and_surrogates_in_every_string_field_are_a_422_naming_it(
    client: httpx.Client,
    probe: RowProbe,
    kind: str,
    method: str,
    path: str,
    query: dict[str, str] | None,
    body: str | None,
    loc: list[str | int],
) -> None:
    url = path.replace("<S>", _PERCENT[kind])
    if query is not None:
        url += "?" + "&".join(f"{k}={v.replace('<S>', _PERCENT[kind])}" for k, v in query.items())
    content = body.replace("<S>", HOSTILE_TEXT[kind]).encode() if body is not None else None
    before = probe.fingerprint()
    response = client.request(
        method, url, content=content, headers={"Content-Type": "application/json"}
    )
    assert probe.fingerprint() == before, f"{method} {url} wrote something"
    assert response.status_code < 500, (method, url, response.status_code, response.text[:300])
    if kind != "NUL" and body is None:
        # A surrogate cannot be percent-encoded as UTF-8: its bytes arrive decoded as U+FFFD,
        # a character like any other (a filter that matches nothing, an id that is not found).
        return
    assert response.status_code == 422, (method, url, response.status_code, response.text[:300])
    assert names_a_field(response.json()), response.text[:300]
    locs = [item["loc"] for item in response.json()["detail"]]
    assert any(found[: len(loc)] == loc for found in locs), (loc, locs)
