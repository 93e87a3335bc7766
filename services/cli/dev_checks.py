"""What ``taskfleet dev`` checks before it starts anything: one instance per folder, the ports,
and whether the database has a connection for every part asked for."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections.abc import Sequence
from pathlib import Path

from taskfleet.cli.main import check_listen_address
from taskfleet.shared import db, queries
from taskfleet.shared.errors import OperatorError

#: Connections one worker holds: claims; outcomes and config reads; the heartbeat; LISTEN; and
#: retention's deletes, from the first time something is due (docs/operations.md, "Database
#: connections").
CONNECTIONS_PER_WORKER = 5
#: Beyond the API's pool and the workers: the config writer, psql, the user's own scripts.
SPARE_CONNECTIONS = 10


class DevLock:
    """One ``taskfleet dev`` per folder: an exclusive ``flock`` on a file beside the data
    directory, held until the process exits (the kernel drops it even after SIGKILL). The file
    says who holds it, for the message the second one prints."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, api_base: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise OperatorError(
                f"taskfleet dev is already running in this folder ({holder}): use that one, or "
                "stop it (Ctrl-C in its terminal) before starting another"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "api": api_base}).encode())
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return f"pid {int(info['pid'])}, API {info['api']}"
        except (ValueError, KeyError, TypeError, OSError):
            return "another process"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def connections_needed(workers: int, api_pool: int) -> int:
    """Connections ``taskfleet dev`` opens at most: the API's pool, each worker's own, spares."""
    return api_pool + CONNECTIONS_PER_WORKER * workers + SPARE_CONNECTIONS


def connection_limit(url: str) -> tuple[int, int]:
    """``(max_connections, usable)``: what the server allows, and what the role in ``url`` may
    open of it (superuser-reserved slots excluded for other roles)."""

    async def read() -> tuple[int, int]:
        conn = await db.connect(url, application_name="taskfleet-dev")
        try:
            row = await conn.fetchrow(queries.server_connection_limit.sql)
        finally:
            await conn.close()
        assert row is not None
        return int(row["max_connections"]), int(row["usable"])

    return asyncio.run(read())


def check_ports(host: str, port: int, metrics_host: str, metrics_ports: Sequence[int]) -> None:
    """One line now, rather than a child that dies later, when a port cannot be listened on."""
    check_listen_address(host, port)
    for metrics_port in metrics_ports:
        check_listen_address(
            metrics_host,
            metrics_port,
            host_setting="TASKFLEET_METRICS_HOST",
            port_setting="TASKFLEET_METRICS_PORT (the first worker's; the others follow it)",
        )
