"""``taskfleet worker``: one worker process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

from taskfleet.shared.errors import bind_error
from taskfleet.shared.logs import configure_logging
from taskfleet.shared.registry import load_registry
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.http import bind, create_server
from taskfleet.worker.worker import Worker

log = logging.getLogger("taskfleet.worker")


async def serve_worker(settings: WorkerSettings, worker: Worker | None = None) -> Worker:
    """Run a worker with its HTTP port until it is stopped; returns the stopped worker."""
    if worker is None:
        worker = Worker(settings, load_registry(settings.task_modules))
    sock = _bind_metrics(settings.metrics_host, settings.metrics_port)
    worker.metrics_port = sock.getsockname()[1]
    server = create_server(worker, sock)
    http_task = asyncio.create_task(server.serve(sockets=[sock]), name="worker-http")
    log.info("worker %s: metrics and health on port %d", worker.id, worker.metrics_port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, worker.request_stop)
    try:
        await worker.run()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(http_task, 5)
    return worker


def _bind_metrics(host: str, port: int) -> socket.socket:
    """The socket of /metrics and the probes; a one-line error when it cannot be had."""
    try:
        return bind(host, port)
    except OSError as exc:
        raise bind_error(
            exc,
            host,
            port,
            host_setting="TASKFLEET_METRICS_HOST",
            port_setting="--metrics-port or TASKFLEET_METRICS_PORT (0 picks a free one)",
        ) from exc


def run_worker_process(settings: WorkerSettings) -> int:
    configure_logging(settings.log_level, settings.log_format)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        worker = runner.run(serve_worker(settings))
        if worker.handler_threads_running or worker.attempts_abandoned:
            # Handlers still running past the drain: blocking ones in their threads, async ones
            # that ignored every cancel. Their tasks were not given back, so they must stop now,
            # with the process: the interpreter would wait for the threads at exit, and closing
            # the loop would wait for the coroutines (it cancels and awaits every task left).
            # Their leases expire and the sweep rescues them.
            log.warning(
                "exiting with %d handler(s) still running; their tasks are rescued when their "
                "leases expire",
                worker.handler_threads_running + worker.attempts_abandoned,
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(worker.exit_code)
    return worker.exit_code


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (a dependency except on Windows), as uvicorn does for the
    API: asyncpg's protocol and the wake-up path run on it with less CPU per round trip."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
