"""A TCP proxy in front of Postgres that counts the statements its clients send.

The idle-load figures need "statements per second", and this server has no pg_stat_statements.
``pg_stat_database.xact_commit + xact_rollback`` counts transactions instead, which is the same
for single-statement transactions but undercounts a transaction of several statements. So each
idle worker also connects through one of these: it reads the frontend protocol and counts every
simple ``Query`` and every extended-protocol ``Execute`` message, i.e. every statement sent,
whatever the driver (a simple query string holding several statements counts once; none of the
workers measured sends one while idle). The proxy answers SSL/GSS encryption requests with "no",
so the stream stays readable (local connections only).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_STATEMENT_MESSAGES = (b"Q", b"E")


class StatementCounter:
    """Listens on 127.0.0.1 (an ephemeral port) and forwards to ``upstream``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.statements = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Start-up: answer encryption requests ourselves until the real startup packet comes.
        while True:
            header = await reader.readexactly(8)
            length, code = struct.unpack("!ii", header)
            body = await reader.readexactly(length - 8)
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                writer.write(b"N")
                await writer.drain()
                continue
            break
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        self.connections += 1
        up_writer.write(header + body)
        await up_writer.drain()
        back = asyncio.create_task(_pipe(up_reader, writer))
        try:
            if code == _CANCEL_REQUEST:
                await back
                return
            while True:
                kind = await reader.readexactly(1)
                size = await reader.readexactly(4)
                (length,) = struct.unpack("!i", size)
                payload = await reader.readexactly(length - 4)
                if kind in _STATEMENT_MESSAGES:
                    self.statements += 1
                up_writer.write(kind + size + payload)
                await up_writer.drain()
                if kind == b"X":  # Terminate
                    break
        finally:
            back.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await back
            up_writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
