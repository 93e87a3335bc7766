"""Running the installed ``taskfleet`` command as a user would, for the tests of its failures.

The console script (not ``python -m``, which puts the current directory on the import path by
itself) with an environment free of the caller's ``TASKFLEET_*`` and ``DATABASE_URL``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def taskfleet_script() -> list[str]:
    script = Path(sys.executable).with_name("taskfleet")
    assert script.is_file(), "the taskfleet console script is installed beside the interpreter"
    return [str(script)]


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TASKFLEET_") and k not in ("DATABASE_URL", "PYTHONPATH")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_taskfleet(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``taskfleet ARGS`` to completion; its exit code, stdout and stderr."""
    return subprocess.run(
        [*taskfleet_script(), *args],
        env=env,
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command's only stderr line, which must start with ``error:`` (no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def spawn_taskfleet(
    *args: str, env: dict[str, str], cwd: Path, log: Path
) -> subprocess.Popen[bytes]:
    """Start ``taskfleet ARGS`` in the background, its output (both streams) in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [*taskfleet_script(), *args],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
