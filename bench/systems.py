"""The systems under test, behind one small interface: taskfleet, pgqueuer and procrastinate.

Each system knows how to install its schema, start its workers (and say when they listen), put
work in through its own enqueue path, and read back from its own tables when tasks were created,
started and finished, so every figure comes from the database clock, not from the harness.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from bench import processes, stamps
from bench.peer_worker import NOOP
from taskfleet.shared import db, migrations, protocol, queries, submission
from taskfleet.shared.policy.lanes import lane_for_priority

#: Bound on waiting for workers to say they are ready.
READY_TIMEOUT = 60.0


@dataclass(frozen=True)
class Window:
    """What a drain measured: tasks completed between the first start and the last finish."""

    completed: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0


class Submitter(Protocol):
    """One enqueue path of one system: one task per call, or many in one call."""

    async def one(self) -> int:
        """Enqueue one task; its id (its handler stamps that id: bench.stamps)."""
        ...

    async def many(self, n: int) -> None: ...

    async def close(self) -> None: ...


class System(Protocol):
    name: str
    #: Systems sharing a template key share the installed template (taskfleet's two settings).
    template_key: str

    async def install(self, url: str) -> None: ...

    async def start_workers(
        self, url: str, count: int, concurrency: int
    ) -> list[processes.Process]: ...

    async def submitters(self, url: str, count: int) -> list[Submitter]: ...

    async def queue_left(self, conn: asyncpg.Connection) -> int: ...

    async def drain_window(self, conn: asyncpg.Connection) -> Window: ...

    async def pickup_seconds(self, conn: asyncpg.Connection) -> list[float]: ...


async def seed(system: System, url: str, n: int) -> None:
    """``n`` no-op tasks in one statement through the system's own batch path (one wake-up)."""
    (submitter,) = await system.submitters(url, 1)
    try:
        await submitter.many(n)
    finally:
        await submitter.close()


# ------------------------------------------------------------------------------------------------
# taskfleet
# ------------------------------------------------------------------------------------------------


def taskfleet_insert_params(
    n: int,
    *,
    task_type: str = "demo.echo",
    payload: dict[str, Any] | None = None,
    priority: int = 0,
    labels: Callable[[int], list[str]] | None = None,
) -> dict[str, Any]:
    """Parameters of ``task_insert_batch`` for ``n`` tasks, as the API builds them."""
    payload_json = db.dumps(payload or {})
    return {
        "types": [task_type] * n,
        "payloads": [payload_json] * n,
        "priorities": [priority] * n,
        "weights": [1] * n,
        "labels": [json.dumps(labels(i) if labels else []) for i in range(n)],
        "max_attempts": [3] * n,
        "delays": [None] * n,
        "run_ats": [None] * n,
        "timeouts": [None] * n,
        "unique_keys": [None] * n,
        "requires": ["[]"] * n,
        # As the API and the enqueue paths send it: the lane the tasks are in.
        "wake_hint": protocol.wake_hint([lane_for_priority(priority).value]),
    }


async def taskfleet_insert(conn: asyncpg.Connection, params: dict[str, Any]) -> list[int]:
    """The tasks' ids, in submission order."""
    sql, args = queries.task_insert_batch.positional(params)
    return [int(row["id"]) for row in await conn.fetch(sql, *args)]


