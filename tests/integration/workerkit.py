"""Shared helpers of the worker runtime tests: a real ``Worker`` in the test's event loop against
a real Postgres, tasks submitted with the named queries, and waits on task rows or worker events.

Nothing here sleeps for a fixed time to let something happen: every wait polls an outcome (a task
row, a metric sample, a worker attribute) under an overall deadline, so a slow CI machine only
makes the tests slower, never wrong.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from taskfleet.shared import db, protocol, queries
from taskfleet.shared.context import TaskContext
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.policy.runtime_config import normalise_runtime_config
from taskfleet.shared.registry import PermanentError, TaskParams, TaskRegistry, load_registry
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.worker import Worker

#: Overall bound of any one wait (seconds). Outcomes, not timing: it only limits a hang.
DEADLINE = 20.0
POLL = 0.02
FINISHED = frozenset({"completed", "failed", "cancelled"})

#: Short timers so the tests run fast (lease_ttl must stay above 2 x heartbeat_interval).
FAST_TIMERS: dict[str, Any] = {
    "concurrency": 4,
    "metrics_port": 0,
    "worker_id": "w1",
    "poll_interval": 0.2,
    "heartbeat_interval": 0.2,
    "lease_ttl": 1.0,
    "sweep_interval": 0.2,
    "runtime_config_poll_interval": 0.3,
    "drain_timeout": 2.0,
    "retry_base": 0.01,
    "retry_cap": 0.05,
}

# ------------------------------------------------------------------------------------------------
# Test handlers
# ------------------------------------------------------------------------------------------------

test_tasks = TaskRegistry()


class Gate:
    """An event tests open to let ``kit.block`` tasks finish, with a record of who ran when."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.running: Counter[str] = Counter()
        self.max_running: Counter[str] = Counter()
        self.entered: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        #: Observations made when a task entered: (kind, worker.strict_inflight).
        self.observations: list[tuple[str, int]] = []
        self.observe: Callable[[], int] | None = None


_GATES: dict[str, Gate] = {}


def gate(name: str) -> Gate:
    """A fresh gate under ``name`` (names are per test; one event loop per test)."""
    _GATES[name] = Gate()
    return _GATES[name]


class BlockParams(TaskParams):
    gate: str
    kind: str = ""


@test_tasks.task("kit.block", params=BlockParams)
async def block(params: BlockParams) -> dict[str, Any]:
    g = _GATES[params.gate]
    g.entered[params.kind] += 1
    g.running[params.kind] += 1
    g.max_running[params.kind] = max(g.max_running[params.kind], g.running[params.kind])
    if g.observe is not None:
        g.observations.append((params.kind, g.observe()))
    try:
        await g.open.wait()
    finally:
        g.running[params.kind] -= 1
    g.finished[params.kind] += 1
    return {"kind": params.kind}


#: kit.flaky calls per key (a handler sees its payload, not its task id: the key stands in).
FLAKY_CALLS: Counter[str] = Counter()


class FlakyParams(TaskParams):
    key: str
    failures: int


@test_tasks.task("kit.flaky", params=FlakyParams)
async def flaky(params: FlakyParams) -> dict[str, Any]:
    FLAKY_CALLS[params.key] += 1
    calls = FLAKY_CALLS[params.key]
    if calls <= params.failures:
        raise RuntimeError(f"flaky failure number {calls}")
    return {"calls": calls}


class GroupParams(TaskParams):
    #: Whether one of the grouped errors is a PermanentError.
    permanent: bool


@test_tasks.task("kit.group", params=GroupParams)
async def group(params: GroupParams) -> None:
    """Fails as a TaskGroup does: an ExceptionGroup of its children's errors."""

    async def fails(exc: Exception) -> None:
        raise exc

    async with asyncio.TaskGroup() as children:
        children.create_task(fails(RuntimeError("a transient fault")))
        if params.permanent:
            children.create_task(fails(PermanentError("the record is gone")))


#: kit.self_cancel calls per key.
SELF_CANCEL_CALLS: Counter[str] = Counter()


class SelfCancelParams(TaskParams):
    key: str


@test_tasks.task("kit.self_cancel", params=SelfCancelParams)
async def self_cancel(params: SelfCancelParams) -> None:
    """Raises CancelledError of its own: awaits a future someone else cancelled (a library's
    task cancelled elsewhere, a gather whose child was cancelled). Nobody cancels the attempt."""
    SELF_CANCEL_CALLS[params.key] += 1
    inner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    inner.cancel()
    await inner


#: kit.count invocations per (key, i).
INVOCATIONS: Counter[tuple[str, int]] = Counter()


