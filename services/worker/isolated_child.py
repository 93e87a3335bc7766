"""The child side of ``isolation="process"``: ``python -m taskfleet.worker.isolated_child``.

Reads one request (JSON) on stdin, runs the handler once, writes one answer (JSON) on the real
stdout; the handler's own prints go to stderr. See ``isolation.py``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
import time
import traceback
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_jsonable_python


def _answer(fd: int, document: dict[str, Any]) -> None:
    # ensure_ascii: a lone surrogate in a result crosses the pipe escaped; the worker checks it.
    data = json.dumps(document, default=to_jsonable_python, allow_nan=False).encode()
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _failure(exc: BaseException, *, permanent: bool) -> dict[str, Any]:
    return {
        "ok": False,
        "permanent": permanent,
        "error": "".join(traceback.format_exception(exc)),
    }


def main() -> None:
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # the handler's prints go to the worker's log, not into the answer
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.buffer.read())
    for entry in reversed(request["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)

    from taskfleet.shared.context import TaskContext
    from taskfleet.shared.registry import PermanentError

    try:
        func = _resolve(*request["handler"])
        model = _resolve(*request["params"])
        params = model.model_validate(request["payload"])
    except ValidationError as exc:
        # The payload its model refuses: it would be refused again. (A ValidationError the
        # handler raises itself is an error like any other, retried: below.)
        _answer(answer_fd, _failure(exc, permanent=True))
        return
    except Exception as exc:  # the handler or its model could not be imported, say
        _answer(answer_fd, _failure(exc, permanent=False))
        return
    try:
        fields = request["context"]
        left = fields.pop("time_left")
        deadline = fields.pop("deadline")
        context = TaskContext(
            **fields,
            deadline=datetime.fromisoformat(deadline) if deadline else None,
            _deadline_monotonic=time.monotonic() + left if left is not None else None,
        )
        args = (params, context) if request["takes_context"] else (params,)
        outcome = func(*args)
        result = asyncio.run(outcome) if inspect.iscoroutine(outcome) else outcome
    except PermanentError as exc:
        _answer(answer_fd, _failure(exc, permanent=True))
        return
    except BaseException as exc:  # sys.exit() in the handler fails the attempt too
        _answer(answer_fd, _failure(exc, permanent=False))
        return
    try:
        _answer(answer_fd, {"ok": True, "result": result})
    except (TypeError, ValueError) as exc:
        message = f"PermanentError: result is not JSON-serialisable: {exc}"
        _answer(answer_fd, {"ok": False, "permanent": True, "error": message})


def _resolve(module: str, qualname: str) -> Any:
    """An object by its module path (the handler, its parameter model)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


if __name__ == "__main__":
    main()
    # The answer is written: end now, whatever threads the handler left behind (the interpreter
    # would wait for a non-daemon one, and the worker for the process, past the timeout).
    sys.stderr.flush()
    os._exit(0)
