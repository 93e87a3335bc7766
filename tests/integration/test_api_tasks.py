"""The task API against a real, freshly migrated Postgres (docs/reference.md#tasks).

The app runs in-process with its lifespan (so its own engine and pool), driven over httpx's ASGI
transport. Rows are inspected with plain SQL on a separate connection.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware

from taskfleet.api.app import create_app
from taskfleet.api.metrics import _RouteNameCache
from taskfleet.shared import db
from taskfleet.shared import queries as q
from taskfleet.shared.policy.runtime_config import normalise_runtime_config
from taskfleet.shared.settings import ApiSettings
from tests.integration.conftest import count_tasks
from tests.pg import with_database

ADMIN = "admin-token-0123456789"
SUBMIT = "submit-token-0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_SUBMIT = {"Authorization": f"Bearer {SUBMIT}"}
#: Bound on every wait in these tests; generous, CI shares two cores.
PATIENCE = 30.0


def api_settings(database_url: str, **overrides: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "api_tokens": f"admin:{ADMIN},submit:{SUBMIT}",
        "db_pool_size": 4,
    }
    values.update(overrides)
    return ApiSettings(**values)


async def started_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api", headers=AS_ADMIN
        ) as client,
    ):
        yield client


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in started_client(create_app(api_settings(database_url))):
        yield c


async def submit(client: httpx.AsyncClient, **task: Any) -> dict[str, Any]:
    task.setdefault("type", "demo.echo")
    response = await client.post("/tasks", json=task)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def set_status(conn: asyncpg.Connection, task_id: int, status: str) -> None:
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = $2, worker_id = 'w-test', started_at = now(),"
        " finished_at = CASE WHEN $2 IN ('completed', 'failed', 'cancelled') THEN now() END,"
        " result = CASE WHEN $2 = 'completed' THEN '{\"ok\": true}'::jsonb END"
        " WHERE id = $1",
        task_id,
        status,
    )


WIRE_FIELDS = {
    "id",
    "type",
    "payload",
    "status",
    "priority",
    "weight",
    "labels",
    "attempts",
    "max_attempts",
    "run_after",
    "timeout_seconds",
    "created_at",
    "started_at",
    "finished_at",
    "worker_id",
    "lease_expires_at",
    "result",
    "last_error",
    "unique_key",
    "cancel_requested",
    "requires",
}


# ---------------------------------------------------------------------------------------------
# Create and read
# ---------------------------------------------------------------------------------------------


async def test_create_returns_the_stored_task(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    response = await client.post(
        "/tasks", json={"type": "demo.echo", "payload": {"value": [1, "two"]}, "labels": ["a"]}
    )

    assert response.status_code == 201
    task = response.json()
    assert response.headers["location"] == f"/tasks/{task['id']}"
    assert set(task) == WIRE_FIELDS | {"deduplicated"}
    assert task["deduplicated"] is False
    assert task["type"] == "demo.echo"
    assert task["payload"] == {"value": [1, "two"]}
    assert task["status"] == "pending"
    assert (task["priority"], task["weight"], task["max_attempts"]) == (0, 1, 3)
    assert task["labels"] == ["a"]
    assert task["attempts"] == 0
    assert task["timeout_seconds"] is None
    assert task["cancel_requested"] is False
    row = await conn.fetchrow("SELECT type, labels, payload::text FROM taskfleet.tasks")
    assert (row["type"], row["labels"]) == ("demo.echo", ["a"])

    fetched = await client.get(f"/tasks/{task['id']}")
    assert fetched.status_code == 200
    assert fetched.json() == {k: v for k, v in task.items() if k != "deduplicated"}


async def test_create_with_every_option(client: httpx.AsyncClient) -> None:
    before = datetime.now(UTC)
    delayed = await submit(
        client,
        type="demo.sleep",
        payload={"seconds": 0.5},
        priority=7,
        weight=3,
        labels=["x", "y"],
        delay_seconds=3600,
        max_attempts=5,
        timeout_seconds=12.5,
        unique_key="options-1",
    )
    assert (delayed["priority"], delayed["weight"], delayed["labels"]) == (7, 3, ["x", "y"])
    assert (delayed["max_attempts"], delayed["timeout_seconds"]) == (5, 12.5)
    assert delayed["unique_key"] == "options-1"
    run_after = datetime.fromisoformat(delayed["run_after"])
    created_at = datetime.fromisoformat(delayed["created_at"])
    assert run_after - created_at == timedelta(seconds=3600)

    at = (before + timedelta(days=2)).replace(microsecond=0)
    scheduled = await submit(client, run_at=at.isoformat())
    assert datetime.fromisoformat(scheduled["run_after"]) == at


async def test_get_unknown_task_is_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/tasks/987654")
    assert response.status_code == 404
    assert response.json() == {"detail": "task 987654 not found"}


# ---------------------------------------------------------------------------------------------
# List
# ---------------------------------------------------------------------------------------------


async def test_list_is_newest_first_with_keyset_paging(client: httpx.AsyncClient) -> None:
    ids = [(await submit(client, payload={"value": i}))["id"] for i in range(5)]

    seen: list[int] = []
    pages = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor is not None:
            params["cursor"] = cursor
        response = await client.get("/tasks", params=params)
        assert response.status_code == 200
        page = response.json()
        seen += [t["id"] for t in page["tasks"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == list(reversed(ids))
    assert pages == 3  # 2 + 2 + 1, and the last page says it is the last


async def test_a_list_without_bodies_leaves_out_payloads_and_results(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # The console's task list showed neither, yet fetched both every 5 s: 62 MB a refresh for
    # 50 tasks of 250 KB payloads and 1 MB results.
    big = "x" * 200_000
    task_id = (await submit(client, payload={"value": big}))["id"]
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'completed', result = $2::jsonb WHERE id = $1",
        task_id,
        json.dumps({"blob": big}),
    )
    full = (await client.get("/tasks")).json()["tasks"][0]
    assert (full["payload"], full["result"]) == ({"value": big}, {"blob": big})
    response = await client.get("/tasks", params={"bodies": "false"})
    assert response.status_code == 200
    (light,) = response.json()["tasks"]
    assert (light["id"], light["status"], light["payload"], light["result"]) == (
        task_id,
        "completed",
        None,
        None,
    )
    assert len(response.content) < 2_000


async def test_list_exact_multiple_of_the_limit_has_no_empty_last_page(
    client: httpx.AsyncClient,
) -> None:
    for _ in range(4):
        await submit(client)
    first = (await client.get("/tasks", params={"limit": 2})).json()
    second = (
        await client.get("/tasks", params={"limit": 2, "cursor": first["next_cursor"]})
    ).json()
    assert len(second["tasks"]) == 2
    assert second["next_cursor"] is None


async def test_list_filters_by_status_type_and_label(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    echo_a = await submit(client, labels=["a"])
    echo_b = await submit(client, labels=["b", "a"])
    sleep_b = await submit(client, type="demo.sleep", payload={"seconds": 1}, labels=["b"])
    await set_status(conn, echo_b["id"], "completed")

    async def ids(**params: Any) -> list[int]:
        response = await client.get("/tasks", params=params)
        assert response.status_code == 200, response.text
        return [t["id"] for t in response.json()["tasks"]]

    assert await ids(status="pending") == [sleep_b["id"], echo_a["id"]]
    assert await ids(status="completed") == [echo_b["id"]]
    assert await ids(type="demo.echo") == [echo_b["id"], echo_a["id"]]
    assert await ids(label="a") == [echo_b["id"], echo_a["id"]]
    assert await ids(label="b", type="demo.sleep") == [sleep_b["id"]]
    assert await ids(label="b", status="pending", type="demo.echo") == []
    assert await ids(status="failed") == []


# ---------------------------------------------------------------------------------------------
# Batch
# ---------------------------------------------------------------------------------------------


async def test_batch_returns_tasks_in_submission_order(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    body = {
        "tasks": [
            {"type": "demo.sleep", "payload": {"seconds": 2}},
            {"type": "demo.echo", "payload": {"value": "second"}, "priority": 9},
            {"type": "demo.fail", "labels": ["z"]},
        ]
    }
    response = await client.post("/tasks/batch", json=body)

    assert response.status_code == 201, response.text
    tasks = response.json()["tasks"]
    assert [t["type"] for t in tasks] == ["demo.sleep", "demo.echo", "demo.fail"]
    assert [t["payload"] for t in tasks] == [{"seconds": 2}, {"value": "second"}, {}]
    assert [t["priority"] for t in tasks] == [0, 9, 0]
    assert [t["deduplicated"] for t in tasks] == [False, False, False]
    assert tasks[0]["id"] < tasks[1]["id"] < tasks[2]["id"]
    assert await count_tasks(conn) == 3


async def test_batch_with_one_bad_task_writes_nothing(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    body = {
        "tasks": [
            {"type": "demo.echo"},
            {"type": "demo.echo", "unique_key": "kept-out"},
            {"type": "demo.sleep", "payload": {"seconds": "soon"}},
            {"type": "demo.echo"},
        ]
    }
    response = await client.post("/tasks/batch", json=body)

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body", "tasks", 2, "payload", "seconds"]
    assert await count_tasks(conn) == 0
    # The key of the refused batch is free: nothing of it exists.
    assert (await submit(client, unique_key="kept-out"))["deduplicated"] is False


async def test_batch_error_names_the_first_bad_task_whatever_its_fault(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    body = {
        "tasks": [
            {"type": "demo.echo"},
            {"type": "no.such.type"},  # registry fault, first
            {"type": "demo.echo", "priority": -1},  # model fault, later
        ]
    }
    response = await client.post("/tasks/batch", json=body)

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "tasks", 1, "type"]]
    assert detail[0]["type"] == "unknown_task_type"
    assert await count_tasks(conn) == 0


async def test_batch_of_a_thousand_is_accepted_and_one_more_is_not(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    tasks = [{"type": "demo.echo", "payload": {"value": i}} for i in range(1001)]

    too_many = await client.post("/tasks/batch", json={"tasks": tasks})
    assert too_many.status_code == 422
    assert too_many.json()["detail"][0]["loc"] == ["body", "tasks"]
    assert await count_tasks(conn) == 0

    accepted = await client.post("/tasks/batch", json={"tasks": tasks[:1000]})
    assert accepted.status_code == 201
    assert [t["payload"]["value"] for t in accepted.json()["tasks"]] == list(range(1000))
    assert await count_tasks(conn) == 1000


async def test_batch_sends_one_wakeup_per_request(
    client: httpx.AsyncClient, database_url: str
) -> None:
    received: asyncio.Queue[str] = asyncio.Queue()
    listener = await db.connect(database_url)
    try:
        await listener.add_listener(
            q.TASK_READY_CHANNEL, lambda *args: received.put_nowait(args[3])
        )
        response = await client.post(
            "/tasks/batch", json={"tasks": [{"type": "demo.echo"} for _ in range(50)]}
        )
        assert response.status_code == 201
        # A sentinel after the batch: everything the batch sent has arrived before it.
        await listener.execute("SELECT pg_notify($1, 'sentinel')", q.TASK_READY_CHANNEL)
        payloads = []
        while not payloads or payloads[-1] != "sentinel":
            payloads.append(await asyncio.wait_for(received.get(), PATIENCE))
    finally:
        await listener.close()
    assert payloads == ["normal", "sentinel"]  # one wake-up, naming the lane


# ---------------------------------------------------------------------------------------------
# Deduplication
# ---------------------------------------------------------------------------------------------


async def test_unique_key_deduplicates_onto_the_unfinished_task(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    first = await submit(client, unique_key="report-2024", payload={"value": 1})

    again = await client.post(
        "/tasks", json={"type": "demo.echo", "unique_key": "report-2024", "payload": {"value": 2}}
    )

    assert again.status_code == 200
    body = again.json()
    assert body["deduplicated"] is True
    assert body["id"] == first["id"]
    assert body["payload"] == {"value": 1}  # the existing task, unchanged
    assert await count_tasks(conn) == 1

    await set_status(conn, first["id"], "running")
    while_running = await client.post(
        "/tasks", json={"type": "demo.echo", "unique_key": "report-2024"}
    )
    assert (while_running.status_code, while_running.json()["id"]) == (200, first["id"])

    # Once it is finished the key is free again.
    await set_status(conn, first["id"], "completed")
    fresh = await submit(client, unique_key="report-2024")
    assert fresh["id"] != first["id"]
    assert fresh["deduplicated"] is False
    assert await count_tasks(conn) == 2


async def test_batch_deduplicates_against_existing_and_within_itself(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    existing = await submit(client, unique_key="k1")
    body = {
        "tasks": [
            {"type": "demo.echo", "unique_key": "k1"},
            {"type": "demo.echo", "unique_key": "k2"},
            {"type": "demo.echo", "unique_key": "k2"},
            {"type": "demo.echo"},
        ]
    }
    response = await client.post("/tasks/batch", json=body)

    assert response.status_code == 201
    tasks = response.json()["tasks"]
    assert [t["deduplicated"] for t in tasks] == [True, False, True, False]
    assert tasks[0]["id"] == existing["id"]
    assert tasks[1]["id"] == tasks[2]["id"]
    assert await count_tasks(conn) == 3


# ---------------------------------------------------------------------------------------------
# Cancel
# ---------------------------------------------------------------------------------------------


async def test_cancel_pending_task_cancels_it_at_once(client: httpx.AsyncClient) -> None:
    task = await submit(client)

    response = await client.post(f"/tasks/{task['id']}/cancel")

    assert response.status_code == 200
    cancelled = response.json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["finished_at"] is not None
    assert cancelled["cancel_requested"] is True
    assert (await client.get(f"/tasks/{task['id']}")).json()["status"] == "cancelled"


async def test_cancel_running_task_requests_cancellation(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    task = await submit(client, type="demo.sleep", payload={"seconds": 60})
    await set_status(conn, task["id"], "running")

    response = await client.post(f"/tasks/{task['id']}/cancel")

    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["cancel_requested"]) == ("running", True)
    assert await conn.fetchval(
        "SELECT cancel_requested FROM taskfleet.tasks WHERE id = $1", task["id"]
    )


@pytest.mark.parametrize("finished", ["completed", "failed", "cancelled"])
async def test_cancel_finished_task_is_409(
    client: httpx.AsyncClient, conn: asyncpg.Connection, finished: str
) -> None:
    task = await submit(client)
    await set_status(conn, task["id"], finished)

    response = await client.post(f"/tasks/{task['id']}/cancel")

    assert response.status_code == 409
    assert response.json() == {"detail": f"task {task['id']} is already {finished}"}
    row = await conn.fetchrow(
        "SELECT status, cancel_requested FROM taskfleet.tasks WHERE id = $1", task["id"]
    )
    assert (row["status"], row["cancel_requested"]) == (finished, False)


async def test_cancel_unknown_task_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/tasks/424242/cancel")
    assert response.status_code == 404
    assert response.json() == {"detail": "task 424242 not found"}


# ---------------------------------------------------------------------------------------------
# Wait
# ---------------------------------------------------------------------------------------------


async def test_wait_times_out_on_a_pending_task(client: httpx.AsyncClient) -> None:
    task = await submit(client)

    response = await client.get(f"/tasks/{task['id']}/wait", params={"timeout": 0.2})

    assert response.status_code == 200
    body = response.json()
    assert (body["finished"], body["status"], body["id"]) == (False, "pending", task["id"])


async def test_wait_returns_once_the_task_finishes(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    task = await submit(client)
    waiting = asyncio.create_task(
        client.get(f"/tasks/{task['id']}/wait", params={"timeout": PATIENCE})
    )
    await asyncio.sleep(0.1)  # let it poll at least once while pending
    assert not waiting.done()

    await set_status(conn, task["id"], "completed")
    response = await asyncio.wait_for(waiting, PATIENCE)

    assert response.status_code == 200
    body = response.json()
    assert (body["finished"], body["status"], body["result"]) == (True, "completed", {"ok": True})


async def test_wait_on_a_finished_task_answers_at_once(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    task = await submit(client)
    await set_status(conn, task["id"], "failed")
    response = await client.get(f"/tasks/{task['id']}/wait", params={"timeout": PATIENCE})
    assert (response.status_code, response.json()["finished"]) == (200, True)


async def test_wait_on_unknown_task_is_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/tasks/31337/wait", params={"timeout": 0})
    assert response.status_code == 404


# ---------------------------------------------------------------------------------------------
# Workers, health, metrics
# ---------------------------------------------------------------------------------------------


async def test_workers_lists_every_row_with_alive(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    for worker_id in ("w-alive", "w-stale", "w-offline"):
        sql, args = q.worker_register.positional(
            {
                "id": worker_id,
                "hostname": "host",
                "pid": 1,
                "concurrency": 4,
                "heartbeat_interval": 3.0,
                "lease_ttl": 30.0,
                "applied_config_version": 0,
                "metrics_port": 9100,
                "task_types": ["demo.echo", "demo.sleep"],
                "tags": ["eu", "gpu"] if worker_id == "w-alive" else [],
            }
        )
        await conn.execute(sql, *args)
    await conn.execute(
        "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '1 minute'"
        " WHERE id = 'w-stale'"
    )
    await conn.execute("UPDATE taskfleet.workers SET status = 'offline' WHERE id = 'w-offline'")

    response = await client.get("/workers")

    assert response.status_code == 200
    workers = {w["id"]: w for w in response.json()["workers"]}
    assert {k: w["alive"] for k, w in workers.items()} == {
        "w-alive": True,
        "w-stale": False,
        "w-offline": False,
    }
    assert response.json()["workers"][0]["id"] == "w-alive"  # alive ones first
    assert workers["w-alive"]["concurrency"] == 4
    assert workers["w-alive"]["task_types"] == ["demo.echo", "demo.sleep"]
    assert workers["w-alive"]["tags"] == ["eu", "gpu"]
    assert workers["w-stale"]["tags"] == []
    assert workers["w-offline"]["status"] == "offline"


async def test_healthz_and_readyz_on_a_migrated_database(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz", headers={})).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


async def test_readyz_is_503_on_an_unmigrated_database(pg_server_url: str) -> None:
    name = f"tf_empty_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(with_database(pg_server_url, "postgres"))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            async for client in started_client(
                create_app(api_settings(with_database(pg_server_url, name)))
            ):
                response = await client.get("/readyz")
                assert response.status_code == 503
                assert "not migrated" in response.json()["reason"]
                # The task routes say the same, as a 503, not a 500.
                submitted = await client.post("/tasks", json={"type": "demo.echo"})
                assert submitted.status_code == 503
                assert submitted.json()["detail"] == "database unavailable"
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_unreachable_database_is_503_and_metrics_still_answer() -> None:
    with_socket_closed = "postgresql://postgres@127.0.0.1:1/taskfleet"
    async for client in started_client(create_app(api_settings(with_socket_closed))):
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["reason"] == "database unreachable"

        for response in (
            await client.post("/tasks", json={"type": "demo.echo"}),
            await client.get("/tasks"),
            await client.get("/tasks/1"),
            await client.get("/workers"),
        ):
            assert response.status_code == 503
            assert response.json()["detail"] == "database unavailable"

        scrape = await client.get("/metrics")
        assert scrape.status_code == 200
        assert "taskfleet_api_database_up 0.0" in scrape.text
        assert "http_requests_total" in scrape.text

        assert (await client.get("/healthz")).status_code == 200


def metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.compile(rf"^{re.escape(name)}\{{{re.escape(wanted)}\}} (\S+)$", re.M)
    match = pattern.search(text)
    return float(match.group(1)) if match else None


async def test_metrics_report_queue_depth_from_postgres(client: httpx.AsyncClient) -> None:
    await client.post(
        "/tasks/batch",
        json={
            "tasks": [
                {"type": "demo.echo"},
                {"type": "demo.echo", "labels": ["x"]},
                {"type": "demo.echo", "priority": 5},
            ]
        },
    )

    response = await client.get("/metrics", headers={})

    assert response.status_code == 200
    text = response.text
    assert metric(text, "taskfleet_queue_depth", lane="normal", group="default") == 2
    assert metric(text, "taskfleet_queue_depth", lane="strict", group="") == 1
    assert metric(text, "taskfleet_queue_depth", lane="control", group="") == 0
    assert metric(text, "taskfleet_tasks_submitted_total", lane="normal") == 2
    assert metric(text, "taskfleet_workers_alive") is None or "taskfleet_workers_alive 0.0" in text
    assert "taskfleet_api_database_up 1.0" in text
    # HTTP metrics from the instrumentator, on the app's own registry.
    assert 'handler="/tasks/batch"' in text


async def test_metrics_report_paused_unrunnable_and_limited_tasks(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    config = normalise_runtime_config(
        {
            "pausedLabels": ["held"],
            "pausedLanes": ["strict"],
            "labelLimits": {"hot": {"maxInFlight": 3, "ratePerSecond": 2}},
        }
    )
    sql, args = q.runtime_config_insert.positional(
        {"request_id": config.request_id, "payload": db.dumps(config.to_payload())}
    )
    await conn.execute(sql, *args)
    await conn.execute("UPDATE taskfleet.label_limits SET refilled_at = now() - interval '1 hour'")
    await client.post(
        "/tasks/batch",
        json={
            "tasks": [
                {"type": "demo.echo", "labels": ["held"], "run_at": "2001-01-01T00:00:00Z"},
                {"type": "demo.echo", "priority": 4},
                {"type": "demo.echo", "requires": ["gpu"]},
            ]
        },
    )
    # The paused ones are the oldest: two hours; the gpu task one hour.
    await conn.execute(
        "UPDATE taskfleet.tasks SET created_at = now() - interval '1 hour' * "
        "CASE WHEN labels = '{held}' OR priority > 0 THEN 2 ELSE 1 END, "
        "run_after = now() - interval '2 hours' WHERE priority < 2147483647"
    )

    text = (await client.get("/metrics")).text

    assert "taskfleet_queue_paused_tasks 2.0" in text
    assert metric(text, "taskfleet_queue_unrunnable_tasks", reason="missing_tags") == 1
    # The paused ones are not starvation: only the gpu task (an hour old) counts as ready.
    assert metric(text, "taskfleet_queue_oldest_ready_age_seconds", lane="strict", group="") == 0
    oldest = metric(
        text, "taskfleet_queue_oldest_ready_age_seconds", lane="normal", group="default"
    )
    assert oldest is not None and 3500 < oldest < 5000
    assert metric(text, "taskfleet_queue_depth", lane="normal", group="default") == 2
    assert metric(text, "taskfleet_label_limit_max_in_flight", label="hot") == 3
    assert metric(text, "taskfleet_label_limit_in_flight", label="hot") == 0
    assert metric(text, "taskfleet_label_limit_rate_per_second", label="hot") == 2
    assert metric(text, "taskfleet_label_limit_tokens", label="hot") == 2


async def test_openapi_document_describes_the_task_routes(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/tasks", "/tasks/batch", "/tasks/{id}", "/tasks/{id}/cancel", "/workers"):
        assert path in paths
    assert "bearer" in str(response.json()["components"]["securitySchemes"]).lower()


async def test_list_filters_by_worker(client: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    first, second, _never_run = [await submit(client) for _ in range(3)]
    await set_status(conn, first["id"], "completed")
    await set_status(conn, second["id"], "running")
    await conn.execute(
        "UPDATE taskfleet.tasks SET worker_id = 'w-other' WHERE id = $1", second["id"]
    )

    listed = (await client.get("/tasks", params={"worker": "w-test"})).json()["tasks"]
    assert [t["id"] for t in listed] == [first["id"]]
    listed = (await client.get("/tasks", params={"worker": "w-other"})).json()["tasks"]
    assert [t["id"] for t in listed] == [second["id"]]
    assert (await client.get("/tasks", params={"worker": ""})).status_code == 422


async def test_oldest_ready_age_counts_from_submission_not_from_a_past_run_at(
    client: httpx.AsyncClient,
) -> None:
    # run_at in 1970: the task became ready when it was submitted, a moment ago, not 57 years
    # ago (which fired the documented backlog-aging alert at once).
    await submit(client, type="demo.echo", run_at="1970-01-02T00:00:00Z")
    text = (await client.get("/metrics")).text
    ages = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "taskfleet_queue_oldest_ready_age_seconds"
        and sample.labels == {"lane": "normal", "group": "default"}
    ]
    assert len(ages) == 1 and 0 <= ages[0] < 3600, ages


async def test_http_metrics_name_each_route_by_its_template_when_cached(
    client: httpx.AsyncClient,
) -> None:
    """The route names the request metrics carry are kept per fixed path (metrics.py's
    _RouteNameCache): asked twice, a fixed path keeps its name, a templated one is named by its
    template for every id, and a path of no route is not mistaken for one."""
    ids = []
    for _ in range(2):
        created = await client.post("/tasks", json={"type": "demo.echo"})
        assert created.status_code == 201
        ids.append(created.json()["id"])
    for task_id in ids:
        assert (await client.get(f"/tasks/{task_id}")).status_code == 200
    assert (await client.get("/tasks/stats")).status_code == 200
    assert (await client.get("/nowhere/at/all")).status_code == 404
    text = (await client.get("/metrics", headers={})).text

    def requests(method: str, handler: str) -> float:
        total = 0.0
        for line in text.splitlines():
            if line.startswith("http_requests_total{") and (
                f'handler="{handler}"' in line and f'method="{method}"' in line
            ):
                total += float(line.rsplit(" ", 1)[1])
        return total

    assert requests("POST", "/tasks") == 2
    assert requests("GET", "/tasks/{id}") == 2
    assert requests("GET", "/tasks/stats") == 1
    assert not any(f'handler="/tasks/{i}"' in text for i in ids)
    assert 'handler="/nowhere/at/all"' not in text


def test_the_request_metrics_middleware_is_the_caching_one(database_url: str) -> None:
    classes = [m.cls for m in create_app(api_settings(database_url)).user_middleware]
    assert _RouteNameCache in classes
    assert PrometheusInstrumentatorMiddleware not in classes
