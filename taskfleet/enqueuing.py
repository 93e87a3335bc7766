"""Enqueue tasks inside your own database transaction.

The task exists if and only if your transaction commits: the insert and its wake-up NOTIFY are
part of it, so a rollback leaves nothing and a commit wakes a listening worker at once (the same
pickup as an HTTP submission). ::

    async with pool.acquire() as conn, conn.transaction():          # asyncpg
        await conn.execute("INSERT INTO orders ...")
        await taskfleet.enqueue(conn, "email.send", {"to": "a@example.com"})

Accepted connections: :func:`enqueue` and :func:`enqueue_many` take an asyncpg ``Connection``
(or a pool's connection) and SQLAlchemy's ``AsyncConnection`` and ``AsyncSession``;
:func:`enqueue_sync` and :func:`enqueue_many_sync` take SQLAlchemy's ``Connection`` and
``Session`` (psycopg, or any Postgres driver SQLAlchemy supports).

Every rule ``POST /tasks`` applies is applied here, by the same code, and the row is written by
the same statement; a broken rule raises the exception the API's answer would
(:class:`~taskfleet.errors.InvalidRequest`, :class:`~taskfleet.errors.PayloadTooLarge`) and
writes nothing. The payload is validated against the handler's model when the handler is
registered in this process (its module imported); a type with no handler here is stored as
given, and a worker that has no handler for it fails it.

Nothing here counts in ``taskfleet_tasks_submitted_total`` (the API's counter): whether the
task exists is decided by the caller's commit, which no taskfleet process sees.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

from pydantic import ValidationError

from taskfleet.errors import ApiError, Conflict, error_from_detail
from taskfleet.models import Task, TaskFields, TaskSpec
from taskfleet.shared import queries as q
from taskfleet.shared.registry import TaskRegistry, load_registry
from taskfleet.shared.submission import (
    MAX_BATCH,
    Loc,
    Rejected,
    Row,
    Submission,
    TaskIn,
    UniqueKeyContention,
    check_submission,
    pydantic_errors,
    run_insert,
    run_insert_sync,
    task_out,
)

__all__ = ["enqueue", "enqueue_many", "enqueue_many_sync", "enqueue_sync"]


def _registry() -> TaskRegistry:
    # The handlers this process has registered so far (and the demo ones); read at each call,
    # since an application may import its task modules after importing taskfleet.
    return load_registry(())


def _submission(spec: Mapping[str, Any], registry: TaskRegistry, loc: Loc) -> Submission:
    body = {k: v for k, v in spec.items() if v is not None}
    try:
        task = TaskIn.model_validate(body)
    except ValidationError as exc:
        raise _error(Rejected(422, pydantic_errors(exc.errors(), loc))) from None
    try:
        return check_submission(task, registry, loc, require_registered=False)
    except Rejected as exc:
        raise _error(exc) from None


def _error(rejected: Rejected) -> ApiError:
    return error_from_detail(rejected.status_code, rejected.errors)


def _submissions(specs: Iterable[Mapping[str, Any]]) -> builtins.list[Submission]:
    registry = _registry()
    items = builtins.list(specs)
    if not 1 <= len(items) <= MAX_BATCH:
        raise _error(
            Rejected(
                422,
                [
                    {
                        "loc": ["tasks"],
                        "msg": f"give 1 to {MAX_BATCH} tasks; got {len(items)}",
                        "type": "too_long" if items else "too_short",
                    }
                ],
            )
        )
    return [_submission(spec, registry, ("tasks", i)) for i, spec in enumerate(items)]


def _one(type: str, payload: Mapping[str, Any] | None, fields: TaskFields) -> Submission:
    spec: dict[str, Any] = {"type": type, "payload": dict(payload or {}), **fields}
    return _submission(spec, _registry(), ())


def _task(row: Row, deduplicated: bool) -> Task:
    wire = task_out(row)
    # asyncpg without a jsonb codec returns jsonb as its text; unfinished tasks' result is NULL.
    if isinstance(wire["result"], str):
        wire["result"] = json.loads(wire["result"])
    return Task.model_validate({**wire, "deduplicated": deduplicated})


def _tasks(inserted: Sequence[tuple[Row, bool]]) -> builtins.list[Task]:
    return [_task(row, dedup) for row, dedup in inserted]


# --------------------------------------------------------------------------------------------
# Drivers: each runs a named query on the caller's connection, inside the caller's transaction.


async def _insert_async(conn: Any, submissions: Sequence[Submission]) -> builtins.list[Task]:
    fetch = _async_fetcher(conn)
    try:
        return _tasks(await run_insert(fetch, submissions))
    except UniqueKeyContention as exc:
        raise Conflict(409, exc.message) from None


def _async_fetcher(conn: Any) -> Any:
    module = type(conn).__module__
    if module.startswith("asyncpg"):

        async def fetch_asyncpg(query: q.Query, params: dict[str, Any]) -> list[Row]:
            sql, args = query.positional(params)
            return [dict(r) for r in await conn.fetch(sql, *args)]

        return fetch_asyncpg

    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(conn, AsyncConnection | AsyncSession):

        async def fetch_sqlalchemy(query: q.Query, params: dict[str, Any]) -> list[Row]:
            result = await conn.execute(_statement(query), params)
            return [dict(r) for r in result.mappings()]

        return fetch_sqlalchemy
    raise TypeError(
        "enqueue takes an asyncpg Connection or a SQLAlchemy AsyncConnection or AsyncSession, "
        f"not {type(conn).__name__}; for a SQLAlchemy Connection or Session use enqueue_sync"
    )


def _sync_fetcher(conn: Any) -> Any:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if not isinstance(conn, Connection | Session):
        raise TypeError(
            "enqueue_sync takes a SQLAlchemy Connection or Session, not "
            f"{type(conn).__name__}; for asyncpg or SQLAlchemy's async API use enqueue"
        )

    def fetch(query: q.Query, params: dict[str, Any]) -> list[Row]:
        result = conn.execute(_statement(query), params)
        return [dict(r) for r in result.mappings()]

    return fetch


def _statement(query: q.Query) -> Any:
    from sqlalchemy import text

    return text(query.sql)


# --------------------------------------------------------------------------------------------
# The public functions.


async def enqueue(
    conn: Any, type: str, payload: Mapping[str, Any] | None = None, **fields: Unpack[TaskFields]
) -> Task:
    """Insert one task in ``conn``'s current transaction and return it.

    ``conn``: an asyncpg ``Connection`` or a SQLAlchemy ``AsyncConnection``/``AsyncSession``.
    ``fields``: ``priority``, ``weight``, ``labels``, ``delay_seconds`` or ``run_at``,
    ``max_attempts``, ``timeout_seconds``, ``unique_key``, ``requires`` (as ``POST /tasks`` takes
    them). A ``unique_key`` held by an unfinished task returns that task with ``deduplicated=True``.
    Raises :class:`~taskfleet.errors.InvalidRequest` or ``PayloadTooLarge`` (nothing written).
    """
    submission = _one(type, payload, fields)
    return (await _insert_async(conn, [submission]))[0]


async def enqueue_many(conn: Any, tasks: Iterable[TaskSpec]) -> builtins.list[Task]:
    """Insert 1 to 1,000 tasks (``{"type", "payload", ...fields}`` each) in one statement, in
    ``conn``'s transaction; the tasks in the same order. One bad task raises (its field is
    ``tasks.<index>....``) and none is written."""
    return await _insert_async(conn, _submissions(tasks))


def enqueue_sync(
    conn: Any, type: str, payload: Mapping[str, Any] | None = None, **fields: Unpack[TaskFields]
) -> Task:
    """:func:`enqueue` for a SQLAlchemy ``Connection`` or ``Session`` (blocking)."""
    submission = _one(type, payload, fields)
    return _insert_sync(conn, [submission])[0]


def enqueue_many_sync(conn: Any, tasks: Iterable[TaskSpec]) -> builtins.list[Task]:
    """:func:`enqueue_many` for a SQLAlchemy ``Connection`` or ``Session`` (blocking)."""
    return _insert_sync(conn, _submissions(tasks))


def _insert_sync(conn: Any, submissions: Sequence[Submission]) -> builtins.list[Task]:
    fetch = _sync_fetcher(conn)
    try:
        return _tasks(run_insert_sync(fetch, submissions))
    except UniqueKeyContention as exc:
        raise Conflict(409, exc.message) from None