class CountParams(TaskParams):
    key: str
    i: int
    seconds: float = 0.0


@test_tasks.task("kit.count", params=CountParams)
async def count(params: CountParams) -> dict[str, Any]:
    INVOCATIONS[(params.key, params.i)] += 1
    if params.seconds:
        await asyncio.sleep(params.seconds)
    return {"i": params.i}


#: kit.nth calls per key.
NTH_CALLS: Counter[str] = Counter()


class NthParams(TaskParams):
    key: str


@test_tasks.task("kit.nth", params=NthParams)
async def nth(params: NthParams) -> dict[str, Any]:
    """Call n (per key) waits on gate ``f"{key}-{n}"``: each attempt of a task has a gate of its
    own (a handler sees its payload, not its attempt: the call count stands in)."""
    NTH_CALLS[params.key] += 1
    n = NTH_CALLS[params.key]
    g = _GATES[f"{params.key}-{n}"]
    g.entered[""] += 1
    await g.open.wait()
    g.finished[""] += 1
    return {"call": n}


#: kit.thread: the thread each call ran in, per key.
THREADS: dict[str, list[int]] = {}


class ThreadParams(TaskParams):
    key: str


@test_tasks.task("kit.thread", params=ThreadParams)
def thread_probe(params: ThreadParams) -> dict[str, Any]:
    THREADS.setdefault(params.key, []).append(threading.get_ident())
    return {"ok": True}


#: kit.sync_wait: threading events the test sets, per key.
THREAD_EVENTS: dict[str, threading.Event] = {}
#: kit.sync_wait: what each call saw: (key, cancelled by the time it returned).
SYNC_RETURNS: list[tuple[str, bool]] = []


def thread_event(key: str) -> threading.Event:
    THREAD_EVENTS[key] = threading.Event()
    return THREAD_EVENTS[key]


class SyncWaitParams(TaskParams):
    key: str
    #: Stop early when the context says the attempt should stop (a cooperative handler).
    cooperative: bool = False


@test_tasks.task("kit.sync_wait", params=SyncWaitParams)
def sync_wait(params: SyncWaitParams, ctx: TaskContext) -> dict[str, Any]:
    """A plain (blocking) handler: holds its thread until the test sets its event (or, when
    cooperative, until the attempt is cancelled or times out)."""
    event = THREAD_EVENTS[params.key]
    while not event.wait(0.01):
        if params.cooperative and ctx.cancelled:
            break
    SYNC_RETURNS.append((params.key, ctx.cancelled))
    return {"key": params.key}


class ContextProbeParams(TaskParams):
    key: str


#: kit.context: the context each call saw, per key.
CONTEXTS: dict[str, TaskContext] = {}


@test_tasks.task("kit.context", params=ContextProbeParams)
async def context_probe(params: ContextProbeParams, ctx: TaskContext) -> dict[str, Any]:
    CONTEXTS[params.key] = ctx
    return {"task_id": ctx.task_id, "attempt": ctx.attempt}


class ChildParams(TaskParams):
    #: Written with the child's pid when it starts.
    pid_file: str
    #: "hang" (sleeps an hour in plain code), "echo" (returns what it saw), "fail", "permanent".
    mode: str = "echo"


@test_tasks.task("kit.child", params=ChildParams, isolation="process")
def child(params: ChildParams, ctx: TaskContext) -> dict[str, Any]:
    """Runs in a child process of its own (isolation="process")."""
    import os
    import time
    from pathlib import Path

    Path(params.pid_file).write_text(str(os.getpid()))
    if params.mode == "hang":
        time.sleep(3600)
    if params.mode == "fail":
        raise RuntimeError("the child failed in its own words")
    if params.mode == "permanent":
        raise PermanentError("the child gave up for good")
    return {"pid": os.getpid(), "attempt": ctx.attempt, "task_id": ctx.task_id}


def make_registry() -> TaskRegistry:
    """The built-in demo handlers plus the ``kit.*`` handlers above."""
    registry = load_registry([])
    registry.merge(test_tasks)
    return registry


# ------------------------------------------------------------------------------------------------
# Running a worker
# ------------------------------------------------------------------------------------------------


def worker_settings(url: str, **overrides: Any) -> WorkerSettings:
    return WorkerSettings(**{"database_url": url, **FAST_TIMERS, **overrides})


@dataclass
class WorkerRun:
    """A worker running in the test's event loop."""

    worker: Worker
    task: asyncio.Task[None]

    async def stop(self, timeout: float = 30.0) -> None:
        """request_stop() and wait for run() to return."""
        if not self.task.done():
            self.worker.request_stop()
        await asyncio.wait_for(asyncio.shield(self.task), timeout)


