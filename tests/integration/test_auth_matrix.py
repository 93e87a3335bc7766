"""Who may call what, for every route the app has (docs/reference.md#authentication).

The matrix is built from ``app.routes`` itself, so a route added later cannot slip past it: a
route with no sample request here fails ``test_the_matrix_covers_every_route`` until someone
decides who may call it. For every guarded route: 401 (with ``WWW-Authenticate: Bearer``)
without a token or with a wrong one, 403 for the submit role on admin-only routes, neither for
the right role; nothing is written by a refused request, and no secret (a token, presented or
configured, or the database password) appears in a log record or a response.

Open routes: ``/healthz``, ``/readyz``, ``/metrics`` (docs/reference.md#authentication), and the API
documentation (``/openapi.json``, ``/docs``, ``/docs/oauth2-redirect``, ``/redoc``). The
documentation is left open on purpose: it describes the API's shape, which any client may know; it
must carry no secret, and that is tested.

Also here: every configured token is compared, in constant time, on every request (no early
exit); the API refuses to start without tokens unless auth is explicitly disabled, in-process and
as the ``taskfleet api`` process.
"""

from __future__ import annotations

import hmac
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from pydantic import ValidationError

from taskfleet.api.app import create_app
from taskfleet.api.auth import Authenticator
from taskfleet.shared.settings import ApiSettings
from tests.ports import free_port

ADMIN_TOKEN = "matrix-admin-token-4f8a2c91"
SUBMIT_TOKEN = "matrix-submit-token-b7d03e55"
WRONG_TOKEN = "matrix-wrong-token-0a9c1f"
#: Postgres here trusts local connections and ignores it; it must never surface all the same.
DB_PASSWORD = "matrix-db-password-e2c7"
SECRETS = (ADMIN_TOKEN, SUBMIT_TOKEN, WRONG_TOKEN, DB_PASSWORD)

AS_ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
AS_SUBMIT = {"Authorization": f"Bearer {SUBMIT_TOKEN}"}
AS_ROLE = {"admin": AS_ADMIN, "submit": AS_SUBMIT}

#: Request headers, str or (for a value that is not ASCII) bytes.
Headers = Mapping[str, str] | Mapping[bytes, bytes]

