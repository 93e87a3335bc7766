"""Task and worker statuses: the values the database's CHECK constraints allow.

Kept apart from the table definitions so the public client can name them without importing
SQLAlchemy.
"""

from __future__ import annotations

import enum


class TaskStatus(enum.StrEnum):
    """Where a task is in its life: ``pending`` -> ``running`` -> ``completed``, ``failed`` or
    ``cancelled`` (``running`` -> ``pending`` again on a retry or a lease rescue)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the statuses a task does not leave by itself."""
        return self in FINISHED_STATUSES


FINISHED_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})


class WorkerStatus(enum.StrEnum):
    ONLINE = "online"
    DRAINING = "draining"
    OFFLINE = "offline"