def build_worker(url: str, **overrides: Any) -> Worker:
    return Worker(worker_settings(url, **overrides), make_registry())


async def start(worker: Worker) -> WorkerRun:
    """Start ``worker.run()`` and wait until it is registered and claiming."""
    task = asyncio.create_task(worker.run(), name=f"worker-{worker.id}")
    ready = asyncio.create_task(worker.ready.wait())
    done, _ = await asyncio.wait({ready, task}, timeout=DEADLINE, return_when="FIRST_COMPLETED")
    if ready not in done:
        ready.cancel()
        if task.done():
            task.result()
            raise AssertionError("worker.run() returned before the worker was ready")
        task.cancel()
        raise AssertionError("worker not ready in time")
    return WorkerRun(worker, task)


@asynccontextmanager
async def running_worker(
    url: str, *, worker: Worker | None = None, **overrides: Any
) -> AsyncIterator[Worker]:
    """A started worker, stopped (drained) on exit."""
    w = worker or build_worker(url, **overrides)
    run = await start(w)
    try:
        yield w
    finally:
        await run.stop()


# ------------------------------------------------------------------------------------------------
# Database side
# ------------------------------------------------------------------------------------------------


@asynccontextmanager
async def connect(url: str) -> AsyncIterator[asyncpg.Connection]:
    """A raw connection of the test's own (its application name is not a worker's)."""
    conn = await db.connect(url, application_name="taskfleet-test")
    try:
        yield conn
    finally:
        await conn.close()


async def run_query(conn: asyncpg.Connection, query: queries.Query, **params: Any) -> list[Any]:
    sql, args = query.positional(params)
    return list(await conn.fetch(sql, *args))


async def submit(
    conn: asyncpg.Connection,
    type_: str,
    payloads: Sequence[dict[str, Any]],
    *,
    priority: int = 0,
    weight: int = 1,
    labels: Sequence[str] | Sequence[Sequence[str]] = (),
    max_attempts: int = 3,
    delay: float | None = None,
    timeout: float | None = None,
    wake_hint: str = "",
    requires: Sequence[str] = (),
) -> list[int]:
    """Insert tasks in one statement (one wake-up NOTIFY at commit); their ids in order.

    ``labels``: one list for every task, or one list per task.
    """
    n = len(payloads)
    per_task: list[list[str]]
    if labels and not isinstance(labels[0], str):
        per_task = [list(x) for x in labels]
    else:
        per_task = [[str(x) for x in labels]] * n
    rows = await run_query(
        conn,
        queries.task_insert_batch,
        types=[type_] * n,
        payloads=[json.dumps(p) for p in payloads],
        priorities=[priority] * n,
        weights=[weight] * n,
        labels=[json.dumps(x) for x in per_task],
        max_attempts=[max_attempts] * n,
        delays=[delay] * n,
        run_ats=[None] * n,
        timeouts=[timeout] * n,
        unique_keys=[None] * n,
        requires=[json.dumps(list(requires))] * n,
        wake_hint=wake_hint,
    )
    assert not any(r["deduplicated"] for r in rows)
    return [r["id"] for r in rows]


async def submit_config_task(conn: asyncpg.Connection, params: dict[str, Any]) -> int:
    """Enqueue the control-lane runtime-config task as the API does (control wake-up hint)."""
    (task_id,) = await submit(
        conn,
        RUNTIME_CONFIG_TASK_TYPE,
        [params],
        priority=CONTROL_PRIORITY,
        max_attempts=3,
        wake_hint=protocol.CONTROL_HINT,
    )
    return task_id


async def insert_config(
    conn: asyncpg.Connection, request_id: str, *, notify: bool = True, **params: Any
) -> int:
    """Write a runtime config version (normalised as the update task writes it); its version.

    ``notify``: also send the ``up_config`` notification, as the update task does.
    """
    config = normalise_runtime_config({**params, "requestID": request_id})
    rows = await run_query(
        conn,
        queries.runtime_config_insert,
        request_id=request_id,
        payload=db.dumps(config.to_payload()),
    )
    version = int(rows[0]["version"])
    if notify:
        await notify_raw(
            conn, protocol.CONFIG_CHANNEL, protocol.config_updated_payload(request_id, version)
        )
    return version


async def notify_raw(conn: asyncpg.Connection, channel: str, payload: str) -> None:
    await run_query(conn, queries.notify, channel=channel, payload=payload)


