"""The worker runs tasks: results stored, retries with backoff, timeouts, cancellation
(docs/reference.md#worker-runtime).

A real ``Worker`` in the test's event loop against a real Postgres; every assertion is on task
rows (the truth) or on what the handlers saw.
"""

from __future__ import annotations

import logging
import threading
import uuid

import pytest

from taskfleet.shared import queries
from tests.integration import workerkit as kit


async def test_submitted_tasks_complete_with_their_results_stored(database_url: str) -> None:
    async with kit.connect(database_url) as conn, kit.running_worker(database_url):
        values = [1, "two", {"three": [3]}, None]
        ids = await kit.submit(conn, "demo.echo", [{"value": v} for v in values])
        rows = await kit.wait_tasks(conn, ids)
        for task_id, value in zip(ids, values, strict=True):
            row = rows[task_id]
            assert row["status"] == "completed", row
            assert row["result"] == {"value": value}
            assert row["attempts"] == 1
            assert row["worker_id"] == "w1"
            assert row["last_error"] is None
            assert row["started_at"] is not None and row["finished_at"] >= row["started_at"]


async def test_sync_handlers_run_in_a_thread_not_on_the_event_loop(database_url: str) -> None:
    from taskfleet.shared.demo_tasks import CpuParams, cpu

    key = uuid.uuid4().hex
    async with kit.connect(database_url) as conn, kit.running_worker(database_url):
        (cpu_id,) = await kit.submit(conn, "demo.cpu", [{"iterations": 1000}])
        (probe_id,) = await kit.submit(conn, "kit.thread", [{"key": key}])
        rows = await kit.wait_tasks(conn, [cpu_id, probe_id])
    assert rows[cpu_id]["status"] == "completed", rows[cpu_id]["last_error"]
    assert rows[cpu_id]["result"] == cpu(CpuParams(iterations=1000))
    assert rows[probe_id]["status"] == "completed", rows[probe_id]["last_error"]
    (thread_id,) = kit.THREADS[key]
    assert thread_id != threading.get_ident()  # the test's (and the worker's) event loop thread


async def test_a_failing_task_is_retried_until_it_succeeds(database_url: str) -> None:
    key = uuid.uuid4().hex
    async with kit.connect(database_url) as conn, kit.running_worker(database_url):
        (task_id,) = await kit.submit(
            conn, "kit.flaky", [{"key": key, "failures": 2}], max_attempts=3
        )
        row = await kit.wait_task(conn, task_id, {"completed", "failed"})
    assert row["status"] == "completed", row["last_error"]
    assert row["attempts"] == 3
    assert row["result"] == {"calls": 3}
    assert kit.FLAKY_CALLS[key] == 3


async def test_a_permanent_error_fails_the_task_without_retrying(database_url: str) -> None:
    async with kit.connect(database_url) as conn, kit.running_worker(database_url) as worker:
        (task_id,) = await kit.submit(
            conn, "demo.fail", [{"message": "no way", "permanent": True}], max_attempts=5
        )
        row = await kit.wait_task(conn, task_id)
        assert row["status"] == "failed"
        assert row["attempts"] == 1
        assert "no way" in row["last_error"]
        assert (
            kit.sample(worker, "taskfleet_task_outcomes_total", type="demo.fail", outcome="retried")
            == 0
        )


async def test_exhausted_attempts_fail_the_task_with_the_last_error(database_url: str) -> None:
    async with kit.connect(database_url) as conn, kit.running_worker(database_url) as worker:
        (task_id,) = await kit.submit(
            conn, "demo.fail", [{"message": "still broken", "permanent": False}], max_attempts=3
        )
        row = await kit.wait_task(conn, task_id)
        assert row["status"] == "failed"
        assert row["attempts"] == 3
        assert "still broken" in row["last_error"]
        outcomes = "taskfleet_task_outcomes_total"
        assert kit.sample(worker, outcomes, type="demo.fail", outcome="retried") == 2
        assert kit.sample(worker, outcomes, type="demo.fail", outcome="failed") == 1