BAD_CREDENTIALS: dict[str, Headers] = {
    "no header": {},
    "unknown token": {"Authorization": f"Bearer {WRONG_TOKEN}"},
    "admin token plus a character": {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
    "admin token less a character": {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"},
    "admin token in upper case": {"Authorization": f"Bearer {ADMIN_TOKEN.upper()}"},
    "basic scheme": {"Authorization": f"Basic {ADMIN_TOKEN}"},
    "token without scheme": {"Authorization": ADMIN_TOKEN},
    "scheme without token": {"Authorization": "Bearer "},
    "empty header": {"Authorization": ""},
    "non-ASCII token": {b"Authorization": "Bearer t\u00f6k\u00e9n-\u00e9\u00e9\u00e9".encode()},
}

#: No token needed. docs/reference.md#authentication names them; the documentation is a decision
#: (see top).
PROBES = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
DOCS = {"/openapi.json", "/docs", "/redoc", "/docs/assets/{name}"}
#: The operator console's files: code and styles, no data (it signs in to call the API like any
#: client), so open like the documentation.
CONSOLE = {"/ui", "/ui/", "/ui/{name:path}"}
#: A concrete URL for each open route with a parameter (or a redirect to follow).
OPEN_URLS = {
    "/docs/assets/{name}": "/docs/assets/swagger-init.js",
    "/ui": "/ui/",
    "/ui/{name:path}": "/ui/app.js",
}
#: Admin only (docs/reference.md#authentication: runtime config, cancel, retry, workers and
#: changes of schedules);
#: every other route needs submit.
ADMIN_ONLY = {
    ("POST", "/tasks/{id}/cancel"),
    ("POST", "/tasks/{id}/retry"),
    ("POST", "/tasks/retry"),
    ("POST", "/tasks/cancel"),
    ("GET", "/workers"),
    ("PUT", "/schedules/{name}"),
    ("DELETE", "/schedules/{name}"),
}


def is_open(method: str, path: str) -> bool:
    return (method, path) in PROBES or path in DOCS or path in CONSOLE


def open_call(path: str) -> Call:
    return Call(OPEN_URLS.get(path, path))


def required_role(method: str, path: str) -> str:
    if (method, path) in ADMIN_ONLY or path.startswith("/runtime-config"):
        return "admin"
    return "submit"


# --------------------------------------------------------------------------------------------
# The routes, and one sample request each


def every_route(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path template) of every route, included routers' routes too."""
    routes: set[tuple[str, str]] = set()
    for context in iter_route_contexts(app.routes):
        path, methods = context.path, context.methods
        # A mount, a websocket or another kind of route has no methods: this matrix cannot
        # vouch for it, so it must be looked at (and this test extended) first.
        assert path and methods, f"a route this matrix does not understand: {context!r}"
        routes.update((method, path) for method in methods)
    return routes


@dataclass(frozen=True)
class Call:
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None


@dataclass(frozen=True)
class Ids:
    """Rows the sample requests point at."""

    task: int
    cancellable: int


SAMPLES: dict[tuple[str, str], Callable[[Ids], Call]] = {
    ("POST", "/tasks"): lambda ids: Call("/tasks", json={"type": "demo.echo"}),
    ("POST", "/tasks/batch"): lambda ids: Call(
        "/tasks/batch", json={"tasks": [{"type": "demo.echo"}]}
    ),
    ("GET", "/tasks"): lambda ids: Call("/tasks"),
    ("GET", "/tasks/stats"): lambda ids: Call("/tasks/stats"),
    ("POST", "/tasks/retry"): lambda ids: Call("/tasks/retry", json={"ids": [ids.task]}),
    ("POST", "/tasks/cancel"): lambda ids: Call("/tasks/cancel", json={"ids": [ids.cancellable]}),
    ("GET", "/tasks/{id}"): lambda ids: Call(f"/tasks/{ids.task}"),
    ("GET", "/tasks/{id}/wait"): lambda ids: Call(f"/tasks/{ids.task}/wait", {"timeout": 0}),
    ("POST", "/tasks/{id}/cancel"): lambda ids: Call(f"/tasks/{ids.cancellable}/cancel"),
    ("POST", "/tasks/{id}/retry"): lambda ids: Call(f"/tasks/{ids.task}/retry"),
    ("GET", "/workers"): lambda ids: Call("/workers"),
    ("GET", "/schedules"): lambda ids: Call("/schedules"),
    ("GET", "/schedules/{name}"): lambda ids: Call("/schedules/matrix"),
    ("PUT", "/schedules/{name}"): lambda ids: Call(
        "/schedules/matrix-new", json={"type": "demo.echo", "every": "1h"}
    ),
    ("DELETE", "/schedules/{name}"): lambda ids: Call("/schedules/matrix"),
    ("PUT", "/runtime-config"): lambda ids: Call(
        "/runtime-config", {"wait": "false"}, {"maxStrictPercentage": 50}
    ),
    ("PATCH", "/runtime-config"): lambda ids: Call(
        "/runtime-config", {"wait": "false"}, {"defaultWeight": 2}
    ),
    ("GET", "/runtime-config"): lambda ids: Call("/runtime-config"),
    ("GET", "/runtime-config/requests/{request_id:path}"): lambda ids: Call(
        "/runtime-config/requests/matrix-request"
    ),
}


# --------------------------------------------------------------------------------------------
# Fixtures


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user, _, host = parts.netloc.rpartition("@")
    netloc = f"{user.partition(':')[0]}:{password}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def api_settings(database_url: str, **overrides: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "database_url": with_password(database_url, DB_PASSWORD),
        "api_tokens": f"admin:{ADMIN_TOKEN},submit:{SUBMIT_TOKEN}",
        "db_pool_size": 2,
    }
    values.update(overrides)
    return ApiSettings(**values)


@pytest.fixture
def app(database_url: str) -> FastAPI:
    return create_app(api_settings(database_url))


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http,
    ):
        yield http


