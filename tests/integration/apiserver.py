"""The real API app under a real uvicorn, on an ephemeral port, in a background thread.

Streaming endpoints have to be tested this way: httpx's ASGITransport buffers whole bodies, so
it cannot show that events arrive one by one, and it hangs on a stream that stays open. The
server thread has its own event loop, as a separate API process would; the test's loop (and any
in-process workers on it) only talks to it over HTTP.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from taskfleet.api.app import create_app
from taskfleet.shared.settings import ApiSettings

#: Bound on starting and stopping the server; generous, CI shares two cores.
PATIENCE = 30.0


@dataclass(frozen=True)
class RunningApi:
    url: str
    app: FastAPI
    server: uvicorn.Server


@contextmanager
def running_api(settings: ApiSettings) -> Iterator[RunningApi]:
    """Serve ``create_app(settings)`` on 127.0.0.1 and an ephemeral port until the block ends."""
    app = create_app(settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        access_log=False,
        # Open streams must not keep a finished test waiting.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="api-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + PATIENCE
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn exited before it started")
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield RunningApi(url=f"http://127.0.0.1:{port}", app=app, server=server)
    finally:
        server.should_exit = True
        thread.join(PATIENCE)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("uvicorn did not stop")
