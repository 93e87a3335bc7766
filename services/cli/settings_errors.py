"""Settings loading for the CLI: a broken setting is one line naming it, not a traceback."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from taskfleet.shared.errors import ConfigurationError

S = TypeVar("S")

#: Settings whose value is never repeated back (a URL holds a password; tokens are secrets).
_SECRET_FIELDS = frozenset({"database_url", "listen_database_url", "api_tokens"})


def setting_name(field: str, overrides: dict[str, Any]) -> str:
    """What the user set: the command-line option when one was given, else the variable."""
    if field in overrides:
        return f"--{field.replace('_', '-')}"
    if field in ("database_url", "TASKFLEET_DATABASE_URL", "DATABASE_URL"):
        return "DATABASE_URL"
    return field.upper() if field.startswith("TASKFLEET_") else f"TASKFLEET_{field.upper()}"


def _describe(error: ErrorDetails, overrides: dict[str, Any]) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:  # a rule between several settings: the message names them
        return message
    field = str(error["loc"][0])
    name = setting_name(field, overrides)
    if error["type"] == "missing":
        if name == "DATABASE_URL":
            return (
                "DATABASE_URL is not set: set it to the database's URL, e.g. "
                "postgresql://user:password@localhost:5432/taskfleet"
            )
        return f"{name} is not set"
    shown = ""
    secret = field.lower().removeprefix("taskfleet_") in _SECRET_FIELDS
    if not secret and isinstance(error.get("input"), str | int | float):
        shown = f" (got {error['input']!r})"
    return f"{name}: {message}{shown}"


def load_settings(cls: type[S], overrides: dict[str, Any]) -> S:
    """``cls(**overrides)``, or :class:`ConfigurationError` naming every setting that is wrong."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        problems = [_describe(error, overrides) for error in exc.errors()]
        raise ConfigurationError("; ".join(dict.fromkeys(problems))) from None
