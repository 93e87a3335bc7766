"""User code on a bad day, against real processes: whatever a handler returns or raises, the
attempt ends with a readable outcome and the worker goes on claiming.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.e2e.fleet import Fleet, eventually, task_rows, wait_tasks_terminal
from tests.e2e.hostile_tasks import HOSTILE_MODULE_ENV

#: kind -> (attempts it ends with, at max_attempts=2; words its last_error must contain)
POISON = {
    "nul": (1, ["result cannot be stored", "$.text", "NUL"]),
    "surrogate": (1, ["result cannot be stored", "$.text", "surrogate"]),
    "nul_key": (1, ["result cannot be stored", "NUL"]),
    "nul_error": (2, ["RuntimeError: bad \\x00 byte in the handler's own words"]),
    "surrogate_error": (2, ["RuntimeError: lone \\udc80 surrogate in the handler's own words"]),
    "unencodable": (1, ["result is not JSON-serialisable"]),
    "nan": (1, ["result is not JSON-serialisable"]),
    "huge": (1, ["result is larger than 1 MiB"]),
    # The outcome was lost (the encoder's RecursionError escaped): running until its lease ran
    # out, with the lease's message instead of the reason.
    "deep": (1, ["result is nested too deeply"]),
    # Likewise when formatting the error called the handler's own failing __str__.
    "unprintable_error": (2, ["Unprintable", "str() failed"]),
    "unprintable_permanent": (1, ["UnprintablePermanent", "str() failed"]),
    # sys.exit() in a handler ended the worker process.
    "exit": (2, ["SystemExit: 4"]),
}


@asynccontextmanager
async def hostile_fleet(
    database_url: str, *, concurrency: int = 2
) -> AsyncIterator[tuple[Fleet, Any, asyncpg.Connection]]:
    """An API and one worker ("w1") loading the hostile handlers, retries 10 ms apart; the
    fleet, the worker and a database connection."""
    async with Fleet(
        database_url, env={**HOSTILE_MODULE_ENV, "TASKFLEET_RETRY_BASE": "0.01"}
    ) as fleet:
        await fleet.start_api()
        worker = await fleet.start_worker("w1", concurrency=concurrency)
        conn = await fleet.connect()
        try:
            yield fleet, worker, conn
        finally:
            await conn.close()


async def _submit(client: httpx.AsyncClient, body: dict[str, object]) -> int:
    response = await client.post("/tasks", json=body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


async def test_every_poison_outcome_fails_readably_and_the_next_task_runs(
    database_url: str,
) -> None:
    async with hostile_fleet(database_url, concurrency=2) as (fleet, worker, conn):
        async with fleet.client() as client:
            for kind, (attempts, words) in POISON.items():
                poison_id = await _submit(
                    client,
                    {"type": "hostile.poison", "payload": {"kind": kind}, "max_attempts": 2},
                )
                rows = await wait_tasks_terminal(conn, [poison_id], timeout=30)
                row = rows[poison_id]
                assert row["status"] == "failed", (kind, row)
                assert row["attempts"] == attempts, (kind, row)
                assert row["result"] is None, kind
                for word in words:
                    assert word in row["last_error"], (kind, word, row["last_error"])
                # The same worker goes on: a plain task submitted after it runs.
                plain_id = await _submit(client, {"type": "demo.echo", "payload": {"value": kind}})
                plain = (await wait_tasks_terminal(conn, [plain_id], timeout=30))[plain_id]
                assert plain["status"] == "completed", (kind, plain)
                assert plain["result"] == {"value": kind}
                assert plain["worker_id"] == "w1"

        async def ready() -> bool:
            async with httpx.AsyncClient(timeout=2.0) as http:
                return (await http.get(f"{worker.url}/readyz")).status_code == 200

        await eventually(ready, timeout=10)
        assert not await conn.fetchval(
            "SELECT count(*) FROM taskfleet.tasks WHERE status = 'running'"
        )
        assert all(r["status"] != "running" for r in (await task_rows(conn, [poison_id])).values())


async def test_ten_blocking_handlers_run_at_once_on_ten_slots(database_url: str) -> None:
    # Each returns only when all ten are in their threads at the same time (a barrier): with
    # a shared pool smaller than the slots, some waited for a thread while counted as running.
    async with hostile_fleet(database_url, concurrency=10) as (fleet, _worker, conn):
        async with fleet.client() as client:
            body = {
                "tasks": [
                    {
                        "type": "hostile.barrier",
                        "payload": {"parties": 10, "timeout": 30},
                        "max_attempts": 1,
                    }
                ]
                * 10
            }
            created = await client.post("/tasks/batch", json=body)
            assert created.status_code == 201, created.text
            ids = [t["id"] for t in created.json()["tasks"]]
        rows = await wait_tasks_terminal(conn, ids, timeout=60)
        statuses = [rows[i]["status"] for i in ids]
        assert statuses == ["completed"] * 10, [rows[i]["last_error"] for i in ids]
        assert len({rows[i]["result"]["thread"] for i in ids}) == 10


@pytest.mark.parametrize(
    ("task_type", "logged"),
    [
        # A plain handler blocking its thread: a thread cannot be stopped.
        ("hostile.block_file", "not given back"),
        # An async handler that swallows its cancel: the drain waited for it with no bound, and
        # the process never exited, not even on a second SIGTERM.
        ("hostile.deaf_async", "ignore their cancel"),
    ],
)
async def test_sigterm_with_a_handler_that_cannot_be_stopped_exits_and_keeps_the_task(
    database_url: str, tmp_path: Path, task_type: str, logged: str
) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    env = {**HOSTILE_MODULE_ENV, "TASKFLEET_DRAIN_TIMEOUT": "1"}
    async with Fleet(database_url, env=env) as fleet:
        await fleet.start_api()
        w1 = await fleet.start_worker("w1", concurrency=2)
        conn = await fleet.connect()
        try:
            async with fleet.client() as client:
                task_id = await _submit(
                    client,
                    {
                        "type": task_type,
                        "payload": {"path": str(release), "started": str(started)},
                        "max_attempts": 3,
                    },
                )
            await eventually(lambda: _exists(started), timeout=30)
            w1.signal(signal.SIGTERM)
            # The process exits (the handler's code ends with it) ...
            assert await asyncio.to_thread(w1.wait, 60) == 0, w1.log()[-3000:]
            # ... without giving back a task whose code was still running.
            row = (await task_rows(conn, [task_id]))[task_id]
            assert (row["status"], row["worker_id"]) == ("running", "w1"), row
            assert logged in w1.log()
            # Once its lease expires it is rescued and runs again elsewhere.
            release.write_text("go")
            await fleet.start_worker("w2", concurrency=2)
            done = (await wait_tasks_terminal(conn, [task_id], timeout=60))[task_id]
            assert (done["status"], done["worker_id"], done["attempts"]) == ("completed", "w2", 2)
        finally:
            await conn.close()


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def test_sys_exit_in_a_blocking_handler_fails_the_attempt_not_the_worker(
    database_url: str,
) -> None:
    async with hostile_fleet(database_url, concurrency=2) as (fleet, worker, conn):
        async with fleet.client() as client:
            exiting = await _submit(client, {"type": "hostile.exit_sync", "max_attempts": 2})
            row = (await wait_tasks_terminal(conn, [exiting], timeout=30))[exiting]
            assert (row["status"], row["attempts"]) == ("failed", 2), row
            assert "SystemExit: 3" in row["last_error"]
            plain = await _submit(client, {"type": "demo.echo", "payload": {"value": "on"}})
            done = (await wait_tasks_terminal(conn, [plain], timeout=30))[plain]
            assert (done["status"], done["worker_id"]) == ("completed", "w1")
        assert worker.alive()


def _process_gone(pid: int) -> bool:
    """No such process, or a zombie waiting for its parent: it runs no more."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


