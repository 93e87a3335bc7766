"""The events of a runtime-config change, as ``PUT /runtime-config`` streams them.

In order: ``enqueued`` -> ``version`` (once the update task wrote it) -> ``progress`` whenever the
counts change -> exactly one final event: ``converged``, ``superseded``, ``timeout`` or
``failed`` (docs/reference.md#config-events). :func:`parse_config_event` turns one NDJSON line
into one of the classes below and never raises: a line it cannot read is a :class:`BadLine`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

__all__ = [
    "BadLine",
    "ConfigEvent",
    "Converged",
    "Enqueued",
    "ExcludedWorker",
    "Failed",
    "FinalEvent",
    "FleetProgress",
    "Superseded",
    "TimedOut",
    "VersionWritten",
    "parse_config_event",
]


@dataclass(frozen=True)
class ExcludedWorker:
    """A worker left out of the change: alive after the version was written, no longer alive
    (``reason``: ``heartbeat expired``, ``draining`` or ``offline``), and it had not applied it.
    It applies the version when it comes back."""

    id: str
    reason: str


@dataclass(frozen=True)
class Enqueued:
    """The config task is queued (``request_id`` names the change; re-attach with it)."""

    task_id: int | str | None
    request_id: str | None


@dataclass(frozen=True)
class VersionWritten:
    """The update task wrote this config version; the workers are applying it."""

    version: int


@dataclass(frozen=True)
class FleetProgress:
    """How many alive workers have applied the version, and which lag."""

    version: int | None
    alive_workers: int
    applied_workers: int
    lagging: tuple[str, ...]
    excluded: tuple[ExcludedWorker, ...] = ()


@dataclass(frozen=True)
class Converged:
    """Final: every alive worker applied the version (``seconds`` after it was written);
    ``excluded`` names the workers left out."""

    version: int | None
    seconds: float | None
    excluded: tuple[ExcludedWorker, ...] = ()


@dataclass(frozen=True)
class Superseded:
    """Final: a newer version replaced this one before it converged."""

    version: int | None
    superseded_by: int | None


@dataclass(frozen=True)
class TimedOut:
    """Final: the wait ended with workers still lagging (the change goes on)."""

    version: int | None
    lagging: tuple[str, ...]
    excluded: tuple[ExcludedWorker, ...] = ()


@dataclass(frozen=True)
class Failed:
    """Final: the change could not be made (``error`` says why)."""

    error: str


@dataclass(frozen=True)
class BadLine:
    """A line that is not a known event: reported and skipped, never fatal."""

    line: str
    reason: str


FinalEvent = Converged | Superseded | TimedOut | Failed
ConfigEvent = Enqueued | VersionWritten | FleetProgress | FinalEvent | BadLine


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _worker_ids(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(str(item) for item in value)


def _excluded(value: object) -> tuple[ExcludedWorker, ...]:
    """The ``excluded`` list, leniently: entries that are not ``{id, reason}`` are skipped."""
    if not isinstance(value, list):
        return ()
    return tuple(
        ExcludedWorker(str(item["id"]), str(item.get("reason", "")))
        for item in value
        if isinstance(item, dict) and "id" in item
    )


def parse_config_event(line: str) -> ConfigEvent | None:
    """Parse one NDJSON line; ``None`` for a blank (keep-alive) line. Never raises.

    Final events are read leniently (a missing number is ``None``): the outcome is what matters.
    """
    text = line.strip()
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return BadLine(text, f"not JSON: {exc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
        return BadLine(text, 'not an object with an "event" name')
    kind = doc["event"]
    version = _int(doc.get("version"))
    if kind == "enqueued":
        task_id = doc.get("task_id")
        request_id = doc.get("request_id")
        return Enqueued(
            task_id if isinstance(task_id, (int, str)) and not isinstance(task_id, bool) else None,
            request_id if isinstance(request_id, str) else None,
        )
    if kind == "version":
        if version is None:
            return BadLine(text, "version event without an integer version")
        return VersionWritten(version)
    if kind == "progress":
        alive, applied = _int(doc.get("alive_workers")), _int(doc.get("applied_workers"))
        lagging = _worker_ids(doc.get("lagging", []))
        if alive is None or applied is None or lagging is None:
            return BadLine(text, "progress event without integer counts and a lagging list")
        return FleetProgress(version, alive, applied, lagging, _excluded(doc.get("excluded")))
    if kind == "converged":
        return Converged(version, _seconds(doc.get("seconds")), _excluded(doc.get("excluded")))
    if kind == "superseded":
        return Superseded(version, _int(doc.get("superseded_by")))
    if kind == "timeout":
        lagging = _worker_ids(doc.get("lagging")) or ()
        return TimedOut(version, lagging, _excluded(doc.get("excluded")))
    if kind == "failed":
        error = doc.get("error")
        return Failed(error if isinstance(error, str) and error else "no reason given")
    return BadLine(text, f"unknown event {kind!r}")
