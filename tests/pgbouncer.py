"""A real PgBouncer (Debian's ``pgbouncer`` package) in transaction pooling mode, in front of the
test Postgres, on a free port: what an operator runs in front of a managed Postgres.

Configured as the least capable version the docs promise to work with (1.18, Debian bookworm's):
``pool_mode = transaction``, no prepared-statement support (``max_prepared_statements`` left
unset), ``ignore_startup_parameters = extra_float_digits`` only, and few server connections so
that clients really share them. ``scripts/test`` installs the package when it is missing; a run
without it fails naming the package, never skips.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import asyncpg
import psycopg

from taskfleet.shared.db import asyncpg_dsn
from tests.ports import free_port

BINARY_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
MISSING = (
    "the PgBouncer tests need Debian's package pgbouncer: run 'apt-get install pgbouncer' as "
    "root (scripts/test does it when run as root)"
)


def binary() -> str:
    for candidate in BINARY_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("pgbouncer")
    if found is None:
        raise FileNotFoundError(MISSING)
    return found


@dataclass
class PgBouncer:
    """A running PgBouncer; ``url(database_url)`` points a test database's URL at it."""

    port: int
    workdir: Path
    process: subprocess.Popen[bytes]
    server_url: str

    def url(self, database_url: str) -> str:
        """``database_url`` (a database on the test server) through PgBouncer."""
        parts = urlsplit(asyncpg_dsn(database_url))
        query = {k: v for k, v in parse_qs(parts.query).items() if k not in ("host", "port")}
        netloc = f"postgres@127.0.0.1:{self.port}"
        return urlunsplit(
            (parts.scheme, netloc, parts.path, urlencode(query, doseq=True), parts.fragment)
        )

    @property
    def admin_url(self) -> str:
        """PgBouncer's admin console (``SHOW``, ``KILL``, ``RECONNECT``; simple protocol only)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/pgbouncer"

    async def admin(self, command: str) -> list[dict[str, Any]]:
        """Run an admin console command (``SHOW SERVERS``, ``KILL db``, ``RECONNECT``); its rows.
        The console speaks the simple query protocol only: psycopg's client-side cursor."""
        async with await psycopg.AsyncConnection.connect(
            self.admin_url, autocommit=True, cursor_factory=psycopg.AsyncClientCursor
        ) as conn:
            cursor = await conn.execute(command)
            if cursor.description is None:
                return []
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in await cursor.fetchall()]

    async def server_ports(self, database: str) -> list[int]:
        """The local ports of PgBouncer's server connections to ``database``: the client_port
        Postgres shows for them in pg_stat_activity."""
        rows = await self.admin("SHOW SERVERS")
        return [int(str(r["local_port"])) for r in rows if r.get("database") == database]

    def log(self) -> str:
        return (self.workdir / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start(server_url: str, *, pool_size: int = 4, timeout: float = 15.0) -> PgBouncer:
    """Start PgBouncer in front of the Postgres of ``server_url``; return once it accepts."""
    exe = binary()
    parts = urlsplit(asyncpg_dsn(server_url))
    query = parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
    port = int(query.get("port", [str(parts.port or 5432)])[0])
    user = parts.username or "postgres"
    workdir = Path(tempfile.mkdtemp(prefix="tf-pgbouncer-"))
    listen_port = free_port()
    (workdir / "users.txt").write_text(f'"{user}" ""\n"postgres" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={host} port={port} user={user}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {listen_port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {workdir / 'users.txt'}",
                "admin_users = postgres",
                "pool_mode = transaction",
                "ignore_startup_parameters = extra_float_digits",
                f"default_pool_size = {pool_size}",
                "max_client_conn = 500",
                f"logfile = {workdir / 'pgbouncer.log'}",
                "",
            ]
        )
    )
    command = [exe]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: it runs as postgres, or, in front of a server on a
        # unix socket (the embedded one), as the owner of the socket's directory.
        user = "postgres"
        if host.startswith("/"):
            user = pwd.getpwuid(os.stat(host).st_uid).pw_name
        command += ["-u", user]
        shutil.chown(workdir, user)
        for path in workdir.iterdir():
            shutil.chown(path, user)
    command.append(str(workdir / "pgbouncer.ini"))
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    bouncer = PgBouncer(listen_port, workdir, process, server_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"pgbouncer exited with {process.returncode}: {err}")
        try:
            with socket.create_connection(("127.0.0.1", listen_port), timeout=1):
                break
        except OSError:
            time.sleep(0.05)
    else:
        bouncer.stop()
        raise RuntimeError(f"pgbouncer did not listen on port {listen_port} within {timeout}s")
    try:
        asyncio.run(_probe(bouncer.url(server_url)))
    except Exception as exc:
        log = bouncer.log()
        bouncer.stop()
        # E.g. an embedded server's unix socket the postgres user may not reach.
        raise RuntimeError(f"no query through pgbouncer to {host}:{port} ({exc}):\n{log}") from exc
    return bouncer


async def _probe(url: str) -> None:
    conn = await asyncpg.connect(url, statement_cache_size=0, timeout=10)
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()