async def test_isolated_handlers_end_with_their_answer_and_their_processes(
    database_url: str, tmp_path: Path
) -> None:
    async with hostile_fleet(database_url, concurrency=3) as (fleet, _worker, conn):
        pidfile = tmp_path / "spawned.pid"
        async with fleet.client() as client:
            # Returned at once but left a non-daemon thread: the child waited for it, so
            # the attempt timed out (and without a timeout hung for ever).
            threaded = await _submit(
                client,
                {"type": "hostile.iso_thread", "timeout_seconds": 60, "max_attempts": 1},
            )
            # A ValidationError of the handler's own was taken for a refused payload.
            invalid = await _submit(
                client, {"type": "hostile.iso_validation_error", "max_attempts": 2}
            )
            # Killed at its timeout, it left the process it started running, orphaned.
            spawning = await _submit(
                client,
                {
                    "type": "hostile.iso_spawn",
                    "payload": {"pidfile": str(pidfile)},
                    "timeout_seconds": 2,
                    "max_attempts": 1,
                },
            )
            # Its answer was read whole into the worker's memory before any check.
            huge = await _submit(client, {"type": "hostile.iso_huge", "max_attempts": 2})
            rows = await wait_tasks_terminal(conn, [threaded, invalid, spawning, huge], timeout=60)
        assert (rows[threaded]["status"], rows[threaded]["result"]) == (
            "completed",
            {"returned": True},
        ), rows[threaded]
        assert (rows[invalid]["status"], rows[invalid]["attempts"]) == ("failed", 2)
        assert "ValidationError" in rows[invalid]["last_error"]
        assert (rows[huge]["status"], rows[huge]["attempts"]) == ("failed", 1)
        assert "answer is larger than 16 MiB" in rows[huge]["last_error"]
        assert rows[spawning]["status"] == "failed"
        assert "timed out" in rows[spawning]["last_error"]
        spawned = int(pidfile.read_text())

        async def gone() -> bool:
            return _process_gone(spawned)

        await eventually(gone, timeout=10)


