"""Through a real PgBouncer in transaction mode (tests/pgbouncer.py: Debian's package, pool_mode
transaction, no prepared-statement support, few server connections shared by every client).

``TASKFLEET_DATABASE_URL`` on PgBouncer, ``TASKFLEET_LISTEN_DATABASE_URL`` on Postgres,
``TASKFLEET_DATABASE_POOLER=transaction``: the worker claims, finishes and is woken by LISTEN;
it survives PgBouncer's server connections being killed under it; the API serves concurrent
requests; ``taskfleet migrate`` runs. Without the setting, a worker stops with the reason instead
of looping, and the API's named prepared statements collide (shown, so the setting is needed).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from taskfleet.api.app import create_app
from taskfleet.shared import migrations
from taskfleet.shared.queries import Query
from taskfleet.shared.settings import ApiSettings, WorkerSettings
from taskfleet.testing import with_database
from taskfleet.worker.database import Database
from taskfleet.worker.worker import Worker
from tests.integration.workerkit import (
    build_worker,
    connect,
    sample,
    start,
    submit,
    wait_tasks,
    wait_until,
)
from tests.pgbouncer import PgBouncer

ADMIN = "admin-token-pgbouncer-1"
#: No idle poll within any wait of these tests: only a NOTIFY can wake the claim loop.
NO_POLL = {"poll_interval": 600.0, "runtime_config_poll_interval": 600.0}


def pooled(bouncer: PgBouncer, database_url: str) -> dict[str, Any]:
    """The settings of a process whose DATABASE_URL is PgBouncer and whose LISTEN is direct."""
    return {
        "database_url": bouncer.url(database_url),
        "listen_database_url": database_url,
        "database_pooler": "transaction",
    }


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


async def clients_through(bouncer: PgBouncer, database: str) -> list[str]:
    """The application names of PgBouncer's clients connected to ``database``."""
    rows = await bouncer.admin("SHOW CLIENTS")
    return [str(r["application_name"]) for r in rows if r["database"] == database]


async def kill_server_connections(bouncer: PgBouncer, database_url: str) -> int:
    """pg_terminate_backend every server connection PgBouncer holds to the test database (as a
    failover or an idle-connection reaper would): how many there were."""
    rows = await bouncer.admin("SHOW SERVERS")
    pids = [int(r["remote_pid"]) for r in rows if r["database"] == database_name(database_url)]
    async with connect(database_url) as conn:
        for pid in pids:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
    return len(pids)


def assert_claims_on_the_listen_session(worker: Worker) -> None:
    """The worker's last claim ran on its LISTEN connection (behind a pooler)."""
    claim_conn = worker._claim_db._conn
    assert claim_conn is not None
    assert claim_conn.get_server_pid() == worker.listener.backend_pid


