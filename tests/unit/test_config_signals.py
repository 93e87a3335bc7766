"""The API's config wake-ups without a database: the URL rule, the event hand-over, the waits."""

from __future__ import annotations

import asyncio

from taskfleet.api.config_signals import ConfigSignals, listen_url
from taskfleet.api.shutdown import Shutdown
from taskfleet.shared.settings import ApiSettings

DIRECT = "postgresql://app@db:5432/tasks"
POOLER = "postgresql://app@pgbouncer:6432/tasks"


def _settings(**values: str) -> ApiSettings:
    return ApiSettings(api_tokens="admin:admintoken123", **values)  # type: ignore[arg-type]


def test_the_api_listens_on_the_listen_url_else_on_a_direct_database_url() -> None:
    assert listen_url(_settings(database_url=DIRECT)) == DIRECT
    assert listen_url(_settings(database_url=POOLER, listen_database_url=DIRECT)) == DIRECT
    # A transaction-mode pooler keeps no LISTEN: no listener, the watchers poll.
    assert listen_url(_settings(database_url=POOLER, database_pooler="transaction")) is None
    pooled = _settings(
        database_url=POOLER, database_pooler="transaction", listen_database_url=DIRECT
    )
    assert listen_url(pooled) == DIRECT


async def test_a_notification_sets_the_event_taken_before_it_and_not_the_next() -> None:
    signals = ConfigSignals(None)
    before = signals.next_change()
    signals._wake(None, 0, "anclax_worker_runtime_config_ack", "{}")
    assert before.is_set()
    after = signals.next_change()
    assert after is not before and not after.is_set()


async def test_without_a_url_nothing_starts_and_waits_just_time_out() -> None:
    signals = ConfigSignals(None)
    signals.start()
    assert not signals.connected
    shutdown = Shutdown()
    shutdown.bind()
    assert await shutdown.sleep(0.01, wake=signals.next_change()) is False
    await signals.stop()


async def test_a_shutdown_sleep_ends_when_woken_and_says_whether_the_server_stops() -> None:
    shutdown = Shutdown()
    shutdown.bind()
    wake = asyncio.Event()
    sleeper = asyncio.create_task(shutdown.sleep(3600, wake=wake))
    await asyncio.sleep(0)
    wake.set()
    assert await asyncio.wait_for(sleeper, 30) is False
    sleeper = asyncio.create_task(shutdown.sleep(3600, wake=asyncio.Event()))
    await asyncio.sleep(0)
    shutdown.begin()
    assert await asyncio.wait_for(sleeper, 30) is True