async def task_rows(conn: asyncpg.Connection, ids: Iterable[int]) -> dict[int, asyncpg.Record]:
    rows = await conn.fetch(
        "SELECT id, type, status, attempts, max_attempts, result, last_error, worker_id,"
        " cancel_requested, labels, priority, started_at, finished_at"
        " FROM taskfleet.tasks WHERE id = ANY($1::bigint[])",
        list(ids),
    )
    return {r["id"]: r for r in rows}


async def wait_tasks(
    conn: asyncpg.Connection,
    ids: Sequence[int],
    statuses: Iterable[str] = FINISHED,
    *,
    timeout: float = DEADLINE,
    check: Callable[[], None] | None = None,
) -> dict[int, asyncpg.Record]:
    """Poll the task rows until every one is in ``statuses``; the rows. ``check`` runs at every
    poll and may raise to fail fast (e.g. the worker died)."""
    wanted = frozenset(statuses)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if check is not None:
            check()
        rows = await task_rows(conn, ids)
        if len(rows) == len(set(ids)) and all(r["status"] in wanted for r in rows.values()):
            return rows
        if loop.time() > deadline:
            seen = Counter(r["status"] for r in rows.values())
            raise AssertionError(
                f"tasks not {sorted(wanted)} within {timeout}s: status counts {dict(seen)}"
            )
        await asyncio.sleep(POLL)


async def wait_task(
    conn: asyncpg.Connection,
    task_id: int,
    statuses: Iterable[str] = FINISHED,
    *,
    timeout: float = DEADLINE,
) -> asyncpg.Record:
    return (await wait_tasks(conn, [task_id], statuses, timeout=timeout))[task_id]


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    what: str,
    *,
    timeout: float = DEADLINE,
    interval: float = POLL,
    check: Callable[[], None] | None = None,
) -> None:
    """Poll ``predicate`` (sync or async) until it holds; fail naming ``what`` at the deadline.
    ``check`` runs at every poll and may raise to fail fast."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if check is not None:
            check()
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what}")
        await asyncio.sleep(interval)


async def wait_event(event: asyncio.Event, what: str, *, timeout: float = DEADLINE) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"event not set within {timeout}s: {what}") from None


async def worker_row(conn: asyncpg.Connection, worker_id: str) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM taskfleet.workers WHERE id = $1", worker_id)
    assert row is not None, f"no workers row for {worker_id}"
    return row


async def waits_on_a_lock(conn: asyncpg.Connection, application_name: str) -> bool:
    """A backend of this database with that application name waits on a lock."""
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = $1 AND wait_event_type = 'Lock'",
            application_name,
        )
    )


async def set_live_peer(conn: asyncpg.Connection, alive: bool, worker_id: str = "peer") -> None:
    """Another worker's row, alive (a heartbeat an hour long: it stays alive through the test)
    or offline: what a worker counts as the rest of the fleet (policy/outcome_path.py)."""
    await conn.execute(
        "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status, started_at,"
        " last_heartbeat, heartbeat_interval, lease_ttl)"
        " VALUES ($1, 'peer-host', 1, 4, $2, now(), now(), 3600, 30)"
        " ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, last_heartbeat = now()",
        worker_id,
        "online" if alive else "offline",
    )


async def terminate_worker_backends(
    conn: asyncpg.Connection, prefix: str = "taskfleet-worker"
) -> int:
    """pg_terminate_backend() on every backend of this database whose application_name starts
    with ``prefix``; how many were terminated."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE $1 || '%'"
            " AND pid <> pg_backend_pid()",
            prefix,
        )
    )


# ------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------


def sample(worker: Worker, name: str, **labels: str) -> float:
    """One sample of the worker's own Prometheus registry (0 when absent)."""
    value = worker.metrics_registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def claim_queries(worker: Worker) -> tuple[float, float]:
    """(claimed, empty) claim round trips so far."""
    name = "taskfleet_worker_claim_queries_total"
    return sample(worker, name, result="claimed"), sample(worker, name, result="empty")


def notifications(worker: Worker, channel: str, result: str = "ok") -> float:
    """Notifications the worker's listener received on ``channel`` (result ok or malformed)."""
    return sample(worker, "taskfleet_worker_notifications_total", channel=channel, result=result)


def claimed_tasks(worker: Worker, lane: str, group: str = "") -> float:
    return sample(worker, "taskfleet_worker_claimed_tasks_total", lane=lane, group=group)


@dataclass
class Ack:
    """ACKs received on ``anclax_worker_runtime_config_ack``."""

    payloads: list[dict[str, Any]] = field(default_factory=list)

    def listener(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(json.loads(payload))
