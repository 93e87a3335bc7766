"""Logging for every taskfleet process (API, worker, CLI): one setup, text or JSON lines.

``TASKFLEET_LOG_FORMAT=text`` (the default) writes ``time LEVEL logger: message``;
``TASKFLEET_LOG_FORMAT=json`` writes one JSON object per line with ``time``, ``level``,
``logger``, ``message``, every field a log call passes in ``extra=`` (``task_id``, ``type``,
``attempt``, ...) and, for an exception, ``exception`` (its traceback). Lines go to stderr.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, ``extra=`` fields included (values that JSON cannot hold are
    written as their ``str()``)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and key not in document:
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str, ensure_ascii=False)


class _TaskfleetHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs: a second call replaces it and leaves
    other handlers (a test runner's capture) alone. It writes to whatever ``sys.stderr`` is at
    the time (as Python's last-resort handler does), not to the stream that was stderr when it
    was made, which a test runner may since have closed."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def configure_logging(level: str = "INFO", log_format: LogFormat = "text") -> None:
    """Send every logger's records (uvicorn's included, when it is run with ``log_config=None``)
    to stderr in ``log_format``, at ``level`` and above. Calling it again replaces the setup."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _TaskfleetHandler)]:
        root.removeHandler(handler)
    handler = _TaskfleetHandler()
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level.upper())
