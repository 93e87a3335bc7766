"""The typed HTTP client of the taskfleet API: :class:`Client` (blocking) and
:class:`AsyncClient` (asyncio), with the same methods.

::

    from taskfleet import Client

    with Client("http://127.0.0.1:8000", token="...") as client:
        task = client.submit("demo.echo", {"value": "hello"})
        done = client.wait(task.id, timeout=30)
        print(done.status, done.result)

Errors are exceptions from :mod:`taskfleet.errors`, carrying the API's message and field.
Retries, with exponential backoff and jitter, happen only where a repeat cannot do harm: a
connection that could not be opened (nothing was sent), and, for idempotent calls, any dropped
connection or a 503. Idempotent are every GET, ``change_config`` (it carries a ``requestID``),
and ``submit``/``submit_many`` when every task has a ``unique_key``; ``cancel`` and ``retry``
are not retried.
"""

from __future__ import annotations

import asyncio
import builtins
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self, Unpack

import httpx

from taskfleet import _calls
from taskfleet.config_change import AsyncConfigChange, ConfigChange
from taskfleet.errors import WaitTimeout
from taskfleet.models import (
    RuntimeConfig,
    Schedule,
    ScheduleFields,
    Task,
    TaskFields,
    TaskFilter,
    TaskSpec,
    TaskStats,
    TaskStatus,
    Worker,
)

__all__ = ["AsyncClient", "Client"]

DEFAULT_TIMEOUT = 30.0
USER_AGENT = "taskfleet-python"
#: Seconds an idle connection is kept for reuse: under the API server's keep-alive (5 s).
KEEPALIVE_SECONDS = 2.0


def _headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _check_base_url(base_url: str) -> str:
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url {base_url!r} must be an http:// or https:// URL")
    return base_url


def _status(value: TaskStatus | str | None) -> str | None:
    return None if value is None else TaskStatus(value).value


