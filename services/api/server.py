"""``taskfleet api``: the control plane under uvicorn, one process."""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn

from taskfleet.api.app import create_app
from taskfleet.api.shutdown import Shutdown
from taskfleet.shared.logs import configure_logging
from taskfleet.shared.settings import ApiSettings

# Long /wait requests must not hold a shutdown up for minutes.
GRACEFUL_SHUTDOWN_SECONDS = 10


def serve(settings: ApiSettings) -> None:
    """Run the API until SIGTERM/SIGINT. Blocks."""
    configure_logging(settings.log_level, settings.log_format)
    # Reading the migration head at startup makes Alembic chatty at INFO; its news is not ours.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        # Behind a proxy, X-Forwarded-* would be trusted from anyone: off unless configured.
        proxy_headers=False,
        # uvicorn's access log is the request line and status: no headers, so no tokens.
        access_log=True,
        # Records go through the root logger, in TASKFLEET_LOG_FORMAT, not uvicorn's own setup,
        # and from TASKFLEET_LOG_LEVEL up: uvicorn sets its loggers' levels to this one, which
        # decides for them over the root's (at WARNING, no access log and no start-up lines).
        log_config=None,
        log_level=settings.log_level.lower(),
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    _Server(config, app.state.api.shutdown).run()


class _Server(uvicorn.Server):
    """uvicorn, telling the app the moment it begins to stop (SIGTERM/SIGINT): long polls and
    streams answer then, instead of being cut off after the graceful timeout."""

    def __init__(self, config: uvicorn.Config, shutdown: Shutdown) -> None:
        super().__init__(config)
        self._shutdown = shutdown

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._shutdown.begin()
        super().handle_exit(sig, frame)
