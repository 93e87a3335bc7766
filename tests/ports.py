"""Ports for the processes a test starts (an API, a worker's HTTP port, PgBouncer)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Ports already handed to a child by this test process.
_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port for a child process to listen on: free now, never handed out before by this
    process, and below the kernel's ephemeral range. Outgoing connections (to Postgres, between
    the test's processes) take their local ports from that range, and one of them could take a
    port picked there between this check and the child's own bind (seen: a worker that exited
    with "the port is in use" in a 20-worker test)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, low) if low > 10001 else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")
