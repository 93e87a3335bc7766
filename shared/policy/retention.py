"""How long finished work is kept: the retention durations and the pruning plan, as pure code.

A retention is a duration such as ``2s``, ``15m``, ``24h`` or ``7d`` (one or more number-unit
parts, units ``s``, ``m``, ``h``, ``d``), or ``never``: that kind of row is never pruned.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: The statuses of ``taskfleet_pruned_total`` besides the finished task statuses: an offline
#: worker row, and a runtime-config version past the ones kept.
PRUNED_WORKER = "worker"
PRUNED_RUNTIME_CONFIG = "runtime_config"
PRUNED_TASK_STATUSES = ("completed", "failed", "cancelled")
PRUNED_KINDS = (*PRUNED_TASK_STATUSES, PRUNED_WORKER, PRUNED_RUNTIME_CONFIG)

#: Runtime-config versions always kept: the newest this many (and any a worker or an unfinished
#: update task still names).
RUNTIME_CONFIG_VERSIONS_KEPT = 300

NEVER = "never"
_RULE = "must be a duration such as 2s, 15m, 24h or 7d, or never"
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: Longer than any sensible retention, short enough for Postgres' interval arithmetic.
_MAX_SECONDS = 100 * 365 * 86400.0


def parse_retention(value: object) -> float | None:
    """Seconds to keep, or ``None`` for ``never``. Raises ``ValueError`` stating the rule."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(_RULE)
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if text == NEVER:
            return None
        pos, seconds = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if not text or pos != len(text):
            raise ValueError(_RULE)
    else:
        raise ValueError(_RULE)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{_RULE}; a duration must be greater than 0")
    if seconds > _MAX_SECONDS:
        raise ValueError(f"{_RULE}; at most 100 years (or never)")
    return seconds


def format_retention(seconds: float | None) -> str:
    """The shortest exact rendering: ``never``, ``7d``, ``24h`` is ``1d``, ``90s`` is ``90s``."""
    if seconds is None:
        return NEVER
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class RetentionPolicy:
    """What the pruner deletes: finished tasks of a status once finished longer ago than its
    retention, offline (or dead) worker rows silent longer than theirs. ``None``: never."""

    completed: float | None
    cancelled: float | None
    failed: float | None
    workers: float | None

    def task_cutoffs(self) -> tuple[list[str], list[float]]:
        """(statuses, seconds) of the statuses that are pruned at all, in a fixed order."""
        pairs = [
            (status, seconds)
            for status, seconds in (
                ("completed", self.completed),
                ("failed", self.failed),
                ("cancelled", self.cancelled),
            )
            if seconds is not None
        ]
        return [s for s, _ in pairs], [k for _, k in pairs]
