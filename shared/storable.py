"""What Postgres can store: one home for the rules on text and JSON values.

Postgres ``text`` cannot hold NUL, and ``jsonb`` refuses the escape ``\\u0000``; neither can
hold a lone UTF-16 surrogate (it has no UTF-8 encoding). The API refuses such input with a 422
naming the field; the worker makes what a handler returns or raises storable before it is
queued, so no outcome can ever be refused by the database. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import to_jsonable_python

NUL = "\x00"
#: The largest result a task may store (its JSON text, UTF-8).
MAX_RESULT_BYTES = 1 << 20


def text_problem(value: str) -> str | None:
    """What in ``value`` Postgres text cannot hold (``"a NUL character (\\u0000)"`` or
    ``"an unpaired surrogate"``), or None when it can be stored. Callers phrase the rule:
    ``f"must not contain {problem}"``."""
    if NUL in value:
        return "a NUL character (\\u0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "an unpaired surrogate"
    return None


def escape_text(value: str) -> str:
    """``value`` with every NUL written as ``\\x00`` and every lone surrogate as ``\\udXXX``:
    storable, and still readable."""
    if NUL in value:
        value = value.replace(NUL, "\\x00")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def cap_text(value: str, limit: int, *, head: int = 1000) -> str:
    """At most about ``limit`` characters: the first ``head`` and the last ones, with a note
    saying how much was cut between them."""
    if len(value) <= limit:
        return value
    tail = max(0, limit - head)
    cut = len(value) - head - tail
    return f"{value[:head]}\n[... {cut} characters cut ...]\n{value[len(value) - tail :]}"


def _path(parent: str, key: object) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    text = str(key)
    if text.isidentifier():
        return f"{parent}.{text}"
    return f"{parent}[{escape_text(json.dumps(text, ensure_ascii=False))}]"


def json_problem(value: Any, path: str = "$") -> str | None:
    """The first place in a JSON-able ``value`` (dicts, lists, strings, numbers) holding what
    Postgres cannot store, as ``"$.a[0] contains ..."``, or None. Iterative: depth costs no
    stack."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"{where} contains {problem}"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and (problem := text_problem(key)) is not None:
                    return f"the key {_path(where, key)} contains {problem}"
                stack.append((child, _path(where, key)))
        elif isinstance(item, list | tuple):
            stack.extend((child, _path(where, i)) for i, child in reversed(list(enumerate(item))))
    return None


class UnstorableResult(Exception):
    """A handler's result that cannot be stored; the message says why, for ``last_error``."""


#: One encoder for every result: ``json.dumps`` with options other than its defaults builds a
#: new encoder on every call, half the cost of encoding a small result (a worker encodes one per
#: task). An encoder keeps no state between calls.
_RESULT_ENCODER = json.JSONEncoder(
    default=to_jsonable_python,
    separators=(",", ":"),
    ensure_ascii=False,
    allow_nan=False,
)


def encode_result(result: Any) -> str:
    """The JSON text to store for a handler's result; :class:`UnstorableResult` when Postgres
    could not store it (not JSON, NaN or Infinity, NUL or a lone surrogate, over 1 MiB).

    Such a result fails its attempt for good, with the reason: the handler would return the same
    again, and a stored result that differs from what the handler returned would be worse."""
    if result is None:
        return "null"  # most handlers return nothing: no encoder, no checks
    try:
        encoded = _RESULT_ENCODER.encode(result)
    except (TypeError, ValueError) as exc:
        raise UnstorableResult(f"result is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise UnstorableResult("result is nested too deeply to encode as JSON") from None
    try:
        size = len(encoded.encode("utf-8"))
        suspect = "\\u0000" in encoded  # jsonb refuses the escaped NUL
    except UnicodeEncodeError:
        size, suspect = len(encoded), True
    if suspect and (problem := json_problem(json.loads(encoded))) is not None:
        raise UnstorableResult(
            f"result cannot be stored: {problem}, which Postgres cannot store"
        ) from None
    if size > MAX_RESULT_BYTES:
        raise UnstorableResult("result is larger than 1 MiB")
    return encoded
