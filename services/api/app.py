"""``create_app(settings)``: the HTTP control plane, built from its settings.

Nothing connects at import time or in ``create_app``: the lifespan creates the engine (its pool
sized by ``db_pool_size``) and disposes of it. The API starts even when Postgres is down; it
answers 503 until it is back, and ``/readyz`` says why.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from taskfleet import __version__
from taskfleet.api import bulk, config_signals, console, health, schedules, stats, tasks, workers
from taskfleet.api.auth import Authenticator
from taskfleet.api.body_limit import BodyLimit
from taskfleet.api.config_signals import ConfigSignals
from taskfleet.api.database import Database
from taskfleet.api.deps import ApiState
from taskfleet.api.errors import install_error_handlers
from taskfleet.api.metrics import install_metrics
from taskfleet.shared.metrics import ApiMetrics
from taskfleet.shared.migrations import head_revision
from taskfleet.shared.registry import load_registry
from taskfleet.shared.settings import ApiSettings

log = logging.getLogger(__name__)

#: Written separately; included when present, so the app works before and after it exists.
RUNTIME_CONFIG_ROUTER_MODULE = "taskfleet.api.runtime_config"


def create_app(settings: ApiSettings) -> FastAPI:
    """The FastAPI app of the control plane (docs/reference.md#http-api)."""
    metrics_registry = CollectorRegistry()
    state = ApiState(
        settings=settings,
        registry=load_registry(settings.task_modules),
        authenticator=Authenticator(settings.tokens(), disabled=settings.auth_disabled),
        metrics_registry=metrics_registry,
        metrics=ApiMetrics.create(metrics_registry),
        head_revision=head_revision(),
    )
    if settings.auth_disabled:
        log.warning(
            "AUTHENTICATION IS DISABLED (TASKFLEET_AUTH_DISABLED=true): anyone who can reach "
            "this API can submit and cancel tasks and change the fleet's runtime config"
        )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.database = Database.create(
            settings.database_url, pool_size=settings.db_pool_size, pooled=settings.pooled
        )
        state.shutdown.bind()
        signals = state.config_signals = ConfigSignals(config_signals.listen_url(settings))
        signals.start()
        try:
            yield
        finally:
            state.shutdown.begin()
            state.config_signals = None
            await signals.stop()
            database, state.database = state.database, None
            await database.dispose()

    app = FastAPI(
        title="taskfleet",
        summary="Postgres-backed tasks: strict priority lane, weighted fair normal lane.",
        version=__version__,
        lifespan=lifespan,
        # Served by taskfleet.api.console from packaged copies, not FastAPI's CDN pages.
        docs_url=None,
        redoc_url=None,
    )
    app.state.api = state
    install_error_handlers(app)
    # Before the metrics' middleware, so inside it: a refused body is counted as the 413 it is.
    app.add_middleware(BodyLimit, max_body_bytes=settings.max_body_bytes)
    install_metrics(app, state)
    app.include_router(health.router)
    app.include_router(tasks.batch_router)
    # Before the task routes: /tasks/stats must not be taken for /tasks/{id}.
    app.include_router(stats.router)
    app.include_router(bulk.router)
    app.include_router(tasks.router)
    app.include_router(workers.router)
    app.include_router(schedules.router)
    app.include_router(console.create_router())
    if importlib.util.find_spec(RUNTIME_CONFIG_ROUTER_MODULE) is not None:
        module = importlib.import_module(RUNTIME_CONFIG_ROUTER_MODULE)
        app.include_router(module.router)
    return app
