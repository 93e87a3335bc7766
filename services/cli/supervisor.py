"""The supervisor of ``taskfleet dev``: starts child processes, waits until each is ready,
watches them, and stops them all in order.

The children get a process group of their own, so a Ctrl-C in the terminal reaches only this
supervisor, which stops them in order; on Linux they also get SIGTERM if the supervisor dies.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import typer

#: How long the children get to answer on their /readyz before everything is stopped: a base,
#: plus a little per child (each one imports and connects; 50 workers share a laptop's cores).
READY_TIMEOUT_SECONDS = 60.0
READY_TIMEOUT_PER_CHILD_SECONDS = 2.0


def say(message: str) -> None:
    try:
        typer.echo(f"taskfleet dev: {message}", err=True)
    except OSError:  # e.g. `taskfleet dev | tee log` and Ctrl-C killed tee: keep shutting down
        silence_output()


def silence_output() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


@dataclass
class Child:
    """One child process: the API or a worker."""

    name: str
    argv: list[str]
    health_url: str
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()


@dataclass
class StopRequest:
    """Set by SIGINT/SIGTERM: the first signal asks for an orderly stop, a second for SIGKILL."""

    signum: int | None = None
    count: int = 0
    previous: dict[int, object] = field(default_factory=dict)

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum

    @property
    def requested(self) -> bool:
        return self.count > 0

    @property
    def forced(self) -> bool:
        return self.count > 1


def taskfleet_command() -> list[str]:
    """How to run ``taskfleet`` with this interpreter: the console script installed beside it,
    else the CLI module (a checkout that is importable but not installed)."""
    script = Path(sys.executable).with_name("taskfleet")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "from taskfleet.cli.main import main; main()"]


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None

    def set_pdeathsig() -> None:  # runs in the child between fork and exec
        import ctypes

        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_pdeathsig


def _signal_group(child: Child, signum: int) -> None:
    if child.process is None:
        return
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(200 <= response.status < 300)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_children(children: Sequence[Child], grace: float, stop: StopRequest) -> None:
    """SIGTERM every live child's process group, wait up to ``grace`` seconds (less if a second
    signal arrives), then SIGKILL whatever is left."""
    live = [c for c in children if c.process is not None and c.exited() is None]
    for child in live:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(c.exited() is None for c in live):
        if time.monotonic() >= deadline or stop.forced:
            break
        time.sleep(0.1)
    for child in live:
        if child.exited() is None:
            say(f"{child.name} (pid {child.pid}) did not stop in time; killing it")
        # Also reaps anything the child started in its group.
        _signal_group(child, signal.SIGKILL)
        assert child.process is not None
        child.process.wait()


def supervise(
    children: Sequence[Child],
    env: dict[str, str],
    grace: float,
    stop: StopRequest,
    on_ready: Callable[[Sequence[Child]], None],
) -> int:
    """Start the children, wait until every one is ready, call ``on_ready``, then watch them
    until a signal (-> 0) or an unexpected exit (-> 1). A child not ready within the ready
    timeout is a failure too (-> 1, ``on_ready`` never called). Always stops them."""
    parent_pid = os.getpid()
    status = 0
    try:
        for child in children:
            if stop.requested:
                return 0
            child.process = subprocess.Popen(
                child.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                process_group=0,
                preexec_fn=_die_with_parent(parent_pid),
            )
            say(f"started {child.name} (pid {child.pid}): {shlex.join(child.argv)}")

        announced = False
        ready_timeout = READY_TIMEOUT_SECONDS + READY_TIMEOUT_PER_CHILD_SECONDS * len(children)
        ready_deadline = time.monotonic() + ready_timeout
        while not stop.requested:
            for child in children:
                code = child.exited()
                if code is not None:
                    say(f"{child.name} (pid {child.pid}) exited unexpectedly with code {code}")
                    status = 1
                    return status
            if not announced:
                for child in children:
                    if not child.ready:
                        child.ready = _answers(child.health_url)
                if all(c.ready for c in children):
                    on_ready(children)
                    announced = True
                elif time.monotonic() > ready_deadline:
                    late = ", ".join(c.name for c in children if not c.ready)
                    say(
                        f"not running: {late} not ready after {ready_timeout:.0f} s (their "
                        "output above says why); stopping everything"
                    )
                    status = 1
                    return status
            time.sleep(0.2)
        name = signal.Signals(stop.signum).name if stop.signum else "signal"
        say(f"{name} received; stopping")
        return 0
    finally:
        stop_children(children, grace, stop)
        say("all processes stopped" if status == 0 else "stopped everything after the failure")