class TaskfleetPython:
    """taskfleet's Python enqueue path: the named query on an asyncpg connection."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        # A single task is the stamping no-op (bench.stamps), as the peers' single jobs are;
        # inserted with the statement taskfleet's enqueue paths use for one task.
        query, params = submission.insert_statement(
            [submission.Submission(submission.TaskIn(type=stamps.STAMP_TYPE), "{}")]
        )
        self._one_sql, self._one_args = query.positional(params)

    async def one(self) -> int:
        row = await self.conn.fetchrow(self._one_sql, *self._one_args)
        return int(row["id"])

    async def many(self, n: int) -> None:
        await taskfleet_insert(self.conn, taskfleet_insert_params(n))

    async def close(self) -> None:
        await self.conn.close()


class Taskfleet:
    """``taskfleet worker`` processes; ``synchronous_commit`` is TASKFLEET_SYNCHRONOUS_COMMIT."""

    template_key = "taskfleet"

    def __init__(self, *, synchronous_commit: bool = False) -> None:
        self.synchronous_commit = synchronous_commit
        self.name = "taskfleet-sync" if synchronous_commit else "taskfleet"

    async def install(self, url: str) -> None:
        await migrations.upgrade_async(url)

    def worker_env(self, url: str) -> dict[str, str]:
        return {
            "DATABASE_URL": url,
            "TASKFLEET_LOG_LEVEL": "WARNING",
            "TASKFLEET_TASK_MODULES": "bench.stamp_task",
            "TASKFLEET_SYNCHRONOUS_COMMIT": "true" if self.synchronous_commit else "false",
        }

    async def start_workers(
        self, url: str, count: int, concurrency: int
    ) -> list[processes.Process]:
        started = []
        try:
            for i in range(count):
                argv = [
                    sys.executable, "-m", "taskfleet.cli", "worker",
                    "--concurrency", str(concurrency),
                    "--metrics-port", "0",
                    "--worker-id", f"bench-{i}",
                ]  # fmt: skip
                p = await processes.start(f"taskfleet-worker-{i}", argv, self.worker_env(url))
                p.discard_output()
                started.append(p)
            # A worker registers after its LISTEN connection is up: online means listening.
            conn = await asyncpg.connect(url)
            try:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + READY_TIMEOUT
                while True:
                    online = await conn.fetchval(
                        "SELECT count(*) FROM taskfleet.workers WHERE status = 'online'"
                    )
                    if online >= count:
                        break
                    dead = [p for p in started if not p.running]
                    if dead or loop.time() > deadline:
                        culprit = dead[0] if dead else started[0]
                        raise RuntimeError(
                            f"taskfleet workers not ready ({online}/{count}):\n"
                            + culprit.log_tail()
                        )
                    await asyncio.sleep(0.05)
            finally:
                await conn.close()
        except BaseException:
            await processes.stop(started)
            raise
        return started

    async def submitters(self, url: str, count: int) -> list[Submitter]:
        return [TaskfleetPython(await db.connect(url)) for _ in range(count)]

    async def queue_left(self, conn: asyncpg.Connection) -> int:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE status IN ('pending', 'running')"
            )
        )

    async def drain_window(self, conn: asyncpg.Connection) -> Window:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'completed') AS completed,"
            " EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 AS seconds"
            " FROM taskfleet.tasks WHERE type <> 'updateWorkerRuntimeConfig'"
        )
        return Window(int(row["completed"]), float(row["seconds"] or 0.0))

    async def pickup_seconds(self, conn: asyncpg.Connection) -> list[float]:
        rows = await conn.fetch(
            "SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 AS s"
            " FROM taskfleet.tasks WHERE started_at IS NOT NULL ORDER BY id"
        )
        return [r["s"] for r in rows]


# ------------------------------------------------------------------------------------------------
# pgqueuer
# ------------------------------------------------------------------------------------------------


class PgqueuerSubmitter:
    def __init__(self, conn: asyncpg.Connection) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        self.conn = conn
        self.queries = Queries(AsyncpgDriver(conn))

    async def one(self) -> int:
        (job_id,) = await self.queries.enqueue(NOOP, None)
        return int(job_id)

    async def many(self, n: int) -> None:
        await self.queries.enqueue([NOOP] * n, [None] * n, [0] * n)

    async def close(self) -> None:
        await self.conn.close()


class Pgqueuer:
    """pgqueuer's QueueManager with its defaults (see bench.peer_worker)."""

    name = "pgqueuer"
    template_key = "pgqueuer"

    async def install(self, url: str) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        conn = await asyncpg.connect(url)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def start_workers(
        self, url: str, count: int, concurrency: int
    ) -> list[processes.Process]:
        return await _start_peer_workers("pgqueuer", url, count, concurrency)

    async def submitters(self, url: str, count: int) -> list[Submitter]:
        return [PgqueuerSubmitter(await asyncpg.connect(url)) for _ in range(count)]

    async def queue_left(self, conn: asyncpg.Connection) -> int:
        # Finished jobs are deleted from the queue table (and logged).
        return int(await conn.fetchval("SELECT count(*) FROM pgqueuer"))

    async def drain_window(self, conn: asyncpg.Connection) -> Window:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'successful') AS completed,"
            " EXTRACT(EPOCH FROM max(created) FILTER (WHERE status = 'successful')"
            "   - min(created) FILTER (WHERE status = 'picked'))::float8 AS seconds"
            " FROM pgqueuer_log"
        )
        return Window(int(row["completed"]), float(row["seconds"] or 0.0))

    async def pickup_seconds(self, conn: asyncpg.Connection) -> list[float]:
        rows = await conn.fetch(
            "SELECT EXTRACT(EPOCH FROM p.created - q.created)::float8 AS s"
            " FROM pgqueuer_log q JOIN pgqueuer_log p ON p.job_id = q.job_id"
            " WHERE q.status = 'queued' AND p.status = 'picked' ORDER BY q.job_id"
        )
        return [r["s"] for r in rows]