async def test_a_handlers_own_cancelled_error_is_a_failure_retried_by_its_rules(
    database_url: str,
) -> None:
    # A CancelledError nobody asked for (the handler awaited a future cancelled elsewhere) was
    # taken for an interruption: the task given back uncounted and run again at once, for ever.
    key = uuid.uuid4().hex
    async with kit.connect(database_url) as conn, kit.running_worker(database_url) as worker:
        (task_id,) = await kit.submit(conn, "kit.self_cancel", [{"key": key}], max_attempts=2)
        row = await kit.wait_task(conn, task_id)
        assert row["status"] == "failed"
        assert row["attempts"] == 2
        assert "CancelledError" in row["last_error"]
        assert kit.SELF_CANCEL_CALLS[key] == 2
        outcomes = "taskfleet_task_outcomes_total"
        assert kit.sample(worker, outcomes, type="kit.self_cancel", outcome="retried") == 1
        assert kit.sample(worker, outcomes, type="kit.self_cancel", outcome="failed") == 1
        assert kit.sample(worker, outcomes, type="kit.self_cancel", outcome="released") == 0


async def test_a_task_past_its_timeout_is_interrupted_and_retried(database_url: str) -> None:
    # Short drain: a timeout that did not fire would leave a 30 s sleep running at the end.
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, drain_timeout=0.2),
    ):
        once, twice = await kit.submit(
            conn, "demo.sleep", [{"seconds": 30}], timeout=0.3, max_attempts=1
        ) + await kit.submit(conn, "demo.sleep", [{"seconds": 30}], timeout=0.3, max_attempts=2)
        rows = await kit.wait_tasks(conn, [once, twice])
    for task_id, attempts in ((once, 1), (twice, 2)):
        row = rows[task_id]
        assert row["status"] == "failed", row
        assert row["attempts"] == attempts
        assert "timed out" in row["last_error"]
        assert row["result"] is None


async def test_a_running_task_is_cancelled_when_cancel_is_requested(database_url: str) -> None:
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, drain_timeout=0.2) as worker,
    ):
        (task_id,) = await kit.submit(conn, "demo.sleep", [{"seconds": 30}])
        await kit.wait_task(conn, task_id, {"running"})
        await kit.wait_until(lambda: worker.inflight == 1, "the worker runs the task")
        (row,) = await kit.run_query(conn, queries.task_cancel, id=task_id)
        assert row["status"] == "running" and row["cancel_requested"]
        row = await kit.wait_task(conn, task_id)
        assert row["status"] == "cancelled"
        assert row["attempts"] == 1
        assert row["result"] is None
        assert worker.inflight == 0
        assert (
            kit.sample(
                worker, "taskfleet_task_outcomes_total", type="demo.sleep", outcome="cancelled"
            )
            == 1
        )


async def test_a_pending_task_is_cancelled_at_once_and_never_runs(database_url: str) -> None:
    key = uuid.uuid4().hex
    async with kit.connect(database_url) as conn:
        (task_id,) = await kit.submit(conn, "kit.count", [{"key": key, "i": 0}])
        (row,) = await kit.run_query(conn, queries.task_cancel, id=task_id)
        assert row["status"] == "cancelled"
        async with kit.running_worker(database_url):
            # Anything submitted after it runs; once that is done, the worker has had its chance.
            (later,) = await kit.submit(conn, "kit.count", [{"key": key, "i": 1}])
            await kit.wait_task(conn, later, {"completed"})
        row = (await kit.task_rows(conn, [task_id]))[task_id]
    assert row["status"] == "cancelled"
    assert row["attempts"] == 0
    assert kit.INVOCATIONS[(key, 0)] == 0
    assert kit.INVOCATIONS[(key, 1)] == 1


