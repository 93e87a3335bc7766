"""What routes get from the app: its settings, registry, database and metrics.

Everything is built by ``create_app`` and kept on ``app.state.api``; nothing is a module-level
singleton. Routers written elsewhere (the runtime-config router) use these dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import HTTPException, Request, status
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from taskfleet.api.auth import Authenticator
from taskfleet.api.config_signals import ConfigSignals
from taskfleet.api.database import Database
from taskfleet.api.shutdown import Shutdown
from taskfleet.shared.metrics import ApiMetrics
from taskfleet.shared.registry import TaskRegistry
from taskfleet.shared.settings import ApiSettings


@dataclass
class ApiState:
    """The app's long-lived objects. ``database`` exists while the lifespan runs."""

    settings: ApiSettings
    registry: TaskRegistry
    authenticator: Authenticator
    metrics_registry: CollectorRegistry
    metrics: ApiMetrics
    head_revision: str
    database: Database | None = field(default=None)
    #: Set when the server begins to stop: long requests answer at once.
    shutdown: Shutdown = field(default_factory=Shutdown)
    #: Wakes config watchers when the fleet moves; exists while the lifespan runs.
    config_signals: ConfigSignals | None = field(default=None)


def get_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def _database(request: Request) -> Database:
    database = get_state(request).database
    if database is None:
        # Only when the app is served without running its lifespan.
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "database unavailable")
    return database


# The dependencies are ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool,
# a thread hop per dependency per request for what is an attribute lookup.


async def get_database(request: Request) -> Database:
    return _database(request)


@dataclass(frozen=True)
class Submitting:
    """What a submitting route needs, as one dependency: each dependency FastAPI solves costs
    about 1 % of the API's CPU on ``POST /tasks`` (profiled), and that route needs three."""

    database: Database
    registry: TaskRegistry
    metrics: ApiMetrics


async def get_submitting(request: Request) -> Submitting:
    state = get_state(request)
    return Submitting(_database(request), state.registry, state.metrics)


async def get_engine(request: Request) -> AsyncEngine:
    """The app's SQLAlchemy async engine (pool sized by ``db_pool_size``)."""
    return _database(request).engine


async def get_settings(request: Request) -> ApiSettings:
    return get_state(request).settings


async def get_registry(request: Request) -> TaskRegistry:
    return get_state(request).registry


async def get_shutdown(request: Request) -> Shutdown:
    return get_state(request).shutdown
