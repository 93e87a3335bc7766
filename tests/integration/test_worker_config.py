"""Every worker reads the runtime config (docs/reference.md#protocol, "Reader"): applied on NOTIFY,
recorded with GREATEST and acknowledged; found by the tick when notifications are off or lost; bad
payloads dropped; the LISTEN connection reconnects and catches up.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from taskfleet.shared import protocol, queries
from taskfleet.shared.policy.convergence import (
    DRAINING,
    HEARTBEAT_EXPIRED,
    OFFLINE,
    Excluded,
    view_from_row,
)
from taskfleet.shared.policy.lanes import Lane
from taskfleet.worker.worker import Worker
from tests.integration import workerkit as kit
from tests.pg import with_database

#: Timers far above any wait in these tests (DEADLINE is 20 s): a config version applied, or a
#: task picked up, within a wait cannot have come from the tick or the idle poll.
SLOW_TICK: dict[str, Any] = {
    "poll_interval": 30.0,
    "heartbeat_interval": 30.0,
    "lease_ttl": 90.0,
    "runtime_config_poll_interval": 30.0,
    "sweep_interval": 30.0,
}


def malformed(worker: Worker) -> float:
    return kit.notifications(worker, protocol.CONFIG_CHANNEL, "malformed")


async def test_a_notified_version_is_applied_recorded_and_acknowledged(database_url: str) -> None:
    acks = kit.Ack()
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, **SLOW_TICK) as worker,
    ):
        await conn.add_listener(protocol.CONFIG_ACK_CHANNEL, acks.listener)
        assert worker.applied_version == 0

        worker.config_applied.clear()
        v1 = await kit.insert_config(conn, "req-1", maxStrictPercentage=25, labelWeights={"x": 2})
        await kit.wait_event(worker.config_applied, "version 1 applied")
        assert worker.applied_version == v1
        assert worker.planner.strict_cap == 1  # ceil(4 * 25 / 100)
        assert worker.planner.configured_labels == ["x"]
        assert kit.sample(worker, "anclax_worker_runtime_config_version") == v1
        await kit.wait_until(lambda: len(acks.payloads) >= 1, "the ACK")
        assert acks.payloads[0] == {
            "op": "ack",
            "params": {"request_id": "req-1", "worker_id": "w1", "applied_version": v1},
        }
        # The ACK is sent by the statement that records the version: the row says so already.
        assert (await kit.worker_row(conn, "w1"))["applied_config_version"] == v1

        # GREATEST: the stored version never goes down, even when what the worker applies is
        # older than what the row already says.
        await conn.execute(
            "UPDATE taskfleet.workers SET applied_config_version = 1000 WHERE id = 'w1'"
        )
        worker.config_applied.clear()
        v2 = await kit.insert_config(conn, "req-2", maxStrictPercentage=100)
        await kit.wait_event(worker.config_applied, "version 2 applied")
        assert worker.applied_version == v2 < 1000
        assert worker.planner.strict_cap == 4
        await kit.wait_until(lambda: len(acks.payloads) >= 2, "the second ACK")
        assert acks.payloads[1]["params"]["applied_version"] == v2
        assert (await kit.worker_row(conn, "w1"))["applied_config_version"] == 1000

        # A notification naming a version that is not newer than the applied one changes
        # nothing; one naming a version that does not exist is checked against the table.
        await kit.notify_raw(
            conn, protocol.CONFIG_CHANNEL, protocol.config_updated_payload("req-1", v1)
        )
        await kit.notify_raw(
            conn, protocol.CONFIG_CHANNEL, protocol.config_updated_payload("ghost", 999)
        )
        (task_id,) = await kit.submit(conn, "demo.echo", [{"value": 1}])
        await kit.wait_task(conn, task_id, {"completed"})
        assert worker.applied_version == v2
        assert worker.planner.strict_cap == 4


async def test_a_version_is_acknowledged_only_after_the_claim_in_flight_returns(
    database_url: str,
) -> None:
    # A claim planned under the old version and still in flight could start work the new one
    # pauses: the worker swaps the new version into its planner at once, but records and
    # acknowledges it only once that claim has returned.
    async with (
        kit.connect(database_url) as conn,
        kit.connect(database_url) as locker,
        kit.running_worker(database_url, **SLOW_TICK) as worker,
    ):
        # Written first (writing a version touches the tasks table), announced below.
        v1 = await kit.insert_config(conn, "held", notify=False, pausedLanes=["strict"])
        async with locker.transaction():
            # Every claim now waits for this lock: the next one stays in flight.
            await locker.execute("LOCK TABLE taskfleet.tasks IN ACCESS EXCLUSIVE MODE")
            worker.claim_loop.hint_work()
            await kit.wait_until(
                lambda: conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                    " 'taskfleet-worker-claim' AND wait_event_type = 'Lock'"
                ),
                "a claim waiting on the lock",
            )
            worker.config_applied.clear()
            await kit.notify_raw(
                conn, protocol.CONFIG_CHANNEL, protocol.config_updated_payload("held", v1)
            )
            # Read and swapped into the planner (new claims are planned under it) ...
            await kit.wait_until(
                lambda: worker.planner.lane_paused(Lane.STRICT), "version 1 in the planner"
            )
            # ... but not applied, recorded or acknowledged while the old claim is out.
            assert worker.applied_version == 0
            assert not worker.config_applied.is_set()
            assert (await kit.worker_row(conn, "w1"))["applied_config_version"] == 0
        await kit.wait_event(worker.config_applied, "version 1 applied")
        assert worker.applied_version == v1

        async def recorded() -> bool:
            return (await kit.worker_row(conn, "w1"))["applied_config_version"] == v1

        await kit.wait_until(recorded, "version 1 recorded")


async def test_the_version_at_start_up_is_applied_before_registering(database_url: str) -> None:
    async with kit.connect(database_url) as conn:
        v1 = await kit.insert_config(conn, "boot", notify=False, maxStrictPercentage=50)
        async with kit.running_worker(database_url, **SLOW_TICK) as worker:
            assert worker.applied_version == v1
            assert worker.planner.strict_cap == 2
            row = await kit.worker_row(conn, "w1")
            assert row["applied_config_version"] == v1
            assert row["status"] == "online"


async def test_without_listen_a_new_version_is_applied_by_the_tick(database_url: str) -> None:
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, listen_enabled=False) as worker,
    ):
        assert worker.listener.backend_pid is None
        worker.config_applied.clear()
        v1 = await kit.insert_config(conn, "polled", maxStrictPercentage=0)
        await kit.wait_event(worker.config_applied, "version applied by the tick")
        assert worker.applied_version == v1
        assert worker.planner.strict_cap == 0
        await kit.wait_until(
            lambda: _applied(conn, v1), "workers.applied_config_version == the new version"
        )
        # Tasks are still picked up, by the poll.
        (task_id,) = await kit.submit(conn, "demo.echo", [{"value": "polled"}])
        row = await kit.wait_task(conn, task_id)
        assert row["status"] == "completed"
        assert not worker.listener.connected.is_set()


async def _applied(conn: asyncpg.Connection, version: int) -> bool:
    return bool((await kit.worker_row(conn, "w1"))["applied_config_version"] == version)


async def test_malformed_notifications_are_counted_and_ignored(database_url: str) -> None:
    bad_config = [
        "",
        "not json",
        "[]",
        '{"op": "up_config"}',
        '{"op": "up_config", "params": {"request_id": "r"}}',
        '{"op": "up_config", "params": {"request_id": "r", "version": "7"}}',
        '{"op": "up_config", "params": {"request_id": "r", "version": -1}}',
        '{"op": "up_config", "params": {"request_id": 5, "version": 1}}',
        '{"op": "ack", "params": {"request_id": "r", "version": 1}}',
        "[" * 5000,
    ]
    bad_ready = ["garbage", "{", "x" * 7000]
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, **SLOW_TICK) as worker,
    ):
        listen_pid = worker.listener.backend_pid
        for payload in bad_config:
            await kit.notify_raw(conn, protocol.CONFIG_CHANNEL, payload)
        for payload in bad_ready:
            await kit.notify_raw(conn, queries.TASK_READY_CHANNEL, payload)
        await kit.wait_until(
            lambda: malformed(worker) == len(bad_config),
            "every malformed config notification counted",
        )
        # Nothing was applied, the listener never dropped, and the worker keeps working.
        assert worker.applied_version == 0
        assert worker.listener.connected.is_set()
        assert worker.listener.backend_pid == listen_pid
        assert worker.listener.reconnects == 0
        assert worker.status == "running"
        (task_id,) = await kit.submit(conn, "demo.echo", [{"value": "still here"}])
        row = await kit.wait_task(conn, task_id)
        assert row["status"] == "completed"
        worker.config_applied.clear()
        v1 = await kit.insert_config(conn, "after-garbage", maxStrictPercentage=50)
        await kit.wait_event(worker.config_applied, "a good version after the bad ones")
        assert worker.applied_version == v1
        assert malformed(worker) == len(bad_config)


@contextlib.asynccontextmanager
async def connections_refused(url: str) -> AsyncIterator[None]:
    """No new connection to this test's database (existing ones keep working) while inside."""
    name = urlsplit(url).path.lstrip("/")
    async with kit.connect(with_database(url, "postgres")) as admin:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            yield
        finally:
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


