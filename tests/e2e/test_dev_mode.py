"""``taskfleet dev`` survives what a laptop does to it: a stale ``postmaster.pid`` naming a live
unrelated process, a corrupt handle list, more workers than the server has connections for, a
second ``taskfleet dev`` in the same folder. Real processes and the embedded Postgres, on a data
directory of each test's own."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.e2e.cli import clean_env, one_error_line, run_taskfleet, spawn_taskfleet
from tests.e2e.fleet import free_port

pytestmark = pytest.mark.e2e

BANNER = "taskfleet is running."
#: Generous: the first start runs initdb, CI shares two cores.
PATIENCE = 120.0


def free_port_range(count: int) -> int:
    """The first of ``count`` consecutive ports that are free on 127.0.0.1 right now."""
    for _ in range(100):
        first = free_port()
        if first + count > 65000:
            continue
        sockets = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


@dataclass
class DevRun:
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + PATIENCE
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(f"dev exited {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {PATIENCE}s:\n{self.output()}")
            time.sleep(0.2)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(PATIENCE)


@pytest.fixture
def datadir(tmp_path: Path) -> Iterator[Path]:
    """A data directory for this test's embedded Postgres; whatever runs on it at the end is
    stopped."""
    path = tmp_path / "pg"
    yield path
    for process in _postmasters_of(path):
        process.terminate()


def _postmasters_of(datadir: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "postgres" in (process.info["name"] or "") and str(datadir) in cmdline:
            found.append(process)
    return found


def dev_env(datadir: Path, **extra: str) -> dict[str, str]:
    return clean_env(
        TASKFLEET_EMBEDDED_PGDATA=str(datadir),
        TASKFLEET_METRICS_PORT=str(free_port_range(4)),
        TASKFLEET_DRAIN_TIMEOUT="2",
        **extra,
    )


def start_dev(datadir: Path, *args: str, env: dict[str, str] | None = None) -> DevRun:
    log = datadir.parent / f"dev-{time.monotonic_ns()}.log"
    proc = spawn_taskfleet(
        "dev",
        "--port",
        str(free_port()),
        *args,
        env=env or dev_env(datadir),
        cwd=datadir.parent,
        log=log,
    )
    return DevRun(proc, log)


def initialise(datadir: Path, *statements: str) -> list[str]:
    """Create the data directory (initdb), run ``statements``, stop the server cleanly; the
    lines of ``postmaster.pid`` and of the socket lock file it had while running."""
    from taskfleet.shared.embedded import start_embedded

    url, server = start_embedded(datadir, handle_sigterm=False)
    try:
        if statements:
            asyncio.run(_execute(url, statements))
        pid_lines = (datadir / "postmaster.pid").read_text().splitlines()
    finally:
        server.stop()
    assert not _postmasters_of(datadir)
    return pid_lines


async def _execute(url: str, statements: tuple[str, ...]) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def test_a_stale_postmaster_pid_naming_a_live_unrelated_process(datadir: Path) -> None:
    pid_lines = initialise(datadir)
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        # As after a reboot: the files name a pid that another process now has.
        stale = [str(unrelated.pid), *pid_lines[1:]]
        (datadir / "postmaster.pid").write_text("\n".join(stale) + "\n")
        socket_lock = Path(pid_lines[4]) / f".s.PGSQL.{pid_lines[3]}.lock"
        socket_lock.write_text("\n".join(stale[:5]) + "\n")

        for _ in range(2):  # and it keeps starting cleanly, run after run
            run = start_dev(datadir, "--workers", "1")
            run.wait_for(BANNER)
            assert run.stop() == 0, run.output()
            assert unrelated.poll() is None, "dev signalled an unrelated process"
            assert not _postmasters_of(datadir)
    finally:
        unrelated.kill()
        unrelated.wait()


def test_a_corrupt_handle_list_is_repaired_and_leaks_no_server(datadir: Path) -> None:
    initialise(datadir)
    handles = datadir / ".handle_pids.json"
    for corrupt in ("garbage", "[12,", "{}", "5"):
        handles.write_text(corrupt)
        run = start_dev(datadir, "--workers", "0")
        run.wait_for(BANNER)
        assert run.stop() == 0, run.output()
        assert json.loads(handles.read_text()) == []
        assert not _postmasters_of(datadir), f"a server leaked after {corrupt!r}"


def test_the_embedded_server_is_sized_for_the_workers_asked_for(datadir: Path) -> None:
    # A server that allows fewer connections than the API's pool and 3 workers need (10 + 15 + 10).
    initialise(datadir, "ALTER SYSTEM SET max_connections = 20")
    run = start_dev(datadir, "--workers", "3")
    try:
        run.wait_for(BANNER)
        output = run.output()
        assert "max_connections from 20 to 35" in output
        assert all(f"worker {i}" in output.split(BANNER)[1] for i in (1, 2, 3))
        assert "too many clients" not in output
    finally:
        assert run.stop() == 0, run.output()


def test_an_external_database_too_small_for_the_workers_is_refused(
    pg_server_url: str, tmp_path: Path
) -> None:
    env = clean_env(DATABASE_URL=pg_server_url, TASKFLEET_EMBEDDED_PGDATA=str(tmp_path / "pg"))
    result = run_taskfleet("dev", "--workers", "5000", "--port", str(free_port()), env=env)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "--workers 5000 needs up to 25020 database connections" in line
    assert "max_connections" in line
    assert BANNER not in result.stdout


def test_a_second_dev_in_the_same_folder_is_refused(datadir: Path) -> None:
    first = start_dev(datadir, "--workers", "0")
    try:
        first.wait_for(BANNER)
        second = run_taskfleet(
            "dev", "--workers", "0", "--port", str(free_port()), env=dev_env(datadir)
        )
        assert second.returncode == 1
        line = one_error_line(second)
        assert "already running in this folder" in line and f"pid {first.proc.pid}" in line
        assert BANNER not in second.stdout
        assert first.proc.poll() is None  # the first one is untouched
    finally:
        assert first.stop() == 0, first.output()
    assert not _postmasters_of(datadir)


def test_running_is_never_printed_while_a_part_is_not_ready(
    datadir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that never answers on /readyz: no banner, everything stopped, exit 1."""
    from taskfleet.cli import supervisor

    monkeypatch.setattr(supervisor, "READY_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(supervisor, "READY_TIMEOUT_PER_CHILD_SECONDS", 0.0)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    silent = supervisor.Child("worker 1", sleeper, f"http://127.0.0.1:{free_port()}/readyz")
    announced: list[object] = []
    status = supervisor.supervise(
        [silent], clean_env(), 5.0, supervisor.StopRequest(), announced.append
    )
    assert status == 1
    assert announced == []
    assert silent.exited() is not None
