"""``PUT/PATCH/GET /runtime-config`` against the real app under uvicorn and real workers.

The API runs in its own thread and event loop (``apiserver.running_api``); three workers run
in-process on the test's loop, with short timers; the stream is read line by line over real
HTTP. Where a test needs the fleet to lag on purpose, a "fake" worker row is registered by hand
and kept alive by the test's own heartbeat: it never applies a version, so nothing converges
until the test lets it go stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

from taskfleet.api import config_stream, negotiation
from taskfleet.shared import db
from taskfleet.shared.policy.convergence import NO_ALIVE_WORKER
from taskfleet.shared.registry import load_registry
from taskfleet.shared.settings import ApiSettings, WorkerSettings
from taskfleet.worker.worker import Worker
from tests.integration.apiserver import RunningApi, running_api

ADMIN = {"Authorization": "Bearer admintoken123"}
SUBMIT = {"Authorization": "Bearer submittoken123"}
TOKENS = "admin:admintoken123,submit:submittoken123"
UPDATE_TASK_TYPE = "updateWorkerRuntimeConfig"
#: Bound on every wait; generous, CI shares two cores. Tests wait on events, not on sleeps.
PATIENCE = 30.0
FINAL = {"converged", "superseded", "timeout", "failed"}


# --------------------------------------------------------------------------------------------
# Fixtures: the API, the fleet, a worker that lags on purpose


@pytest.fixture
def api(database_url: str) -> Iterator[RunningApi]:
    with running_api(ApiSettings(database_url=database_url, api_tokens=TOKENS)) as running:
        yield running


@pytest.fixture
async def client(api: RunningApi) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=api.url, headers=ADMIN, timeout=httpx.Timeout(PATIENCE)
    ) as http:
        yield http


def _worker(database_url: str, worker_id: str) -> Worker:
    settings = WorkerSettings(
        database_url=database_url,
        worker_id=worker_id,
        metrics_port=0,
        concurrency=2,
        poll_interval=0.2,
        # Alive for 3 s after a beat: a worker slowed by a loaded machine must not drop out of
        # the lists these tests assert (none of them waits for a real worker to expire).
        heartbeat_interval=1.0,
        lease_ttl=3.0,
        sweep_interval=0.5,
        runtime_config_poll_interval=0.5,
        drain_timeout=0.5,
    )
    return Worker(settings, load_registry([]))


@pytest.fixture
async def fleet(database_url: str) -> AsyncIterator[list[Worker]]:
    """Three workers, in-process, registered and claiming."""
    workers = [_worker(database_url, f"w{i}") for i in range(3)]
    runs = [asyncio.create_task(w.run(), name=f"worker-{w.id}") for w in workers]
    try:
        await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in workers)), PATIENCE)
        yield workers
    finally:
        for worker in workers:
            worker.request_stop()
        await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), PATIENCE)


@dataclass
class FakeWorker:
    """A worker row with a fresh heartbeat that never applies a config: it holds convergence
    up for as long as the test keeps it alive."""

    conn: asyncpg.Connection
    worker_id: str = "fake"
    beat: asyncio.Task[None] | None = field(default=None)

    async def start(self) -> None:
        await self.conn.execute(
            "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status, "
            "last_heartbeat, heartbeat_interval, applied_config_version) "
            "VALUES ($1, 'nowhere', 1, 1, 'online', now(), 1.0, 0)",
            self.worker_id,
        )
        self.beat = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self.conn.execute(
                "UPDATE taskfleet.workers SET last_heartbeat = now() WHERE id = $1",
                self.worker_id,
            )

    async def stop_beating(self) -> None:
        if self.beat is not None:
            self.beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.beat
            self.beat = None

    async def go_stale(self) -> None:
        """Its heartbeat is now far older than 3 x its interval: it is dead to the fleet."""
        await self.stop_beating()
        await self.conn.execute(
            "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '1 hour' WHERE id = $1",
            self.worker_id,
        )


@pytest.fixture
async def fake_worker(database_url: str) -> AsyncIterator[FakeWorker]:
    # A connection of its own: its heartbeat runs concurrently with the test's queries.
    fake = FakeWorker(await db.connect(database_url))
    try:
        await fake.start()
        yield fake
    finally:
        await fake.stop_beating()
        await fake.conn.close()


# --------------------------------------------------------------------------------------------
# Helpers


async def update_task_count(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM taskfleet.tasks WHERE type = $1", UPDATE_TASK_TYPE
        )
    )


class EventStream:
    """An NDJSON event stream read line by line as the server sends it."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines
        self.events: list[dict[str, Any]] = []

    async def next(self) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            async for line in self._lines:
                if line.strip():
                    event: dict[str, Any] = json.loads(line)
                    self.events.append(event)
                    return event
            raise AssertionError(f"the stream ended after {self.events}")

        return await asyncio.wait_for(read(), PATIENCE)

    async def until(self, predicate: Any) -> dict[str, Any]:
        while True:
            event = await self.next()
            if predicate(event):
                return event
            assert event["event"] not in FINAL, f"ended before the awaited event: {self.events}"

    async def rest(self) -> list[dict[str, Any]]:
        """Every remaining event; the stream must end right after the final one."""
        while not self.events or self.events[-1]["event"] not in FINAL:
            await self.next()
        leftover = [line async for line in self._lines if line.strip()]
        assert leftover == [], f"lines after the final event: {leftover}"
        return self.events


