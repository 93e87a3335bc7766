"""The core pipeline with real processes (``taskfleet api`` + ``taskfleet worker``), and load.

Outcomes are read from Postgres (the truth) or the API; nothing here asserts on how long anything
took. Latencies are measured and printed for the docs, never asserted.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

from tests.e2e.audit_tasks import (
    AUDIT_MODULE_ENV,
    audit_accounting,
    audit_task,
    create_audit_table,
)
from tests.e2e.fleet import Fleet, eventually, task_rows, wait_tasks_terminal


def _mixed_task(i: int) -> dict[str, Any]:
    kind = i % 5
    if kind == 0:
        return {"type": "demo.echo", "payload": {"value": i}}
    if kind == 1:
        return {"type": "demo.sleep", "payload": {"seconds": 0.01}, "labels": ["slow"]}
    if kind == 2:
        return {"type": "demo.cpu", "payload": {"iterations": 2000}, "weight": 3}
    if kind == 3:
        return {"type": "demo.echo", "payload": {"value": {"n": i}}, "priority": 5}
    return {"type": "demo.echo", "payload": {"value": f"delayed-{i}"}, "delay_seconds": 0.2}


def _expected_result(task: dict[str, Any]) -> dict[str, Any] | None:
    payload = task["payload"]
    if task["type"] == "demo.echo":
        return {"value": payload["value"]}
    if task["type"] == "demo.sleep":
        return {"slept": payload["seconds"]}
    return None  # demo.cpu: a checksum


async def test_batch_of_200_mixed_tasks_all_complete(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        await fleet.start_workers("w1", "w2")
        sent = [_mixed_task(i) for i in range(200)]
        async with fleet.client() as client:
            created = await client.post("/tasks/batch", json={"tasks": sent})
            assert created.status_code == 201, created.text
            tasks = created.json()["tasks"]
        assert len(tasks) == 200
        # Same order as sent.
        assert [t["type"] for t in tasks] == [t["type"] for t in sent]
        assert [t["payload"] for t in tasks] == [t["payload"] for t in sent]
        ids = [t["id"] for t in tasks]
        assert len(set(ids)) == 200

        conn = await fleet.connect()
        try:
            rows = await wait_tasks_terminal(conn, ids, timeout=90)
        finally:
            await conn.close()
        statuses = {row["status"] for row in rows.values()}
        assert statuses == {"completed"}, statuses
        for task, body in zip(tasks, sent, strict=True):
            row = rows[task["id"]]
            assert row["attempts"] == 1, row
            expected = _expected_result(body)
            if expected is not None:
                assert row["result"] == expected, row
            else:
                assert row["result"]["iterations"] == 2000, row
        by_worker = {row["worker_id"] for row in rows.values()}
        # Both workers took part, and nothing else did.
        assert by_worker == {"w1", "w2"}, by_worker


async def test_failing_task_retried_then_failed_and_running_task_cancelled(
    database_url: str,
) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        await fleet.start_workers("w1", "w2")
        async with fleet.client() as client:
            failing = await client.post(
                "/tasks",
                json={
                    "type": "demo.fail",
                    "payload": {"message": "boom-retry-me"},
                    "max_attempts": 2,
                },
            )
            permanent = await client.post(
                "/tasks",
                json={
                    "type": "demo.fail",
                    "payload": {"message": "boom-permanent", "permanent": True},
                    "max_attempts": 5,
                },
            )
            sleeper = await client.post(
                "/tasks", json={"type": "demo.sleep", "payload": {"seconds": 60}}
            )
            for response in (failing, permanent, sleeper):
                assert response.status_code == 201, response.text
            sleeper_id = sleeper.json()["id"]

            # Cancel the long task once a worker really runs it.
            async def sleeper_running() -> dict[str, Any] | None:
                task = (await client.get(f"/tasks/{sleeper_id}")).json()
                return task if task["status"] == "running" else None

            running = await eventually(sleeper_running, timeout=30)
            assert running["worker_id"] in {"w1", "w2"}
            cancel = await client.post(f"/tasks/{sleeper_id}/cancel")
            assert cancel.status_code == 200, cancel.text

            waited = await client.get(f"/tasks/{sleeper_id}/wait", params={"timeout": 30})
            cancelled = waited.json()
            assert cancelled["status"] == "cancelled", cancelled
            assert cancelled["finished_at"] is not None
            assert cancelled["result"] is None
            # Finished tasks cannot be cancelled again.
            again = await client.post(f"/tasks/{sleeper_id}/cancel")
            assert again.status_code == 409, again.text

            failed = (
                await client.get(f"/tasks/{failing.json()['id']}/wait", params={"timeout": 30})
            ).json()
            assert failed["status"] == "failed", failed
            assert failed["attempts"] == 2, failed
            assert "boom-retry-me" in failed["last_error"], failed

            permanent_failed = (
                await client.get(f"/tasks/{permanent.json()['id']}/wait", params={"timeout": 30})
            ).json()
            assert permanent_failed["status"] == "failed", permanent_failed
            assert permanent_failed["attempts"] == 1, permanent_failed
            assert "boom-permanent" in permanent_failed["last_error"], permanent_failed

            # The cancelled task's slot is free again: new work still runs.
            echo = await client.post("/tasks", json={"type": "demo.echo", "payload": {"value": 1}})
            done = (
                await client.get(f"/tasks/{echo.json()['id']}/wait", params={"timeout": 30})
            ).json()
            assert done["status"] == "completed", done


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


async def test_load_500_concurrent_submissions_and_a_batch_of_1000(database_url: str) -> None:
    async with Fleet(database_url, env=AUDIT_MODULE_ENV) as fleet:
        conn = await fleet.connect()
        try:
            await create_audit_table(conn)
            await fleet.start_api()
            await fleet.start_workers("w1", "w2", "w3", concurrency=8)

            run = uuid.uuid4().hex[:8]
            tokens = [f"load-{run}-{i}" for i in range(500)]
            in_flight = asyncio.Semaphore(50)
            latencies: list[float] = []
            statuses: list[int] = []
            ids_by_token: dict[str, int] = {}
            # httpx allows 100 connections per client: the semaphore is the only limit.
            async with fleet.client(timeout=60) as client:

                async def submit(token: str) -> None:
                    async with in_flight:
                        started = time.perf_counter()
                        response = await client.post("/tasks", json=audit_task(token))
                        latencies.append(time.perf_counter() - started)
                    statuses.append(response.status_code)
                    if response.status_code == 201:
                        ids_by_token[token] = response.json()["id"]

                await asyncio.gather(*(submit(t) for t in tokens))
                assert statuses.count(201) == 500, sorted(set(statuses))
                print(
                    "\nPOST /tasks latency, 500 requests, 50 in flight: "
                    f"p50 {_percentile(latencies, 50) * 1000:.1f} ms, "
                    f"p95 {_percentile(latencies, 95) * 1000:.1f} ms, "
                    f"p99 {_percentile(latencies, 99) * 1000:.1f} ms, "
                    f"mean {statistics.fmean(latencies) * 1000:.1f} ms"
                )

                # A single batch of 1,000 while the first 500 are still being worked off.
                started = time.perf_counter()
                batch = await client.post(
                    "/tasks/batch",
                    json={
                        "tasks": [
                            {"type": "demo.echo", "payload": {"value": i}} for i in range(1000)
                        ]
                    },
                )
                batch_seconds = time.perf_counter() - started
                assert batch.status_code == 201, batch.text[:2000]
                batch_ids = [t["id"] for t in batch.json()["tasks"]]
                assert len(set(batch_ids)) == 1000
                print(f"POST /tasks/batch of 1000: {batch_seconds * 1000:.0f} ms")

            assert len(ids_by_token) == 500
            rows = await wait_tasks_terminal(conn, list(ids_by_token.values()), timeout=120)
            assert {r["status"] for r in rows.values()} == {"completed"}
            batch_rows = await wait_tasks_terminal(conn, batch_ids, timeout=120)
            assert {r["status"] for r in batch_rows.values()} == {"completed"}
            values = sorted(r["result"]["value"] for r in batch_rows.values())
            assert values == list(range(1000))

            # Exactly once: one recorded run per submitted token, one attempt per task.
            report = await audit_accounting(conn, ids_by_token)
            print("load audit:", report.summary())
            assert report.violations == [], report.violations[:20]
            assert report.audit_rows == 500, report.summary()
            assert report.retried_tasks == 0, report.summary()
            reread = await task_rows(conn, list(ids_by_token.values()))
            assert all(r["attempts"] == 1 for r in reread.values())
        finally:
            await conn.close()