class Client:
    """A blocking client. ``base_url``: the API, e.g. ``http://127.0.0.1:8000``; ``token``: a
    bearer token (role ``submit`` for tasks, ``admin`` for cancel, retry, workers and config);
    ``timeout``: seconds to wait for an answer (waits and config streams add their own);
    ``retries``: tries after the first, for retryable failures. Use it as a context manager, or
    call :meth:`close`."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = _calls.RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._timeout = _calls.http_timeout(timeout)
        self._retries = _calls.check_retries(retries)
        self._http = httpx.Client(
            base_url=_check_base_url(base_url),
            headers=_headers(token),
            timeout=self._timeout,
            # An idle connection is dropped before the API's keep-alive (uvicorn: 5 s) ends, so
            # a request is never sent on a connection the server is closing.
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS),
            transport=transport,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    # -- sending -------------------------------------------------------------------------------

    def _request(self, call: _calls.Call, *, stream: bool) -> httpx.Response:
        request = _calls.build_request(self._http, call, self._timeout)
        for attempt in range(self._retries + 1):
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if attempt < self._retries and _calls.may_retry_error(call, exc):
                    time.sleep(_calls.retry_delay(attempt))
                    continue
                raise
            if attempt < self._retries and _calls.may_retry_status(call, response.status_code):
                response.close()
                time.sleep(_calls.retry_delay(attempt))
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, call: _calls.Call) -> Any:
        return _calls.decode(self._request(call, stream=False))

    def _open_stream(self, call: _calls.Call) -> httpx.Response:
        response = self._request(call, stream=True)
        if not response.is_success:
            response.read()
            response.close()
            raise _calls.error_for(response)
        return response

    # -- tasks ---------------------------------------------------------------------------------

    def submit(
        self, type: str, payload: Mapping[str, Any] | None = None, **fields: Unpack[TaskFields]
    ) -> Task:
        """Submit one task (``POST /tasks``). ``fields``: ``priority``, ``weight``, ``labels``,
        ``delay_seconds`` or ``run_at``, ``max_attempts``, ``timeout_seconds``, ``unique_key``,
        ``requires`` (worker tags).
        A ``unique_key`` held by an unfinished task returns that task, ``deduplicated``."""
        return Task.model_validate(self._send(_calls.submit(type, payload, fields)))

    def submit_many(self, tasks: Iterable[TaskSpec]) -> builtins.list[Task]:
        """Submit up to 1,000 tasks in one transaction, all or nothing; in the same order."""
        doc = self._send(_calls.submit_many(tasks))
        return [Task.model_validate(t) for t in doc["tasks"]]

    def get(self, id: int) -> Task:
        """Read a task (``NotFound`` if there is none)."""
        return Task.model_validate(self._send(_calls.Call("GET", f"/tasks/{id}", idempotent=True)))

    def wait(self, id: int, timeout: float = 30.0) -> Task:
        """The task once it is finished (completed, failed or cancelled). Raises
        :class:`~taskfleet.errors.WaitTimeout` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            asked = min(max(0.0, deadline - time.monotonic()), _calls.WAIT_CHUNK)
            sent = time.monotonic()
            task = Task.model_validate(self._send(_calls.wait(id, asked)))
            if task.finished:
                return task
            if (pause := _calls.pause_before_asking_again(sent, asked, deadline)) is None:
                raise WaitTimeout(task, timeout)
            time.sleep(pause)

    def cancel(self, id: int) -> Task:
        """Cancel a task: a pending one at once, a running one when its worker next heartbeats.
        ``Conflict`` if it is already finished. Needs the admin role."""
        return Task.model_validate(self._send(_calls.Call("POST", f"/tasks/{id}/cancel")))

    def retry(self, id: int) -> Task:
        """Run a failed or cancelled task again, from attempt 0. ``Conflict`` for any other
        status. Needs the admin role."""
        return Task.model_validate(self._send(_calls.Call("POST", f"/tasks/{id}/retry")))

    def retry_many(self, **task_filter: Unpack[TaskFilter]) -> int:
        """Run every matching failed task (or ``status=["cancelled"]``, ...) again, from attempt
        0 (``POST /tasks/retry``); the number retried. ``task_filter``: ``ids``, ``type``,
        ``labels`` (all of them), ``status``, ``created_before``, ``created_after``, or
        ``all=True``; an empty filter is refused (``InvalidRequest``). Needs the admin role."""
        return int(self._send(_calls.bulk("retry", task_filter))["retried"])

    def cancel_many(self, **task_filter: Unpack[TaskFilter]) -> int:
        """Cancel every matching pending task (``status=["running"]`` flags running ones too)
        (``POST /tasks/cancel``); the number cancelled. The same filter as :meth:`retry_many`.
        Needs the admin role."""
        return int(self._send(_calls.bulk("cancel", task_filter))["cancelled"])

    def stats(self) -> TaskStats:
        """Tasks per status, lane and group, the oldest waits and recent outcomes
        (``GET /tasks/stats``)."""
        call = _calls.Call("GET", "/tasks/stats", idempotent=True)
        return TaskStats.model_validate(self._send(call))

    def list(
        self,
        *,
        status: TaskStatus | str | None = None,
        type: str | None = None,
        label: str | None = None,
        worker: str | None = None,
        page_size: int = 100,
    ) -> Iterator[Task]:
        """Every task matching the filters, newest first, fetched a page at a time.
        ``worker``: the id of the worker that ran the task's last attempt."""
        cursor: str | None = None
        while True:
            call = _calls.list_page(_status(status), type, label, page_size, cursor, worker)
            doc = self._send(call)
            for item in doc["tasks"]:
                yield Task.model_validate(item)
            cursor = doc.get("next_cursor")
            if cursor is None:
                return

    # -- schedules -----------------------------------------------------------------------------

    def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name, with ``next_run_at`` and ``last_run_at`` (a page at a
        time)."""
        found: builtins.list[Schedule] = []
        after: str | None = None
        while True:
            after = _calls.add_schedule_page(found, self._send(_calls.list_schedules(after)))
            if after is None:
                return found

    def schedule(self, name: str) -> Schedule:
        """One schedule (``NotFound`` if there is none)."""
        return Schedule.model_validate(self._send(_calls.get_schedule(name)))

    def set_schedule(
        self,
        name: str,
        type: str,
        payload: Mapping[str, Any] | None = None,
        **fields: Unpack[ScheduleFields],
    ) -> Schedule:
        """Create or replace a schedule (``PUT /schedules/{name}``): ``cron`` (with
        ``timezone``) or ``every``, and the task fields ``priority``, ``weight``, ``labels``,
        ``max_attempts``, ``timeout_seconds``. Needs the admin role."""
        return Schedule.model_validate(self._send(_calls.set_schedule(name, type, payload, fields)))

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule (``NotFound`` if there is none). Needs the admin role."""
        self._send(_calls.delete_schedule(name))

    # -- fleet and config ----------------------------------------------------------------------

    def workers(self) -> builtins.list[Worker]:
        """Every registered worker, with ``alive`` computed. Needs the admin role."""
        doc = self._send(_calls.Call("GET", "/workers", idempotent=True))
        return [Worker.model_validate(w) for w in doc["workers"]]

    def config(self) -> RuntimeConfig:
        """The latest runtime config and each alive worker's applied version."""
        return RuntimeConfig.model_validate(
            self._send(_calls.Call("GET", "/runtime-config", idempotent=True))
        )

    def change_config(
        self,
        *,
        patch: bool = False,
        timeout: float = 60.0,
        request_id: str | None = None,
        **fields: Any,
    ) -> ConfigChange:
        """Change the runtime config and follow it: iterate the result for the events
        (``enqueued``, ``version``, ``progress``, then the outcome), or call ``.result()``.

        ``fields``: ``max_strict_percentage``, ``default_weight``, ``label_weights`` (or
        ``labels`` with ``weights``), ``notify_interval``, ``listen_timeout``,
        ``paused_labels``, ``paused_types``, ``paused_lanes``, ``label_limits`` (label ->
        ``{"maxInFlight": n, "ratePerSecond": r}``). ``patch=False``
        replaces the config (omitted fields take their defaults); ``patch=True`` changes only
        the given fields. ``timeout``: seconds the server follows the fleet before answering
        ``timeout``. The request is sent before this returns.
        """
        request_id = request_id or str(uuid.uuid4())
        call = _calls.change_config(_calls.config_body(fields, request_id), patch, timeout)
        return ConfigChange(self, call, request_id, timeout)


