"""Wake-ups for the API's config watchers: one LISTEN session on the runtime-config channels.

A config request's stream (or blocking ``PUT``) re-reads the database when the fleet moves. The
update task's version announcement (``anclax_worker_runtime_config``) and every worker's ACK
(``anclax_worker_runtime_config_ack``) wake all the watchers of this process at once, so they see
the move when it happens rather than at their next poll (20 ms to 200 ms later).

Notifications are hints. The watchers still poll, backing off as before, so a lost notification,
a listener that is reconnecting, or no listener at all costs latency, never an answer. There is
none behind a transaction-mode pooler without ``TASKFLEET_LISTEN_DATABASE_URL`` (a pooler does
not keep a LISTEN). It costs one direct connection per API process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from taskfleet.shared import db, protocol
from taskfleet.shared.errors import first_line
from taskfleet.shared.policy.backoff import LoopBackoff
from taskfleet.shared.settings import ApiSettings

log = logging.getLogger("taskfleet.api.config_signals")

#: How often the idle session checks (locally, no statement) that its socket is still open.
CLOSED_CHECK_INTERVAL = 1.0
APPLICATION_NAME = "taskfleet-api-listen"


def listen_url(settings: ApiSettings) -> str | None:
    """Where the API listens: ``TASKFLEET_LISTEN_DATABASE_URL``, else ``DATABASE_URL`` unless
    that is a transaction-mode pooler (then nowhere: the watchers poll)."""
    if settings.listen_database_url is not None:
        return str(settings.listen_database_url)
    return None if settings.pooled else str(settings.database_url)


class ConfigSignals:
    """The runtime-config channels of one API process, as an event that each notification sets
    (and replaces)."""

    def __init__(self, url: str | None) -> None:
        self._url = url
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: True while LISTENing.
        self.connected = False

    def start(self) -> None:
        if self._url is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="config-signals")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def next_change(self) -> asyncio.Event:
        """The event the next notification sets. Take it *before* reading the database: a change
        that lands during the read then still ends the wait that follows."""
        return self._changed

    def _wake(self, *_notification: object) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        assert self._url is not None
        retry = LoopBackoff(base=0.1, cap=5.0)
        while True:
            lost = asyncio.Event()
            conn = None
            reason = "connecting failed"
            try:
                async with asyncio.timeout(30):
                    conn = await db.connect(self._url, application_name=APPLICATION_NAME)
                reason = "listening failed"
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for channel in (protocol.CONFIG_CHANNEL, protocol.CONFIG_ACK_CHANNEL):
                    await conn.add_listener(channel, self._wake)
                self.connected = True
                retry.reset()
                # Whatever moved while nobody listened: every watcher looks now.
                self._wake()
                while not lost.is_set() and not conn.is_closed():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(CLOSED_CHECK_INTERVAL):
                            await lost.wait()
                reason, detail = "connection lost", "the server closed it"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                detail = first_line(exc)
            finally:
                self.connected = False
                if conn is not None:
                    conn.terminate()
            delay = retry.next()
            log.warning(
                "runtime-config listener: %s (%s); config requests are polled meanwhile; "
                "retrying in %.2fs",
                reason,
                detail,
                delay,
            )
            await asyncio.sleep(delay)
