"""Helpers for your own test suite.

Run a handler inline, as a worker would run it (payload validated against its model, a sync
handler in a thread, the timeout applied, the result stored as JSON)::

    from taskfleet.testing import run_task

    def test_send_email():
        assert run_task("email.send", {"to": "a@example.com", "subject": "hi"}) == {"sent": True}

Test against a real, disposable Postgres database (migrated, dropped afterwards), for the code
that enqueues in a transaction or talks to a running API::

    from taskfleet.testing import disposable_database

    with disposable_database("postgresql://postgres@127.0.0.1:5432/postgres") as url:
        ...

For many tests, :class:`TemplateDatabases` migrates one template once and clones it per test
(``CREATE DATABASE ... TEMPLATE``: milliseconds, not a migration per test); docs/python.md has a
pytest fixture built on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from taskfleet.errors import InvalidRequest
from taskfleet.shared.context import make_context
from taskfleet.shared.registry import TaskRegistry, load_registry
from taskfleet.shared.storable import encode_result
from taskfleet.shared.submission import pydantic_errors

__all__ = [
    "TemplateDatabases",
    "disposable_database",
    "run_task",
    "run_task_async",
    "with_database",
]


# --------------------------------------------------------------------------------------------
# Running a handler inline.


async def run_task_async(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    timeout: float | None = None,
    registry: TaskRegistry | None = None,
    task_id: int = 1,
    attempt: int = 1,
    max_attempts: int = 3,
    labels: Sequence[str] = (),
    worker_id: str = "taskfleet-testing",
) -> Any:
    """Run the handler of ``type`` on ``payload`` in this event loop and return its result as
    it would be stored (JSON, decoded again).

    A handler that takes a second argument gets a real :class:`~taskfleet.TaskContext` built
    from ``task_id``, ``attempt``, ``max_attempts``, ``labels``, ``worker_id`` and ``timeout``
    (its deadline); the timeout also sets its cancellation signal, as a worker's does.

    Raises :class:`~taskfleet.errors.InvalidRequest` for a payload the API would refuse,
    ``LookupError`` for a type with no handler, ``TimeoutError`` past ``timeout`` seconds,
    :class:`~taskfleet.shared.storable.UnstorableResult` for a result a worker could not store
    (not JSON, NaN, NUL or a lone surrogate, over 1 MiB: the task would fail), and whatever the
    handler raises (``PermanentError`` included). ``registry``: default, the handlers this
    process has registered (import your tasks module first) and the demo ones.
    """
    handlers = registry if registry is not None else load_registry(())
    definition = handlers.get(type)
    if definition is None or definition.internal:
        raise LookupError(f"no handler registered for task type {type!r}; import its module")
    try:
        params = definition.validate(dict(payload or {}))
    except ValidationError as exc:
        errors = pydantic_errors(exc.errors(), ("payload",))
        raise InvalidRequest(422, errors[0]["msg"], field="payload", errors=errors) from None
    context = make_context(
        task_id=task_id,
        type=type,
        attempt=attempt,
        max_attempts=max_attempts,
        labels=labels,
        worker_id=worker_id,
        timeout=timeout,
        now=datetime.now(UTC),
    )
    args = (params, context) if definition.takes_context else (params,)

    async def call() -> Any:
        if definition.is_async:
            return await definition.func(*args)
        return await asyncio.to_thread(definition.func, *args)

    if timeout is None:
        result = await call()
    else:
        try:
            async with asyncio.timeout(timeout):
                result = await call()
        except TimeoutError:
            context.cancellation.set("timeout")
            raise
    return json.loads(encode_result(result))


def run_task(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    timeout: float | None = None,
    registry: TaskRegistry | None = None,
    task_id: int = 1,
    attempt: int = 1,
    max_attempts: int = 3,
    labels: Sequence[str] = (),
    worker_id: str = "taskfleet-testing",
) -> Any:
    """:func:`run_task_async` for code that is not in an event loop (a plain test function)."""
    return asyncio.run(
        run_task_async(
            type,
            payload,
            timeout=timeout,
            registry=registry,
            task_id=task_id,
            attempt=attempt,
            max_attempts=max_attempts,
            labels=labels,
            worker_id=worker_id,
        )
    )


# --------------------------------------------------------------------------------------------
# Disposable databases.


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at database ``name`` (keeps ``?host=`` for unix sockets)."""
    from taskfleet.shared.db import asyncpg_dsn

    parts = urlsplit(asyncpg_dsn(url))
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _admin(url: str, *statements: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(with_database(url, "postgres"))
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


class TemplateDatabases:
    """One migrated template database, cloned into a fresh database per test.

    ``server_url``: any database URL on the server (its ``postgres`` database is used for
    administration; the role must be allowed to create databases). Call :meth:`setup` once,
    :meth:`create` per test (a URL), :meth:`drop` after it, :meth:`teardown` at the end.
    """

    def __init__(self, server_url: str, *, prefix: str = "tf") -> None:
        self.server_url = server_url
        self.prefix = prefix
        self.template = f"{prefix}_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._created: list[str] = []

    def setup(self) -> None:
        """Create the template and apply every migration to it."""
        from taskfleet.shared import migrations

        _admin(self.server_url, f'CREATE DATABASE "{self.template}"')
        migrations.upgrade(with_database(self.server_url, self.template))
        # No connection may stay on a template while it is cloned.
        _admin(
            self.server_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{self.template}' AND pid <> pg_backend_pid()",
        )

    def create(self) -> str:
        """A fresh, migrated database of its own; its URL."""
        name = f"{self.prefix}_t_{uuid.uuid4().hex[:12]}"
        _admin(self.server_url, f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self._created.append(name)
        return with_database(self.server_url, name)

    def drop(self, url: str) -> None:
        """Drop a database :meth:`create` made (connections to it are closed)."""
        name = urlsplit(url).path.lstrip("/")
        _admin(self.server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._created:
            self._created.remove(name)

    def teardown(self) -> None:
        """Drop what is left, the template last."""
        statements = [f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in self._created]
        statements.append(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        _admin(self.server_url, *statements)
        self._created.clear()


@contextmanager
def disposable_database(server_url: str) -> Iterator[str]:
    """A fresh database with the taskfleet schema migrated, dropped when the block ends."""
    databases = TemplateDatabases(server_url)
    databases.setup()
    try:
        yield databases.create()
    finally:
        databases.teardown()
