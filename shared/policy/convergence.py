"""When a runtime-config change is done (docs/reference.md#config-events).

One rule, used by the worker that writes a version (the update task) and by the API that streams
its progress: a newer version means **superseded** (checked first); no alive worker below the
version means **converged**; otherwise the change is still in progress. The database's view of
the alive fleet is the input; notifications and ACKs never decide anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class FleetView:
    """One read of the database about ``version``."""

    version: int
    #: The newest version written so far.
    latest: int
    alive_workers: int
    #: Alive workers whose applied version is below ``version``.
    lagging: Sequence[str]
    seconds_since_insert: float | None = None


@dataclass(frozen=True)
class Converged:
    version: int
    seconds: float | None
    alive_workers: int
    kind: Literal["converged"] = "converged"


@dataclass(frozen=True)
class Superseded:
    version: int
    superseded_by: int
    kind: Literal["superseded"] = "superseded"


Decision = Converged | Superseded


def decide(view: FleetView) -> Decision | None:
    """The change's outcome if the fleet has one for it, else None (keep waiting)."""
    if view.latest > view.version:
        return Superseded(view.version, view.latest)
    if not view.lagging:
        seconds = view.seconds_since_insert
        return Converged(
            view.version,
            round(seconds, 6) if seconds is not None else None,
            view.alive_workers,
        )
    return None
