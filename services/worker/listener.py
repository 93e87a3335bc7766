"""LISTEN on a direct connection; reconnect with backoff; catch up after every (re)connect.

Notifications are hints. Whatever they say, the worker re-reads the database row (the truth), so
a lost notification costs latency, never correctness (the tick polls as a fallback).

Behind a transaction-mode pooler the worker's claims, config reads and ACKs run on this
connection too (:meth:`Listener.connection`): it is a direct session, so they stay prepared and
take one round trip each, and the worker opens no further connection to Postgres for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from taskfleet.shared import db, protocol
from taskfleet.shared.errors import first_line
from taskfleet.shared.metrics import WorkerMetrics
from taskfleet.shared.policy.backoff import LoopBackoff
from taskfleet.worker.stopping import stop_tasks

log = logging.getLogger("taskfleet.worker.listener")

#: How often the idle listener checks (locally, no statement) that its socket is still open.
CLOSED_CHECK_INTERVAL = 1.0


class Listener:
    def __init__(
        self,
        url: str,
        *,
        channels: Sequence[str],
        on_message: Callable[[protocol.Message], None],
        on_connect: Callable[[], Awaitable[None]],
        metrics: WorkerMetrics,
        synchronous_commit: bool = True,
        statement_timeout: float | None = None,
        generic_plans: bool = False,
    ) -> None:
        self._url = url
        #: The session settings of the statements others run on this connection (claims, config).
        self._synchronous_commit = synchronous_commit
        self._statement_timeout = statement_timeout
        self._generic_plans = generic_plans
        self._channels = tuple(channels)
        self._on_message = on_message
        self._on_connect = on_connect
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        #: Set while LISTENing; cleared while reconnecting.
        self.connected = asyncio.Event()
        self.reconnects = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="listener")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task])
            self._task = None

    async def connection(self, timeout: float) -> asyncpg.Connection:
        """The listening connection, once connected (waits up to ``timeout`` seconds while it
        reconnects). Statements run on it between notifications; a caller that finds it broken
        terminates it, and the listener connects again and catches up."""
        async with asyncio.timeout(timeout):
            while True:
                await self.connected.wait()
                conn = self._conn
                if conn is not None and not conn.is_closed():
                    return conn
                await asyncio.sleep(0.01)  # between a loss and the flag cleared

    @property
    def backend_pid(self) -> int | None:
        """The listening connection's server pid (tests terminate it)."""
        conn = self._conn
        return conn.get_server_pid() if conn is not None and not conn.is_closed() else None

    async def _run(self) -> None:
        retry = LoopBackoff(base=0.1, cap=5.0)
        ever_connected = False
        while True:
            lost = asyncio.Event()
            conn: asyncpg.Connection | None = None
            what = "connecting failed"
            try:
                # asyncio.timeout, not wait_for (which can swallow a cancel on Python 3.11).
                async with asyncio.timeout(30):
                    live: asyncpg.Connection = await db.connect(
                        self._url,
                        application_name="taskfleet-worker-listen",
                        synchronous_commit=self._synchronous_commit,
                        statement_timeout=self._statement_timeout,
                        generic_plans=self._generic_plans,
                    )
                conn = live
                live.add_termination_listener(lambda _c, lost=lost: lost.set())
                for channel in self._channels:
                    await live.add_listener(channel, self._deliver)
                self._conn = live
                self.connected.set()
                self._metrics.listener_connected.set(1)
                if ever_connected:
                    self.reconnects += 1
                    self._metrics.listener_reconnects.inc()
                    log.info("listener reconnected")
                ever_connected = True
                retry.reset()
                await self._on_connect()
                while not lost.is_set() and not live.is_closed():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(CLOSED_CHECK_INTERVAL):
                            await lost.wait()
                what = "connection lost"
                error = "the server closed it"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = first_line(exc)
            finally:
                self.connected.clear()
                self._metrics.listener_connected.set(0)
                self._conn = None
                if conn is not None:
                    conn.terminate()
            delay = retry.next()
            log.warning("listener: %s (%s); retrying in %.2fs", what, error, delay)
            await asyncio.sleep(delay)

    def _deliver(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        message = protocol.parse(channel, payload)
        try:
            self._on_message(message)
        except Exception:  # a bad notification must never take the listener down
            log.exception("handling a notification on %s failed", channel)
        # Counted once acted on: a wake-up's claim goes out first (this callback is queued
        # behind the claim loop's resumption), not after the counter's code.
        result = "malformed" if isinstance(message, protocol.Malformed) else "ok"
        asyncio.get_running_loop().call_soon(self._count, channel, result)

    def _count(self, channel: str, result: str) -> None:
        self._metrics.notifications.labels(channel, result).inc()
