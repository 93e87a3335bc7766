"""Settings loading for the CLI: a broken setting is a clear one-line error, not a traceback."""

from __future__ import annotations

from typing import Any, TypeVar

import typer
from pydantic import ValidationError

S = TypeVar("S")


def load_settings(cls: type[S], overrides: dict[str, Any]) -> S:
    try:
        return cls(**overrides)
    except ValidationError as exc:
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"]) or "settings"
            env = f"TASKFLEET_{field.upper()}" if error["loc"] else ""
            if field == "database_url":
                env = "DATABASE_URL"
            where = f" ({env})" if env else ""
            typer.echo(f"error: {field}{where}: {error['msg']}", err=True)
        raise typer.Exit(2) from None