async def test_an_outcome_the_database_refuses_blocks_neither_the_others_nor_the_claims(
    database_url: str,
) -> None:
    # The executor makes every outcome storable before it is queued; this is the net under it:
    # an outcome the server still refuses is split from the batch and written as a failure.
    from taskfleet.worker.outcomes import Outcome

    key = uuid.uuid4().hex
    async with kit.connect(database_url) as conn, kit.running_worker(database_url) as worker:
        # Not claimable (an hour away), then marked as if this worker held them.
        bad, good = await kit.submit(
            conn, "kit.count", [{"key": key, "i": 0}, {"key": key, "i": 1}], delay=3600
        )
        await conn.execute(
            "UPDATE taskfleet.tasks SET status = 'running', worker_id = 'w1', attempts = 1,"
            " lease_expires_at = now() + interval '1 minute' WHERE id = ANY($1::bigint[])",
            [bad, good],
        )
        worker.outcomes.put(
            Outcome(bad, 1, "completed", result='{"text": "a\\u0000b"}', type="demo.echo")
        )
        worker.outcomes.put(
            Outcome(good, 1, "completed", result='{"fine": true}', type="demo.echo")
        )
        rows = await kit.wait_tasks(conn, [bad, good])
        assert rows[good]["status"] == "completed"
        assert rows[good]["result"] == {"fine": True}
        assert rows[bad]["status"] == "failed"
        assert "the database refused this attempt's outcome (completed)" in rows[bad]["last_error"]
        # And the worker goes on claiming.
        (later,) = await kit.submit(conn, "kit.count", [{"key": key, "i": 2}])
        assert (await kit.wait_task(conn, later))["status"] == "completed"
    assert kit.INVOCATIONS[(key, 0)] == 0 and kit.INVOCATIONS[(key, 2)] == 1


def _task_records(caplog: pytest.LogCaptureFixture, task_id: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "task_id", None) == task_id]


async def test_every_failed_attempt_is_logged_with_its_fields(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Failed attempts were stored in the database only: the worker logged nothing.
    caplog.set_level(logging.DEBUG, logger="taskfleet.worker")
    async with kit.connect(database_url) as conn, kit.running_worker(database_url):
        retried, permanent = await kit.submit(
            conn, "demo.fail", [{"message": "first line\nsecond line"}], max_attempts=2
        ) + await kit.submit(
            conn, "demo.fail", [{"message": "give up", "permanent": True}], max_attempts=5
        )
        await kit.wait_tasks(conn, [retried, permanent])

    records = _task_records(caplog, retried)
    attempts = [r for r in records if r.levelno >= logging.WARNING]
    assert [(r.levelname, r.attempt, r.outcome) for r in attempts] == [
        ("WARNING", 1, "retried"),
        ("ERROR", 2, "failed"),
    ]
    first = attempts[0]
    assert (first.task_type, first.max_attempts, first.worker_id) == ("demo.fail", 2, "w1")
    assert first.error == "RuntimeError: first line"
    assert first.getMessage().startswith(f"task {retried} (demo.fail) attempt 1 of 2 failed:")
    assert "\n" not in first.getMessage()
    assert first.retry_in_seconds >= 0
    # The whole traceback, at DEBUG only.
    debug = [r for r in records if r.levelno == logging.DEBUG]
    assert len(debug) == 2 and "Traceback" in debug[0].getMessage()
    assert "second line" in debug[0].getMessage()

    (final,) = [r for r in _task_records(caplog, permanent) if r.levelno >= logging.WARNING]
    assert (final.levelname, final.attempt, final.outcome) == ("ERROR", 1, "failed")
    assert final.error == "PermanentError: give up"
    assert "a permanent error" in final.getMessage()


async def test_a_permanent_error_inside_an_exception_group_fails_the_task_for_good(
    database_url: str,
) -> None:
    # A PermanentError raised in a TaskGroup reaches the worker inside an ExceptionGroup, and
    # was retried to max_attempts: the same record is gone on every attempt.
    async with kit.connect(database_url) as conn, kit.running_worker(database_url):
        permanent, transient = await kit.submit(
            conn, "kit.group", [{"permanent": True}, {"permanent": False}], max_attempts=3
        )
        rows = {i: await kit.wait_task(conn, i) for i in (permanent, transient)}
    assert (rows[permanent]["status"], rows[permanent]["attempts"]) == ("failed", 1)
    assert "the record is gone" in rows[permanent]["last_error"]
    assert (rows[transient]["status"], rows[transient]["attempts"]) == ("failed", 3)
