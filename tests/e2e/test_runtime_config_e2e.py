"""The runtime-config protocol (docs/reference.md#runtime-config) with real processes.

``taskfleet api`` under uvicorn and several ``taskfleet worker`` processes against one fresh
database; config changes go through ``PUT /runtime-config`` (streamed NDJSON, read line by line
as it arrives) or the ``taskfleet config`` CLI, and every claim about the fleet is checked where
an operator would see it: each worker's own ``/metrics``, the ``workers`` rows, the stream.

Where a version must lag on purpose, a "fake" worker row is registered by hand and kept alive by
the test's own heartbeat: it never applies anything, so nothing converges until the test lets
its heartbeat go stale. Nothing here asserts on a wall-clock gap (CI shares two cores): waits
poll a condition with a generous deadline; measured seconds are printed, not asserted. (The last
test gives a millisecond step 30 s, against idle timers of 60 s and more.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.fleet import ADMIN_TOKEN, Fleet, Proc, eventually, taskfleet_command, wait_http

pytestmark = pytest.mark.e2e

#: Bound on every wait: generous, because CI shares two cores with everything else.
PATIENCE = 60.0
CONFIG_CHANNEL = "anclax_worker_runtime_config"
ACK_CHANNEL = "anclax_worker_runtime_config_ack"
TASK_READY_CHANNEL = "taskfleet_task_ready"
UPDATE_TASK_TYPE = "updateWorkerRuntimeConfig"
FINAL = frozenset({"converged", "superseded", "timeout", "failed"})
#: pg_notify refuses a payload of 8000 bytes or more.
NOTIFY_LIMIT = 8000
REPO_ROOT = Path(__file__).resolve().parents[2]


def expected_strict_cap(concurrency: int, percent: int) -> int:
    """docs/reference.md#strict-cap, written out again here so the test checks the product's
    formula, not itself."""
    if percent <= 0:
        return 0
    if percent >= 100:
        return concurrency
    return math.ceil(concurrency * percent / 100)


# --------------------------------------------------------------------------------------------
# Processes and metrics


async def start_workers(
    fleet: Fleet,
    concurrency: dict[str, int],
    *,
    extra_env: dict[str, str] | None = None,
) -> list[Proc]:
    """Start the workers side by side (start-up dominates these tests), then wait until every
    one is ready."""
    procs = [
        await fleet.start_worker(
            worker_id, concurrency=slots, extra_env=extra_env, wait_ready=False
        )
        for worker_id, slots in concurrency.items()
    ]
    await asyncio.gather(
        *(wait_http(f"http://127.0.0.1:{p.port}/readyz", p, timeout=PATIENCE) for p in procs)
    )
    return procs


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` scrape: sample name + labels -> value."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when it was never set (a counter not yet incremented)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


async def scrape(proc: Proc) -> Scrape:
    async with httpx.AsyncClient(timeout=10.0) as http:
        response = await http.get(f"http://127.0.0.1:{proc.port}/metrics")
    response.raise_for_status()
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(samples)


async def scrape_all(procs: Iterable[Proc]) -> list[Scrape]:
    return list(await asyncio.gather(*(scrape(p) for p in procs)))


async def assert_ready(procs: Iterable[Proc]) -> None:
    async with httpx.AsyncClient(timeout=10.0) as http:
        for proc in procs:
            assert proc.alive(), f"{proc.name} exited:\n{proc.log()[-3000:]}"
            ready = await http.get(f"http://127.0.0.1:{proc.port}/readyz")
            assert ready.status_code == 200, (proc.name, ready.text)


# --------------------------------------------------------------------------------------------
# The PUT /runtime-config stream


@dataclass
class ConfigStream:
    """One ``PUT /runtime-config`` NDJSON stream, read line by line in the background."""

    client: httpx.AsyncClient
    body: dict[str, Any]
    timeout: float = PATIENCE
    events: list[dict[str, Any]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    def start(self) -> ConfigStream:
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            async with self.client.stream(
                "PUT",
                "/runtime-config",
                json=self.body,
                params={"timeout": self.timeout},
                timeout=httpx.Timeout(10.0, read=self.timeout + 30),
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise AssertionError(f"PUT {response.status_code}: {response.text}")
                assert response.headers["content-type"].startswith("application/x-ndjson")
                async for line in response.aiter_lines():
                    if line.strip():
                        self.events.append(json.loads(line))
                        self._changed.set()
        finally:
            self._changed.set()

    @property
    def done(self) -> bool:
        return self._reader is not None and self._reader.done()

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = PATIENCE
    ) -> dict[str, Any]:
        """The first event (seen so far or to come) that satisfies ``predicate``."""
        assert self._reader is not None, "start() first"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for event in self.events:
                if predicate(event):
                    return event
            if self._reader.done():
                self._reader.result()  # the reader's own failure, if it failed
                raise AssertionError(f"the stream ended without such an event: {self.events}")
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no such event within {timeout}s: {self.events}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def finished(self) -> list[dict[str, Any]]:
        """Every event, once the stream has ended (after its final event)."""
        assert self._reader is not None, "start() first"
        await asyncio.wait_for(asyncio.shield(self._reader), self.timeout + 30)
        return self.events

    async def close(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


async def put_config(client: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    stream = ConfigStream(client, body).start()
    try:
        return await stream.finished()
    finally:
        await stream.close()


def check_event_order(events: list[dict[str, Any]], final: str) -> int:
    """enqueued -> version -> progress* -> exactly one final event; returns the version.

    Before the version exists, only the 15 s heartbeat progress (version null) may appear.
    """
    names = [e["event"] for e in events]
    assert names[0] == "enqueued", names
    assert events[0]["task_id"] is not None
    assert names.count("version") == 1, names
    at = names.index("version")
    for event in events[1:at]:
        assert event["event"] == "progress" and event["version"] is None, events
    assert all(n == "progress" for n in names[at + 1 : -1]), names
    assert names[-1] == final, events
    version = events[at]["version"]
    assert isinstance(version, int) and version >= 1
    for event in events[at + 1 :]:
        assert event["version"] == version, events
    return int(version)


def progress_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "progress"]


# --------------------------------------------------------------------------------------------
# A worker row that lags on purpose


@dataclass
class FakeWorker:
    """A registered worker row with a fresh heartbeat that never applies a config: it holds
    every version up for as long as the test keeps it beating."""

    conn: asyncpg.Connection
    worker_id: str = "fake"
    beat: asyncio.Task[None] | None = None

    @classmethod
    async def register(cls, fleet: Fleet, worker_id: str = "fake") -> FakeWorker:
        fake = cls(await fleet.connect(), worker_id)
        await fake.conn.execute(
            "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status, "
            "last_heartbeat, heartbeat_interval, applied_config_version) "
            "VALUES ($1, 'nowhere', 1, 1, 'online', now(), 1.0, 0)",
            worker_id,
        )
        fake.beat = asyncio.create_task(fake._beat())
        return fake

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self.conn.execute(
                "UPDATE taskfleet.workers SET last_heartbeat = now() WHERE id = $1",
                self.worker_id,
            )

    async def go_stale(self) -> None:
        """Stop beating and age the heartbeat far past 3 x its interval: dead to the fleet."""
        await self._stop_beating()
        await self.conn.execute(
            "UPDATE taskfleet.workers SET last_heartbeat = now() - interval '1 hour' WHERE id = $1",
            self.worker_id,
        )

    async def _stop_beating(self) -> None:
        if self.beat is not None:
            self.beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.beat
            self.beat = None

    async def close(self) -> None:
        await self._stop_beating()
        await self.conn.close()


async def notify(conn: asyncpg.Connection, channel: str, payload: str) -> None:
    await conn.execute("SELECT pg_notify($1, $2)", channel, payload)


async def update_task_results(conn: asyncpg.Connection) -> list[Any]:
    rows = await conn.fetch(
        "SELECT status, result FROM taskfleet.tasks WHERE type = $1 ORDER BY id", UPDATE_TASK_TYPE
    )
    # Fleet.connect() is a plain asyncpg connection: jsonb arrives as text.
    return [(r["status"], json.loads(r["result"]) if r["result"] else None) for r in rows]


# --------------------------------------------------------------------------------------------
# 1. Convergence across three worker processes


async def test_put_converges_across_three_worker_processes(database_url: str) -> None:
    concurrency = {"w1": 3, "w2": 4, "w3": 7}
    percent = 30
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        workers = await start_workers(fleet, concurrency)
        async with fleet.client() as client:
            events = await put_config(
                client, {"maxStrictPercentage": percent, "labelWeights": {"a": 3, "b": 1}}
            )
        version = check_event_order(events, "converged")
        assert isinstance(events[-1]["seconds"], float | int) and events[-1]["seconds"] >= 0
        last = progress_events(events)[-1]
        assert last == {
            "event": "progress",
            "version": version,
            "alive_workers": 3,
            "applied_workers": 3,
            "lagging": [],
            "excluded": [],
        }
        print(f"\nconvergence across 3 worker processes: {events[-1]['seconds']:.3f}s (database)")

        # Every worker applied it before the database could say converged.
        for proc, metrics in zip(workers, await scrape_all(workers), strict=True):
            assert metrics.value("anclax_worker_runtime_config_version") == version, proc.name
            assert metrics.value("anclax_worker_strict_cap") == expected_strict_cap(
                concurrency[proc.name], percent
            ), proc.name
        conn = await fleet.connect()
        try:
            applied = await conn.fetch(
                "SELECT id, applied_config_version FROM taskfleet.workers ORDER BY id"
            )
            assert {r["id"]: r["applied_config_version"] for r in applied} == dict.fromkeys(
                concurrency, version
            )

            # The update task finishes right after the API saw convergence in the database.
            async def finished() -> list[Any]:
                results = await update_task_results(conn)
                return results if results and results[0][0] == "completed" else []

            [(_, result)] = await eventually(finished, timeout=PATIENCE)
            assert result["outcome"] == "converged" and result["version"] == version
        finally:
            await conn.close()

        # The worker that ran the update task observed the convergence time.
        scrapes = await scrape_all(workers)
        count = sum(s.value("anclax_runtime_config_convergence_seconds_count") for s in scrapes)
        assert count == 1, [
            s.value("anclax_runtime_config_convergence_seconds_count") for s in scrapes
        ]
        assert sum(s.value("anclax_runtime_config_lagging_workers") for s in scrapes) == 0


# --------------------------------------------------------------------------------------------
# 2. Two overlapping PUTs: the first is superseded, the second converges


async def test_overlapping_puts_first_is_superseded_second_converges(database_url: str) -> None:
    concurrency = {"w1": 4, "w2": 4, "w3": 4}
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        workers = await start_workers(fleet, concurrency)
        fake = await FakeWorker.register(fleet)
        first: ConfigStream | None = None
        second: ConfigStream | None = None
        try:
            async with fleet.client() as client:
                first = ConfigStream(client, {"maxStrictPercentage": 10}).start()
                # Version 1 is written, the real workers have it, the fake one holds it up.
                await first.until(
                    lambda e: (
                        e["event"] == "progress"
                        and e["lagging"] == ["fake"]
                        and e["applied_workers"] == 3
                    )
                )
                second = ConfigStream(client, {"maxStrictPercentage": 20}).start()
                v2 = (await second.until(lambda e: e["event"] == "version"))["version"]
                first_events = await first.finished()
                v1 = check_event_order(first_events, "superseded")
                assert v2 > v1
                assert first_events[-1] == {
                    "event": "superseded",
                    "version": v1,
                    "superseded_by": v2,
                }
                # The second one cannot converge while the fake worker lags ...
                await second.until(
                    lambda e: (
                        e["event"] == "progress" and e["version"] == v2 and e["lagging"] == ["fake"]
                    )
                )
                assert not any(e["event"] in FINAL for e in second.events), second.events
                # ... and does once its heartbeat is stale.
                await fake.go_stale()
                second_events = await second.finished()
                assert check_event_order(second_events, "converged") == v2
                assert progress_events(second_events)[-1]["alive_workers"] == 3
        finally:
            for stream in (first, second):
                if stream is not None:
                    await stream.close()
            await fake.close()

        for proc, metrics in zip(workers, await scrape_all(workers), strict=True):
            assert metrics.value("anclax_worker_runtime_config_version") == v2, proc.name
            assert metrics.value("anclax_worker_strict_cap") == expected_strict_cap(4, 20)

        async def superseded_counted() -> float:
            scrapes = await scrape_all(workers)
            return sum(s.value("anclax_runtime_config_superseded_total") for s in scrapes)

        assert await eventually(superseded_counted, timeout=PATIENCE) == 1
        conn = await fleet.connect()
        try:

            async def both_finished() -> list[Any]:
                results = await update_task_results(conn)
                return results if [s for s, _ in results] == ["completed"] * 2 else []

            results = [r for _, r in await eventually(both_finished, timeout=PATIENCE)]
        finally:
            await conn.close()
        assert results[0] == {"outcome": "superseded", "version": v1, "superseded_by": v2}
        assert results[1]["outcome"] == "converged" and results[1]["version"] == v2
        scrapes = await scrape_all(workers)
        assert sum(s.value("anclax_runtime_config_convergence_seconds_count") for s in scrapes) == 1


# --------------------------------------------------------------------------------------------
# 3. A worker killed with SIGKILL does not hold convergence up once its heartbeat is stale


async def test_killed_worker_drops_out_of_convergence(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        w1, w2, w3 = await start_workers(fleet, {"w1": 4, "w2": 4, "w3": 4})
        w3.kill9()
        async with fleet.client() as client:
            events = await put_config(client, {"maxStrictPercentage": 50})
            version = check_event_order(events, "converged")
            progress = progress_events(events)
            # Named as left out when it still counted as alive after the version was written.
            left_out = [{"id": "w3", "reason": "heartbeat expired"}]
            if any(e["alive_workers"] == 3 for e in progress):
                assert events[-1]["excluded"] == left_out, events
            assert events[-1]["excluded"] in ([], left_out), events
            assert progress[-1] == {
                "event": "progress",
                "version": version,
                "alive_workers": 2,
                "applied_workers": 2,
                "lagging": [],
                "excluded": events[-1]["excluded"],
            }
            # While the dead worker still counted as alive, it was the only one lagging.
            for event in progress:
                assert event["alive_workers"] in (2, 3), progress
                if event["alive_workers"] == 3:
                    assert "w3" in event["lagging"], progress
                assert set(event["lagging"]) <= {"w1", "w2", "w3"}
            print(
                f"\nconvergence with a killed worker: {events[-1]['seconds']:.3f}s; alive "
                f"workers per progress event: {[e['alive_workers'] for e in progress]}"
            )
            fleet_view = {w["id"]: w for w in (await client.get("/workers")).json()["workers"]}
        assert fleet_view["w3"]["alive"] is False
        assert fleet_view["w3"]["applied_config_version"] < version
        assert fleet_view["w1"]["applied_config_version"] == version
        assert fleet_view["w2"]["applied_config_version"] == version
        for metrics in await scrape_all([w1, w2]):
            assert metrics.value("anclax_worker_runtime_config_version") == version
            assert metrics.value("anclax_worker_strict_cap") == expected_strict_cap(4, 50)


# --------------------------------------------------------------------------------------------
# 4. A worker that starts after a version was written comes up on it


async def test_worker_started_later_comes_up_on_the_latest_version(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        [early] = await start_workers(fleet, {"early": 4})
        async with fleet.client() as client:
            check_event_order(await put_config(client, {"maxStrictPercentage": 100}), "converged")
            # The latest version forbids strict claims: a late worker that claimed before
            # applying it would run the strict task below with the default cap.
            events = await put_config(client, {"maxStrictPercentage": 0, "labelWeights": {"a": 2}})
            version = check_event_order(events, "converged")
            assert version == 2
            early.signal(signal.SIGTERM)
            assert await asyncio.to_thread(early.wait, PATIENCE) == 0

            strict = await client.post(
                "/tasks", json={"type": "demo.echo", "payload": {"value": "s"}, "priority": 5}
            )
            normal = await client.post(
                "/tasks", json={"type": "demo.echo", "payload": {"value": "n"}, "labels": ["a"]}
            )
            assert strict.status_code == 201 and normal.status_code == 201

            [late] = await start_workers(fleet, {"late": 4})
            metrics = await scrape(late)
            assert metrics.value("anclax_worker_runtime_config_version") == version
            assert metrics.value("anclax_worker_strict_cap") == 0
            conn = await fleet.connect()
            try:
                row = await conn.fetchrow(
                    "SELECT applied_config_version FROM taskfleet.workers WHERE id = 'late'"
                )
            finally:
                await conn.close()
            assert row["applied_config_version"] == version

            waited = await client.get(
                f"/tasks/{normal.json()['id']}/wait", params={"timeout": PATIENCE}
            )
            assert waited.json()["status"] == "completed", waited.text
            assert waited.json()["worker_id"] == "late"
            # The late worker has claimed; the strict task was never claimable for it.
            still = (await client.get(f"/tasks/{strict.json()['id']}")).json()
            assert still["status"] == "pending", still
            assert still["attempts"] == 0, still


# --------------------------------------------------------------------------------------------
# 5. The listening connection is terminated: the worker reconnects and convergence still works


async def test_terminated_listener_reconnects_and_a_later_put_converges(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        workers = await start_workers(fleet, {"w1": 4, "w2": 4, "w3": 4})
        conn = await fleet.connect()
        try:
            listeners = (
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'taskfleet-worker-listen' ORDER BY pid"
            )
            before = [r["pid"] for r in await conn.fetch(listeners)]
            assert len(before) == 3, before
            terminated = await conn.fetch(
                "SELECT pg_terminate_backend(pid) AS ok FROM unnest($1::int[]) AS pid", before
            )
            assert all(r["ok"] for r in terminated)

            async def all_reconnected() -> bool:
                scrapes = await scrape_all(workers)
                return all(
                    s.value("taskfleet_worker_listener_reconnects_total") >= 1
                    and s.value("taskfleet_worker_listener_connected") == 1
                    for s in scrapes
                )

            await eventually(all_reconnected, timeout=PATIENCE)
            after = [r["pid"] for r in await conn.fetch(listeners)]
            assert len(after) == 3 and not set(after) & set(before), (before, after)
        finally:
            await conn.close()
        await assert_ready(workers)

        async with fleet.client() as client:
            events = await put_config(client, {"maxStrictPercentage": 25})
        version = check_event_order(events, "converged")
        print(f"\nconvergence after the listeners were terminated: {events[-1]['seconds']:.3f}s")
        for metrics in await scrape_all(workers):
            assert metrics.value("anclax_worker_runtime_config_version") == version
            assert metrics.value("anclax_worker_strict_cap") == expected_strict_cap(4, 25)


# --------------------------------------------------------------------------------------------
# 6. Notifications lost entirely: the poll fallback converges


async def test_put_converges_with_every_notification_lost(database_url: str) -> None:
    no_listen = {
        "TASKFLEET_LISTEN_ENABLED": "false",
        "TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL": "1",
    }
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        workers = await start_workers(fleet, {"w1": 4, "w2": 4, "w3": 4}, extra_env=no_listen)
        conn = await fleet.connect()
        try:
            listening = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'taskfleet-worker-listen'"
            )
            assert listening == 0
            async with fleet.client() as client:
                events = await put_config(client, {"maxStrictPercentage": 75})
            version = check_event_order(events, "converged")
            print(
                f"\nconvergence with notifications lost (config poll 1 s): "
                f"{events[-1]['seconds']:.3f}s"
            )
            claimed_by = await conn.fetchval(
                "SELECT worker_id FROM taskfleet.tasks WHERE type = $1", UPDATE_TASK_TYPE
            )
            assert claimed_by in {"w1", "w2", "w3"}
        finally:
            await conn.close()
        for metrics in await scrape_all(workers):
            assert metrics.value("anclax_worker_runtime_config_version") == version
            assert metrics.value("anclax_worker_strict_cap") == expected_strict_cap(4, 75)
            assert metrics.value("taskfleet_worker_listener_connected") == 0
            assert metrics.total("taskfleet_worker_notifications_total") == 0


# --------------------------------------------------------------------------------------------
# 7. Malformed notifications are logged and dropped; nothing breaks


def _huge(prefix: str, suffix: str, filler: str = "x") -> str:
    """The largest payload pg_notify accepts, ``prefix + filler... + suffix``."""
    room = NOTIFY_LIMIT - 1 - len((prefix + suffix).encode())
    return prefix + filler * room + suffix


#: Payloads on the config channel that must each count once as malformed.
MALFORMED_CONFIG = [
    "",
    "garbage",
    "null",
    "[]",
    "42",
    '"up_config"',
    "{}",
    '{"op": "up_config"}',
    '{"op": "up_config", "params": []}',
    '{"op": "up_config", "params": {"request_id": 7, "version": 1}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": "1"}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": -1}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": true}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": 1.5}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": 1e999}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": NaN}}',
    '{"op": "up_config", "params": {"request_id": "r"}}',
    '{"op": "ack", "params": {"request_id": "r", "worker_id": "w1", "applied_version": 1}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": 1',
    "\u00e9\u00e8\u2603\U0001f600 not json",
    _huge("", ""),
    _huge('{"op": "up_config", "params": {"request_id": "', '", "version": "1"}}', "r"),
    _huge("", "", "["),
    "[" * 3990 + "]" * 3990,
    # Valid JSON at the size limit, but no version in it.
    _huge('{"op": "up_config", "params": {"request_id": "r", "pad": "', '"}}', "p"),
]

#: Well-formed but lying: a version far beyond anything written. The worker must re-read the
#: database (the truth) and not take the number from the payload.
LYING_CONFIG = (
    '{"op": "up_config", "params": {"request_id": "lie", "version": 4611686018427387904}}'
)

MALFORMED_ACK = [
    "garbage",
    "{}",
    '{"op": "ack", "params": {"request_id": "r", "worker_id": 5, "applied_version": 1}}',
    '{"op": "ack", "params": {"request_id": "r", "worker_id": "w1", "applied_version": "1"}}',
    '{"op": "up_config", "params": {"request_id": "r", "version": 1}}',
    _huge("", ""),
    "[" * 3990 + "]" * 3990,
]

TASK_READY_GARBAGE = ["", "garbage", "{}", "control ", _huge("", ""), "[" * 3990 + "]" * 3990]


async def test_malformed_notifications_are_ignored(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        workers = await start_workers(fleet, {"w1": 4, "w2": 4, "w3": 4})
        conn = await fleet.connect()
        fake: FakeWorker | None = None
        stream: ConfigStream | None = None
        try:
            with pytest.raises(asyncpg.InvalidParameterValueError):
                await notify(conn, CONFIG_CHANNEL, "x" * NOTIFY_LIMIT)
            for payload in MALFORMED_CONFIG:
                assert len(payload.encode()) < NOTIFY_LIMIT
                await notify(conn, CONFIG_CHANNEL, payload)
            await notify(conn, CONFIG_CHANNEL, LYING_CONFIG)
            for payload in TASK_READY_GARBAGE:
                await notify(conn, TASK_READY_CHANNEL, payload)
            for payload in MALFORMED_ACK:  # nobody listens yet: no update task runs
                await notify(conn, ACK_CHANNEL, payload)

            async def all_counted() -> bool:
                return all(
                    s.value(
                        "taskfleet_worker_notifications_total",
                        channel=CONFIG_CHANNEL,
                        result="malformed",
                    )
                    == len(MALFORMED_CONFIG)
                    and s.value(
                        "taskfleet_worker_notifications_total", channel=CONFIG_CHANNEL, result="ok"
                    )
                    == 1
                    # Every payload is counted: an empty or lane-naming one as a wake-up ("ok"),
                    # the rest as malformed (logged and ignored).
                    and s.value(
                        "taskfleet_worker_notifications_total",
                        channel=TASK_READY_CHANNEL,
                        result="ok",
                    )
                    + s.value(
                        "taskfleet_worker_notifications_total",
                        channel=TASK_READY_CHANNEL,
                        result="malformed",
                    )
                    >= len(TASK_READY_GARBAGE)
                    and s.value(
                        "taskfleet_worker_notifications_total",
                        channel=TASK_READY_CHANNEL,
                        result="malformed",
                    )
                    >= 3
                    for s in await scrape_all(workers)
                )

            await eventually(all_counted, timeout=PATIENCE)
            await assert_ready(workers)

            # Now while an update task is waiting on a lagging worker (so the writer listens
            # for ACKs): garbage ACKs, and forged ones that claim the lagging worker applied.
            fake = await FakeWorker.register(fleet)
            async with fleet.client() as client:
                stream = ConfigStream(client, {"maxStrictPercentage": 40}).start()
                version = (await stream.until(lambda e: e["event"] == "version"))["version"]
                await stream.until(lambda e: e["event"] == "progress" and e["lagging"] == ["fake"])
                for payload in MALFORMED_ACK:
                    await notify(conn, ACK_CHANNEL, payload)
                for _ in range(3):
                    await notify(
                        conn,
                        ACK_CHANNEL,
                        json.dumps(
                            {
                                "op": "ack",
                                "params": {
                                    "request_id": "forged",
                                    "worker_id": "fake",
                                    "applied_version": version,
                                },
                            }
                        ),
                    )
                for payload in MALFORMED_CONFIG[:5]:
                    await notify(conn, CONFIG_CHANNEL, payload)

                async def counted_again() -> bool:
                    return all(
                        s.value(
                            "taskfleet_worker_notifications_total",
                            channel=CONFIG_CHANNEL,
                            result="malformed",
                        )
                        == len(MALFORMED_CONFIG) + 5
                        for s in await scrape_all(workers)
                    )

                await eventually(counted_again, timeout=PATIENCE)
                # A forged ACK is only a hint: the database still says "fake" lags.
                status = (await client.get("/runtime-config")).json()
                assert status["lagging"] == ["fake"], status
                assert not stream.done, stream.events
                assert await conn.fetchval(
                    "SELECT status FROM taskfleet.tasks WHERE type = $1", UPDATE_TASK_TYPE
                ) in ("pending", "running")

                await fake.go_stale()
                assert check_event_order(await stream.finished(), "converged") == version
                # And one more change, end to end, after all of it.
                events = await put_config(client, {"maxStrictPercentage": 60})
                second = check_event_order(events, "converged")
                assert second == version + 1
        finally:
            if stream is not None:
                await stream.close()
            if fake is not None:
                await fake.close()
            await conn.close()

        await assert_ready(workers)
        for proc, metrics in zip(workers, await scrape_all(workers), strict=True):
            # The lying version number was not taken from the payload.
            assert metrics.value("anclax_worker_runtime_config_version") == second, proc.name
            assert metrics.value("anclax_worker_strict_cap") == expected_strict_cap(4, 60)
            assert metrics.value("taskfleet_worker_listener_reconnects_total") == 0, proc.name
            assert "Traceback" not in proc.log(), proc.log()[-3000:]


# --------------------------------------------------------------------------------------------
# 8. The control lane cannot lock itself out


async def test_config_changes_converge_with_strict_cap_zero_and_every_slot_busy(
    database_url: str,
) -> None:
    concurrency = {"w1": 2, "w2": 2}
    slots = sum(concurrency.values())
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        workers = await start_workers(fleet, concurrency)
        conn = await fleet.connect()
        sleepers: list[int] = []
        try:
            async with fleet.client() as client:
                created = await client.post(
                    "/tasks/batch",
                    json={
                        "tasks": [
                            {"type": "demo.sleep", "payload": {"seconds": 30}} for _ in range(slots)
                        ]
                    },
                )
                assert created.status_code == 201, created.text
                sleepers = [t["id"] for t in created.json()["tasks"]]

                async def all_running() -> bool:
                    running = await conn.fetchval(
                        "SELECT count(*) FROM taskfleet.tasks WHERE id = ANY($1::bigint[]) "
                        "AND status = 'running'",
                        sleepers,
                    )
                    return bool(running == slots)

                await eventually(all_running, timeout=PATIENCE)

                async def every_slot_busy() -> bool:
                    return all(
                        s.value("taskfleet_worker_inflight_tasks", lane="normal")
                        == concurrency[p.name]
                        for p, s in zip(workers, await scrape_all(workers), strict=True)
                    )

                await eventually(every_slot_busy, timeout=PATIENCE)

                first = await put_config(client, {"maxStrictPercentage": 0})
                v1 = check_event_order(first, "converged")
                # Strict work waits behind a cap of 0; the control lane must not.
                strict = await client.post(
                    "/tasks", json={"type": "demo.echo", "payload": {"value": 1}, "priority": 9}
                )
                assert strict.status_code == 201
                second = await put_config(
                    client, {"maxStrictPercentage": 0, "labelWeights": {"a": 5}}
                )
                v2 = check_event_order(second, "converged")
                assert v2 == v1 + 1

                # Both changes happened while every slot stayed busy with the sleepers.
                statuses = await conn.fetch(
                    "SELECT status, started_at FROM taskfleet.tasks WHERE id = ANY($1::bigint[])",
                    sleepers,
                )
                assert [r["status"] for r in statuses] == ["running"] * slots
                config_tasks = await conn.fetch(
                    "SELECT status, worker_id, started_at FROM taskfleet.tasks WHERE type = $1",
                    UPDATE_TASK_TYPE,
                )
                assert len(config_tasks) == 2
                busy_since = max(r["started_at"] for r in statuses)
                for task in config_tasks:
                    assert task["worker_id"] in concurrency
                    assert task["started_at"] > busy_since
                assert (await client.get(f"/tasks/{strict.json()['id']}")).json()[
                    "status"
                ] == "pending"
                for proc, metrics in zip(workers, await scrape_all(workers), strict=True):
                    assert metrics.value("anclax_worker_runtime_config_version") == v2
                    assert metrics.value("anclax_worker_strict_cap") == 0
                    assert (
                        metrics.value("taskfleet_worker_inflight_tasks", lane="normal")
                        == concurrency[proc.name]
                    )
                for task_id in sleepers:  # don't wait out 30 s sleeps at shutdown
                    await client.post(f"/tasks/{task_id}/cancel")
        finally:
            await conn.close()


# --------------------------------------------------------------------------------------------
# 9. The CLI against the real fleet


async def run_cli(fleet: Fleet, *args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
    env.update(
        {
            "TASKFLEET_URL": fleet.api_url,
            "TASKFLEET_TOKEN": ADMIN_TOKEN,
            "COLUMNS": "200",
            "NO_COLOR": "1",
        }
    )
    process = await asyncio.create_subprocess_exec(
        *taskfleet_command(),
        *args,
        env=env,
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), PATIENCE + 30)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def test_cli_config_set_show_and_workers(database_url: str) -> None:
    concurrency = {"cli-w1": 4, "cli-w2": 10}
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        workers = await start_workers(fleet, concurrency)

        code, out = await run_cli(
            fleet, "config", "set", "--max-strict-percentage", "30", "--weight", "a=3"
        )
        assert code == 0, out
        assert "converged: version 1 applied by every alive worker" in out, out

        for proc, metrics in zip(workers, await scrape_all(workers), strict=True):
            assert metrics.value("anclax_worker_runtime_config_version") == 1
            assert metrics.value("anclax_worker_strict_cap") == expected_strict_cap(
                concurrency[proc.name], 30
            )

        code, out = await run_cli(fleet, "config", "show")
        assert code == 0, out
        lines = out.splitlines()
        assert any("version" in line and " 1 " in f" {line} " for line in lines), out
        assert any("maxStrictPercentage" in line and "30" in line for line in lines), out
        assert any("labelWeights" in line and "a=3" in line for line in lines), out
        for worker_id in concurrency:
            assert any(worker_id in line and "yes" in line for line in lines), out

        code, out = await run_cli(fleet, "workers")
        assert code == 0, out
        for worker_id, slots in concurrency.items():
            [row] = [line for line in out.splitlines() if worker_id in line]
            assert "online" in row.split(), out
            assert any(cell.endswith(f"/{slots}") for cell in row.split()), row

        # The CLI process itself is gone; the fleet did not notice it.
        await assert_ready(workers)


# --------------------------------------------------------------------------------------------
# 10. An update queued behind a running one is claimed when the control slot frees


async def test_update_queued_behind_a_running_one_is_claimed_when_the_control_slot_frees(
    database_url: str,
) -> None:
    """One worker; update 1 holds its control slot (a lagging worker keeps it waiting) when
    update 2 is enqueued. When update 1 finishes, the freed control slot must be used at once:
    the pending control task is known, so nothing should wait for a poll or a tick.

    The idle timers are made so long (tick 60 s, poll 1000 s, the first sweep
    at a random time within 100000 s) that a worker which
    only finds the task on its next tick or poll cannot meet the 30 s bound.
    """
    slow_timers = {
        "TASKFLEET_HEARTBEAT_INTERVAL": "60",
        "TASKFLEET_LEASE_TTL": "200",
        "TASKFLEET_POLL_INTERVAL": "1000",
        "TASKFLEET_SWEEP_INTERVAL": "100000",
        "TASKFLEET_RUNTIME_CONFIG_POLL_INTERVAL": "1000",
    }
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        [solo] = await start_workers(fleet, {"solo": 2}, extra_env=slow_timers)
        fake = await FakeWorker.register(fleet)
        first: ConfigStream | None = None
        second: ConfigStream | None = None
        try:
            async with fleet.client() as client:
                first = ConfigStream(client, {"maxStrictPercentage": 10}).start()
                await first.until(lambda e: e["event"] == "progress" and e["lagging"] == ["fake"])
                hints = (await scrape(solo)).value(
                    "taskfleet_worker_notifications_total", channel=TASK_READY_CHANNEL, result="ok"
                )
                second = ConfigStream(client, {"maxStrictPercentage": 20}, timeout=30).start()
                await second.until(lambda e: e["event"] == "enqueued")

                # The worker heard of update 2 while its control slot was busy with update 1.
                async def hint_received() -> bool:
                    metrics = await scrape(solo)
                    return (
                        metrics.value(
                            "taskfleet_worker_notifications_total",
                            channel=TASK_READY_CHANNEL,
                            result="ok",
                        )
                        > hints
                    )

                await eventually(hint_received, timeout=PATIENCE)
                assert not first.done

                await fake.go_stale()
                v1 = check_event_order(await first.finished(), "converged")
                events = await second.finished()
                assert events[-1]["event"] == "converged", events
                assert check_event_order(events, "converged") == v1 + 1
        finally:
            for stream in (first, second):
                if stream is not None:
                    await stream.close()
            await fake.close()
