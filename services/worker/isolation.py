"""Running one attempt in a child process (``@task(..., isolation="process")``).

The only honest timeout for CPU-bound or hung Python code: a thread cannot be stopped, a process
can. The child is a fresh interpreter (``python -m taskfleet.worker.isolated_child``) that
imports the handler by its module path, reads the request (payload and context) as JSON on its
stdin, and writes one JSON answer on its stdout; whatever the handler prints goes to stderr, the
worker's log. At the timeout, on a cancel or at shutdown the child is killed, with every process
it started (it runs in a process group of its own); once it has answered it exits at once,
whatever threads the handler left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

from taskfleet.shared.context import TaskContext
from taskfleet.shared.registry import TaskDefinition

CHILD_MODULE = "taskfleet.worker.isolated_child"


class ChildFailed(Exception):
    """The handler raised in the child (the message is its traceback), or the child died."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def request(definition: TaskDefinition, payload: Any, context: TaskContext) -> bytes:
    """The child's stdin: which handler and parameter model, the payload, the context."""
    return json.dumps(
        {
            "handler": [definition.func.__module__, definition.func.__qualname__],
            "params": [definition.params.__module__, definition.params.__qualname__],
            "takes_context": definition.takes_context,
            "payload": payload,
            "sys_path": sys.path,
            "context": {
                "task_id": context.task_id,
                "type": context.type,
                "attempt": context.attempt,
                "max_attempts": context.max_attempts,
                "labels": list(context.labels),
                "worker_id": context.worker_id,
                "deadline": context.deadline.isoformat() if context.deadline else None,
                "time_left": context.time_left(),
            },
        }
    ).encode()


#: The most the worker reads of a child's answer (a result of at most 1 MiB, escaped as
#: ASCII, or a traceback): past it the child is killed, not read into the worker's memory.
MAX_ANSWER_BYTES = 16 << 20


class AnswerTooLarge(Exception):
    pass


async def _exchange(proc: asyncio.subprocess.Process, data: bytes) -> bytes:
    """Send the request, read the answer to EOF (at most :data:`MAX_ANSWER_BYTES`), wait for
    the process to end."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(data)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await proc.stdin.drain()
    proc.stdin.close()
    chunks: list[bytes] = []
    size = 0
    while chunk := await proc.stdout.read(1 << 16):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise AnswerTooLarge
        chunks.append(chunk)
    await proc.wait()
    return b"".join(chunks)


async def run_in_child(
    definition: TaskDefinition, payload: Any, context: TaskContext, timeout: float | None
) -> Any:
    """Run the handler on ``payload`` in a child process; its (JSON) result. Raises
    :class:`ChildFailed`, or ``TimeoutError`` after ``timeout`` seconds (the child killed)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        CHILD_MODULE,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        # Its own process group: a kill reaches whatever it started too.
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout):
            out = await _exchange(proc, request(definition, payload, context))
    except AnswerTooLarge:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.shield(proc.wait())
        raise ChildFailed(
            f"PermanentError: the handler's answer is larger than {MAX_ANSWER_BYTES >> 20} MiB "
            "(a result is at most 1 MiB)",
            permanent=True,
        ) from None
    except BaseException:
        # Timeout, cancel or shutdown: the code stops here, with the process and every
        # process it started (a subprocess of the handler's would go on, orphaned).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.shield(proc.wait())
        raise
    try:
        answer = json.loads(out)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ChildFailed(
            f"the handler's process exited with code {proc.returncode} without an answer "
            "(killed, crashed, or it exited itself)",
            permanent=False,
        )
    if answer.get("ok"):
        return answer.get("result")
    raise ChildFailed(str(answer.get("error")), permanent=bool(answer.get("permanent")))
