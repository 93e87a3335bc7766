"""A runtime-config change in flight: its streamed events, and its outcome.

The change carries a ``requestID``, so it is one version however often it is sent. When the
stream drops before the outcome, the change re-attaches with ``GET
/runtime-config/requests/{id}?watch=true`` (and, if the server never saw the request, sends it
again with the same id) instead of creating a new version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING

import httpx

from taskfleet import _calls
from taskfleet.config_events import (
    ConfigEvent,
    Converged,
    Enqueued,
    Failed,
    FinalEvent,
    Superseded,
    TimedOut,
    VersionWritten,
    parse_config_event,
)
from taskfleet.errors import NotFound

if TYPE_CHECKING:
    from taskfleet.client import AsyncClient, Client

#: Re-attachments after a dropped stream before the change gives up.
REATTACH_LIMIT = 5


class ConfigStreamLost(Exception):
    """The event stream kept dropping before the outcome; the change may still converge (read
    it with ``Client.config()`` or re-attach with its ``request_id``)."""

    def __init__(self, request_id: str, reason: str) -> None:
        self.request_id = request_id
        super().__init__(f"config request {request_id}: the stream was lost: {reason}")


class _Events:
    """What has been seen: a re-attached stream starts over with ``enqueued`` and ``version``,
    which the caller has already had."""

    def __init__(self) -> None:
        self.final: FinalEvent | None = None
        self.enqueued = False
        self.version: int | None = None
        self.events: list[ConfigEvent] = []

    def accept(self, line: str) -> ConfigEvent | None:
        event = parse_config_event(line)
        if event is None:
            return None
        if isinstance(event, Enqueued):
            if self.enqueued:
                return None
            self.enqueued = True
        if isinstance(event, VersionWritten):
            if self.version == event.version:
                return None
            self.version = event.version
        if isinstance(event, Converged | Superseded | TimedOut | Failed):
            self.final = event
        self.events.append(event)
        return event


class ConfigChange:
    """Iterate for the events as they arrive; :meth:`result` waits for the outcome.

    ``request_id`` names the change (it is in the ``enqueued`` event too).
    """

    def __init__(self, client: Client, call: _calls.Call, request_id: str, timeout: float):
        self.request_id = request_id
        self._client = client
        self._call = call
        self._deadline = time.monotonic() + timeout
        self._seen = _Events()
        # Sent now, so a refused change raises here and an unread change still happens.
        self._response: httpx.Response | None = client._open_stream(call)
        self._stream = self._run()

    @property
    def final(self) -> FinalEvent | None:
        """The outcome event, once it has arrived."""
        return self._seen.final

    def __iter__(self) -> Iterator[ConfigEvent]:
        return self

    def __next__(self) -> ConfigEvent:
        return next(self._stream)

    def result(self) -> FinalEvent:
        """Read the stream to its outcome event and return it (``converged``, ``superseded``,
        ``timeout`` or ``failed``). Raises :class:`ConfigStreamLost` if it never arrives."""
        for _ in self:
            pass
        assert self._seen.final is not None
        return self._seen.final

    def close(self) -> None:
        """Stop reading (the change itself goes on)."""
        self._stream.close()
        if self._response is not None:
            self._response.close()

    def _run(self) -> Generator[ConfigEvent]:
        reason = "the stream ended before an outcome"
        for attempt in range(REATTACH_LIMIT + 1):
            if self._response is None:
                time.sleep(_calls.retry_delay(attempt))
                try:
                    self._response = self._reopen()
                except httpx.TransportError as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                    continue
            try:
                for line in self._response.iter_lines():
                    event = self._seen.accept(line)
                    if event is not None:
                        yield event
                    if self._seen.final is not None:
                        return
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self._response.close()
                self._response = None
        raise ConfigStreamLost(self.request_id, reason)

    def _reopen(self) -> httpx.Response:
        remaining = max(1.0, self._deadline - time.monotonic())
        try:
            return self._client._open_stream(_calls.watch_config(self.request_id, remaining))
        except NotFound:
            # The server never saw the request: send it again, under the same request id.
            return self._client._open_stream(self._call)


class AsyncConfigChange:
    """The async twin of :class:`ConfigChange`: ``async for`` the events, ``await result()``."""

    def __init__(
        self, client: AsyncClient, call: _calls.Call, request_id: str, timeout: float
    ) -> None:
        self.request_id = request_id
        self._client = client
        self._call = call
        self._deadline = time.monotonic() + timeout
        self._seen = _Events()
        self._response: httpx.Response | None = None
        self._stream = self._run()

    async def _start(self) -> AsyncConfigChange:
        self._response = await self._client._open_stream(self._call)
        return self

    @property
    def final(self) -> FinalEvent | None:
        """The outcome event, once it has arrived."""
        return self._seen.final

    def __aiter__(self) -> AsyncIterator[ConfigEvent]:
        return self

    async def __anext__(self) -> ConfigEvent:
        return await anext(self._stream)

    async def result(self) -> FinalEvent:
        """Read the stream to its outcome event and return it. Raises :class:`ConfigStreamLost`
        if it never arrives."""
        async for _ in self:
            pass
        assert self._seen.final is not None
        return self._seen.final

    async def aclose(self) -> None:
        """Stop reading (the change itself goes on)."""
        await self._stream.aclose()
        if self._response is not None:
            await self._response.aclose()

    async def _run(self) -> AsyncGenerator[ConfigEvent]:
        reason = "the stream ended before an outcome"
        for attempt in range(REATTACH_LIMIT + 1):
            if self._response is None:
                await asyncio.sleep(_calls.retry_delay(attempt))
                try:
                    self._response = await self._reopen()
                except httpx.TransportError as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                    continue
            try:
                async for line in self._response.aiter_lines():
                    event = self._seen.accept(line)
                    if event is not None:
                        yield event
                    if self._seen.final is not None:
                        return
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                await self._response.aclose()
                self._response = None
        raise ConfigStreamLost(self.request_id, reason)

    async def _reopen(self) -> httpx.Response:
        remaining = max(1.0, self._deadline - time.monotonic())
        try:
            return await self._client._open_stream(_calls.watch_config(self.request_id, remaining))
        except NotFound:
            return await self._client._open_stream(self._call)