async def fingerprint(conn: asyncpg.Connection) -> tuple[Any, ...]:
    """Everything a request could have written: the task rows (hashed), versions, workers,
    schedules (hashed)."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM taskfleet.tasks),"
        " (SELECT coalesce(sum(hashtext(t::text)::bigint), 0) FROM taskfleet.tasks t),"
        " (SELECT count(*) FROM taskfleet.worker_runtime_configs),"
        " (SELECT count(*) FROM taskfleet.workers),"
        " (SELECT coalesce(sum(hashtext(s::text)::bigint), 0) FROM taskfleet.schedules s)"
    )
    return tuple(row.values())


async def make_ids(client: httpx.AsyncClient) -> Ids:
    created = await client.post(
        "/tasks/batch", json={"tasks": [{"type": "demo.echo"}] * 2}, headers=AS_ADMIN
    )
    assert created.status_code == 201, created.text
    first, second = (t["id"] for t in created.json()["tasks"])
    return Ids(task=first, cancellable=second)


async def send(
    client: httpx.AsyncClient, method: str, call: Call, headers: Headers
) -> httpx.Response:
    return await client.request(
        method, call.url, params=call.params, json=call.json, headers=headers
    )


def guarded_routes(app: FastAPI) -> list[tuple[str, str]]:
    return sorted(r for r in every_route(app) if not is_open(*r))


def assert_no_secret_in(response: httpx.Response, what: str) -> None:
    text = response.text + "".join(f"{k}: {v}\n" for k, v in response.headers.items())
    for secret in SECRETS:
        assert secret not in text, f"{what}: a secret is in the response"


# --------------------------------------------------------------------------------------------
# The matrix


def test_the_matrix_covers_every_route(app: FastAPI) -> None:
    routes = every_route(app)
    uncovered = sorted(r for r in routes if not is_open(*r) and r not in SAMPLES)
    assert not uncovered, (
        f"routes with no row in the auth matrix (add them to SAMPLES): {uncovered}"
    )
    stale = sorted(set(SAMPLES) - routes)
    assert not stale, f"matrix rows for routes that no longer exist: {stale}"
    # The walk sees what the OpenAPI document sees (included routers were not skipped).
    documented = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    walked = {(m, re.sub(r"\{(\w+):\w+\}", r"{\1}", p)) for m, p in routes}
    assert documented <= walked, sorted(documented - walked)


async def test_without_a_valid_token_every_guarded_route_is_401(
    app: FastAPI, client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    ids = await make_ids(client)
    before = await fingerprint(conn)
    wrong = []
    for method, path in guarded_routes(app):
        call = SAMPLES[(method, path)](ids)
        for name, headers in BAD_CREDENTIALS.items():
            response = await send(client, method, call, headers)
            what = f"{method} {path} with {name}"
            assert_no_secret_in(response, what)
            if response.status_code != 401 or response.headers.get("www-authenticate") != "Bearer":
                wrong.append(f"{what}: {response.status_code} {response.text[:200]}")
                continue
            assert isinstance(response.json()["detail"], str), what
        # Refused before the body is read: garbage gets the same answer as a good body.
        garbage = await client.request(
            method, call.url, content=b"{" * 1000, headers={"Content-Type": "application/json"}
        )
        if garbage.status_code != 401:
            wrong.append(f"{method} {path} anonymous with a garbage body: {garbage.status_code}")
    assert not wrong, "\n".join(wrong)
    assert await fingerprint(conn) == before, "a refused request wrote something"


async def test_the_submit_role_is_403_on_admin_routes_and_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    ids = await make_ids(client)
    before = await fingerprint(conn)
    admin_routes = [r for r in guarded_routes(app) if required_role(*r) == "admin"]
    assert {("POST", "/tasks/{id}/cancel"), ("GET", "/workers"), ("PUT", "/runtime-config")} <= set(
        admin_routes
    )
    wrong = []
    for method, path in admin_routes:
        response = await send(client, method, SAMPLES[(method, path)](ids), AS_SUBMIT)
        assert_no_secret_in(response, f"{method} {path}")
        if response.status_code != 403 or "admin" not in response.json()["detail"]:
            wrong.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
        # The role is checked before the body: a broken body is still a 403, not a 422.
        broken = await client.request(
            method,
            SAMPLES[(method, path)](ids).url,
            content=b"{not json",
            headers={**AS_SUBMIT, "Content-Type": "application/json"},
        )
        if broken.status_code != 403:
            wrong.append(f"{method} {path} with a broken body: {broken.status_code}")
    assert not wrong, "\n".join(wrong)
    assert await fingerprint(conn) == before, "a refused request wrote something"


@pytest.mark.parametrize("role", ["submit", "admin"])
async def test_the_right_role_is_let_in_everywhere_it_may_go(
    app: FastAPI, client: httpx.AsyncClient, role: str
) -> None:
    ids = await make_ids(client)
    wrong = []
    for method, path in guarded_routes(app):
        if role == "submit" and required_role(method, path) == "admin":
            continue
        response = await send(client, method, SAMPLES[(method, path)](ids), AS_ROLE[role])
        assert_no_secret_in(response, f"{method} {path}")
        if response.status_code in (401, 403) or response.status_code >= 500:
            wrong.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
    assert not wrong, "\n".join(wrong)


async def test_open_routes_answer_without_a_token_and_carry_no_secret(
    app: FastAPI, client: httpx.AsyncClient, database_url: str
) -> None:
    open_routes = sorted(r for r in every_route(app) if is_open(*r))
    assert {("GET", p) for p in ("/healthz", "/readyz", "/metrics", "/openapi.json")} <= set(
        open_routes
    )
    assert {("GET", p) for p in ("/docs", "/redoc", "/ui/")} <= set(open_routes)
    for method, path in open_routes:
        response = await client.request(method, OPEN_URLS.get(path, path))
        assert response.status_code == 200, (method, path, response.text[:200])
        assert_no_secret_in(response, f"{method} {path}")
    document = (await client.get("/openapi.json")).text
    # The document describes the scheme, never a credential or where the database is.
    assert '"HTTPBearer"' in document
    database_name = urlsplit(database_url).path.lstrip("/")
    assert database_name not in document
    assert "127.0.0.1" not in document


async def test_no_secret_reaches_a_log_record(
    app: FastAPI, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ids = await make_ids(client)
    for method, path in sorted(every_route(app)):
        call = SAMPLES[(method, path)](ids) if (method, path) in SAMPLES else open_call(path)
        for headers in (AS_ADMIN, AS_SUBMIT, *BAD_CREDENTIALS.values()):
            await send(client, method, call, headers)
        # A token sent where it does not belong (a query parameter, a body) is not echoed.
        await client.request(
            method, call.url, params={**call.params, "token": WRONG_TOKEN}, headers=AS_SUBMIT
        )
        await client.request(
            method,
            call.url,
            params=call.params,
            json={"token": WRONG_TOKEN, "type": WRONG_TOKEN},
            headers=AS_ADMIN,
        )
    # The test's own HTTP client logs each URL it requests (at INFO): proof that the capture
    # works; the API's records are what is under test.
    assert any(r.name == "httpx" for r in caplog.records), "the log capture is not working"
    assert_no_secret_in_records(caplog.records)


def assert_no_secret_in_records(records: list[logging.LogRecord]) -> None:
    for record in records:
        if record.name.split(".")[0] in ("httpx", "httpcore"):
            continue
        rendered = " ".join(
            [record.getMessage(), repr(record.args), record.exc_text or "", str(record.__dict__)]
        )
        for secret in SECRETS:
            assert secret not in rendered, f"{record.name}: {record.getMessage()[:200]}"


async def test_database_failures_leak_no_secret_to_logs_or_bodies(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With Postgres unreachable, every route answers (503 where it needs the database) and
    neither the answer nor the log says the password or a token."""
    caplog.set_level(logging.DEBUG)
    unreachable = urlunsplit(urlsplit(database_url)._replace(netloc="postgres@127.0.0.1:1"))
    app = create_app(api_settings(unreachable))
    statuses = set()
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http,
    ):
        for method, path in sorted(every_route(app)):
            call = (
                SAMPLES[(method, path)](Ids(1, 2)) if (method, path) in SAMPLES else open_call(path)
            )
            for headers in (AS_ADMIN, AS_SUBMIT, BAD_CREDENTIALS["unknown token"]):
                response = await send(http, method, call, headers)
                assert response.status_code in (200, 401, 403, 503), (method, path, response.text)
                assert_no_secret_in(response, f"{method} {path}")
                statuses.add(response.status_code)
    assert 503 in statuses
    assert any(
        r.levelno >= logging.WARNING and r.name.startswith("taskfleet") for r in caplog.records
    )
    assert_no_secret_in_records(caplog.records)