async def test_the_listener_reconnects_and_catches_up_on_what_it_missed(
    database_url: str,
) -> None:
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url, **SLOW_TICK) as worker,
    ):
        await kit.wait_until(lambda: kit.claim_queries(worker)[1] >= 1, "the first empty claim")
        old_pid = worker.listener.backend_pid
        assert old_pid is not None
        assert worker.healthy

        # Kill the LISTEN connection and keep it from coming back until a version is written:
        # its up_config notification is lost for sure.
        async with connections_refused(database_url):
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", old_pid)
            await kit.wait_until(
                lambda: not worker.listener.connected.is_set(), "the listener noticed"
            )
            assert not worker.healthy  # /readyz says 503 while the listener is down
            v1 = await kit.insert_config(conn, "missed", maxStrictPercentage=50)
        await kit.wait_until(
            lambda: worker.listener.reconnects >= 1 and worker.listener.connected.is_set(),
            "the listener reconnected",
        )
        assert worker.listener.backend_pid not in (None, old_pid)
        assert kit.sample(worker, "taskfleet_worker_listener_reconnects_total") >= 1
        assert kit.sample(worker, "taskfleet_worker_listener_connected") == 1
        # The catch-up read after the reconnect applies it (the tick is 30 s away).
        await kit.wait_until(lambda: worker.applied_version == v1, "the missed version applied")
        await kit.wait_until(
            lambda: _applied(conn, v1), "workers.applied_config_version == the missed version"
        )
        assert worker.healthy

        # Wake-ups work again: the second task is submitted once the worker is idle again, so
        # only its NOTIFY can explain the pickup (the idle poll is 30 s).
        first = await kit.submit(conn, "demo.echo", [{"value": 1}])
        await kit.wait_tasks(conn, first, {"completed"})
        second = await kit.submit(conn, "demo.echo", [{"value": 2}])
        rows = await kit.wait_tasks(conn, second, {"completed"})
        assert rows[second[0]]["result"] == {"value": 2}


