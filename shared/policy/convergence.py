"""When a runtime-config change is done (docs/reference.md#config-events).

One rule, used by the worker that writes a version (the update task, against its own deadline)
and by the API that streams its progress (against the client's ``?timeout=``):

1. a newer version exists: **superseded** (checked first);
2. at least one worker is alive and none of the alive ones is below the version: **converged**;
3. the deadline has passed: **timeout**, naming the lagging workers; with no alive worker at
   all, it says so (``alive_workers: 0`` and a reason): a version nobody runs has not
   converged, it waits in the database for the next worker that starts;
4. otherwise the change is still in progress.

The database's view of the alive fleet is the input; notifications and ACKs never decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

#: The reason given when a change times out with no alive worker.
NO_ALIVE_WORKER = (
    "no alive worker: the version is stored, and every worker applies it when it starts"
)


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


@dataclass(frozen=True)
class TimedOut:
    version: int
    lagging: tuple[str, ...]
    alive_workers: int
    #: Set when no worker was alive to apply it.
    reason: str | None = None
    kind: Literal["timeout"] = "timeout"


Decision = Converged | Superseded | TimedOut


def decide(view: FleetView, *, deadline_passed: bool = False) -> Decision | None:
    """The change's outcome if there is one now, else None (keep waiting)."""
    if view.latest > view.version:
        return Superseded(view.version, view.latest)
    if view.alive_workers > 0 and not view.lagging:
        seconds = view.seconds_since_insert
        return Converged(
            view.version,
            round(seconds, 6) if seconds is not None else None,
            view.alive_workers,
        )
    if deadline_passed:
        return TimedOut(
            view.version,
            tuple(view.lagging),
            view.alive_workers,
            NO_ALIVE_WORKER if view.alive_workers == 0 else None,
        )
    return None