async def _overlap_past_its_timeout(
    client: httpx.AsyncClient, log: Path, release: Path, *, max_attempts: int
) -> int:
    """A hostile.overlap task with a 0.5 s timeout, once its first attempt has timed out (its
    thread goes on until ``release`` exists); its id."""
    task_id = await _submit(
        client,
        {
            "type": "hostile.overlap",
            "payload": {"log": str(log), "release": str(release)},
            "timeout_seconds": 0.5,
            "max_attempts": max_attempts,
        },
    )

    async def timed_out() -> bool:
        return log.exists() and "timed out 1" in log.read_text()  # noqa: ASYNC240 - tiny, local

    await eventually(timed_out, timeout=30)
    return task_id


async def test_a_blocking_handler_past_its_timeout_is_not_retried_while_it_still_runs(
    database_url: str, tmp_path: Path
) -> None:
    log, release = tmp_path / "events.log", tmp_path / "release"
    async with hostile_fleet(database_url, concurrency=2) as (fleet, _worker, conn):
        async with fleet.client() as client:
            task_id = await _overlap_past_its_timeout(client, log, release, max_attempts=2)

        # Its retry went out at once, and attempt 2 started beside the running thread.
        async def second_attempt() -> bool:
            return bool((await task_rows(conn, [task_id]))[task_id]["attempts"] >= 2)

        with pytest.raises(TimeoutError):
            await eventually(second_attempt, timeout=3)
        row = (await task_rows(conn, [task_id]))[task_id]
        assert (row["status"], row["attempts"]) == ("running", 1)
        release.touch()
        done = (await wait_tasks_terminal(conn, [task_id], timeout=30))[task_id]
        assert (done["status"], done["attempts"]) == ("completed", 2), done
        assert log.read_text().split("\n")[:-1] == [
            "start 1",
            "timed out 1",
            "end 1",
            "start 2",
            "end 2",
        ]


async def test_an_async_handler_deaf_to_its_cancel_still_times_out(
    database_url: str, tmp_path: Path
) -> None:
    # It swallowed the CancelledError of its timeout and the task stayed running for ever,
    # holding its slot. Now the attempt ends as timed out at the timeout; the handler keeps its
    # slot until it really ends.
    release, started = tmp_path / "release", tmp_path / "started"
    async with hostile_fleet(database_url, concurrency=2) as (fleet, _worker, conn):
        try:
            async with fleet.client() as client:
                deaf = await _submit(
                    client,
                    {
                        "type": "hostile.deaf_async",
                        "payload": {"path": str(release), "started": str(started)},
                        "timeout_seconds": 1,
                        "max_attempts": 1,
                    },
                )
                row = (await wait_tasks_terminal(conn, [deaf], timeout=30))[deaf]
                assert row["status"] == "failed", row
                assert "timed out after 1s" in row["last_error"]
                release.touch()
                plain = await _submit(client, {"type": "demo.echo", "payload": {"value": "x"}})
                done = (await wait_tasks_terminal(conn, [plain], timeout=30))[plain]
                assert done["status"] == "completed"
        finally:
            release.touch()


async def test_a_cancel_reaches_a_task_whose_timed_out_code_still_runs(
    database_url: str, tmp_path: Path
) -> None:
    # Its retry is held back until the thread returns; a cancel meanwhile did nothing until
    # then (for ever, for a handler that never returns). A cancelled task never runs again, so
    # the cancel is written at once.
    log, release = tmp_path / "events.log", tmp_path / "release"
    async with hostile_fleet(database_url) as (fleet, _worker, conn):
        try:
            async with fleet.client() as client:
                task_id = await _overlap_past_its_timeout(client, log, release, max_attempts=3)
                cancelled = await client.post(f"/tasks/{task_id}/cancel")
                assert cancelled.status_code == 200, cancelled.text
            row = (await wait_tasks_terminal(conn, [task_id], timeout=30))[task_id]
            assert (row["status"], row["attempts"]) == ("cancelled", 1), row
            assert "end 1" not in log.read_text()  # its code still runs
        finally:
            release.touch()
