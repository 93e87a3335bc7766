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

**One decision, one time.** The update task decides, and its result is the stored answer: the
stream's final event, ``GET /runtime-config/requests/{id}``, the task's result and
``anclax_runtime_config_convergence_seconds`` all report that one decision (the API decides by
itself only for a version no unfinished update task follows). So that its time is the moment
the database says so, the update task looks again at once on an ACK, and when the heartbeat of
the first lagging worker expires (:func:`next_check_seconds`), never only after listenTimeout.

**Who was left out.** A worker that was alive after the version was written and is no longer
alive without having applied it does not hold convergence up: the outcome names it, with why
(:func:`exclusion_reason`), in ``excluded``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: The reason given when a change times out with no alive worker.
NO_ALIVE_WORKER = (
    "no alive worker: the version is stored, and every worker applies it when it starts"
)


#: Why a worker is left out of a change's convergence, by its row's status.
HEARTBEAT_EXPIRED = "heartbeat expired"
DRAINING = "draining"
OFFLINE = "offline"


def exclusion_reason(status: str) -> str:
    """Why a worker that is not alive (any more) is left out: an ``online`` row whose heartbeat
    expired (the process stalled, was killed, or lost the database), or one that began to drain
    or went offline before it applied the version."""
    if status == "draining":
        return DRAINING
    if status == "offline":
        return OFFLINE
    return HEARTBEAT_EXPIRED


@dataclass(frozen=True)
class Excluded:
    """A worker left out of a change's convergence: alive after the version was written, not
    alive now, and it had not applied the version."""

    id: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "reason": self.reason}


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
    #: Workers left out (see :class:`Excluded`).
    excluded: Sequence[Excluded] = ()
    #: Seconds until the first lagging worker's heartbeat expires (None: none lags).
    lagging_expire_in: float | None = None
    applied_workers: int = 0


def view_from_row(version: int, row: Mapping[str, Any]) -> FleetView:
    """The view of ``version`` from a row of the ``runtime_config_convergence`` statement."""
    since = row["seconds_since_insert"]
    expire_in = row["lagging_expire_in"]
    return FleetView(
        version=version,
        latest=int(row["latest"]),
        alive_workers=int(row["alive_workers"]),
        applied_workers=int(row["applied_workers"]),
        lagging=tuple(str(w) for w in row["lagging"]),
        seconds_since_insert=float(since) if since is not None else None,
        excluded=tuple(
            Excluded(str(w), exclusion_reason(str(status)))
            for w, status in zip(row["excluded"], row["excluded_statuses"], strict=True)
        ),
        lagging_expire_in=float(expire_in) if expire_in is not None else None,
    )


@dataclass(frozen=True)
class Converged:
    version: int
    seconds: float | None
    alive_workers: int
    excluded: tuple[Excluded, ...] = ()
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
    excluded: tuple[Excluded, ...] = ()
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
            tuple(view.excluded),
        )
    if deadline_passed:
        return TimedOut(
            view.version,
            tuple(view.lagging),
            view.alive_workers,
            NO_ALIVE_WORKER if view.alive_workers == 0 else None,
            tuple(view.excluded),
        )
    return None


#: How long past a heartbeat's expiry the update task looks again (the expiry is computed by
#: the database; a check a hair late sees it expired).
EXPIRY_MARGIN_SECONDS = 0.01


def next_check_seconds(
    *, listen_timeout: float, until_notify: float, lagging_expire_in: float | None
) -> float:
    """How long the update task may wait for an ACK before it looks at the database again.

    The lagging set shrinks in two ways: a worker applies the version (its ACK ends the wait at
    once) or a lagging worker's heartbeat expires (no message says so: the wait ends at the
    first expiry). Never longer than listenTimeout, nor past the next re-notification.
    """
    wait = min(listen_timeout, until_notify)
    if lagging_expire_in is not None:
        wait = min(wait, max(lagging_expire_in, 0.0) + EXPIRY_MARGIN_SECONDS)
    return max(0.005, wait)
