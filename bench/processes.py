"""Worker and API processes started by the benchmarks: start, wait for a line, stop by pid."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: Bound on a process starting up or shutting down; two shared cores can be slow.
PATIENCE = 60.0

#: The checkout: children import ``bench`` (not an installed package) from here, whatever the cwd.
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Process:
    """One child process; stderr goes to a log file shown when something fails."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    _drain: asyncio.Task[None] | None = field(default=None, repr=False)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def wait_for_line(self, expected: str, timeout: float = PATIENCE) -> None:
        """Read stdout until ``expected`` appears; then keep draining stdout in the background."""
        assert self.proc.stdout is not None

        async def read() -> None:
            assert self.proc.stdout is not None
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(
                        f"{self.name} exited before {expected!r}:\n{self.log_tail()}"
                    )
                if line.decode(errors="replace").strip() == expected:
                    return

        try:
            await asyncio.wait_for(read(), timeout)
        except TimeoutError as exc:
            tail = self.log_tail()
            raise RuntimeError(f"{self.name}: no {expected!r} in {timeout:g}s:\n{tail}") from exc
        self.discard_output()

    def discard_output(self) -> None:
        """Keep reading stdout (and dropping it), so a chatty child never blocks on the pipe."""
        if self._drain is None:
            self._drain = asyncio.create_task(self._discard_stdout())

    async def _discard_stdout(self) -> None:
        assert self.proc.stdout is not None
        while await self.proc.stdout.read(65536):
            pass

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


async def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
    fd, log_name = tempfile.mkstemp(prefix=f"tfbench-{name}-", suffix=".log")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=fd,
            env={**os.environ, "PYTHONPATH": path, **(env or {})},
        )
    finally:
        os.close(fd)
    return Process(name, proc, Path(log_name))


async def stop(processes: list[Process], timeout: float = PATIENCE) -> None:
    """SIGTERM each (a graceful drain), then SIGKILL whatever is still there after ``timeout``."""
    for p in processes:
        if p.running:
            with contextlib.suppress(ProcessLookupError):
                p.proc.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            await asyncio.wait_for(p.proc.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.proc.kill()
            await p.proc.wait()
        if p._drain is not None:
            p._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await p._drain
        with contextlib.suppress(OSError):
            p.log_path.unlink()
