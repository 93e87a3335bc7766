"""How the ``taskfleet`` command reports a failure: one line on stderr and an exit code.

2 for configuration (a setting is invalid, or names a role, database or module that does not
exist), 1 for the rest. ``taskfleet -v COMMAND`` prints the traceback as well.
"""

from __future__ import annotations

import errno
import socket
import traceback
from collections.abc import Iterator
from urllib.parse import urlsplit

import asyncpg
import typer

from taskfleet.shared.db import asyncpg_dsn
from taskfleet.shared.errors import ConfigurationError, OperatorError


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors behind it (SQLAlchemy wraps asyncpg's, which it keeps as the
    ``__cause__`` of its adapter's ``orig``)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [getattr(current, "orig", None), current.__cause__, current.__context__]


def _where(url: str) -> str:
    """The server a URL points at, for a message (never the password)."""
    parts = urlsplit(asyncpg_dsn(url))
    host = parts.netloc.rpartition("@")[2] or "localhost"
    for key, _, value in (p.partition("=") for p in parts.query.split("&")):
        if key == "host":  # a unix socket folder
            host = value
    return f"{host}/{parts.path.lstrip('/')}"


def database_error(exc: BaseException, url: str) -> OperatorError | None:
    """The one-line explanation of a failure to reach or use the database at ``url``, or None
    when ``exc`` is not a database failure."""
    where = _where(url)
    for cause in _chain(exc):
        if isinstance(cause, OperatorError):
            return cause
        if isinstance(cause, asyncpg.PostgresError):
            return _server_said(cause, where)
        if isinstance(cause, socket.gaierror):
            return ConfigurationError(
                f"DATABASE_URL: cannot resolve the host of {where} ({cause.strerror}): "
                "fix the host name"
            )
        if isinstance(cause, ConnectionRefusedError) or (
            isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED
        ):
            return OperatorError(
                f"cannot connect to the database at {where}: connection refused. Is Postgres "
                "running and listening there? Check the host and port in DATABASE_URL"
            )
        if isinstance(cause, TimeoutError):
            return OperatorError(
                f"no answer from the database at {where} in time: check that the host in "
                "DATABASE_URL is reachable from here (firewall, VPN) and that Postgres is up"
            )
        if isinstance(cause, OSError) and cause.errno is not None:
            return OperatorError(f"cannot connect to the database at {where}: {cause.strerror}")
    return None


def _server_said(exc: asyncpg.PostgresError, where: str) -> OperatorError:
    code = exc.sqlstate or ""
    said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if code == "28P01":
        return ConfigurationError(
            f"the database at {where} refused the login: {said}: fix the password in DATABASE_URL"
        )
    if code.startswith("28"):
        return ConfigurationError(
            f"the database at {where} refused the login: {said}: create the role, or fix the "
            "user name in DATABASE_URL (or pg_hba.conf, if the role exists)"
        )
    if code == "3D000":
        return ConfigurationError(
            f"{said} (at {where}): create it (createdb, or CREATE DATABASE) or fix the database "
            "name in DATABASE_URL"
        )
    if code == "42501":
        return OperatorError(
            f"the database at {where} refused: {said}. taskfleet migrate creates the schema "
            "taskfleet and its tables: run it as the database owner, or GRANT CREATE ON DATABASE "
            "(and on SCHEMA taskfleet, once it exists) to this role"
        )
    if code == "55000" or code.startswith("57P0"):
        return OperatorError(
            f"the database at {where} is not accepting connections now ({said}): try again "
            "when it is back"
        )
    if code == "53300":
        return OperatorError(
            f"the database at {where} has no connection slot left ({said}): close other "
            "clients or raise max_connections"
        )
    return OperatorError(f"database error at {where}: {said} (SQLSTATE {code})")


def explained(exc: Exception, database_url: str) -> Exception:
    """``exc`` as the :class:`OperatorError` that explains it, when it is a database failure
    (raise the result ``from exc``); else ``exc`` itself."""
    return database_error(exc, database_url) or exc


def report(exc: BaseException, *, verbose: bool) -> int:
    """Print ``exc`` as one line on stderr (after its traceback when ``verbose``); the exit
    code: the :class:`OperatorError`'s own, else 1."""
    if verbose:
        traceback.print_exception(exc)
    if isinstance(exc, OperatorError):
        typer.echo(f"error: {exc.message}", err=True)
        return exc.exit_code
    first_line = (str(exc).splitlines() or [""])[0]
    hint = "" if verbose else " (taskfleet -v shows the traceback)"
    typer.echo(f"error: unexpected {type(exc).__name__}: {first_line}{hint}", err=True)
    return 1
