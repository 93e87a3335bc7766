"""Faults with real processes: kill -9 a worker, SIGTERM drain, Postgres connections killed,
Postgres restarted (a private server), and exactly-once accounting under kill -9.

Every wait polls a condition with a generous deadline; no assertion is about how long something
took. Outcomes are read from Postgres, the truth, or from the processes' HTTP ports.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from typing import Any

import asyncpg
import httpx

from tests.e2e.audit_tasks import (
    AUDIT_MODULE_ENV,
    audit_accounting,
    audit_task,
    create_audit_table,
)
from tests.e2e.fleet import (
    Fleet,
    Proc,
    eventually,
    scrape_metric,
    task_rows,
    wait_tasks_terminal,
)
from tests.e2e.pgcluster import PgCluster

RECONNECTS = "taskfleet_worker_listener_reconnects_total"
#: Lease TTL 3 s + sweep 0.5 s in the harness; rescue deadlines are many times that.
RESCUE_DEADLINE = 45.0


def _token(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def _submit(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/tasks", json=body)
    assert response.status_code == 201, response.text
    task: dict[str, Any] = response.json()
    return task


async def _wait_running_on(
    conn: asyncpg.Connection, ids: list[int], worker_id: str, timeout: float = 30.0
) -> None:
    async def check() -> bool:
        rows = await task_rows(conn, ids)
        return all(
            rows[i]["status"] == "running" and rows[i]["worker_id"] == worker_id for i in ids
        )

    await eventually(check, timeout=timeout, interval=0.05)


async def _readyz_status(proc: Proc) -> int | None:
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            return (await client.get(f"{proc.url}/readyz")).status_code
    except httpx.HTTPError:
        return None


async def _put_config_converges(client: httpx.AsyncClient, percentage: int) -> dict[str, Any]:
    response = await client.put(
        "/runtime-config",
        json={"maxStrictPercentage": percentage},
        headers={"Accept": "application/json"},
        params={"timeout": 30},
    )
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    assert document["outcome"] == "converged", document
    return document


# ------------------------------------------------------------------------------------------------
# kill -9
# ------------------------------------------------------------------------------------------------


async def test_kill9_worker_mid_task_is_rescued_by_the_lease_sweep(database_url: str) -> None:
    async with Fleet(database_url, env=AUDIT_MODULE_ENV) as fleet:
        conn = await fleet.connect()
        try:
            await create_audit_table(conn)
            await fleet.start_api()
            victim = await fleet.start_worker("w1")
            async with fleet.client() as client:
                # A: retried after the kill. B: its only attempt dies with the worker.
                token = _token("rescued")
                rescued = await _submit(client, audit_task(token, seconds=2))
                exhausted = await _submit(
                    client,
                    {"type": "demo.sleep", "payload": {"seconds": 60}, "max_attempts": 1},
                )
                ids = [rescued["id"], exhausted["id"]]
                await _wait_running_on(conn, ids, "w1")
                victim.kill9()
                # The survivor starts only now, so both tasks were certainly w1's; it is up
                # long before w1's leases expire.
                await fleet.start_worker("w2")

                final = await wait_tasks_terminal(conn, ids, timeout=RESCUE_DEADLINE)
                a, b = final[rescued["id"]], final[exhausted["id"]]
                assert a["status"] == "completed", a
                assert a["worker_id"] == "w2", a
                assert a["attempts"] == 2, a
                assert a["result"]["token"] == token, a
                assert b["status"] == "failed", b
                assert b["attempts"] == 1, b
                assert "lease" in (b["last_error"] or ""), b
                # The killed run left its row; the rescued run its own: two runs, two attempts.
                pids = [r["pid"] for r in await conn.fetch(
                    "SELECT pid FROM public.audit_runs WHERE token = $1 ORDER BY ran_at", token
                )]  # fmt: skip
                assert pids == [victim.popen.pid, fleet.proc("w2").popen.pid], pids
                # The fleet view says w1 is dead.
                workers = {w["id"]: w for w in (await client.get("/workers")).json()["workers"]}
                assert workers["w2"]["alive"] is True, workers
                await eventually(
                    lambda: _worker_alive(client, "w1", False), timeout=RESCUE_DEADLINE
                )
        finally:
            await conn.close()


async def _worker_alive(client: httpx.AsyncClient, worker_id: str, alive: bool) -> bool:
    workers = {w["id"]: w for w in (await client.get("/workers")).json()["workers"]}
    return worker_id in workers and workers[worker_id]["alive"] is alive


# ------------------------------------------------------------------------------------------------
# SIGTERM drain
# ------------------------------------------------------------------------------------------------


async def test_sigterm_drains_finishes_short_tasks_and_returns_long_ones(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        conn = await fleet.connect()
        try:
            await fleet.start_api()
            w1 = await fleet.start_worker("w1", concurrency=2)
            async with fleet.client() as client:
                short = await _submit(client, {"type": "demo.sleep", "payload": {"seconds": 3}})
                long = await _submit(client, {"type": "demo.sleep", "payload": {"seconds": 60}})
                await _wait_running_on(conn, [short["id"], long["id"]], "w1")
                sigterm_at = await conn.fetchval("SELECT now()")
                w1.signal(signal.SIGTERM)

                # Draining: /readyz says 503 at once (the long task keeps it draining ~5 s).
                async def not_ready() -> dict[str, Any] | None:
                    async with httpx.AsyncClient(timeout=2.0) as probe:
                        response = await probe.get(f"{w1.url}/readyz")
                    return response.json() if response.status_code == 503 else None

                readyz = await eventually(not_ready, timeout=4, interval=0.02)
                assert readyz["status"] == "draining", readyz
                assert w1.alive(), "the worker must still be draining"

                async def row_draining() -> bool:
                    workers = (await client.get("/workers")).json()["workers"]
                    return any(w["id"] == "w1" and w["status"] == "draining" for w in workers)

                await eventually(row_draining, timeout=4, interval=0.05)
                # Submitted during the drain: the draining worker must not claim it.
                late = await _submit(client, {"type": "demo.echo", "payload": {"value": "late"}})

                exit_code = await asyncio.to_thread(w1.wait, 60)
                assert exit_code == 0, w1.log()[-3000:]

                rows = await task_rows(conn, [short["id"], long["id"], late["id"]])
                s, lg, lt = rows[short["id"]], rows[long["id"]], rows[late["id"]]
                # The short task finished during the drain, on w1.
                assert s["status"] == "completed", s
                assert s["worker_id"] == "w1" and s["finished_at"] > sigterm_at, s
                # The long one went back to pending, not lost and not failed.
                assert lg["status"] == "pending", lg
                assert lg["worker_id"] is None, lg
                assert lg["attempts"] == 0, lg
                # Nobody claimed the late one.
                assert lt["status"] == "pending" and lt["attempts"] == 0, lt
                workers = {w["id"]: w for w in (await client.get("/workers")).json()["workers"]}
                assert workers["w1"]["status"] == "offline", workers["w1"]
                assert workers["w1"]["alive"] is False, workers["w1"]

                # With no worker, they stay pending; another worker then runs them.
                await fleet.start_worker("w2", concurrency=2)
                done = (
                    await client.get(f"/tasks/{late['id']}/wait", params={"timeout": 30})
                ).json()
                assert done["status"] == "completed" and done["worker_id"] == "w2", done
                await _wait_running_on(conn, [long["id"]], "w2")
                cancel = await client.post(f"/tasks/{long['id']}/cancel")
                assert cancel.status_code == 200, cancel.text
                final = (
                    await client.get(f"/tasks/{long['id']}/wait", params={"timeout": 30})
                ).json()
                assert final["status"] == "cancelled", final
        finally:
            await conn.close()


# ------------------------------------------------------------------------------------------------
# Postgres connections killed
# ------------------------------------------------------------------------------------------------


async def test_postgres_connections_killed_everything_reconnects(database_url: str) -> None:
    async with Fleet(database_url, env=AUDIT_MODULE_ENV) as fleet:
        conn = await fleet.connect()
        try:
            await create_audit_table(conn)
            await fleet.start_api()
            workers = await fleet.start_workers("w1", "w2")
            async with fleet.client() as client:
                warm = [
                    (await _submit(client, {"type": "demo.echo", "payload": {"value": i}}))["id"]
                    for i in range(20)
                ]
                await wait_tasks_terminal(conn, warm, timeout=30)
                for proc in workers:
                    assert await scrape_metric(f"{proc.url}/metrics", RECONNECTS) == 0

                killed = await conn.fetch(
                    "SELECT pid, application_name, pg_terminate_backend(pid) AS terminated "
                    "FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                names = sorted(r["application_name"] for r in killed)
                print("\nterminated backends:", names)
                assert all(r["terminated"] for r in killed), killed
                assert names.count("taskfleet-worker-listen") == 2, names
                assert "taskfleet-api" in names, names
                assert any(n.startswith("taskfleet-worker-") for n in names if "listen" not in n)
                # pg_terminate_backend only signals: wait until those backends have gone. A
                # request sent on a connection whose backend is still exiting is lost with it
                # (a 503, by design: the API does not ping a connection in steady use); this
                # test is about what follows the kill, not about that window.
                pids = [r["pid"] for r in killed]

                async def gone() -> bool:
                    left = await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", pids
                    )
                    return left == 0

                await eventually(gone, timeout=30, interval=0.01)

                # Tasks keep flowing: every submission accepted, every task completed once.
                ids_by_token: dict[str, int] = {}
                statuses: list[int] = []
                for i in range(50):
                    token = f"after-kill-{i}"
                    response = await client.post("/tasks", json=audit_task(token))
                    statuses.append(response.status_code)
                    if response.status_code == 201:
                        ids_by_token[token] = response.json()["id"]
                assert statuses == [201] * 50, statuses
                rows = await wait_tasks_terminal(conn, list(ids_by_token.values()), timeout=60)
                assert {r["status"] for r in rows.values()} == {"completed"}
                report = await audit_accounting(conn, ids_by_token)
                assert report.violations == [], report.violations
                assert report.audit_rows == 50, report.summary()

                # Both listeners came back.
                for proc in workers:

                    async def reconnected(proc: Proc = proc) -> bool:
                        value = await scrape_metric(f"{proc.url}/metrics", RECONNECTS)
                        return (value or 0) >= 1 and await _readyz_status(proc) == 200

                    await eventually(reconnected, timeout=30, interval=0.2)

                document = await _put_config_converges(client, 50)
                assert document["version"] >= 1, document
        finally:
            await conn.close()


# ------------------------------------------------------------------------------------------------
# Postgres restarted (a private server)
# ------------------------------------------------------------------------------------------------


async def test_postgres_restart_api_503_then_everything_recovers() -> None:
    cluster = PgCluster()
    try:
        await asyncio.to_thread(cluster.init)
        await asyncio.to_thread(cluster.start)
        url = await asyncio.to_thread(cluster.create_database, "taskfleet_e2e")
        await _postgres_restart(cluster, url)
    except BaseException:
        print("===== private postgres log\n", cluster.log()[-5000:])
        raise
    finally:
        await asyncio.to_thread(cluster.destroy)


async def _postgres_restart(cluster: PgCluster, url: str) -> None:
    ids_by_token: dict[str, int] = {}

    async def submit_audit(client: httpx.AsyncClient, token: str, seconds: float = 0.0) -> int:
        task = await _submit(client, audit_task(token, seconds=seconds))
        ids_by_token[token] = task["id"]
        return int(task["id"])

    async with Fleet(url, env=AUDIT_MODULE_ENV) as fleet:
        conn = await asyncpg.connect(url)
        try:
            await create_audit_table(conn)
        finally:
            await conn.close()
        api = await fleet.start_api()
        workers = await fleet.start_workers("w1", "w2")
        async with fleet.client(timeout=15) as client:
            # Work in flight when the server goes away: three tasks certainly running through
            # the outage, and more behind them.
            long_ids = [await submit_audit(client, f"before-long-{i}", seconds=3) for i in range(3)]
            for i in range(30):
                await submit_audit(client, f"before-{i}", seconds=1.0 if i % 3 == 0 else 0.0)
            conn = await asyncpg.connect(url)
            try:

                async def long_ones_running() -> bool:
                    rows = await task_rows(conn, long_ids)
                    return all(r["status"] == "running" for r in rows.values())

                await eventually(long_ones_running, timeout=30)
                in_flight = await conn.fetchval(
                    "SELECT count(*) FROM taskfleet.tasks WHERE status IN ('pending', 'running')"
                )
            finally:
                await conn.close()
            print(f"\n{in_flight} task(s) pending or running when Postgres stops")

            await asyncio.to_thread(cluster.stop, "fast")

            # While it is down: the API answers 503, never 500; so do the readiness probes.
            for _ in range(3):
                down = await client.post("/tasks", json={"type": "demo.echo", "payload": {}})
                assert down.status_code == 503, (down.status_code, down.text)
            assert await _readyz_status(api) == 503
            for proc in workers:

                async def worker_unready(proc: Proc = proc) -> bool:
                    return await _readyz_status(proc) == 503

                await eventually(worker_unready, timeout=15, interval=0.1)
            still_down = await client.get("/tasks", params={"limit": 1})
            assert still_down.status_code == 503, still_down.text

            await asyncio.to_thread(cluster.start)
            restarted = time.monotonic()

            # Within 20 s, tasks flow again: submit -> completed.
            first_token = "after-restart-first"

            async def flowing() -> bool:
                if first_token not in ids_by_token:
                    response = await client.post("/tasks", json=audit_task(first_token))
                    if response.status_code != 201:
                        assert response.status_code == 503, response.text
                        return False
                    ids_by_token[first_token] = response.json()["id"]
                task = await client.get(f"/tasks/{ids_by_token[first_token]}")
                return task.status_code == 200 and task.json()["status"] == "completed"

            await eventually(flowing, timeout=20, interval=0.2)
            print(f"\nfirst task completed {time.monotonic() - restarted:.1f}s after restart")

            # The listeners are back (reconnected at least once) and the workers ready.
            for proc in workers:

                async def listening(proc: Proc = proc) -> bool:
                    value = await scrape_metric(f"{proc.url}/metrics", RECONNECTS)
                    return (value or 0) >= 1 and await _readyz_status(proc) == 200

                await eventually(listening, timeout=30, interval=0.2)
            assert await _readyz_status(api) == 200

            await _put_config_converges(client, 50)

            for i in range(30):
                await submit_audit(client, f"after-{i}", seconds=0.2 if i % 3 == 0 else 0.0)

        conn = await asyncpg.connect(url)
        try:
            await wait_tasks_terminal(conn, list(ids_by_token.values()), timeout=60)
            report = await audit_accounting(conn, ids_by_token)
        finally:
            await conn.close()
        print("restart audit:", report.summary())
        for token, pids in report.repeated.items():
            print(f"  run more than once: {token} pids {pids}")
        # No task lost or completed twice; a task ran more than once only if it was claimed
        # more than once (at-least-once across the outage), never within one attempt.
        assert report.violations == [], report.violations
        assert report.statuses == {"completed": len(ids_by_token)}, report.summary()
        assert report.runs_without_completion <= report.retried_tasks, report.summary()


# ------------------------------------------------------------------------------------------------
# Exactly-once accounting under kill -9
# ------------------------------------------------------------------------------------------------


async def test_exactly_once_accounting_under_kill9(database_url: str) -> None:
    async with Fleet(database_url, env=AUDIT_MODULE_ENV) as fleet:
        conn = await fleet.connect()
        try:
            await create_audit_table(conn)
            await fleet.start_api()
            w1, _w2, _w3 = await fleet.start_workers("w1", "w2", "w3")
            run = uuid.uuid4().hex[:8]
            tokens = [f"acct-{run}-{i}" for i in range(300)]
            bodies = [
                audit_task(token, seconds=0.2 if i % 4 == 0 else 0.0)
                for i, token in enumerate(tokens)
            ]
            ids_by_token: dict[str, int] = {}
            async with fleet.client() as client:
                for start in range(0, 300, 100):
                    response = await client.post(
                        "/tasks/batch", json={"tasks": bodies[start : start + 100]}
                    )
                    assert response.status_code == 201, response.text
                    for token, task in zip(
                        tokens[start : start + 100], response.json()["tasks"], strict=True
                    ):
                        ids_by_token[token] = task["id"]
            ids = list(ids_by_token.values())

            # Kill w1 in the middle: some work done, w1 holding running tasks.
            async def middle() -> bool:
                counts = dict(
                    await conn.fetch(
                        "SELECT status, count(*) FROM taskfleet.tasks "
                        "WHERE id = ANY($1::bigint[]) GROUP BY status",
                        ids,
                    )
                )
                held = await conn.fetchval(
                    "SELECT count(*) FROM taskfleet.tasks WHERE id = ANY($1::bigint[]) "
                    "AND status = 'running' AND worker_id = 'w1'",
                    ids,
                )
                return bool(counts.get("completed", 0) >= 60 and held >= 1)

            await eventually(middle, timeout=60, interval=0.02)
            held_at_kill = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE id = ANY($1::bigint[]) "
                "AND status = 'running' AND worker_id = 'w1'",
                ids,
            )
            w1.kill9()
            await fleet.start_worker("w4")

            rows = await wait_tasks_terminal(conn, ids, timeout=120)
            report = await audit_accounting(conn, ids_by_token)
            from_victim = await conn.fetchval(
                "SELECT count(*) FROM public.audit_runs WHERE pid = $1", w1.popen.pid
            )
        finally:
            await conn.close()

        print(
            f"\nexactly-once audit (300 tasks, 3 workers, kill -9 w1 holding {held_at_kill} "
            f"running): {report.summary()} runs_by_killed_worker={from_victim}"
        )
        assert {r["status"] for r in rows.values()} == {"completed"}
        assert report.statuses == {"completed": 300}, report.summary()
        assert report.violations == [], report.violations[:20]
        # Extra runs exist only for tasks claimed again after the kill, and each of those runs
        # was the killed worker's (the completing run is the one whose result was stored).
        assert report.runs_without_completion <= report.retried_tasks, report.summary()
        for token, pids in report.repeated.items():
            assert pids.count(w1.popen.pid) >= len(pids) - 1, (token, pids)
        assert report.retried_tasks >= 1, "the killed worker held running tasks"
