"""Periodic tasks against a real Postgres (docs/operations.md#periodic-tasks).

The API in process (set, read, list, delete, validation, roles), the firing by the workers'
scheduler part (one task per slot however many fire at once, one catch-up run after a
downtime) and the schedules declared in code. Every assertion about "once" is read from the
database: the tasks a schedule enqueued and the slot each carries, never from timing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client import CollectorRegistry

import taskfleet
from taskfleet import _calls
from taskfleet.api.app import create_app
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.registry import TaskParams, TaskRegistry, load_registry
from taskfleet.worker.database import Database
from taskfleet.worker.scheduler import DUE_BATCH, Scheduler
from tests.integration.conftest import count_tasks
from tests.integration.test_api_tasks import ADMIN, AS_SUBMIT, api_settings, started_client
from tests.integration.workerkit import build_worker, start, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in started_client(create_app(api_settings(database_url))):
        yield c


async def put(client: httpx.AsyncClient, name: str, **body: Any) -> httpx.Response:
    body.setdefault("type", "demo.echo")
    return await client.put(f"/schedules/{name}", json=body)


async def schedule_count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM taskfleet.schedules"))


async def slots_of(conn: asyncpg.Connection, name: str) -> list[asyncpg.Record]:
    return list(
        await conn.fetch(
            "SELECT schedule_slot, count(*) AS n FROM taskfleet.tasks WHERE schedule_name = $1 "
            "GROUP BY schedule_slot ORDER BY schedule_slot",
            name,
        )
    )


async def no_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


def scheduler(url: str, registry: TaskRegistry | None = None, n: int = 0) -> Scheduler:
    return Scheduler(
        database=Database(url, f"taskfleet-test-scheduler-{n}"),
        registry=registry or load_registry([]),
        metrics=WorkerMetrics.create(CollectorRegistry()),
        sleep=no_sleep,
    )


# --------------------------------------------------------------------------------------------
# The API


async def test_put_get_list_delete(client: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    before = datetime.now(UTC)
    created = await put(
        client,
        "report.daily",
        cron="0 6 * * *",
        timezone="Europe/Berlin",
        payload={"value": 1},
        labels=["reports"],
        priority=0,
        weight=2,
        max_attempts=5,
        timeout_seconds=60.0,
    )
    assert created.status_code == 201, created.text
    assert created.headers["Location"] == "/schedules/report.daily"
    body = created.json()
    assert body["name"] == "report.daily" and body["source"] == "api"
    assert body["cron"] == "0 6 * * *" and body["every"] is None
    assert body["timezone"] == "Europe/Berlin"
    assert body["labels"] == ["reports"] and body["weight"] == 2 and body["max_attempts"] == 5
    assert body["timeout_seconds"] == 60.0 and body["payload"] == {"value": 1}
    assert body["last_run_at"] is None and body["last_task_id"] is None
    next_run = datetime.fromisoformat(body["next_run_at"])
    assert before < next_run <= before + timedelta(days=1, seconds=5)
    # 06:00 in Berlin is 05:00 or 04:00 UTC, whatever the season.
    assert next_run.astimezone(UTC).hour in (4, 5) and next_run.minute == 0

    # The same timing again keeps its slot; a new timing moves it.
    again = await put(client, "report.daily", cron="0 6 * * *", timezone="Europe/Berlin")
    assert again.status_code == 200
    assert again.json()["next_run_at"] == body["next_run_at"]
    assert again.json()["labels"] == [] and again.json()["payload"] == {}
    moved = await put(client, "report.daily", every="1h")
    assert moved.status_code == 200
    assert moved.json()["every"] == "1h" and moved.json()["cron"] is None
    assert moved.json()["timezone"] is None
    assert datetime.fromisoformat(moved.json()["next_run_at"]).minute == 0

    assert (await put(client, "tick", every="30s")).status_code == 201
    listed = await client.get("/schedules", headers=AS_SUBMIT)
    assert listed.status_code == 200
    assert [s["name"] for s in listed.json()["schedules"]] == ["report.daily", "tick"]
    one = await client.get("/schedules/tick", headers=AS_SUBMIT)
    assert one.status_code == 200 and one.json()["every"] == "30s"

    deleted = await client.delete("/schedules/tick")
    assert deleted.status_code == 204
    assert (await client.get("/schedules/tick")).status_code == 404
    assert (await client.delete("/schedules/tick")).status_code == 404
    assert await schedule_count(conn) == 1
    assert await count_tasks(conn) == 0


async def test_a_name_in_any_script_round_trips(client: httpx.AsyncClient) -> None:
    created = await put(client, "rapport-été 日報", every="1d")
    assert created.status_code == 201, created.text
    assert created.headers["Location"] == "/schedules/rapport-%C3%A9t%C3%A9%20%E6%97%A5%E5%A0%B1"
    fetched = await client.get(created.headers["Location"])
    assert fetched.status_code == 200 and fetched.json()["name"] == "rapport-été 日報"


async def test_roles(client: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    refused = await client.put(
        "/schedules/s", json={"type": "demo.echo", "every": "1m"}, headers=AS_SUBMIT
    )
    assert refused.status_code == 403
    assert (await client.delete("/schedules/s", headers=AS_SUBMIT)).status_code == 403
    no_token = await client.get("/schedules", headers={"Authorization": ""})
    assert no_token.status_code == 401
    assert await schedule_count(conn) == 0


BAD_BODIES: list[tuple[dict[str, Any], list[str | int], str]] = [
    ({"type": "demo.echo"}, ["body", "cron"], "missing"),
    ({"type": "demo.echo", "cron": "* * * * *", "every": "1m"}, ["body", "every"], "mutually"),
    ({"type": "demo.echo", "cron": "61 * * * *"}, ["body", "cron"], "invalid_cron"),
    ({"type": "demo.echo", "cron": "* * * *"}, ["body", "cron"], "invalid_cron"),
    ({"type": "demo.echo", "cron": "0 6 * * * * 2027"}, ["body", "cron"], "invalid_cron"),
    ({"type": "demo.echo", "cron": "0 6 *\x00 * *"}, ["body", "cron"], "invalid_text"),
    ({"type": "demo.echo", "every": "0s"}, ["body", "every"], "invalid_duration"),
    ({"type": "demo.echo", "every": "1 hour"}, ["body", "every"], "invalid_duration"),
    ({"type": "demo.echo", "every": "\ud800s"}, ["body", "every"], "string_unicode"),
    (
        {"type": "demo.echo", "cron": "0 6 * * *", "timezone": "Mars/Olympus"},
        ["body", "timezone"],
        "invalid_timezone",
    ),
    (
        {"type": "demo.echo", "cron": "0 6 * * *", "timezone": "../../etc/passwd"},
        ["body", "timezone"],
        "invalid_timezone",
    ),
    ({"type": "demo.echo", "every": "1m", "timezone": "UTC"}, ["body", "timezone"], "not_appl"),
    ({"type": "no.such.type", "every": "1m"}, ["body", "type"], "unknown_task_type"),
    ({"type": "demo.sleep", "every": "1m", "payload": {}}, ["body", "payload", "seconds"], "miss"),
    ({"type": "demo.echo", "every": "1m", "labels": ["a\x00"]}, ["body", "labels", 0], "invalid"),
    ({"type": "demo.echo", "every": "1m", "priority": 2147483647}, ["body", "priority"], "reser"),
    ({"type": "demo.echo", "every": "1m", "weight": 0}, ["body", "weight"], "greater"),
    (
        {"type": "demo.echo", "every": "1m", "run_at": "2030-01-01T00:00:00Z"},
        ["body", "run_at"],
        "extra",
    ),
    ({"type": "updateWorkerRuntimeConfig", "every": "1m"}, ["body", "type"], "reserved"),
]


@pytest.mark.parametrize(("body", "loc", "kind"), BAD_BODIES)
async def test_bad_bodies_are_refused_naming_the_field(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    body: dict[str, Any],
    loc: list[str | int],
    kind: str,
) -> None:
    # As escaped JSON text: a lone surrogate travels as \ud800, as a hostile client sends it.
    response = await client.put(
        "/schedules/bad", content=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(e["loc"] == loc and e["type"].startswith(kind) for e in errors), errors
    assert await schedule_count(conn) == 0


@pytest.mark.parametrize(
    # C1 controls (U+0085 here) and the dot segments clients normalise away were accepted.
    "name",
    ["a%01b", "a%00b", "x" * 201, "a%7Fb", "a%C2%85b", "%2E%2E", "%2E"],
)
async def test_bad_names_are_refused(
    client: httpx.AsyncClient, conn: asyncpg.Connection, name: str
) -> None:
    for response in (
        await client.put(f"/schedules/{name}", json={"type": "demo.echo", "every": "1m"}),
        await client.get(f"/schedules/{name}"),
        await client.delete(f"/schedules/{name}"),
    ):
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["path", "name"]
    assert await schedule_count(conn) == 0


# --------------------------------------------------------------------------------------------
# Firing


async def test_one_catch_up_run_after_a_downtime(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    assert (await put(client, "hourly", every="1h")).status_code == 201
    # The fleet was down for ten slots.
    await conn.execute(
        "UPDATE taskfleet.schedules SET next_run_at = date_trunc('hour', now()) "
        "- interval '10 hours' WHERE name = 'hourly'"
    )
    firing = scheduler(database_url)
    await firing.fire_due()
    await firing.fire_due()
    assert firing.fired == 1
    slots = await slots_of(conn, "hourly")
    assert len(slots) == 1 and slots[0]["n"] == 1
    row = await conn.fetchrow(
        "SELECT next_run_at, last_run_at, last_task_id, now() AS now FROM taskfleet.schedules"
    )
    # The run is for the latest missed slot; the next is the first after now.
    assert row["last_run_at"] == slots[0]["schedule_slot"]
    assert row["last_run_at"] <= row["now"] < row["last_run_at"] + timedelta(hours=1)
    assert row["next_run_at"] == row["last_run_at"] + timedelta(hours=1)
    task = await conn.fetchrow(
        "SELECT type, status, schedule_slot FROM taskfleet.tasks WHERE id = $1",
        row["last_task_id"],
    )
    assert task["type"] == "demo.echo" and task["status"] == "pending"
    fetched = (await client.get("/schedules/hourly")).json()
    assert fetched["last_task_id"] == row["last_task_id"]


async def test_a_schedules_worker_tags_go_to_every_task_it_fires(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    answer = await put(client, "gpu-hourly", every="1h", requires=["gpu", "eu", "gpu"])
    assert answer.status_code == 201, answer.text
    # A set, as a submitted task's: sorted, each tag once.
    assert answer.json()["requires"] == ["eu", "gpu"]
    assert (await client.get("/schedules/gpu-hourly")).json()["requires"] == ["eu", "gpu"]
    refused = await put(client, "bad-tags", every="1h", requires=["ok", "x\u0000y"])
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][:2] == [
        "body",
        "requires",
    ]
    await conn.execute(
        "UPDATE taskfleet.schedules SET next_run_at = now() - interval '1 second' "
        "WHERE name = 'gpu-hourly'"
    )
    firing = scheduler(database_url)
    await firing.fire_due()
    assert firing.fired == 1
    requires = await conn.fetchval(
        "SELECT requires FROM taskfleet.tasks WHERE schedule_name = 'gpu-hourly'"
    )
    assert list(requires) == ["eu", "gpu"]


async def test_concurrent_firings_enqueue_one_task_per_slot(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    """Twelve schedulers fire the same due slot at once: one task, from the database's
    guard (the conditional UPDATE), not from any agreement between them."""
    assert (await put(client, "race", every="1h")).status_code == 201
    for _ in range(5):
        await conn.execute(
            "UPDATE taskfleet.schedules SET next_run_at = date_trunc('hour', now()) "
            "WHERE name = 'race'"
        )
        await conn.execute("DELETE FROM taskfleet.tasks")
        firings = [scheduler(database_url, n=i) for i in range(12)]
        await asyncio.gather(*(f.fire_due() for f in firings))
        assert sum(f.fired for f in firings) == 1
        assert [r["n"] for r in await slots_of(conn, "race")] == [1]


async def test_every_second_on_three_workers_runs_once_per_slot(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    """Three workers fire an every-second schedule while workers stop and start: every slot
    has exactly one task (read from the tasks' schedule slots)."""
    assert (await put(client, "each-second", every="1s")).status_code == 201
    runs = [await start(build_worker(database_url, worker_id=f"w{i}")) for i in range(3)]
    every_run = list(runs)

    async def slots_at_least(n: int) -> bool:
        return len(await slots_of(conn, "each-second")) >= n

    try:
        await wait_until(lambda: slots_at_least(2), "two slots fired by three workers")
        # A worker stops and another starts while the schedule keeps firing.
        await runs[0].stop()
        runs[0] = await start(build_worker(database_url, worker_id="w3"))
        every_run.append(runs[0])
        await wait_until(lambda: slots_at_least(4), "four slots")
        await runs[1].stop()
        runs[1] = await start(build_worker(database_url, worker_id="w4"))
        every_run.append(runs[1])
        await wait_until(lambda: slots_at_least(6), "six slots")

        async def one_completed() -> bool:
            done = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE schedule_name = 'each-second' "
                "AND status = 'completed'"
            )
            return bool(done)

        # They also run, as any task: the workers claim them.
        await wait_until(one_completed, "a scheduled task completed")
    finally:
        for run in runs:
            await run.stop()
    slots = await slots_of(conn, "each-second")
    assert all(r["n"] == 1 for r in slots), [(r["schedule_slot"], r["n"]) for r in slots]
    assert all(r["schedule_slot"].microsecond == 0 for r in slots)
    total = await conn.fetchval(
        "SELECT count(*) FROM taskfleet.tasks WHERE schedule_name = 'each-second'"
    )
    assert total == len(slots) >= 6
    # What the workers counted as fired (a stop may cut one short after its commit) is no more.
    assert sum(run.worker.scheduler.fired for run in every_run) <= total


