"""The README's "Write your own tasks" section, run as written from a new project folder.

The files are the README's Python blocks (each names its path on its first line); the commands
are its shell blocks, run in order with their exports, the long-running ``taskfleet api`` and
``taskfleet worker`` in the background (as in their own terminals). Only the database URL and
the two ports are swapped for this test's own, and the printed output is compared with the
README's ``# ...`` lines.

PYTHONPATH is not set: the commands put the current directory on the import path themselves,
as the README says.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.fleet import free_port

REPO = Path(__file__).resolve().parents[2]
README_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PATIENCE = 60.0


def section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("### Write your own tasks")
    return text[start : text.index("\n## ", start)]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready:\n{log.read_text()}")


def test_the_readme_handler_example_runs_as_written(database_url: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").write_text("")  # "an empty myapp/__init__.py"
    api_port, metrics_port = free_port(), free_port()

    def ours(text: str) -> str:
        text = text.replace(README_URL, database_url)
        text = text.replace("127.0.0.1:8000", f"127.0.0.1:{api_port}")
        text = text.replace("--port 8000", f"--port {api_port}")
        return text.replace("--metrics-port 9100", f"--metrics-port {metrics_port}")

    text = section()
    for block in blocks(text, "python"):
        first = block.partition("\n")[0]
        assert first.startswith("# "), first
        (project / first[2:].strip()).write_text(ours(block))

    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
    env.pop("DATABASE_URL", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    background: list[tuple[subprocess.Popen[bytes], Path]] = []
    shell = blocks(text, "sh")
    assert len(shell) == 2, shell
    try:
        for raw in ours(shell[0]).splitlines():
            line = raw.split("  #")[0].strip()
            if not line:
                continue
            words = shlex.split(line)
            if words[0] == "export":
                env.update(word.split("=", 1) for word in words[1:])
            elif words[:2] in (["taskfleet", "api"], ["taskfleet", "worker"]):
                log = tmp_path / f"{words[1]}.log"
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        words, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT
                    )
                background.append((proc, log))
                port = api_port if words[1] == "api" else metrics_port
                wait_ready(f"http://127.0.0.1:{port}/readyz", proc, log)
            else:
                done = subprocess.run(
                    words, cwd=project, env=env, capture_output=True, text=True, timeout=PATIENCE
                )
                assert done.returncode == 0, done.stdout + done.stderr

        commands = ours(shell[1])
        expected = [line[2:] for line in commands.splitlines() if line.startswith("# ")]
        script = "\n".join(line for line in commands.splitlines() if not line.startswith("#"))
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=PATIENCE,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == expected

        done = subprocess.run(
            [sys.executable, "submit.py"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=PATIENCE,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "{'to': 'ada@example.com', 'sent': True}"
    finally:
        for proc, _ in background:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in background:
            try:
                proc.wait(PATIENCE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(PATIENCE)
