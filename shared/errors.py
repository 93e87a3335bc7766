"""Failures an operator fixes, reported by the ``taskfleet`` command as one line, no traceback.

The message names the setting or the cause and what to do. ``exit_code`` is 2 for configuration
(a setting is invalid or names something that does not exist) and 1 for the rest (the database
refuses, a port is taken, the schema is newer than the code). ``taskfleet -v`` shows the
traceback of the underlying error.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Something outside the code stops the command: one line saying what and what to do."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigurationError(OperatorError):
    """A setting is invalid, or names something that does not exist."""

    exit_code = 2


def bind_error(
    exc: OSError, host: str, port: int, *, host_setting: str, port_setting: str
) -> Exception:
    """The one-line explanation of a failure to listen on ``host:port`` (raise it ``from exc``),
    naming the settings that chose them; ``exc`` itself when it is something else."""
    import errno
    import socket

    not_here = (
        f"{host_setting}: {host!r} is not an address of this machine ({exc.strerror}): use an IP "
        "address such as 0.0.0.0 (every interface) or 127.0.0.1"
    )
    if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return ConfigurationError(not_here)
    if exc.errno == errno.EADDRINUSE:
        return OperatorError(
            f"cannot listen on {host}:{port}: the port is in use by another process; stop it, "
            f"or choose another port with {port_setting}"
        )
    if exc.errno == errno.EACCES:
        return OperatorError(
            f"cannot listen on {host}:{port}: permission denied (ports below 1024 need "
            f"privileges); choose another port with {port_setting}"
        )
    return exc


def error_text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder naming its type when its ``__str__`` raises (a handler's
    own exception class can do anything)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"


def first_line(exc: BaseException) -> str:
    """An error's first line (a log line stays one line), or its type when it has no text."""
    text = error_text(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