async def _fake_worker(conn: asyncpg.Connection, worker_id: str, *, alive: bool) -> None:
    """A workers row of a worker that never applies anything: alive (fresh heartbeat, long
    interval) or dead (heartbeat long past 3 x its interval)."""
    await conn.execute(
        "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status, last_heartbeat,"
        " heartbeat_interval, applied_config_version)"
        " VALUES ($1, 'elsewhere', 1, 1, 'online',"
        " CASE WHEN $2 THEN now() ELSE now() - interval '1 hour' END, 600, 0)",
        worker_id,
        alive,
    )


async def test_a_dead_worker_does_not_hold_convergence_up(database_url: str) -> None:
    async with kit.connect(database_url) as conn:
        await _fake_worker(conn, "dead", alive=False)
        async with kit.running_worker(database_url) as worker:
            task_id = await kit.submit_config_task(conn, {"requestID": "r-dead"})
            row = await kit.wait_task(conn, task_id)
            assert row["status"] == "completed", row["last_error"]
            assert row["result"]["outcome"] == "converged"
            assert row["result"]["alive_workers"] == 1
            assert worker.applied_version == row["result"]["version"]


async def test_an_update_waiting_on_a_lagging_worker_is_superseded_by_a_newer_version(
    database_url: str,
) -> None:
    acks = kit.Ack()
    async with kit.connect(database_url) as conn:
        await _fake_worker(conn, "laggard", alive=True)
        async with kit.running_worker(database_url) as worker:
            await conn.add_listener(protocol.CONFIG_ACK_CHANNEL, acks.listener)
            task_id = await kit.submit_config_task(
                conn, {"requestID": "r-old", "notifyInterval": "100ms", "listenTimeout": "50ms"}
            )
            # It wrote its version, this worker applied it, and it waits on the laggard.
            await kit.wait_until(lambda: len(acks.payloads) >= 1, "this worker's ACK")
            target = acks.payloads[0]["params"]["applied_version"]
            assert (await kit.task_rows(conn, [task_id]))[task_id]["status"] == "running"
            newer = await kit.insert_config(conn, "r-new", maxStrictPercentage=10)
            row = await kit.wait_task(conn, task_id)
            assert row["status"] == "completed", row["last_error"]
            assert row["result"] == {
                "outcome": "superseded",
                "version": target,
                "superseded_by": newer,
            }
            assert kit.sample(worker, "anclax_runtime_config_superseded_total") == 1
            await kit.wait_until(lambda: worker.applied_version == newer, "the newer applied")