# ------------------------------------------------------------------------------------------------
# procrastinate
# ------------------------------------------------------------------------------------------------


class ProcrastinateSubmitter:
    """procrastinate's defer path over one shared app (its connection pool sized to the
    submitters in flight, so the pool is not the bottleneck)."""

    def __init__(self, app: Any, task: Any, owner: bool) -> None:
        self.app = app
        self.task = task
        self.owner = owner

    async def one(self) -> int:
        return int(await self.task.defer_async())

    async def many(self, n: int) -> None:
        await self.task.batch_defer_async(*([{}] * n))

    async def close(self) -> None:
        if self.owner:
            await self.app.close_async()


def _procrastinate_app(url: str, pool_size: int | None = None) -> tuple[Any, Any]:
    from procrastinate import App, PsycopgConnector

    sizes: dict[str, Any] = {"min_size": pool_size, "max_size": pool_size} if pool_size else {}
    app = App(connector=PsycopgConnector(conninfo=url, **sizes))

    @app.task(name=NOOP)
    async def noop() -> None:
        return None

    return app, noop


class Procrastinate:
    """procrastinate's worker with its defaults and ``concurrency`` (see bench.peer_worker)."""

    name = "procrastinate"
    template_key = "procrastinate"

    async def install(self, url: str) -> None:
        app, _ = _procrastinate_app(url, pool_size=1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def start_workers(
        self, url: str, count: int, concurrency: int
    ) -> list[processes.Process]:
        return await _start_peer_workers("procrastinate", url, count, concurrency)

    async def submitters(self, url: str, count: int) -> list[Submitter]:
        app, task = _procrastinate_app(url, pool_size=count)
        await app.open_async()
        return [ProcrastinateSubmitter(app, task, owner=(i == 0)) for i in range(count)]

    async def queue_left(self, conn: asyncpg.Connection) -> int:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            )
        )

    async def drain_window(self, conn: asyncpg.Connection) -> Window:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE type = 'succeeded') AS completed,"
            " EXTRACT(EPOCH FROM max(at) FILTER (WHERE type = 'succeeded')"
            "   - min(at) FILTER (WHERE type = 'started'))::float8 AS seconds"
            " FROM procrastinate_events"
        )
        return Window(int(row["completed"]), float(row["seconds"] or 0.0))

    async def pickup_seconds(self, conn: asyncpg.Connection) -> list[float]:
        rows = await conn.fetch(
            "SELECT EXTRACT(EPOCH FROM s.at - d.at)::float8 AS s"
            " FROM procrastinate_events d JOIN procrastinate_events s ON s.job_id = d.job_id"
            " WHERE d.type = 'deferred' AND s.type = 'started' ORDER BY d.job_id"
        )
        return [r["s"] for r in rows]


async def _start_peer_workers(
    system: str, url: str, count: int, concurrency: int
) -> list[processes.Process]:
    started: list[processes.Process] = []
    try:
        for i in range(count):
            argv = [
                sys.executable, "-m", "bench.peer_worker", system,
                "--dsn", url, "--concurrency", str(concurrency), "--name", f"bench-peer-{i}",
            ]  # fmt: skip
            started.append(await processes.start(f"{system}-worker-{i}", argv))
        await asyncio.gather(*(p.wait_for_line("READY", READY_TIMEOUT) for p in started))
    except BaseException:
        await processes.stop(started)
        raise
    return started


def all_systems() -> dict[str, System]:
    return {
        s.name: s
        for s in (
            Taskfleet(),
            Taskfleet(synchronous_commit=True),
            Pgqueuer(),
            Procrastinate(),
        )
    }