async def test_a_schedule_set_while_workers_run_is_seen_at_a_tick(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    """The scheduler sleeps while there is no schedule; the heartbeat tick tells it of one."""
    run = await start(build_worker(database_url))
    try:
        await wait_until(lambda: run.worker.scheduler.declared.is_set(), "scheduler started")
        assert (await put(client, "late", every="1s")).status_code == 201

        async def fired() -> bool:
            return len(await slots_of(conn, "late")) >= 2

        await wait_until(fired, "two slots of a schedule set after the worker started")
    finally:
        await run.stop()
    assert all(r["n"] == 1 for r in await slots_of(conn, "late"))


# --------------------------------------------------------------------------------------------
# Declared in code


class Nothing(TaskParams):
    pass


def code_registry(**schedule: Any) -> TaskRegistry:
    registry = TaskRegistry()

    @registry.task("report.nightly", params=Nothing, **schedule)
    async def nightly(params: Nothing) -> None:
        return None

    return registry


async def test_code_schedules_are_declared_and_an_api_one_wins(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    registry = code_registry(schedule="0 3 * * *", timezone="America/New_York")
    await scheduler(database_url, registry).declare()
    row = await conn.fetchrow("SELECT * FROM taskfleet.schedules WHERE name = 'report.nightly'")
    assert row["source"] == "code" and row["cron"] == "0 3 * * *"
    assert row["timezone"] == "America/New_York" and row["type"] == "report.nightly"
    revision = row["revision"]

    # Declared again unchanged (every worker start): nothing written.
    await scheduler(database_url, registry).declare()
    assert await conn.fetchval("SELECT revision FROM taskfleet.schedules") == revision

    # Changed in code: followed.
    await scheduler(database_url, code_registry(every="10m")).declare()
    row = await conn.fetchrow("SELECT * FROM taskfleet.schedules")
    assert row["every"] == "10m" and row["cron"] is None and row["source"] == "code"

    # Set over the API (the API loads demo types only, so set it as one of those): it wins.
    assert (await put(client, "report.nightly", every="5m")).status_code == 200
    await scheduler(database_url, code_registry(every="10m")).declare()
    row = await conn.fetchrow("SELECT * FROM taskfleet.schedules")
    assert row["every"] == "5m" and row["source"] == "api"

    # Deleted: the next declaration brings the code's back.
    assert (await client.delete("/schedules/report.nightly")).status_code == 204
    await scheduler(database_url, code_registry(every="10m")).declare()
    row = await conn.fetchrow("SELECT * FROM taskfleet.schedules")
    assert row["every"] == "10m" and row["source"] == "code"


async def test_a_schedule_removed_from_the_code_is_removed_at_the_next_worker_start(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    # It kept firing for ever: nothing but a DELETE ever removed a code schedule.
    await scheduler(database_url, code_registry(every="10m")).declare()

    other = TaskRegistry()  # another worker's modules: they do not know report.nightly

    @other.task("report.weekly", params=Nothing)
    async def weekly(params: Nothing) -> None:
        return None

    await scheduler(database_url, other).declare()
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.schedules") == 1

    # A worker whose code still has the type but no longer declares its schedule removes it.
    await scheduler(database_url, code_registry()).declare()
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.schedules") == 0

    # One set over the API is the operator's: it stays.
    assert (await put(client, "report.nightly", every="5m")).status_code == 201
    await scheduler(database_url, code_registry()).declare()
    row = await conn.fetchrow("SELECT * FROM taskfleet.schedules")
    assert row["every"] == "5m" and row["source"] == "api"


async def test_a_code_schedule_that_cannot_be_declared_leaves_the_others_firing(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # One the import checks let through and the declaration refuses (a ValidationError): the
    # scheduler retried it for ever, without yielding once a stop was requested, and never
    # started firing the schedules already stored.
    registry = code_registry(every="1m")
    definition = registry.get("report.nightly")
    assert definition is not None and definition.schedule is not None
    object.__setattr__(definition.schedule, "every", "1" * 40)  # past the 32-character rule
    s = scheduler(database_url, registry)
    with caplog.at_level("ERROR"):
        await asyncio.wait_for(s.declare(), 10)
    assert s.declared.is_set()
    assert "cannot be declared" in caplog.text


async def test_the_list_pages_by_name_and_the_client_reads_every_page(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client asked once, without a limit: past 1,000 schedules it returned the first 1,000
    # as "every schedule".
    names = [f"s{i}" for i in range(5)]
    for name in names:
        assert (await put(client, name, every="1h")).status_code == 201
    first = (await client.get("/schedules", params={"limit": 2})).json()["schedules"]
    assert [s["name"] for s in first] == names[:2]
    rest = await client.get("/schedules", params={"limit": 10, "after": first[-1]["name"]})
    assert [s["name"] for s in rest.json()["schedules"]] == names[2:]

    # A NUL cannot go to Postgres as text: refused naming the parameter (it was a 500, found by
    # the API fuzz).
    refused = await client.get("/schedules", params={"after": "a\x00b"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["query", "after"]

    monkeypatch.setattr(_calls, "SCHEDULE_PAGE", 2)
    async with taskfleet.AsyncClient(
        "http://api", token=ADMIN, transport=client._transport
    ) as python_client:
        assert [s.name for s in await python_client.schedules()] == names


async def test_a_full_batch_of_schedules_that_cannot_fire_does_not_starve_the_rest(
    client: httpx.AsyncClient, conn: asyncpg.Connection, database_url: str
) -> None:
    # Stored timings that no longer parse (a zone since refused) stay due for ever. With a whole
    # batch of them ahead, the scheduler looked again at once, in a loop, and never reached a
    # valid schedule behind them.
    assert (await put(client, "valid", every="1h")).status_code == 201
    for i in range(DUE_BATCH):
        assert (await put(client, f"broken-{i:03d}", every="1h")).status_code == 201
    await conn.execute(
        "UPDATE taskfleet.schedules SET cron = '0 * * * *', every = NULL, timezone = 'localtime',"
        " next_run_at = now() - interval '2 hours' WHERE name LIKE 'broken-%'"
    )
    await conn.execute(
        "UPDATE taskfleet.schedules SET next_run_at = now() - interval '1 hour'"
        " WHERE name = 'valid'"
    )
    firing = scheduler(database_url)
    waits = [await firing.fire_due() for _ in range(3)]
    assert firing.fired == 1
    assert len(await slots_of(conn, "valid")) == 1
    # Then it waits for the valid schedule's next slot, not 0 s.
    assert waits[-1] is not None and waits[-1] > 60