async def test_an_update_ended_before_its_decision_leaves_no_lagging_workers_reported(
    database_url: str,
) -> None:
    # The gauge was reset only when a decision was reached: an update interrupted while it
    # waited on a laggard left this worker reporting one lagging worker until its next update.
    acks = kit.Ack()
    lagging = "anclax_runtime_config_lagging_workers"
    async with kit.connect(database_url) as conn:
        await _fake_worker(conn, "laggard", alive=True)
        async with kit.running_worker(database_url) as worker:
            await conn.add_listener(protocol.CONFIG_ACK_CHANNEL, acks.listener)
            task_id = await kit.submit_config_task(
                conn, {"requestID": "r-cut", "notifyInterval": "100ms", "listenTimeout": "50ms"}
            )
            await kit.wait_until(lambda: kit.sample(worker, lagging) == 1, "one lagging worker")
            worker.executor.cancel(task_id, "user")  # as a shutdown's interrupt would
            row = await kit.wait_task(conn, task_id)
            assert row["status"] == "cancelled", row
            assert kit.sample(worker, lagging) == 0


async def test_a_retried_update_request_writes_one_version(database_url: str) -> None:
    async with (
        kit.connect(database_url) as conn,
        kit.running_worker(database_url) as worker,
    ):
        first = await kit.submit_config_task(conn, {"requestID": "same", "defaultWeight": 2})
        row1 = await kit.wait_task(conn, first)
        second = await kit.submit_config_task(conn, {"requestID": "same", "defaultWeight": 2})
        row2 = await kit.wait_task(conn, second)
        assert row1["status"] == row2["status"] == "completed"
        assert row1["result"]["version"] == row2["result"]["version"] == worker.applied_version
        assert await conn.fetchval("SELECT count(*) FROM taskfleet.worker_runtime_configs") == 1


async def test_the_workers_left_out_are_those_alive_after_the_version_and_behind_it(
    database_url: str,
) -> None:
    """``runtime_config_convergence``: a worker that stopped counting (heartbeat expired,
    draining, offline) after the version was written and had not applied it is named with its
    reason; one long gone, or one that applied it, is not."""
    async with kit.connect(database_url) as conn:
        await conn.execute(
            "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload, created_at)"
            " VALUES ('r', '{}', now() - interval '10 seconds')"
        )
        # (id, status, heartbeat seconds ago (interval 1 s: alive for 3 s), applied version)
        for worker_id, status, ago, applied in (
            ("alive-behind", "online", 0, 0),
            ("alive-applied", "online", 0, 1),
            ("stalled", "online", 5, 0),
            ("draining", "draining", 1, 0),
            ("stopped", "offline", 8, 0),
            ("stalled-applied", "online", 5, 1),
            ("long-gone", "online", 3600, 0),
        ):
            await conn.execute(
                "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status,"
                " last_heartbeat, heartbeat_interval, applied_config_version)"
                " VALUES ($1, 'h', 1, 1, $2, now() - make_interval(secs => $3), 1, $4)",
                worker_id,
                status,
                float(ago),
                applied,
            )
        sql, args = queries.runtime_config_convergence.positional({"version": 1})
        view = view_from_row(1, await conn.fetchrow(sql, *args))
    assert (view.alive_workers, view.applied_workers, view.lagging) == (2, 1, ("alive-behind",))
    assert view.excluded == (
        Excluded("draining", DRAINING),
        Excluded("stalled", HEARTBEAT_EXPIRED),
        Excluded("stopped", OFFLINE),
    )
    assert view.lagging_expire_in is not None and 2 < view.lagging_expire_in <= 3
