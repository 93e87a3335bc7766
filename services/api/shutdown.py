"""The API's shutdown signal: long requests answer at once when the server begins to stop.

uvicorn stops accepting connections at SIGTERM and then waits (up to its graceful timeout) for
the open ones; a pending ``GET /tasks/{id}/wait`` or a config stream would hold on until the
timeout and be cut off with a 500. Instead, they watch this signal: a wait answers with the
task's current state, a stream ends (the client re-attaches by its request id), a blocking config
request answers 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio


class Shutdown:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._requested = False

    def bind(self) -> None:
        """In the server's event loop, at start-up (the lifespan)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self._requested:
            self._event.set()

    def begin(self) -> None:
        """The server begins to stop. Safe from a signal handler or another thread."""
        self._requested = True
        if self._loop is not None and self._event is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    @property
    def started(self) -> bool:
        return self._event.is_set() if self._event is not None else self._requested

    async def sleep(self, seconds: float, *, wake: asyncio.Event | None = None) -> bool:
        """Sleep up to ``seconds``, or until ``wake`` is set; True (at once) when the server
        begins to stop."""
        events = [e for e in (self._event, wake) if e is not None]
        if events:
            waits = [asyncio.ensure_future(e.wait()) for e in events]
            try:
                await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        else:
            await asyncio.sleep(seconds)
        return self.started