def documented_statuses(app: FastAPI, method: str, path: str) -> set[int]:
    operation = app.openapi()["paths"][re.sub(r"\{(\w+):\w+\}", r"{\1}", path)]
    return {int(code) for code in operation[method.lower()]["responses"] if code.isdigit()}


async def test_every_status_a_guarded_route_answers_is_documented(
    database_url: str, app: FastAPI, client: httpx.AsyncClient
) -> None:
    """401, 403 and, with the database down, 503 are answers like any other: a client built
    from the OpenAPI document must find them there."""
    ids = await make_ids(client)
    seen: dict[tuple[str, str], set[int]] = {}
    for method, path in guarded_routes(app):
        call = SAMPLES[(method, path)](ids)
        as_role = AS_ROLE[required_role(method, path)]
        for headers in (as_role, AS_SUBMIT, BAD_CREDENTIALS["no header"]):
            response = await send(client, method, call, headers)
            seen.setdefault((method, path), set()).add(response.status_code)
    unreachable = urlunsplit(urlsplit(database_url)._replace(netloc="postgres@127.0.0.1:1"))
    down = create_app(api_settings(unreachable))
    async with (
        down.router.lifespan_context(down),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=down), base_url="http://api") as http,
    ):
        for method, path in guarded_routes(down):
            response = await send(http, method, SAMPLES[(method, path)](ids), AS_ADMIN)
            seen[(method, path)].add(response.status_code)
    undocumented = [
        f"{method} {path}: answers {sorted(statuses - documented)}, documents {sorted(documented)}"
        for (method, path), statuses in sorted(seen.items())
        if (documented := documented_statuses(app, method, path)) and statuses - documented
    ]
    assert not undocumented, "\n".join(undocumented)


