"""A counting TCP proxy for end-to-end tests: a process connects to Postgres through it, and the
test sees every connection attempt it made (with its time), whatever the process logs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


@dataclass
class CountingProxy:
    """Forwards 127.0.0.1:<port> to ``target`` and records when each connection was opened.

    ``target_host`` is a host name, or (with ``target_unix``) the directory of a Unix socket, as
    the embedded Postgres listens on."""

    target_host: str
    target_port: int
    target_unix: bool = False
    #: Wall-clock times (time.time()) of the accepted connections.
    opened: list[float] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _pipes: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def for_url(cls, database_url: str) -> CountingProxy:
        """A proxy in front of the server ``database_url`` names (TCP or ``?host=<socket dir>``)."""
        parts = urlsplit(database_url)
        socket_dir = dict(parse_qsl(parts.query)).get("host", "")
        if socket_dir.startswith("/"):
            return cls(socket_dir, parts.port or 5432, target_unix=True)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def url_for(self, database_url: str) -> str:
        """``database_url`` pointing at the proxy instead of the server."""
        parts = urlsplit(database_url)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "host"])
        return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{self.port}", query=query))

    def opened_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.opened if start <= t <= end)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.opened.append(time.time())
        try:
            if self.target_unix:
                path = f"{self.target_host}/.s.PGSQL.{self.target_port}"
                up_reader, up_writer = await asyncio.open_unix_connection(path)
            else:
                up_reader, up_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()
