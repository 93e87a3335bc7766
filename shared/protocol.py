"""Postgres channels and their payloads (docs/reference.md#notify-channels), parsed defensively into
a tagged union.

A payload that does not parse is reported as :class:`Malformed` for the caller to log and drop;
nothing here raises on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from taskfleet.shared.queries import TASK_READY_CHANNEL
from taskfleet.shared.storable import text_problem

CONFIG_CHANNEL = "anclax_worker_runtime_config"
CONFIG_ACK_CHANNEL = "anclax_worker_runtime_config_ack"
CHANNELS = (TASK_READY_CHANNEL, CONFIG_CHANNEL, CONFIG_ACK_CHANNEL)

#: Wake-up hint payload when the submitted work includes a control-lane task.
CONTROL_HINT = "control"
_LANE_NAMES = frozenset({"control", "strict", "normal"})
MAX_PAYLOAD_BYTES = 8000


@dataclass(frozen=True)
class TaskReady:
    """New work. ``lanes``: the lanes it is in, or ``None`` when the hint does not say."""

    lanes: frozenset[str] | None

    @property
    def control(self) -> bool:
        # Only an explicit hint: a busy worker claims into its control slot on it. Control work
        # is always announced by name (and found by the heartbeat's probe if a hint is lost).
        return self.lanes is not None and "control" in self.lanes


def wake_hint(lanes: Iterable[str]) -> str:
    """The ``taskfleet_task_ready`` payload naming the lanes a submission put work in, so a
    worker retries only those (an empty payload means: any lane)."""
    return ",".join(sorted(set(lanes) & _LANE_NAMES))


@dataclass(frozen=True)
class ConfigUpdated:
    request_id: str
    version: int


@dataclass(frozen=True)
class ConfigAck:
    request_id: str
    worker_id: str
    applied_version: int


@dataclass(frozen=True)
class Malformed:
    channel: str
    payload: str
    reason: str


Message = TaskReady | ConfigUpdated | ConfigAck | Malformed


def config_updated_payload(request_id: str, version: int) -> str:
    return json.dumps({"op": "up_config", "params": {"request_id": request_id, "version": version}})


def config_ack_payload(request_id: str, worker_id: str, applied_version: int) -> str:
    return json.dumps(
        {
            "op": "ack",
            "params": {
                "request_id": request_id,
                "worker_id": worker_id,
                "applied_version": applied_version,
            },
        }
    )


def _positive_int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _known_task_ready_payloads() -> dict[str, TaskReady]:
    """Every payload :func:`wake_hint` writes, parsed once: a wake-up is parsed with one lookup
    (the parse sits between a notification and the claim it triggers)."""
    names = sorted(_LANE_NAMES)
    known: dict[str, TaskReady] = {"": TaskReady(lanes=None)}
    for mask in range(1, 1 << len(names)):
        lanes = frozenset(n for i, n in enumerate(names) if mask & (1 << i))
        known[wake_hint(lanes)] = TaskReady(lanes=lanes)
    return known


_TASK_READY_PAYLOADS = _known_task_ready_payloads()


def parse(channel: str, payload: str) -> Message:
    """Parse one notification. Never raises."""
    if channel == TASK_READY_CHANNEL:
        # Empty: work in any lane (in the table). Otherwise a comma-separated list of lane
        # names, spelled as wake_hint writes it (the table) or any other way; anything else is
        # malformed (logged and ignored: the poll finds whatever it was about).
        known = _TASK_READY_PAYLOADS.get(payload)
        if known is not None:
            return known
        named = frozenset(part.strip() for part in payload.split(","))
        if named <= _LANE_NAMES:
            return TaskReady(lanes=named)
        return Malformed(channel, payload[:200], "expected lane names: control, strict, normal")
    if channel not in (CONFIG_CHANNEL, CONFIG_ACK_CHANNEL):
        return Malformed(channel, payload[:200], "unknown channel")
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return Malformed(channel, payload[:200], "not JSON")
    if not isinstance(doc, dict) or not isinstance(doc.get("params"), dict):
        return Malformed(channel, payload[:200], "expected {op, params}")
    params = doc["params"]
    request_id = params.get("request_id")
    if not isinstance(request_id, str):
        return Malformed(channel, payload[:200], "params.request_id must be a string")
    if text_problem(request_id) is not None:
        # No such id can exist: Postgres cannot store it (a JSON escape of NUL or a surrogate).
        return Malformed(channel, payload[:200], "params.request_id is not storable text")
    if channel == CONFIG_CHANNEL:
        version = _positive_int(params.get("version"))
        if doc.get("op") != "up_config" or version is None:
            return Malformed(channel, payload[:200], "expected op up_config with a version")
        return ConfigUpdated(request_id, version)
    applied = _positive_int(params.get("applied_version"))
    worker_id = params.get("worker_id")
    if doc.get("op") != "ack" or applied is None or not isinstance(worker_id, str):
        return Malformed(channel, payload[:200], "expected op ack with worker_id, applied_version")
    if text_problem(worker_id) is not None:
        return Malformed(channel, payload[:200], "params.worker_id is not storable text")
    return ConfigAck(request_id, worker_id, applied)