class AsyncClient:
    """The asyncio twin of :class:`Client`: the same methods, awaited (``list`` is an async
    iterator; ``change_config`` returns an :class:`~taskfleet.config_change.AsyncConfigChange`
    to ``async for`` over). Use it with ``async with``, or call :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = _calls.RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeout = _calls.http_timeout(timeout)
        self._retries = _calls.check_retries(retries)
        self._http = httpx.AsyncClient(
            base_url=_check_base_url(base_url),
            headers=_headers(token),
            timeout=self._timeout,
            # An idle connection is dropped before the API's keep-alive (uvicorn: 5 s) ends, so
            # a request is never sent on a connection the server is closing.
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS),
            transport=transport,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _request(self, call: _calls.Call, *, stream: bool) -> httpx.Response:
        request = _calls.build_request(self._http, call, self._timeout)
        for attempt in range(self._retries + 1):
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if attempt < self._retries and _calls.may_retry_error(call, exc):
                    await asyncio.sleep(_calls.retry_delay(attempt))
                    continue
                raise
            if attempt < self._retries and _calls.may_retry_status(call, response.status_code):
                await response.aclose()
                await asyncio.sleep(_calls.retry_delay(attempt))
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(self, call: _calls.Call) -> Any:
        return _calls.decode(await self._request(call, stream=False))

    async def _open_stream(self, call: _calls.Call) -> httpx.Response:
        response = await self._request(call, stream=True)
        if not response.is_success:
            await response.aread()
            await response.aclose()
            raise _calls.error_for(response)
        return response

    async def submit(
        self, type: str, payload: Mapping[str, Any] | None = None, **fields: Unpack[TaskFields]
    ) -> Task:
        """See :meth:`Client.submit`."""
        return Task.model_validate(await self._send(_calls.submit(type, payload, fields)))

    async def submit_many(self, tasks: Iterable[TaskSpec]) -> builtins.list[Task]:
        """See :meth:`Client.submit_many`."""
        doc = await self._send(_calls.submit_many(tasks))
        return [Task.model_validate(t) for t in doc["tasks"]]

    async def get(self, id: int) -> Task:
        """See :meth:`Client.get`."""
        call = _calls.Call("GET", f"/tasks/{id}", idempotent=True)
        return Task.model_validate(await self._send(call))

    async def wait(self, id: int, timeout: float = 30.0) -> Task:
        """See :meth:`Client.wait`."""
        deadline = time.monotonic() + timeout
        while True:
            asked = min(max(0.0, deadline - time.monotonic()), _calls.WAIT_CHUNK)
            sent = time.monotonic()
            task = Task.model_validate(await self._send(_calls.wait(id, asked)))
            if task.finished:
                return task
            if (pause := _calls.pause_before_asking_again(sent, asked, deadline)) is None:
                raise WaitTimeout(task, timeout)
            await asyncio.sleep(pause)

    async def cancel(self, id: int) -> Task:
        """See :meth:`Client.cancel`."""
        return Task.model_validate(await self._send(_calls.Call("POST", f"/tasks/{id}/cancel")))

    async def retry(self, id: int) -> Task:
        """See :meth:`Client.retry`."""
        return Task.model_validate(await self._send(_calls.Call("POST", f"/tasks/{id}/retry")))

    async def retry_many(self, **task_filter: Unpack[TaskFilter]) -> int:
        """See :meth:`Client.retry_many`."""
        return int((await self._send(_calls.bulk("retry", task_filter)))["retried"])

    async def cancel_many(self, **task_filter: Unpack[TaskFilter]) -> int:
        """See :meth:`Client.cancel_many`."""
        return int((await self._send(_calls.bulk("cancel", task_filter)))["cancelled"])

    async def stats(self) -> TaskStats:
        """See :meth:`Client.stats`."""
        call = _calls.Call("GET", "/tasks/stats", idempotent=True)
        return TaskStats.model_validate(await self._send(call))

    async def list(
        self,
        *,
        status: TaskStatus | str | None = None,
        type: str | None = None,
        label: str | None = None,
        worker: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Task]:
        """See :meth:`Client.list` (an async iterator)."""
        cursor: str | None = None
        while True:
            call = _calls.list_page(_status(status), type, label, page_size, cursor, worker)
            doc = await self._send(call)
            for item in doc["tasks"]:
                yield Task.model_validate(item)
            cursor = doc.get("next_cursor")
            if cursor is None:
                return

    async def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name, with ``next_run_at`` and ``last_run_at`` (a page at a
        time)."""
        found: builtins.list[Schedule] = []
        after: str | None = None
        while True:
            doc = await self._send(_calls.list_schedules(after))
            after = _calls.add_schedule_page(found, doc)
            if after is None:
                return found

    async def schedule(self, name: str) -> Schedule:
        """One schedule (``NotFound`` if there is none)."""
        return Schedule.model_validate(await self._send(_calls.get_schedule(name)))

    async def set_schedule(
        self,
        name: str,
        type: str,
        payload: Mapping[str, Any] | None = None,
        **fields: Unpack[ScheduleFields],
    ) -> Schedule:
        """Create or replace a schedule (see :meth:`Client.set_schedule`)."""
        return Schedule.model_validate(
            await self._send(_calls.set_schedule(name, type, payload, fields))
        )

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule (``NotFound`` if there is none). Needs the admin role."""
        await self._send(_calls.delete_schedule(name))

    async def workers(self) -> builtins.list[Worker]:
        """See :meth:`Client.workers`."""
        doc = await self._send(_calls.Call("GET", "/workers", idempotent=True))
        return [Worker.model_validate(w) for w in doc["workers"]]

    async def config(self) -> RuntimeConfig:
        """See :meth:`Client.config`."""
        doc = await self._send(_calls.Call("GET", "/runtime-config", idempotent=True))
        return RuntimeConfig.model_validate(doc)

    async def change_config(
        self,
        *,
        patch: bool = False,
        timeout: float = 60.0,
        request_id: str | None = None,
        **fields: Any,
    ) -> AsyncConfigChange:
        """See :meth:`Client.change_config`: ``async for`` the events, or ``await result()``."""
        request_id = request_id or str(uuid.uuid4())
        call = _calls.change_config(_calls.config_body(fields, request_id), patch, timeout)
        return await AsyncConfigChange(self, call, request_id, timeout)._start()
