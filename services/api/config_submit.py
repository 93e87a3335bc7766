"""Enqueueing a runtime-config change: the control-lane ``updateWorkerRuntimeConfig`` task, or
the one already there for the same request id (one request id is one version).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import status

from taskfleet.api.database import Database, fetch_all, fetch_one
from taskfleet.api.errors import ApiError, error_item
from taskfleet.shared import db, protocol, queries
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, RUNTIME_CONFIG_TASK_TYPE

#: Attempts of the update task: it only fails on a database error, and a retry is idempotent.
UPDATE_TASK_MAX_ATTEMPTS = 10


@dataclass(frozen=True)
class Submitted:
    request_id: str
    task_id: int | None
    #: True when the request id was known already: this request attached to it.
    deduplicated: bool


def _unique_key(request_id: str) -> str:
    return f"runtime-config:{request_id}"


async def submit_config(
    database: Database, request_id: str, payload: dict[str, Any], *, check_payload: bool
) -> Submitted:
    """Enqueue the update task with ``payload`` (a PUT's config, or a PATCH's changes), or
    attach to the one its request id has.

    One request id is one version: a retry while the task is unfinished is deduplicated by the
    task's unique key, and a request id that already has a version or a finished task is
    attached to. Reusing a request id for a different config (a PUT's, compared with its task or
    its version; a PATCH's changes, compared with its task's) is a 409: attaching would report
    the outcome of a change the client did not send. ``check_payload``: ``payload`` is a whole
    config (a PUT), comparable with a stored version too.
    """
    async with database.transaction() as conn:
        existing = await fetch_one(conn, queries.runtime_config_request_task, request_id=request_id)
        stored = existing["payload"] if existing is not None else None
        if existing is None:
            row = await fetch_one(conn, queries.runtime_config_by_request, request_id=request_id)
            stored = row["payload"] if row is not None else None
        if stored is None:
            rows = await fetch_all(
                conn,
                queries.task_insert_batch,
                types=[RUNTIME_CONFIG_TASK_TYPE],
                payloads=[db.dumps(payload)],
                priorities=[CONTROL_PRIORITY],
                weights=[1],
                labels=["[]"],
                max_attempts=[UPDATE_TASK_MAX_ATTEMPTS],
                delays=[None],
                run_ats=[None],
                timeouts=[None],
                unique_keys=[_unique_key(request_id)],
                requires=["[]"],
                wake_hint=protocol.CONTROL_HINT,
            )
            if not rows[0]["deduplicated"]:
                return Submitted(request_id, int(rows[0]["id"]), deduplicated=False)
            # A concurrent request with the same id enqueued it first.
            existing = await fetch_one(
                conn, queries.task_get_unfinished_by_unique_key, unique_key=_unique_key(request_id)
            ) or await fetch_one(conn, queries.runtime_config_request_task, request_id=request_id)
            stored = existing["payload"] if existing is not None else None
    # A PATCH's task payload is its changes as sent, comparable with this one; the version it
    # wrote (once its task is pruned) holds the merged config, which is not.
    comparable = check_payload or existing is not None
    if comparable and stored is not None and stored != payload:
        raise ApiError(
            status.HTTP_409_CONFLICT,
            [
                error_item(
                    ("body", "requestID"),
                    f"request id {request_id!r} was already used for a different config; "
                    "use a new requestID (or leave it out) for a new change",
                    "conflict",
                )
            ],
        )
    task_id = int(existing["id"]) if existing is not None else None
    return Submitted(request_id, task_id, deduplicated=True)