# --------------------------------------------------------------------------------------------
# Constant-time comparison against every configured token


CONFIGURED = {
    "ct-admin-0000000001": "admin",
    "ct-submit-000000002": "submit",
    "ct-admin-0000000003": "admin",
    "ct-submit-000000004": "submit",
    "ct-admin-0000000005": "admin",
}


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The configured token of each hmac.compare_digest call the authenticator makes."""
    calls: list[bytes] = []
    configured = {token.encode() for token in CONFIGURED}
    real = hmac.compare_digest

    def counting(a: Any, b: Any) -> bool:
        hits = [bytes(x) for x in (a, b) if isinstance(x, bytes) and bytes(x) in configured]
        calls.append(hits[-1] if hits else b"<not a configured token>")
        return real(a, b)

    # taskfleet.api.auth calls hmac.compare_digest through the module, at call time.
    monkeypatch.setattr(hmac, "compare_digest", counting)
    return calls


def assert_each_configured_token_compared_alike(calls: list[bytes], what: str) -> None:
    counts = Counter(calls)
    expected = {token.encode() for token in CONFIGURED}
    assert set(counts) == expected, f"{what}: compared {sorted(counts)}"
    assert len(set(counts.values())) == 1, f"{what}: uneven comparisons {dict(counts)}"


@pytest.mark.parametrize(
    "presented",
    [*CONFIGURED, "ct-unknown-00000000", "", "ct-admin-000000000", "\u00e9" * 20],
    ids=["first", "second", "middle", "fourth", "last", "unknown", "empty", "prefix", "unicode"],
)
def test_the_authenticator_compares_every_token_whatever_is_presented(
    compared: list[bytes], presented: str
) -> None:
    authenticator = Authenticator(CONFIGURED)
    role = authenticator.role_for(presented)
    assert role == CONFIGURED.get(presented)
    assert len(compared) == len(CONFIGURED)
    assert_each_configured_token_compared_alike(compared, repr(presented))


async def test_every_request_compares_every_configured_token(
    database_url: str, compared: list[bytes]
) -> None:
    tokens = ",".join(f"{role}:{token}" for token, role in CONFIGURED.items())
    app = create_app(api_settings(database_url, api_tokens=tokens))
    first, *_, last = CONFIGURED
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http,
    ):
        for presented, path, status in [
            (first, "/tasks", 200),
            (last, "/workers", 200),
            ("ct-submit-000000002", "/workers", 403),
            ("ct-unknown-00000000", "/tasks", 401),
            (first[:-1], "/tasks", 401),
        ]:
            compared.clear()
            response = await http.get(path, headers={"Authorization": f"Bearer {presented}"})
            assert response.status_code == status, response.text
            assert_each_configured_token_compared_alike(compared, f"{presented} on {path}")


# --------------------------------------------------------------------------------------------
# Refusing to start without tokens


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TASKFLEET_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("tokens", [None, "", " , ,"])
def test_api_settings_without_tokens_refuse_with_a_clear_message(tokens: str | None) -> None:
    with pytest.raises(ValidationError) as raised:
        ApiSettings(database_url="postgresql://postgres@127.0.0.1/x", api_tokens=tokens)
    message = str(raised.value)
    assert "no API tokens configured" in message
    assert "TASKFLEET_API_TOKENS" in message
    assert "TASKFLEET_AUTH_DISABLED" in message


@pytest.mark.usefixtures("clean_env")
def test_api_settings_without_tokens_are_fine_when_auth_is_disabled_explicitly() -> None:
    settings_ = ApiSettings(database_url="postgresql://postgres@127.0.0.1/x", auth_disabled=True)
    assert settings_.tokens() == {}


#: The installed entry point, or the same main() through the interpreter where not installed.
_ENTRY_POINT = Path(sys.executable).with_name("taskfleet")
TASKFLEET = (
    [str(_ENTRY_POINT)]
    if _ENTRY_POINT.exists()
    else [sys.executable, "-c", "from taskfleet.cli.main import main; main()"]
)
#: Bound on a process starting, answering and stopping; generous, CI shares two cores.
PATIENCE = 30.0


def process_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TASKFLEET_") and k != "DATABASE_URL"
    }
    env.update(
        DATABASE_URL=with_password(database_url, DB_PASSWORD),
        TASKFLEET_HOST="127.0.0.1",
        TASKFLEET_PORT="0",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def test_taskfleet_api_without_tokens_exits_with_one_line_naming_the_variable(
    database_url: str,
) -> None:
    result = subprocess.run(
        [*TASKFLEET, "api"],
        env=process_env(database_url),
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode != 0, output
    assert "Traceback" not in output
    assert len(output.splitlines()) == 1, output
    assert "TASKFLEET_API_TOKENS" in output


def test_taskfleet_api_with_a_bad_token_list_does_not_print_the_good_tokens(
    database_url: str,
) -> None:
    result = subprocess.run(
        [*TASKFLEET, "api"],
        env=process_env(database_url, TASKFLEET_API_TOKENS=f"admin:{ADMIN_TOKEN},submit:x"),
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in output
    assert "TASKFLEET_API_TOKENS" in output
    for secret in SECRETS:
        assert secret not in output


@dataclass
class ApiProcess:
    process: subprocess.Popen[str]
    url: str
    lines: list[str]


@contextmanager
def api_process(env: dict[str, str]) -> Iterator[ApiProcess]:
    """``taskfleet api`` on an ephemeral port; its output lines (stdout and stderr) collected
    until it exits. Stopped with SIGTERM on exit."""
    process = subprocess.Popen(
        [*TASKFLEET, "api"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    stdout = process.stdout
    lines: list[str] = []
    fresh: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stdout:
            lines.append(line.rstrip("\n"))
            fresh.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + PATIENCE
        url = None
        while url is None:
            try:
                line = fresh.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"taskfleet api did not start: {lines}") from None
            found = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line)
            url = found.group(1) if found else None
        yield ApiProcess(process, url, lines)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(PATIENCE)
        finally:
            if process.poll() is None:
                process.kill()
            reader.join(PATIENCE)


def test_taskfleet_api_with_auth_disabled_starts_and_warns_loudly(database_url: str) -> None:
    env = process_env(database_url, TASKFLEET_AUTH_DISABLED="true")
    with api_process(env) as api:
        response = httpx.get(f"{api.url}/workers", timeout=PATIENCE)
        assert response.status_code == 200  # really open: the warning is no false alarm
    # uvicorn re-raises the signal once it has shut down cleanly, so the exit says SIGTERM.
    assert api.process.returncode in (0, -signal.SIGTERM), api.lines
    assert any("Application shutdown complete" in line for line in api.lines), api.lines
    warnings = [line for line in api.lines if "WARNING" in line]
    assert any("AUTHENTICATION IS DISABLED" in line for line in warnings), api.lines


def test_taskfleet_api_never_logs_a_token(database_url: str) -> None:
    env = process_env(
        database_url, TASKFLEET_API_TOKENS=f"admin:{ADMIN_TOKEN},submit:{SUBMIT_TOKEN}"
    )
    with api_process(env) as api, httpx.Client(base_url=api.url, timeout=PATIENCE) as http:
        assert http.get("/tasks", headers=AS_SUBMIT).status_code == 200
        assert http.get("/workers", headers=AS_SUBMIT).status_code == 403
        assert (
            http.get("/tasks", headers={"Authorization": f"Bearer {WRONG_TOKEN}"}).status_code
            == 401
        )
        assert http.post("/tasks", json={"type": WRONG_TOKEN}, headers=AS_ADMIN).status_code == 422
        assert http.get("/nowhere", headers=AS_ADMIN).status_code == 404
    output = "\n".join(api.lines)
    assert "GET /tasks" in output, output  # the access log is on: there was something to leak
    for secret in SECRETS:
        assert secret not in output


def test_taskfleet_api_at_warning_logs_no_access_lines(database_url: str) -> None:
    """TASKFLEET_LOG_LEVEL is the lowest level logged, uvicorn's records included: its access
    log is INFO, so at WARNING a request leaves no line (it did: uvicorn's loggers were set to
    INFO whatever the setting)."""
    port = free_port()
    env = process_env(
        database_url, TASKFLEET_API_TOKENS=f"submit:{SUBMIT_TOKEN}", TASKFLEET_LOG_LEVEL="WARNING"
    )
    env["TASKFLEET_PORT"] = str(port)
    process = subprocess.Popen(
        [*TASKFLEET, "api"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + PATIENCE
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=PATIENCE).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "api did not start"
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=PATIENCE) as http:
            assert http.get("/tasks", headers=AS_SUBMIT).status_code == 200
            assert http.get("/nowhere", headers=AS_SUBMIT).status_code == 404
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=PATIENCE)
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "GET /tasks" not in output and "GET /readyz" not in output, output
    assert "INFO" not in output, output