async def test_a_worker_claims_finishes_and_wakes_through_pgbouncer(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    worker = build_worker(database_url, **pooled(pgbouncer, database_url), **NO_POLL)
    run = await start(worker)
    try:
        # Two connections (io, tick) go through PgBouncer, under one application_name (so
        # PgBouncer need not SET it at each hand-out); the LISTEN connection does not, and the
        # claims run on it (a direct session: prepared, one round trip each).
        database = database_name(database_url)

        async def two_clients() -> bool:
            return len(await clients_through(pgbouncer, database)) == 2

        await wait_until(two_clients, "the worker's two connections on PgBouncer")
        assert await clients_through(pgbouncer, database) == ["taskfleet"] * 2
        async with connect(database_url) as conn:
            # Submitted after the worker went idle: with no poll due, only the NOTIFY on the
            # direct LISTEN connection can wake it.
            ids = await submit(conn, "kit.count", [{"key": "pgb", "i": i} for i in range(20)])
            rows = await wait_tasks(conn, ids, {"completed"})
            assert {r["worker_id"] for r in rows.values()} == {worker.id}
            assert sorted(r["result"]["i"] for r in rows.values()) == list(range(20))
            # Postgres saw the claims from the listening backend, and from no other of the
            # worker's (a direct claim connection would be a third application name).
            names = await conn.fetch(
                "SELECT application_name, pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE 'taskfleet-worker-%'"
            )
            assert [(r["application_name"], r["pid"]) for r in names] == [
                ("taskfleet-worker-listen", worker.listener.backend_pid)
            ]
            assert_claims_on_the_listen_session(worker)
            # On their generic plan there too (db.session_settings).
            async with worker._claim_db._lock:
                listen = worker._claim_db._conn
                assert listen is not None
                assert await listen.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
        assert worker.not_ready_reasons() == []
    finally:
        await run.stop()


async def test_claims_follow_the_listen_connection_when_it_is_lost(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    # The claims share the direct LISTEN connection: when it dies (idle, or under a claim), the
    # listener connects again and catches up, and the claims run on the new one.
    worker = build_worker(database_url, **pooled(pgbouncer, database_url), **NO_POLL)
    run = await start(worker)
    try:
        async with connect(database_url) as conn:
            (first,) = await submit(conn, "kit.count", [{"key": "lost", "i": 0}])
            await wait_tasks(conn, [first], {"completed"})
            old_pid = worker.listener.backend_pid
            assert old_pid is not None
            await conn.execute("SELECT pg_terminate_backend($1)", old_pid)

            async def reconnected() -> bool:
                pid = worker.listener.backend_pid
                return pid is not None and pid != old_pid

            await wait_until(reconnected, "the listener connects again")
            ids = await submit(conn, "kit.count", [{"key": "lost", "i": i} for i in range(1, 6)])
            rows = await wait_tasks(conn, ids, {"completed"})
            assert all(r["attempts"] == 1 for r in rows.values())
            assert_claims_on_the_listen_session(worker)
        assert worker.not_ready_reasons() == []
    finally:
        await run.stop()


async def test_a_worker_prunes_through_pgbouncer(database_url: str, pgbouncer: PgBouncer) -> None:
    # Retention runs on a connection of its own, opened the first time something is due: it
    # too must keep no session state (it once sent synchronous_commit as a startup parameter,
    # which PgBouncer refuses, so nothing was ever pruned through a pooler).
    worker = build_worker(database_url, **pooled(pgbouncer, database_url), retention_completed="1s")
    run = await start(worker)
    try:
        async with connect(database_url) as conn:
            ids = await submit(conn, "demo.echo", [{"value": i} for i in range(5)])
            # Not a wait for "completed" first: a lone worker writes its outcomes at once, and
            # a one-second retention may prune the rows before a poll sees them completed.
            await wait_until(
                lambda: sample(worker, "taskfleet_pruned_total", status="completed") >= 5,
                "the completed tasks are pruned",
            )
            left = await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE id = ANY($1::bigint[])", ids
            )
            assert left == 0
        assert worker.not_ready_reasons() == []
    finally:
        await run.stop()


async def test_a_killed_server_connection_costs_no_task(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    worker = build_worker(database_url, **pooled(pgbouncer, database_url), **NO_POLL)
    run = await start(worker)
    try:
        async with connect(database_url) as conn:
            first = await submit(conn, "kit.count", [{"key": "kill", "i": i} for i in range(5)])
            await wait_tasks(conn, first, {"completed"})
            assert await kill_server_connections(pgbouncer, database_url) > 0
            # PgBouncer opens new server connections; the worker's statement that met the dead
            # one fails, is retried, and nothing is lost or run twice.
            second = await submit(
                conn, "kit.count", [{"key": "kill", "i": i} for i in range(5, 15)]
            )
            rows = await wait_tasks(conn, second, {"completed"})
            assert all(r["attempts"] == 1 for r in rows.values())
            # Harder: PgBouncer drops every client and server connection of the database
            # (KILL), and holds new ones until RESUME. The worker's connections break, and
            # reconnect once it resumes.
            await pgbouncer.admin(f"KILL {database_name(database_url)}")
            await pgbouncer.admin(f"RESUME {database_name(database_url)}")
            third = await submit(
                conn, "kit.count", [{"key": "kill", "i": i} for i in range(15, 25)]
            )
            rows = await wait_tasks(conn, third, {"completed"})
            assert all(r["attempts"] == 1 for r in rows.values())
        await wait_until(lambda: worker.not_ready_reasons() == [], "worker ready again")
        assert worker.status == "running"
    finally:
        await run.stop()


async def test_without_the_pooler_setting_a_worker_stops_with_the_reason(
    database_url: str, pgbouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    # The report this comes from: every worker looped on "unsupported startup parameter:
    # synchronous_commit" while looking alive. Now it exits 2 with what to set.
    worker = build_worker(
        database_url, database_url=pgbouncer.url(database_url), listen_database_url=database_url
    )
    await asyncio.wait_for(worker.run(), 30)
    assert worker.exit_code == 2
    assert not worker.ready.is_set()
    message = "\n".join(r.getMessage() for r in caplog.records)
    assert "unsupported startup parameter" in message
    assert "TASKFLEET_DATABASE_POOLER=transaction" in message


async def test_worker_settings_hold_for_each_statement_and_stay_in_it(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    """SET LOCAL through the pooler: the statement runs under the connection's settings (the
    server's statement timeout ends a statement, and with it its locks), and the server
    connection goes back to the pool without them."""
    through = pgbouncer.url(database_url)
    worker_db = Database(through, "t", synchronous_commit=False, statement_timeout=0.5, pooled=True)
    settings = Query(
        "t_settings",
        "SELECT current_setting('synchronous_commit') AS sync, "
        "current_setting('statement_timeout') AS timeout, pg_backend_pid() AS pid",
    )
    try:
        (row,) = await worker_db.fetch(settings)
        assert (row["sync"], row["timeout"]) == ("off", "500ms")
        with pytest.raises(asyncpg.QueryCanceledError):
            await worker_db.fetch(Query("t_sleep", "SELECT pg_sleep(5)"))
        (row,) = await worker_db.fetch(settings)  # the connection is usable again
        assert row["sync"] == "off"
        server_pid = row["pid"]
    finally:
        await worker_db.close()
    # Another client of the same pool gets that server connection (this database's pool has
    # only the one, used one statement at a time) and sees the server's defaults: nothing
    # stayed in the session.
    other = await asyncpg.connect(through, statement_cache_size=0)
    try:
        assert await other.fetchval("SELECT pg_backend_pid()") == server_pid
        assert await other.fetchval("SHOW synchronous_commit") == "on"
        assert await other.fetchval("SHOW statement_timeout") == "0"
    finally:
        await other.close()


def test_a_pooled_worker_requires_a_direct_listen_url(database_url: str) -> None:
    with pytest.raises(ValueError, match="TASKFLEET_LISTEN_DATABASE_URL"):
        WorkerSettings(database_url=database_url, database_pooler="transaction")
    # The API does not LISTEN: the setting alone is enough.
    ApiSettings(database_url=database_url, database_pooler="transaction", auth_disabled=True)


def test_a_pooled_api_refuses_a_url_libpq_cannot_read(database_url: str) -> None:
    # asyncpg passes an unknown query parameter to the server as a setting; libpq (the API's
    # driver behind a pooler) refuses it: said at start, naming the parameter.
    url = f"{database_url}?applicationname=x"
    with pytest.raises(ValueError, match=r'DATABASE_URL.*libpq.*"applicationname"'):
        ApiSettings(database_url=url, database_pooler="transaction", auth_disabled=True)
    # Directly on Postgres the API is on asyncpg: not its concern there.
    ApiSettings(database_url=url, auth_disabled=True)
    ApiSettings(
        database_url=f"{database_url}?sslmode=disable",
        database_pooler="transaction",
        auth_disabled=True,
    )


@pytest.fixture
async def pooled_api(database_url: str, pgbouncer: PgBouncer) -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(
        **pooled(pgbouncer, database_url), api_tokens=f"admin:{ADMIN}", db_pool_size=6
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://api",
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as client,
    ):
        yield client


async def _submit_and_read(client: httpx.AsyncClient, n: int) -> list[int]:
    async def one(i: int) -> int:
        created = await client.post("/tasks", json={"type": "demo.echo", "payload": {"value": i}})
        assert created.status_code == 201, created.text
        task_id = int(created.json()["id"])
        read = await client.get(f"/tasks/{task_id}")
        assert read.status_code == 200, read.text
        return task_id

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_the_api_serves_concurrent_requests_through_pgbouncer(
    pooled_api: httpx.AsyncClient,
) -> None:
    # Six pooled API connections over a few shared server connections: a statement prepared
    # under a name on one would collide with, or be missing from, the next.
    ids = await _submit_and_read(pooled_api, 60)
    assert len(set(ids)) == 60
    listed = await pooled_api.get("/tasks", params={"limit": 100})
    assert listed.status_code == 200, listed.text
    config = await pooled_api.get("/runtime-config")
    assert config.status_code in (200, 404), config.text


async def test_the_api_replaces_connections_pgbouncer_dropped_without_a_failed_request(
    pooled_api: httpx.AsyncClient, pgbouncer: PgBouncer, database_url: str
) -> None:
    """PgBouncer dropping its clients (``KILL``: a pooler restarting, or an operator draining
    it) closes every pooled API connection while it sits idle. psycopg learns that only when it
    next reads; the pool's checkout sees the goodbye in the socket and replaces the connection
    before the request's statement, so no request fails for it."""
    await _submit_and_read(pooled_api, 12)  # several pooled connections, all idle now
    database = database_url.rsplit("/", 1)[1].split("?")[0]
    await pgbouncer.admin(f"KILL {database}")
    await pgbouncer.admin(f"RESUME {database}")
    for i in range(12):
        created = await pooled_api.post(
            "/tasks", json={"type": "demo.echo", "payload": {"value": i}}
        )
        assert created.status_code == 201, created.text


async def test_without_the_setting_the_api_answers_503_naming_it(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    """What the setting prevents, shown so the test above can fail: asyncpg's and SQLAlchemy's
    named, cached statements meet other connections' on PgBouncer's shared server connections.
    The API answers 503 naming the setting (never a 500)."""
    settings = ApiSettings(
        database_url=pgbouncer.url(database_url), api_tokens=f"admin:{ADMIN}", db_pool_size=6
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://api",
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as client,
    ):

        async def one(i: int) -> httpx.Response:
            return await client.post("/tasks", json={"type": "demo.echo", "payload": {"value": i}})

        answers = await asyncio.gather(*(one(i) for i in range(60)))
        statuses = {a.status_code for a in answers}
        assert statuses <= {201, 503}, statuses
        refused = [a for a in answers if a.status_code == 503]
        assert refused, "no collision: the test cannot show what the setting prevents"
        assert "TASKFLEET_DATABASE_POOLER=transaction" in refused[0].text


@pytest.fixture
def empty_database(pg_server_url: str) -> Iterator[str]:
    name = f"tf_pgb_{uuid.uuid4().hex[:12]}"
    admin = with_database(pg_server_url, "postgres")

    async def run(statement: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(pg_server_url, name)
    finally:
        asyncio.run(run(f'DROP DATABASE "{name}" WITH (FORCE)'))


def test_taskfleet_migrate_runs_through_pgbouncer(
    empty_database: str, pgbouncer: PgBouncer
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
    env.update(
        {
            "DATABASE_URL": pgbouncer.url(empty_database),
            "TASKFLEET_LISTEN_DATABASE_URL": empty_database,
            "TASKFLEET_DATABASE_POOLER": "transaction",
        }
    )

    def migrate() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "taskfleet.cli", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def outcomes(runs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
        return [(run.wait(timeout=120), run.communicate()[1]) for run in runs]

    # From empty, then again at head: the second run reuses server connections on which the
    # first left its (uniquely named) statements.
    for _ in range(2):
        assert outcomes([migrate()]) == [(0, "")]
    # Back to empty, then three at once through the pooler, as several pods' migrate Jobs
    # would: they queue on the transaction-level advisory lock and all succeed.
    migrations.downgrade(pgbouncer.url(empty_database), "base")
    results = outcomes([migrate() for _ in range(3)])
    assert [code for code, _ in results] == [0, 0, 0], results

    async def revisions() -> list[str]:
        conn = await asyncpg.connect(empty_database)
        try:
            rows = await conn.fetch("SELECT version_num FROM taskfleet.alembic_version")
        finally:
            await conn.close()
        return [r["version_num"] for r in rows]

    assert asyncio.run(revisions()) == [migrations.head_revision()]
