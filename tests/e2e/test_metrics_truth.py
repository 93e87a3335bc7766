"""The metrics tell the truth under faults, checked against the database with real processes.

One stalled worker (SIGSTOP) holds two running tasks while a config change is made: the change
converges without it and names it (``excluded``), with one convergence time wherever it is
reported; its tasks are rescued and completed by the other worker; resumed (SIGCONT), it applies
the version and its stale outcomes are refused, and counted nowhere. Every counter then equals
what the database says happened, and the label sets existed at zero from start-up.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import asyncpg

from tests.e2e.fleet import Fleet, Proc, eventually, scrape_metric, task_rows, wait_tasks_terminal

OUTCOMES = "taskfleet_task_outcomes_total"
RESCUES = "taskfleet_lease_rescues_total"
SUBMITTED = "taskfleet_tasks_submitted_total"
LOST = "not written: this worker no longer holds its lease"


async def _total(procs: list[Proc], name: str, **labels: str) -> float:
    return sum([await scrape_metric(f"{p.url}/metrics", name, **labels) or 0.0 for p in procs])


async def _held_by(conn: asyncpg.Connection, ids: list[int], worker_id: str) -> bool:
    rows = (await task_rows(conn, ids)).values()
    return all(r["status"] == "running" and r["worker_id"] == worker_id for r in rows)


async def _rescued(conn: asyncpg.Connection, ids: list[int]) -> bool:
    return all(r["attempts"] == 2 for r in (await task_rows(conn, ids)).values())


async def _applied(conn: asyncpg.Connection, worker_id: str, version: int) -> bool:
    sql = "SELECT applied_config_version FROM taskfleet.workers WHERE id = $1"
    return int(await conn.fetchval(sql, worker_id)) == version


async def test_a_stalled_worker_counts_nothing_twice_and_is_named_by_the_config_change(
    database_url: str,
) -> None:
    # Short leases: the stalled worker's tasks are rescued a second and a half after it stops.
    async with Fleet(database_url, env={"TASKFLEET_LEASE_TTL": "1.5"}) as fleet:
        api = await fleet.start_api()
        stalled, other = await fleet.start_workers("m3", "m1", concurrency=2)
        conn = await fleet.connect()
        try:
            # Every label set an alert reads exists at zero before its first event.
            for proc, name, labels in (
                (stalled, RESCUES, {"outcome": "pending"}),
                (stalled, OUTCOMES, {"type": "demo.fail", "outcome": "failed"}),
                (stalled, "taskfleet_worker_claimed_tasks_total", {"lane": "strict"}),
                (api, SUBMITTED, {"lane": "control"}),
                (api, SUBMITTED, {"lane": "strict"}),
            ):
                assert await scrape_metric(f"{proc.url}/metrics", name, **labels) == 0.0, name

            async with fleet.client() as client:
                # m1 frozen for a moment, so that m3 claims both tasks.
                other.signal(signal.SIGSTOP)
                response = await client.post(
                    "/tasks/batch",
                    json={"tasks": [{"type": "demo.sleep", "payload": {"seconds": 1}}] * 2},
                )
                assert response.status_code == 201, response.text
                ids = [t["id"] for t in response.json()["tasks"]]
                await eventually(lambda: _held_by(conn, ids, "m3"))
                stalled.signal(signal.SIGSTOP)
                other.signal(signal.SIGCONT)
                try:
                    # m3 is alive when the version is written; its heartbeat then expires.
                    put = await client.put(
                        "/runtime-config",
                        json={"labelWeights": {"tenant-a": 3}, "requestID": "around-a-stall"},
                        headers={"Accept": "application/json"},
                    )
                    assert put.status_code == 200, put.text
                    doc: dict[str, Any] = put.json()
                    assert doc["outcome"] == "converged", doc
                    left_out = [{"id": "m3", "reason": "heartbeat expired"}]
                    assert doc["excluded"] == left_out, doc
                    version = doc["version"]
                    # Its tasks are rescued (attempt 2) by m1 before m3 resumes.
                    await eventually(lambda: _rescued(conn, ids))
                finally:
                    stalled.signal(signal.SIGCONT)
                # Resumed, m3 applies the version it missed, and its stale outcomes are refused.
                await eventually(lambda: _applied(conn, "m3", version))
                await eventually(lambda: _logged(stalled, LOST, times=2))
                rows = await wait_tasks_terminal(conn, ids)
                assert {(r["status"], r["worker_id"]) for r in rows.values()} == {
                    ("completed", "m1")
                }
                request = await client.get("/runtime-config/requests/around-a-stall")
                assert request.json()["final"] == doc["events"][-1]

            workers = [stalled, other]
            # One convergence time and one list of excluded workers, wherever reported.
            task_result = json.loads(
                await conn.fetchval(
                    "SELECT result::text FROM taskfleet.tasks WHERE id = $1", doc["task_id"]
                )
            )
            assert (task_result["seconds"], task_result["excluded"]) == (doc["seconds"], left_out)
            histogram = "anclax_runtime_config_convergence_seconds"
            assert await _total(workers, f"{histogram}_count") == 1
            assert await _total(workers, f"{histogram}_sum") == doc["seconds"]
            print(f"\nconverged around a stalled worker in {doc['seconds']:.3f}s, everywhere")
            excluded = "taskfleet_runtime_config_excluded_workers_total"
            assert await _total(workers, excluded, reason="heartbeat expired") == 1
            applied = "anclax_worker_runtime_config_version"
            assert await scrape_metric(f"{stalled.url}/metrics", applied) == version
            # The group the new config names is counted from zero on every worker.
            claims = "taskfleet_worker_claimed_tasks_total"
            for proc in workers:
                labels = {"lane": "normal", "group": "tenant-a"}
                assert await scrape_metric(f"{proc.url}/metrics", claims, **labels) == 0.0

            # Every counter equals the database's count of what happened.
            truth = await conn.fetch(
                "SELECT type, status, count(*) AS n, sum(attempts - 1) AS rescued "
                "FROM taskfleet.tasks GROUP BY type, status"
            )
            for row in truth:
                counted = await _total(workers, OUTCOMES, type=row["type"], outcome=row["status"])
                assert counted == row["n"], (row["type"], row["status"], counted)
            assert await _total(workers, OUTCOMES, outcome="completed") == 3  # 2 sleeps + update
            assert await _total(workers, RESCUES, outcome="pending") == sum(
                r["rescued"] for r in truth
            )
            lanes = {"control": 1, "normal": 2, "strict": 0}
            for lane, submitted in lanes.items():
                assert await scrape_metric(f"{api.url}/metrics", SUBMITTED, lane=lane) == submitted
        finally:
            for proc in (stalled, other):
                proc.signal(signal.SIGCONT)
            await conn.close()


async def _logged(proc: Proc, text: str, *, times: int) -> bool:
    return sum(text in line for line in proc.log().splitlines()) == times
