"""Bearer tokens and roles (docs/reference.md#authentication): 401 without a valid token, 403 for
the wrong role, nothing written on either, probes open, tokens never logged."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import ValidationError

from taskfleet.api.app import create_app
from taskfleet.api.auth import Authenticator
from taskfleet.shared.settings import ApiSettings
from tests.integration.conftest import count_tasks

ADMIN = "admin-token-0123456789"
SUBMIT = "submit-token-0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_SUBMIT = {"Authorization": f"Bearer {SUBMIT}"}


def api_settings(database_url: str, **overrides: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "api_tokens": f"admin:{ADMIN},submit:{SUBMIT}",
        "db_pool_size": 2,
    }
    values.update(overrides)
    return ApiSettings(**values)


async def started_client(settings: ApiSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client,
    ):
        yield client


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in started_client(api_settings(database_url)):
        yield c


async def a_task(client: httpx.AsyncClient) -> int:
    response = await client.post("/tasks", json={"type": "demo.echo"}, headers=AS_ADMIN)
    assert response.status_code == 201
    task_id: int = response.json()["id"]
    return task_id


BAD_CREDENTIALS = [
    pytest.param({}, id="no header"),
    pytest.param({"Authorization": "Bearer not-a-configured-token"}, id="unknown token"),
    pytest.param({"Authorization": f"Bearer {ADMIN}x"}, id="token plus a character"),
    pytest.param({"Authorization": f"Bearer {ADMIN[:-1]}"}, id="token prefix"),
    pytest.param({"Authorization": f"Basic {ADMIN}"}, id="wrong scheme"),
    pytest.param({"Authorization": "Bearer"}, id="scheme without token"),
    pytest.param({"Authorization": ADMIN}, id="token without scheme"),
]


@pytest.mark.parametrize("headers", BAD_CREDENTIALS)
async def test_missing_or_invalid_token_is_401_and_writes_nothing(
    client: httpx.AsyncClient, conn: asyncpg.Connection, headers: dict[str, str]
) -> None:
    attempts = [
        client.post("/tasks", json={"type": "demo.echo"}, headers=headers),
        client.post("/tasks/batch", json={"tasks": [{"type": "demo.echo"}]}, headers=headers),
        client.get("/tasks", headers=headers),
        client.get("/tasks/1", headers=headers),
        client.get("/tasks/1/wait", params={"timeout": 0}, headers=headers),
        client.post("/tasks/1/cancel", headers=headers),
        client.get("/workers", headers=headers),
    ]
    for attempt in attempts:
        response = await attempt
        assert response.status_code == 401, response.request.url
        assert response.headers["www-authenticate"] == "Bearer"
        assert "token" in response.json()["detail"]
    assert await count_tasks(conn) == 0


async def test_scheme_is_case_insensitive(client: httpx.AsyncClient) -> None:
    response = await client.get("/tasks", headers={"Authorization": f"bearer {SUBMIT}"})
    assert response.status_code == 200


async def test_submit_role_creates_and_reads_tasks(client: httpx.AsyncClient) -> None:
    created = await client.post("/tasks", json={"type": "demo.echo"}, headers=AS_SUBMIT)
    assert created.status_code == 201
    task_id = created.json()["id"]

    batch = await client.post(
        "/tasks/batch", json={"tasks": [{"type": "demo.echo"}]}, headers=AS_SUBMIT
    )
    assert batch.status_code == 201
    assert (await client.get(f"/tasks/{task_id}", headers=AS_SUBMIT)).status_code == 200
    assert (await client.get("/tasks", headers=AS_SUBMIT)).status_code == 200
    waited = await client.get(f"/tasks/{task_id}/wait", params={"timeout": 0}, headers=AS_SUBMIT)
    assert waited.status_code == 200


async def test_submit_role_cannot_cancel_or_see_workers(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    task_id = await a_task(client)

    cancel = await client.post(f"/tasks/{task_id}/cancel", headers=AS_SUBMIT)
    workers = await client.get("/workers", headers=AS_SUBMIT)

    for response in (cancel, workers):
        assert response.status_code == 403
        assert "admin role" in response.json()["detail"]
    status = await conn.fetchval("SELECT status FROM taskfleet.tasks WHERE id = $1", task_id)
    assert status == "pending"


async def test_admin_role_can_do_everything(client: httpx.AsyncClient) -> None:
    task_id = await a_task(client)
    assert (await client.get(f"/tasks/{task_id}", headers=AS_ADMIN)).status_code == 200
    assert (await client.get("/tasks", headers=AS_ADMIN)).status_code == 200
    assert (await client.get("/workers", headers=AS_ADMIN)).status_code == 200
    cancel = await client.post(f"/tasks/{task_id}/cancel", headers=AS_ADMIN)
    assert (cancel.status_code, cancel.json()["status"]) == (200, "cancelled")


async def test_probes_and_metrics_need_no_token(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200


async def test_anonymous_request_is_refused_before_its_body_is_read(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # Too large and not even JSON: an anonymous client learns only that it is not let in.
    for path in ("/tasks", "/tasks/batch"):
        response = await client.post(
            path, content=b"{" * (400 * 1024), headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 401, path
    assert await count_tasks(conn) == 0


async def test_tokens_are_never_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-token-that-must-not-appear"
    await client.get("/tasks", headers={"Authorization": f"Bearer {wrong}"})
    await client.get("/tasks", headers=AS_SUBMIT)
    await client.get("/workers", headers=AS_SUBMIT)
    for secret in (wrong, SUBMIT, ADMIN):
        assert secret not in caplog.text


async def test_auth_disabled_lets_everyone_in_and_says_so_loudly(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    settings = ApiSettings(database_url=database_url, auth_disabled=True)
    async for client in started_client(settings):
        assert (await client.post("/tasks", json={"type": "demo.echo"})).status_code == 201
        assert (await client.get("/workers")).status_code == 200
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("AUTHENTICATION IS DISABLED" in r.getMessage() for r in warnings)


async def test_auth_disabled_refuses_writes_a_browser_sends_from_another_site(
    database_url: str,
) -> None:
    # Any page the operator visited could cancel or retry tasks: those POSTs have no body, so
    # the browser sends them cross-site without asking first.
    settings = ApiSettings(database_url=database_url, auth_disabled=True)
    async for client in started_client(settings):
        created = await client.post("/tasks", json={"type": "demo.echo", "delay_seconds": 600})
        task_id = created.json()["id"]
        host = client.base_url.netloc.decode()
        for origin in ("http://evil.example", "null"):
            refused = await client.post(f"/tasks/{task_id}/cancel", headers={"Origin": origin})
            assert refused.status_code == 403, refused.text
            assert "another site" in refused.json()["detail"]
        assert (await client.get(f"/tasks/{task_id}")).json()["status"] == "pending"
        # Reads stay open; a same-origin write (the console) and one without an Origin (curl,
        # the Python client) go through.
        assert (
            await client.get("/tasks", headers={"Origin": "http://evil.example"})
        ).status_code == 200
        same = await client.post(f"/tasks/{task_id}/cancel", headers={"Origin": f"http://{host}"})
        assert same.status_code == 200, same.text
        plain = await client.post("/tasks", json={"type": "demo.echo"})
        assert plain.status_code == 201


def test_no_tokens_without_auth_disabled_refuses_to_start() -> None:
    with pytest.raises(ValidationError, match="no API tokens configured"):
        ApiSettings(
            database_url="postgresql://postgres@127.0.0.1/x", api_tokens=None, auth_disabled=False
        )


def test_authenticator_maps_each_token_to_its_role() -> None:
    authenticator = Authenticator({"aaaaaaaa": "admin", "bbbbbbbb": "submit"})
    assert authenticator.role_for("aaaaaaaa") == "admin"
    assert authenticator.role_for("bbbbbbbb") == "submit"
    assert authenticator.role_for("aaaaaaab") is None
    assert authenticator.role_for("") is None
    assert authenticator.role_for("ünïcødé") is None