@contextlib.asynccontextmanager
async def put_stream(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    *,
    method: str = "PUT",
    path: str = "/runtime-config",
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[EventStream]:
    async with client.stream(
        method, path, json=body if method != "GET" else None, params=params, headers=headers
    ) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        yield EventStream(response.aiter_lines())


def assert_event_order(events: list[dict[str, Any]]) -> None:
    """enqueued -> version -> progress* -> exactly one final event, last."""
    kinds = [e["event"] for e in events]
    assert kinds[0] == "enqueued", kinds
    assert kinds.count("version") == 1, kinds
    assert kinds[1] == "version", kinds
    assert set(kinds[2:-1]) <= {"progress"}, kinds
    assert kinds[-1] in FINAL, kinds
    assert sum(k in FINAL for k in kinds) == 1, kinds
    version = events[1]["version"]
    for event in events[2:-1]:
        assert event["version"] == version
        assert event["alive_workers"] == event["applied_workers"] + len(event["lagging"])


async def wait_for_outcome(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    """Poll the request's status document until it has an outcome."""
    async with asyncio.timeout(PATIENCE):
        while True:
            response = await client.get(f"/runtime-config/requests/{request_id}")
            assert response.status_code == 200, response.text
            doc: dict[str, Any] = response.json()
            if doc["outcome"] is not None:
                return doc
            await asyncio.sleep(0.05)


async def sent_twice(
    client: httpx.AsyncClient, method: str, body: dict[str, Any]
) -> tuple[httpx.Response, httpx.Response]:
    """The same update sent twice without waiting (a client retrying): both accepted (202)."""
    first = await client.request(method, "/runtime-config", params={"wait": "false"}, json=body)
    again = await client.request(method, "/runtime-config", params={"wait": "false"}, json=body)
    assert first.status_code == again.status_code == 202
    return first, again


async def wait_for_task(conn: asyncpg.Connection, task_id: int) -> asyncpg.Record:
    """The update task once it has finished."""
    async with asyncio.timeout(PATIENCE):
        while True:
            row = await conn.fetchrow(
                "SELECT status, result, last_error FROM taskfleet.tasks WHERE id = $1", task_id
            )
            if row["status"] in ("completed", "failed", "cancelled"):
                return row
            await asyncio.sleep(0.05)


# --------------------------------------------------------------------------------------------
# The stream, in each representation


async def test_put_streams_ndjson_in_order_until_every_worker_converged(
    client: httpx.AsyncClient, fleet: list[Worker], conn: asyncpg.Connection
) -> None:
    body = {"maxStrictPercentage": 50, "labelWeights": {"a": 3, "b": 1}, "requestID": "r-1"}
    async with put_stream(client, body) as stream:
        events = await stream.rest()

    assert_event_order(events)
    assert events[0]["request_id"] == "r-1"
    assert isinstance(events[0]["task_id"], int)
    version = events[1]["version"]
    assert version == 1
    last_progress = events[-2]
    assert last_progress["event"] == "progress"
    assert (last_progress["alive_workers"], last_progress["applied_workers"]) == (3, 3)
    assert last_progress["lagging"] == []
    assert events[-1]["event"] == "converged"
    assert events[-1]["version"] == version
    assert events[-1]["seconds"] >= 0

    applied = await conn.fetch("SELECT id, applied_config_version FROM taskfleet.workers")
    assert {r["id"]: r["applied_config_version"] for r in applied} == {
        "w0": version,
        "w1": version,
        "w2": version,
    }
    for worker in fleet:
        assert worker.applied_version == version
    task = await wait_for_task(conn, events[0]["task_id"])
    assert task["status"] == "completed"
    assert task["result"]["outcome"] == "converged"
    assert task["result"]["version"] == version
    row = await conn.fetchrow(
        "SELECT priority, max_attempts, unique_key, payload FROM taskfleet.tasks WHERE id = $1",
        events[0]["task_id"],
    )
    assert row["priority"] == 2147483647
    assert row["unique_key"] == "runtime-config:r-1"
    assert row["payload"]["labelWeights"] == {"a": 3, "b": 1}
    assert row["payload"]["requestID"] == "r-1"

    # The streamed response went through the HTTP metrics like any other.
    metrics = (await client.get("/metrics")).text
    assert any(
        'handler="/runtime-config"' in line and 'method="PUT"' in line
        for line in metrics.splitlines()
        if line.startswith("http_request")
    ), "the streamed PUT is missing from the HTTP metrics"


async def test_events_arrive_as_they_happen_not_when_the_stream_ends(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
) -> None:
    async with put_stream(client, {"maxStrictPercentage": 30}) as stream:
        assert (await stream.next())["event"] == "enqueued"
        version = (await stream.next())["version"]
        # The fake worker holds convergence up, so the server cannot have finished: this line
        # is read while the response is still open.
        lagging = await stream.until(
            lambda e: e["event"] == "progress" and e["applied_workers"] == 3
        )
        assert lagging == {
            "event": "progress",
            "version": version,
            "alive_workers": 4,
            "applied_workers": 3,
            "lagging": ["fake"],
            "excluded": [],
        }
        await fake_worker.go_stale()
        events = await stream.rest()

    assert_event_order(events)
    assert events[-2]["alive_workers"] == 3 and events[-2]["lagging"] == []
    assert events[-1]["event"] == "converged" and events[-1]["version"] == version


async def test_a_worker_left_out_is_named_and_the_convergence_time_has_one_answer(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
    conn: asyncpg.Connection,
) -> None:
    # The fake's heartbeat simply stops (interval 1 s: it expires 3 s later), as a stalled
    # process's does: no ACK and no notification says so. With listenTimeout and notifyInterval
    # far above the stream's timeout, only the update task's look at the expiry decides in time.
    body = {"defaultWeight": 2, "requestID": "expiring", "listenTimeout": "600s"}
    body["notifyInterval"] = "600s"
    async with put_stream(client, body, params={"timeout": "20"}) as stream:
        assert (await stream.next())["event"] == "enqueued"
        await stream.until(lambda e: e["event"] == "progress" and e["lagging"] == ["fake"])
        await fake_worker.stop_beating()
        events = await stream.rest()
    assert_event_order(events)
    final = events[-1]
    left_out = [{"id": "fake", "reason": "heartbeat expired"}]
    assert final["event"] == "converged" and final["excluded"] == left_out, events

    # One number and one list, wherever they are reported: the request document, the update
    # task's stored result, and the histogram and counter of the worker that ran it.
    doc = await wait_for_outcome(client, "expiring")
    assert (doc["final"], doc["excluded"]) == (final, left_out)
    result = json.loads(
        await conn.fetchval(
            "SELECT result::text FROM taskfleet.tasks WHERE id = $1", events[0]["task_id"]
        )
    )
    assert (result["seconds"], result["excluded"]) == (final["seconds"], left_out)

    def total(name: str, **labels: str) -> float:
        return sum(w.metrics_registry.get_sample_value(name, labels) or 0.0 for w in fleet)

    assert total("anclax_runtime_config_convergence_seconds_count") == 1
    assert total("anclax_runtime_config_convergence_seconds_sum") == final["seconds"]
    excluded = "taskfleet_runtime_config_excluded_workers_total"
    assert total(excluded, reason="heartbeat expired") == 1


async def test_the_outcome_does_not_wait_for_the_regrouping(
    client: httpx.AsyncClient, fleet: list[Worker], database_url: str
) -> None:
    # A transaction open across the change holds the re-grouping back (an insert in it may
    # have read the old labels); the change's outcome, the update task's result, must not wait.
    async with contextlib.AsyncExitStack() as stack:
        racer = await db.connect(database_url)
        stack.push_async_callback(racer.close)
        transaction = racer.transaction()
        await transaction.start()
        stack.push_async_callback(transaction.rollback)
        await racer.execute("SELECT txid_current()")
        async with put_stream(client, {"labelWeights": {"a": 2}}, params={"timeout": "20"}) as s:
            events = await s.rest()
        assert events[-1]["event"] == "converged", events
        waiting = await racer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'taskfleet-regroup'"
            " AND datname = current_database()"
        )
        assert waiting == 1  # still re-grouping in the background, after the outcome


async def test_sse_sends_each_event_as_an_event_and_data_pair(
    client: httpx.AsyncClient, fleet: list[Worker]
) -> None:
    async with client.stream(
        "PUT",
        "/runtime-config",
        json={"defaultWeight": 2},
        headers={"Accept": "text/event-stream"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        raw = (await response.aread()).decode()

    assert raw.endswith("\n\n")
    events = []
    for block in raw.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2, block
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = json.loads(lines[1].removeprefix("data: "))
        assert data["event"] == lines[0].removeprefix("event: ")
        events.append(data)
    assert_event_order(events)
    assert events[-1]["event"] == "converged"


async def test_application_json_answers_one_document_with_the_outcome(
    client: httpx.AsyncClient, fleet: list[Worker]
) -> None:
    response = await client.put(
        "/runtime-config",
        json={"labels": ["x", "y"], "weights": [2, 5], "requestID": "doc-1"},
        headers={"Accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    doc = response.json()
    assert doc["outcome"] == "converged"
    assert doc["request_id"] == "doc-1"
    assert doc["version"] == 1
    assert doc["seconds"] >= 0
    assert isinstance(doc["task_id"], int)
    assert_event_order(doc["events"])
    assert doc["events"][-1] == {
        "event": "converged",
        "version": 1,
        "seconds": doc["seconds"],
        "excluded": [],
    }


async def test_wait_false_answers_202_then_status_and_watch_reattach(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
    conn: asyncpg.Connection,
) -> None:
    response = await client.put(
        "/runtime-config", params={"wait": "false"}, json={"requestID": "later/1 x"}
    )
    assert response.status_code == 202, response.text
    assert response.headers["location"] == "/runtime-config/requests/later%2F1%20x"
    accepted = response.json()
    assert accepted["request_id"] == "later/1 x"
    assert isinstance(accepted["task_id"], int)
    assert await update_task_count(conn) == 1

    # Re-attach while the fake worker lags: the same events, as a client that lost its stream
    # would see them.
    async with put_stream(
        client, {}, method="GET", path=response.headers["location"], params={"watch": "true"}
    ) as stream:
        first = await stream.next()
        assert first["event"] == "enqueued"
        assert (first["task_id"], first["request_id"]) == (accepted["task_id"], "later/1 x")
        version = (await stream.next())["version"]
        await stream.until(lambda e: e["event"] == "progress" and e["lagging"] == ["fake"])

        status = (await client.get(response.headers["location"])).json()
        assert status["outcome"] is None
        assert status["task_id"] == accepted["task_id"]
        assert status["task_status"] in ("pending", "running")
        assert status["version"] == version
        assert status["lagging"] == ["fake"]
        assert status["alive_workers"] == 4 and status["applied_workers"] == 3

        await fake_worker.go_stale()
        events = await stream.rest()
    assert_event_order(events)
    assert events[-1]["event"] == "converged"

    doc = await wait_for_outcome(client, "later/1 x")
    assert doc["outcome"] == "converged" and doc["version"] == version
    # Watching a finished request replays its state and its outcome at once.
    async with put_stream(
        client, {}, method="GET", path=response.headers["location"], params={"watch": "true"}
    ) as stream:
        replay = await stream.rest()
    assert_event_order(replay)
    assert replay[-1]["event"] == "converged" and replay[-1]["version"] == version

    unknown = await client.get("/runtime-config/requests/nope")
    assert unknown.status_code == 404
    assert unknown.json()["detail"][0]["loc"] == ["path", "request_id"]
    # Longer than any request id can be: refused, not echoed back in a 404 (it was, all of it).
    too_long = await client.get("/runtime-config/requests/" + "x" * 60_000)
    assert too_long.status_code == 422
    assert too_long.json()["detail"][0]["loc"] == ["path", "request_id"]
    assert len(too_long.text) < 1000
    assert (await client.get("/runtime-config/requests/nope?watch=true")).status_code == 404


# --------------------------------------------------------------------------------------------
# Validation: every rule is a 422 naming the field, and nothing is enqueued

INVALID_BODIES: list[tuple[Any, list[Any]]] = [
    ({"maxStrictPercentage": -1}, ["body", "maxStrictPercentage"]),
    ({"maxStrictPercentage": 101}, ["body", "maxStrictPercentage"]),
    ({"maxStrictPercentage": 50.5}, ["body", "maxStrictPercentage"]),
    ({"maxStrictPercentage": "50"}, ["body", "maxStrictPercentage"]),
    ({"maxStrictPercentage": True}, ["body", "maxStrictPercentage"]),
    ({"defaultWeight": 0}, ["body", "defaultWeight"]),
    ({"defaultWeight": "2"}, ["body", "defaultWeight"]),
    ({"labels": ["a", "b"], "weights": [1]}, ["body", "weights"]),
    ({"labels": ["a"]}, ["body", "weights"]),
    ({"weights": [1]}, ["body", "labels"]),
    ({"labels": [""], "weights": [1]}, ["body", "labels", 0]),
    ({"labels": ["a", 7], "weights": [1, 1]}, ["body", "labels", 1]),
    ({"labels": ["a"], "weights": [0]}, ["body", "weights", 0]),
    ({"labelWeights": {"a": 0}}, ["body", "labelWeights", "a"]),
    ({"labelWeights": {"": 2}}, ["body", "labelWeights", ""]),
    ({"labelWeights": ["a"]}, ["body", "labelWeights"]),
    ({"labelWeights": {"a": 1}, "labels": ["a"], "weights": [1]}, ["body", "labelWeights"]),
    ({"notifyInterval": "0s"}, ["body", "notifyInterval"]),
    ({"notifyInterval": "soon"}, ["body", "notifyInterval"]),
    ({"notifyInterval": -1}, ["body", "notifyInterval"]),
    ({"listenTimeout": "0ms"}, ["body", "listenTimeout"]),
    ({"listenTimeout": "2 s"}, ["body", "listenTimeout"]),
    ({"requestID": ""}, ["body", "requestID"]),
    ({"requestID": 5}, ["body", "requestID"]),
    ({"requestID": "x" * 201}, ["body", "requestID"]),
    ({"maxStrictPercent": 5}, ["body", "maxStrictPercent"]),
    ({"pausedLabels": "a"}, ["body", "pausedLabels"]),
    ({"pausedLabels": [""]}, ["body", "pausedLabels", 0]),
    ({"pausedLabels": ["a", "b\u0000"]}, ["body", "pausedLabels", 1]),
    ({"pausedTypes": ["updateWorkerRuntimeConfig"]}, ["body", "pausedTypes", 0]),
    ({"pausedTypes": [3]}, ["body", "pausedTypes", 0]),
    ({"pausedLanes": ["control"]}, ["body", "pausedLanes", 0]),
    ({"pausedLanes": ["fast"]}, ["body", "pausedLanes", 0]),
    ({"labelLimits": []}, ["body", "labelLimits"]),
    ({"labelLimits": {"a": {}}}, ["body", "labelLimits", "a"]),
    ({"labelLimits": {"a": 3}}, ["body", "labelLimits", "a"]),
    ({"labelLimits": {"a": {"maxInFlight": 0}}}, ["body", "labelLimits", "a", "maxInFlight"]),
    ({"labelLimits": {"a": {"maxInFlight": 1.5}}}, ["body", "labelLimits", "a", "maxInFlight"]),
    ({"labelLimits": {"a": {"ratePerSecond": 0}}}, ["body", "labelLimits", "a", "ratePerSecond"]),
    (
        {"labelLimits": {"a": {"ratePerSecond": 1e-320}}},
        ["body", "labelLimits", "a", "ratePerSecond"],
    ),
    # Under a nanosecond: it would be stored as "0s", which the same rules refuse later.
    ({"notifyInterval": "0.0000000001s"}, ["body", "notifyInterval"]),
    ({"listenTimeout": 1e-300}, ["body", "listenTimeout"]),
    ({"labelLimits": {"a": {"ratePerSecond": "4"}}}, ["body", "labelLimits", "a", "ratePerSecond"]),
    ({"labelLimits": {"a": {"rate": 4}}}, ["body", "labelLimits", "a", "rate"]),
    ({"labelLimits": {"": {"maxInFlight": 1}}}, ["body", "labelLimits", ""]),
    ([{"maxStrictPercentage": 5}], ["body"]),
    ("just a string", ["body"]),
]
INVALID_RAW: list[tuple[bytes, list[Any]]] = [
    (b"{not json", ["body"]),
    (b"", ["body"]),
    (b'{"maxStrictPercentage": NaN}', ["body"]),
    (b'{"pausedLabels": ["\\ud800"]}', ["body", "pausedLabels", 0]),
    (b'{"labelLimits": {"\\ud800": {"maxInFlight": 1}}}', ["body", "labelLimits", "\\ud800"]),
]
INVALID_QUERIES: list[tuple[dict[str, str], list[Any]]] = [
    ({"timeout": "0"}, ["query", "timeout"]),
    ({"timeout": "-1"}, ["query", "timeout"]),
    ({"timeout": "3601"}, ["query", "timeout"]),
    ({"timeout": "soon"}, ["query", "timeout"]),
    ({"timeout": "nan"}, ["query", "timeout"]),
    ({"wait": "maybe"}, ["query", "wait"]),
]


async def test_every_validation_rule_is_a_422_naming_the_field_and_nothing_is_enqueued(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    failures: list[str] = []

    def check(case: object, response: httpx.Response, loc: list[Any]) -> None:
        if response.status_code != 422:
            failures.append(f"{case!r}: {response.status_code} {response.text}")
            return
        detail = response.json()["detail"]
        if loc not in [item["loc"] for item in detail] or not all(d["msg"] for d in detail):
            failures.append(f"{case!r}: expected loc {loc}, got {detail}")

    for method in ("PUT", "PATCH"):
        for body, loc in INVALID_BODIES:
            check((method, body), await client.request(method, "/runtime-config", json=body), loc)
        for raw, loc in INVALID_RAW:
            response = await client.request(
                method,
                "/runtime-config",
                content=raw,
                headers={"Content-Type": "application/json"},
            )
            check((method, raw), response, loc)
        for params, loc in INVALID_QUERIES:
            response = await client.request(
                method, "/runtime-config", params=params, json={"maxStrictPercentage": 5}
            )
            check((method, params), response, loc)
    response = await client.get("/runtime-config/requests/x", params={"timeout": "0"})
    check(("GET", "timeout=0"), response, ["query", "timeout"])

    # A body's every broken rule is reported, each with its own field, and rule text.
    response = await client.put(
        "/runtime-config", json={"maxStrictPercentage": 200, "defaultWeight": 0}
    )
    detail = response.json()["detail"]
    assert {tuple(d["loc"]) for d in detail} == {
        ("body", "maxStrictPercentage"),
        ("body", "defaultWeight"),
    }
    assert all(d["type"] == "value_error" for d in detail)
    assert "[0, 100]" in next(d["msg"] for d in detail if d["loc"][1] == "maxStrictPercentage")

    assert failures == []
    assert await update_task_count(conn) == 0
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.worker_runtime_configs") == 0


async def test_a_patch_over_a_latest_version_that_breaks_a_rule_is_a_409(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # Stored by an older version under looser rules (a "0s" interval): nothing to merge into.
    # It answered 500.
    await conn.execute(
        "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)"
        " VALUES ('old-rules', $1::jsonb)",
        json.dumps({"requestID": "old-rules", "notifyInterval": "0s"}),
    )
    response = await client.patch("/runtime-config", json={"maxStrictPercentage": 50})
    assert response.status_code == 409, response.text
    (item,) = response.json()["detail"]
    assert "notifyInterval" in item["msg"] and "PUT a whole config" in item["msg"]
    assert await update_task_count(conn) == 0


async def test_an_accept_header_with_no_offered_type_is_a_406_before_anything_is_enqueued(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    response = await client.put("/runtime-config", json={}, headers={"Accept": "text/html"})
    assert response.status_code == 406
    assert response.json()["detail"][0]["loc"] == ["header", "accept"]
    assert await update_task_count(conn) == 0


def test_accept_negotiation_prefers_the_most_specific_and_highest_quality_type() -> None:
    negotiate = negotiation.negotiate
    assert negotiate(None) == "application/x-ndjson"
    assert negotiate("") == "application/x-ndjson"
    assert negotiate("*/*") == "application/x-ndjson"
    assert negotiate("application/x-ndjson") == "application/x-ndjson"
    assert negotiate("application/jsonl") == "application/jsonl"
    assert negotiate("text/event-stream") == "text/event-stream"
    assert negotiate("application/json") == "application/json"
    assert negotiate("application/json, */*;q=0.5") == "application/json"
    assert negotiate("text/event-stream;q=0.4, application/json;q=0.9") == "application/json"
    assert negotiate("application/*") == "application/x-ndjson"
    assert negotiate("text/*") == "text/event-stream"
    assert negotiate("*/*, application/x-ndjson;q=0") == "application/jsonl"
    assert negotiate("text/html") is None
    assert negotiate("garbage") is None


# --------------------------------------------------------------------------------------------
# Outcomes other than converged


async def test_overlapping_updates_the_first_is_superseded_the_second_converges(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
    conn: asyncpg.Connection,
) -> None:
    async with put_stream(client, {"maxStrictPercentage": 10}) as first:
        await first.until(lambda e: e["event"] == "progress" and e["lagging"] == ["fake"])
        first_version = first.events[1]["version"]
        async with put_stream(client, {"maxStrictPercentage": 20}) as second:
            second_version = (await second.until(lambda e: e["event"] == "version"))["version"]
            assert second_version > first_version
            first_events = await first.rest()
            await second.until(lambda e: e["event"] == "progress" and e["lagging"] == ["fake"])
            await fake_worker.go_stale()
            second_events = await second.rest()

    assert_event_order(first_events)
    assert first_events[-1] == {
        "event": "superseded",
        "version": first_version,
        "superseded_by": second_version,
    }
    assert_event_order(second_events)
    assert second_events[-1]["event"] == "converged"
    assert second_events[-1]["version"] == second_version

    # The update tasks end the same way.
    first_task = await wait_for_task(conn, first_events[0]["task_id"])
    second_task = await wait_for_task(conn, second_events[0]["task_id"])
    assert first_task["result"]["outcome"] == "superseded"
    assert second_task["result"]["outcome"] == "converged"
    for worker in fleet:
        assert worker.applied_version == second_version


async def test_a_timeout_names_the_lagging_worker_and_the_task_goes_on(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
    conn: asyncpg.Connection,
) -> None:
    async with put_stream(
        client, {"defaultWeight": 3, "requestID": "slow"}, params={"timeout": "2"}
    ) as stream:
        events = await stream.rest()
    assert_event_order(events)
    version = events[1]["version"]
    assert events[-1] == {
        "event": "timeout",
        "version": version,
        "lagging": ["fake"],
        "alive_workers": 4,
        "excluded": [],
    }

    # The config task goes on after the stream gave up; it converges once the fake is gone.
    status = await conn.fetchval(
        "SELECT status FROM taskfleet.tasks WHERE id = $1", events[0]["task_id"]
    )
    assert status in ("pending", "running")
    await fake_worker.go_stale()
    doc = await wait_for_outcome(client, "slow")
    assert doc["outcome"] == "converged" and doc["version"] == version


async def test_progress_is_repeated_as_a_heartbeat_while_nothing_changes(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config_stream, "PROGRESS_HEARTBEAT_SECONDS", 0.2)
    async with put_stream(client, {"defaultWeight": 4}, params={"timeout": "3"}) as stream:
        events = await stream.rest()
    assert_event_order(events)
    stuck = [e for e in events if e["event"] == "progress" and e["lagging"] == ["fake"]]
    assert len(stuck) >= 2, events
    assert all(e == stuck[0] for e in stuck)
    assert events[-1]["event"] == "timeout"


async def test_with_no_alive_worker_the_stream_says_so_and_times_out(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    async with put_stream(client, {}, params={"timeout": "0.5"}) as stream:
        events = await stream.rest()
    kinds = [e["event"] for e in events]
    assert kinds == ["enqueued", "progress", "timeout"], events
    assert events[1] == {
        "event": "progress",
        "version": None,
        "alive_workers": 0,
        "applied_workers": 0,
        "lagging": [],
        "excluded": [],
    }
    assert events[2] == {
        "event": "timeout",
        "version": None,
        "lagging": [],
        "alive_workers": 0,
        "excluded": [],
        "reason": NO_ALIVE_WORKER,
    }
    # Enqueued all the same: the first worker to come up will run it.
    assert await update_task_count(conn) == 1


async def test_a_failed_update_task_ends_the_stream_with_failed(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    response = await client.put(
        "/runtime-config", params={"wait": "false"}, json={"requestID": "doomed"}
    )
    task_id = response.json()["task_id"]
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'failed', finished_at = now(), "
        "last_error = 'invalid runtime config: boom' WHERE id = $1",
        task_id,
    )
    async with put_stream(
        client,
        {},
        method="GET",
        path="/runtime-config/requests/doomed",
        params={"watch": "true"},
    ) as stream:
        events = await stream.rest()
    assert events == [
        {"event": "enqueued", "task_id": task_id, "request_id": "doomed", "deduplicated": True},
        {"event": "failed", "error": "invalid runtime config: boom"},
    ]
    doc = (await client.get("/runtime-config/requests/doomed")).json()
    assert doc["outcome"] == "failed" and doc["task_status"] == "failed"


# --------------------------------------------------------------------------------------------
# The control lane, stale workers, idempotency, PATCH, GET


async def test_the_control_lane_cannot_lock_itself_out(
    client: httpx.AsyncClient, fleet: list[Worker], conn: asyncpg.Connection
) -> None:
    async with put_stream(client, {"maxStrictPercentage": 0}) as stream:
        events = await stream.rest()
    assert events[-1]["event"] == "converged"
    for worker in fleet:
        assert worker.applied_version == events[1]["version"]

    # Fill every slot of every worker with normal work, and queue strict work the cap of 0
    # keeps waiting: the next change must still get through.
    for _ in range(6):
        response = await client.post(
            "/tasks", json={"type": "demo.sleep", "payload": {"seconds": 60}}, headers=SUBMIT
        )
        assert response.status_code == 201, response.text
    for _ in range(3):
        response = await client.post(
            "/tasks",
            json={"type": "demo.sleep", "payload": {"seconds": 60}, "priority": 5},
            headers=SUBMIT,
        )
        assert response.status_code == 201, response.text
    async with asyncio.timeout(PATIENCE):
        while True:
            running = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks "
                "WHERE status = 'running' AND type = 'demo.sleep'"
            )
            if running == 6:
                break
            await asyncio.sleep(0.05)

    async with put_stream(client, {"maxStrictPercentage": 0, "defaultWeight": 2}) as stream:
        events = await stream.rest()
    assert_event_order(events)
    assert events[-1]["event"] == "converged"
    for worker in fleet:
        assert worker.applied_version == events[1]["version"]
    strict_running = await conn.fetchval(
        "SELECT count(*) FROM taskfleet.tasks WHERE status = 'running' AND priority = 5"
    )
    assert strict_running == 0


async def test_a_stale_worker_does_not_hold_convergence_up(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
) -> None:
    await fake_worker.go_stale()
    async with put_stream(client, {"maxStrictPercentage": 70}) as stream:
        events = await stream.rest()
    assert_event_order(events)
    assert all(e["alive_workers"] == 3 for e in events if e["event"] == "progress")
    assert events[-1]["event"] == "converged"
    status = (await client.get("/runtime-config")).json()
    assert [w["id"] for w in status["workers"]] == ["w0", "w1", "w2"]


async def test_a_patch_reusing_a_request_id_for_other_changes_is_a_409(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
    conn: asyncpg.Connection,
) -> None:
    # It attached to the first PATCH's request and answered its outcome: the second change
    # (here a pause of the normal lane) was never made, and the caller was told it converged.
    body = {"maxStrictPercentage": 10, "requestID": "patch-once"}
    _, again = await sent_twice(client, "PATCH", body)
    assert again.json()["deduplicated"] is True
    clash = await client.patch(
        "/runtime-config",
        params={"wait": "false"},
        json={"pausedLanes": ["normal"], "maxStrictPercentage": 90, "requestID": "patch-once"},
    )
    assert clash.status_code == 409, clash.text
    assert clash.json()["detail"][0]["loc"] == ["body", "requestID"]
    assert await update_task_count(conn) == 1


async def test_a_retried_put_attaches_to_its_request_instead_of_enqueueing_again(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
    conn: asyncpg.Connection,
) -> None:
    body = {"maxStrictPercentage": 40, "requestID": "retry-me"}
    first, again = await sent_twice(client, "PUT", body)
    assert first.json()["deduplicated"] is False
    assert again.json()["deduplicated"] is True
    assert again.json()["task_id"] == first.json()["task_id"]
    assert await update_task_count(conn) == 1

    # The same request id for a different config is refused, not silently attached.
    clash = await client.put(
        "/runtime-config", json={"maxStrictPercentage": 41, "requestID": "retry-me"}
    )
    assert clash.status_code == 409
    assert clash.json()["detail"][0]["loc"] == ["body", "requestID"]

    await fake_worker.go_stale()
    doc = await wait_for_outcome(client, "retry-me")
    assert doc["outcome"] == "converged"
    # After it finished, a retry still attaches: one request id is one version.
    async with put_stream(client, body) as stream:
        events = await stream.rest()
    assert events[0]["task_id"] == first.json()["task_id"]
    assert events[0]["deduplicated"] is True
    assert events[1]["version"] == doc["version"]
    assert events[-1]["event"] == "converged"
    assert await update_task_count(conn) == 1
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.worker_runtime_configs") == 1


async def test_patch_merges_into_the_latest_version(
    client: httpx.AsyncClient, fleet: list[Worker]
) -> None:
    async with put_stream(
        client, {"maxStrictPercentage": 50, "labelWeights": {"a": 3}, "requestID": "base"}
    ) as stream:
        assert (await stream.rest())[-1]["event"] == "converged"
    async with put_stream(client, {"defaultWeight": 2}, method="PATCH") as stream:
        events = await stream.rest()
    assert_event_order(events)
    assert events[-1]["event"] == "converged"
    assert events[0]["request_id"] != "base"

    doc = (await client.get("/runtime-config")).json()
    assert doc["version"] == events[1]["version"] == 2
    assert doc["request_id"] == events[0]["request_id"]
    assert doc["payload"]["maxStrictPercentage"] == 50
    assert doc["payload"]["labelWeights"] == {"a": 3}
    assert doc["payload"]["defaultWeight"] == 2

    # PATCH with the pair form replaces the weight map, and keeps the rest.
    async with put_stream(
        client, {"labels": ["b"], "weights": [4]}, method="PATCH", params={"timeout": "10"}
    ) as stream:
        assert (await stream.rest())[-1]["event"] == "converged"
    payload = (await client.get("/runtime-config")).json()["payload"]
    assert payload["labelWeights"] == {"b": 4}
    assert (payload["maxStrictPercentage"], payload["defaultWeight"]) == (50, 2)


async def test_concurrent_patches_compose(
    client: httpx.AsyncClient, fleet: list[Worker], conn: asyncpg.Connection
) -> None:
    # Two PATCHes at once, one field each: both fields must be in the final version. (The API
    # merged against the version it read, so one of the two was lost in 5 rounds of 5.)
    json_doc = {"Accept": "application/json"}
    for round_ in range(5):
        strict, weight = 10 + round_, 2 + round_
        answers = await asyncio.gather(
            client.patch("/runtime-config", json={"maxStrictPercentage": strict}, headers=json_doc),
            client.patch("/runtime-config", json={"labelWeights": {"r": weight}}, headers=json_doc),
        )
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert answer.json()["outcome"] in ("converged", "superseded"), answer.json()
        payload = (await client.get("/runtime-config")).json()["payload"]
        assert (payload["maxStrictPercentage"], payload["labelWeights"]) == (
            strict,
            {"r": weight},
        ), f"round {round_}: {payload}"
    assert await conn.fetchval("SELECT count(*) FROM taskfleet.worker_runtime_configs") == 10


async def test_get_runtime_config_shows_the_latest_version_and_each_alive_worker(
    client: httpx.AsyncClient, fleet: list[Worker], fake_worker: FakeWorker
) -> None:
    doc = (await client.get("/runtime-config")).json()
    assert doc["version"] == 0
    assert doc["request_id"] is None
    assert doc["payload"]["maxStrictPercentage"] == 100
    assert doc["payload"]["labelWeights"] == {}
    assert [(w["id"], w["applied_config_version"]) for w in doc["workers"]] == [
        ("fake", 0),
        ("w0", 0),
        ("w1", 0),
        ("w2", 0),
    ]

    await fake_worker.go_stale()
    async with put_stream(client, {"labelWeights": {"z": 9}, "requestID": "shown"}) as stream:
        events = await stream.rest()
    assert events[-1]["event"] == "converged"
    doc = (await client.get("/runtime-config")).json()
    assert doc["version"] == 1
    assert doc["request_id"] == "shown"
    assert doc["payload"]["labelWeights"] == {"z": 9}
    assert doc["created_at"] is not None
    assert doc["workers"] == [
        {"id": f"w{i}", "applied_config_version": 1, "up_to_date": True} for i in range(3)
    ]
    assert (doc["alive_workers"], doc["applied_workers"], doc["lagging"]) == (3, 3, [])


# --------------------------------------------------------------------------------------------
# Auth


async def test_runtime_config_needs_the_admin_role(
    api: RunningApi, conn: asyncpg.Connection
) -> None:
    calls = [
        ("PUT", "/runtime-config", {"maxStrictPercentage": 5}),
        ("PATCH", "/runtime-config", {"maxStrictPercentage": 5}),
        ("GET", "/runtime-config", None),
        ("GET", "/runtime-config/requests/x", None),
    ]
    async with httpx.AsyncClient(base_url=api.url, timeout=PATIENCE) as anonymous:
        for method, path, body in calls:
            response = await anonymous.request(method, path, json=body)
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
            wrong = await anonymous.request(
                method, path, json=body, headers={"Authorization": "Bearer not-a-token"}
            )
            assert wrong.status_code == 401, (method, path)
            submit = await anonymous.request(method, path, json=body, headers=SUBMIT)
            assert submit.status_code == 403, (method, path, submit.text)
        # Unauthorised callers learn nothing about the body's validity either.
        response = await anonymous.put("/runtime-config", content=b"{broken", headers=SUBMIT)
        assert response.status_code == 403
    assert await update_task_count(conn) == 0


# --------------------------------------------------------------------------------------------
# Resources


async def test_open_streams_do_not_hold_pooled_connections(
    database_url: str, fleet: list[Worker], fake_worker: FakeWorker
) -> None:
    """Six streams share a pool of two: each poll borrows a connection and gives it back, and a
    client that goes away mid-stream leaves nothing checked out."""
    settings = ApiSettings(database_url=database_url, api_tokens=TOKENS, db_pool_size=2)
    with running_api(settings) as small:
        engine = small.app.state.api.database.engine
        async with (
            httpx.AsyncClient(base_url=small.url, headers=ADMIN, timeout=PATIENCE) as http,
            contextlib.AsyncExitStack() as streams,
        ):
            opened = [
                await streams.enter_async_context(
                    put_stream(http, {"defaultWeight": 5, "requestID": "shared"})
                )
                for _ in range(6)
            ]
            for stream in opened:
                await stream.until(lambda e: e["event"] == "progress" and e["lagging"] == ["fake"])
            # Still open, and the pool serves other requests at once.
            assert (await http.get("/runtime-config")).status_code == 200
        async with asyncio.timeout(PATIENCE):
            while True:
                if engine.pool.checkedout() == 0:
                    break
                await asyncio.sleep(0.05)


async def test_a_long_stream_does_not_swamp_the_http_latency_histogram(
    client: httpx.AsyncClient,
    fleet: list[Worker],
    fake_worker: FakeWorker,
) -> None:
    # The lagging fake keeps the stream open until its 3 s timeout: the request lasts >= 3 s.
    async with put_stream(
        client, {"defaultWeight": 2, "requestID": "long"}, params={"timeout": "3"}
    ) as stream:
        events = await stream.rest()
    assert events[-1]["event"] == "timeout"

    metrics = (await client.get("/metrics")).text
    durations = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("http_request_duration_seconds_sum")
        and 'handler="/runtime-config"' in line
        and 'method="PUT"' in line
    ]
    assert durations, "the PUT is missing from the latency histogram"
    # Recorded as time to the first event, not the 3 s the stream stayed open.
    assert durations[0] < 2.0, durations


# --------------------------------------------------------------------------------------------
# Cancelling a config change: refused; and the document of one cancelled earlier is honest


async def test_the_config_update_task_cannot_be_cancelled(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # No worker: the update task stays pending.
    response = await client.put(
        "/runtime-config", params={"wait": "false"}, json={"requestID": "keep-me"}
    )
    task_id = response.json()["task_id"]
    refused = await client.post(f"/tasks/{task_id}/cancel")
    assert refused.status_code == 409, refused.text
    assert "PUT a new config" in refused.json()["detail"]
    row = await conn.fetchrow(
        "SELECT status, cancel_requested FROM taskfleet.tasks WHERE id = $1", task_id
    )
    assert (row["status"], row["cancel_requested"]) == ("pending", False)


async def test_a_request_cancelled_before_it_wrote_a_version_says_so(
    client: httpx.AsyncClient, fleet: list[Worker], conn: asyncpg.Connection
) -> None:
    async with put_stream(client, {"requestID": "first"}) as stream:
        assert (await stream.rest())[-1]["event"] == "converged"
    # A config task cancelled by an earlier version, before it ran.
    task_id = await conn.fetchval(
        "INSERT INTO taskfleet.tasks (type, payload, priority, status, finished_at,"
        " cancel_requested, last_error) VALUES ($1, $2::jsonb, 2147483647, 'cancelled', now(),"
        " true, 'cancelled before it started') RETURNING id",
        UPDATE_TASK_TYPE,
        json.dumps({"requestID": "cancelled-early", "defaultWeight": 3}),
    )
    doc = (await client.get("/runtime-config/requests/cancelled-early")).json()
    assert doc["task_id"] == task_id and doc["task_status"] == "cancelled"
    assert doc["version"] is None
    assert doc["latest_version"] == 1  # not null: the fleet's latest is known
    assert doc["lagging"] == []  # nobody is expected to apply a version that does not exist
    assert doc["outcome"] == "failed"
    assert "before it wrote a version" in doc["final"]["error"]


async def test_a_request_cancelled_after_its_version_was_applied_reports_what_happened(
    client: httpx.AsyncClient, fleet: list[Worker], conn: asyncpg.Connection
) -> None:
    async with put_stream(client, {"requestID": "applied", "defaultWeight": 4}) as stream:
        assert (await stream.rest())[-1]["event"] == "converged"
    # As an earlier version let a running update task be cancelled after it wrote its version.
    await conn.execute(
        "UPDATE taskfleet.tasks SET status = 'cancelled', result = NULL, last_error = 'cancelled'"
        " WHERE type = $1 AND payload ->> 'requestID' = 'applied'",
        UPDATE_TASK_TYPE,
    )
    doc = (await client.get("/runtime-config/requests/applied")).json()
    assert doc["task_status"] == "cancelled"
    assert (doc["version"], doc["outcome"]) == (1, "converged"), doc


# --------------------------------------------------------------------------------------------
# A change that cannot converge ends, after a bounded time; no alive worker is not convergence


async def test_a_change_that_cannot_converge_times_out_and_frees_the_control_slot(
    client: httpx.AsyncClient, database_url: str, fake_worker: FakeWorker
) -> None:
    # The fake worker is alive and never applies anything: the update task gives up after its
    # deadline, naming it, instead of re-notifying forever with the control slot held.
    settings = WorkerSettings(
        database_url=database_url,
        worker_id="writer",
        metrics_port=0,
        heartbeat_interval=0.2,
        lease_ttl=1.0,
        poll_interval=0.2,
        runtime_config_deadline=1.0,
    )
    worker = Worker(settings, load_registry([]))
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.ready.wait(), PATIENCE)
        answer = await client.put(
            "/runtime-config",
            json={"requestID": "stuck", "defaultWeight": 2},
            headers={"Accept": "application/json"},
        )
        doc = answer.json()
        assert (doc["outcome"], doc["lagging"]) == ("timeout", ["fake"]), doc
        request = (await client.get("/runtime-config/requests/stuck")).json()
        assert (request["task_status"], request["outcome"]) == ("completed", "timeout")
        assert request["final"]["lagging"] == ["fake"]
        # The control slot is free: the next change runs (and converges once fake is gone).
        await fake_worker.go_stale()
        answer = await client.put(
            "/runtime-config",
            json={"requestID": "next", "defaultWeight": 3},
            headers={"Accept": "application/json"},
        )
        assert answer.json()["outcome"] == "converged", answer.json()
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, PATIENCE)


async def test_no_alive_worker_is_not_reported_as_converged(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # A version written while no worker is alive (its writer died since): nobody runs it.
    await conn.execute(
        "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)"
        " VALUES ('orphan', $1::jsonb)",
        json.dumps({"requestID": "orphan", "defaultWeight": 5}),
    )
    doc = (await client.get("/runtime-config/requests/orphan")).json()
    assert (doc["version"], doc["alive_workers"], doc["outcome"]) == (1, 0, None), doc
    async with put_stream(
        client,
        {},
        method="GET",
        path="/runtime-config/requests/orphan",
        params={"watch": "true", "timeout": "0.5"},
    ) as stream:
        events = await stream.rest()
    final = events[-1]
    assert final["event"] == "timeout", events
    assert (final["alive_workers"], final["lagging"]) == (0, [])
    assert "no alive worker" in final["reason"]


async def test_a_watcher_is_woken_by_the_fleet_not_by_its_poll(
    client: httpx.AsyncClient, fleet: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polls an hour apart: the request can only finish within PATIENCE if the version's
    # announcement and the workers' ACKs wake the API's watcher (the update task's result, which
    # nothing announces, is then looked for with the quick polls that follow a decided view).
    monkeypatch.setattr(config_stream, "POLL_MIN_SECONDS", 3600.0)
    monkeypatch.setattr(config_stream, "POLL_MAX_SECONDS", 3600.0)
    response = await client.put(
        "/runtime-config",
        json={"labelWeights": {"woken": 3}, "requestID": "woken-1"},
        headers={"Accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "converged"


async def test_without_its_listener_the_api_still_answers_by_polling(
    database_url: str, fleet: list[Worker]
) -> None:
    # The API's LISTEN session cannot connect (nothing listens on port 1): the watchers poll.
    settings = ApiSettings(
        database_url=database_url,
        api_tokens=TOKENS,
        listen_database_url="postgresql://postgres@127.0.0.1:1/postgres",
    )
    with running_api(settings) as api:
        async with httpx.AsyncClient(
            base_url=api.url, headers=ADMIN, timeout=httpx.Timeout(PATIENCE)
        ) as http:
            response = await http.put(
                "/runtime-config",
                json={"labelWeights": {"polled": 2}, "requestID": "polled-1"},
                headers={"Accept": "application/json"},
            )
        signals = api.app.state.api.config_signals
        assert signals is not None and not signals.connected
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "converged"
