"""The worker's own HTTP port: /metrics, /healthz, /readyz."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from taskfleet.worker.worker import Worker


def create_worker_http_app(worker: Worker) -> Starlette:
    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(worker.metrics_registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "worker_id": worker.id})

    async def readyz(_request: Request) -> Response:
        reasons = worker.not_ready_reasons()
        body = {
            "worker_id": worker.id,
            "status": worker.status,
            "ready": not reasons,
            "reasons": reasons,
            "listener_connected": worker.listener.connected.is_set(),
            "applied_config_version": worker.applied_version,
            "schema_revision_expected": worker.expected_revision,
        }
        return JSONResponse(body, status_code=200 if not reasons else 503)

    return Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
        ]
    )


class _Server(uvicorn.Server):
    # The worker owns SIGTERM/SIGINT (drain); uvicorn must not take them over.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def create_server(worker: Worker, sock: socket.socket) -> _Server:
    config = uvicorn.Config(
        create_worker_http_app(worker),
        log_config=None,  # through the root logger, as the process's other records
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = _Server(config)
    server._sock = sock  # type: ignore[attr-defined]
    return server
