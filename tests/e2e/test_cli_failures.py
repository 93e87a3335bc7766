"""The ``taskfleet`` command's start-up failures: one line naming the setting or the cause and
what to do, exit 2 for configuration and 1 for the rest, the traceback only with ``-v``; the
version; and a project folder's task modules importable without PYTHONPATH."""

from __future__ import annotations

import json
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import taskfleet
from tests.e2e.cli import clean_env, one_error_line, run_taskfleet, spawn_taskfleet
from tests.e2e.fleet import ADMIN_TOKEN, eventually, free_port, wait_http

pytestmark = pytest.mark.e2e

REFUSED_URL = "postgresql://postgres@127.0.0.1:1/taskfleet"


def test_version_is_the_package_version() -> None:
    result = run_taskfleet("--version", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"taskfleet {taskfleet.__version__}"


def test_missing_database_url_names_the_variable_that_exists() -> None:
    result = run_taskfleet("migrate", env=clean_env())
    assert result.returncode == 2
    line = one_error_line(result)
    assert "DATABASE_URL is not set" in line
    assert "TASKFLEET_TASKFLEET" not in line


@pytest.mark.parametrize(
    ("command", "env", "names"),
    [
        (["migrate"], {"TASKFLEET_LOG_LEVEL": "verbose"}, "TASKFLEET_LOG_LEVEL"),
        (["worker"], {"TASKFLEET_LOG_FORMAT": "yaml"}, "TASKFLEET_LOG_FORMAT"),
        (["migrate"], {"DATABASE_URL": "postgresql://db:notaport/x"}, "DATABASE_URL: port"),
        (["worker"], {"TASKFLEET_METRICS_HOST": "no such host!"}, "TASKFLEET_METRICS_HOST"),
        (["worker"], {"TASKFLEET_TASK_MODULES": "no_such_pkg.tasks"}, "'no_such_pkg.tasks'"),
        (["api"], {"TASKFLEET_TASK_MODULES": "no_such_pkg.tasks"}, "'no_such_pkg.tasks'"),
        (["api"], {"TASKFLEET_HOST": "no such host!"}, "TASKFLEET_HOST"),
        (["worker", "--concurrency", "0"], {}, "--concurrency"),
    ],
)
def test_configuration_errors_are_one_line_and_exit_2(
    command: list[str], env: dict[str, str], names: str
) -> None:
    base = {"DATABASE_URL": REFUSED_URL, "TASKFLEET_AUTH_DISABLED": "true"}
    result = run_taskfleet(*command, env=clean_env(**{**base, **env}))
    assert result.returncode == 2, result.stderr
    assert names in one_error_line(result)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 0.0.0.0 that another socket is listening on."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize(
    ("command", "setting"),
    [
        (["worker", "--metrics-port"], "TASKFLEET_METRICS_PORT"),
        (["api", "--host", "0.0.0.0", "--port"], "TASKFLEET_PORT"),
    ],
)
def test_a_port_in_use_is_one_line_and_exit_1(
    taken_port: int, command: list[str], setting: str
) -> None:
    env = clean_env(DATABASE_URL=REFUSED_URL, TASKFLEET_AUTH_DISABLED="true")
    result = run_taskfleet(*command, str(taken_port), env=env)
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)
    assert f":{taken_port}" in line and "in use" in line and setting in line


def test_verbose_adds_the_traceback() -> None:
    env = clean_env(DATABASE_URL=REFUSED_URL)
    quiet = run_taskfleet("migrate", env=env)
    assert quiet.returncode == 1
    assert "connection refused" in one_error_line(quiet)

    verbose = run_taskfleet("-v", "migrate", env=env)
    assert verbose.returncode == 1
    assert "Traceback (most recent call last)" in verbose.stderr
    assert "ConnectionRefusedError" in verbose.stderr
    assert verbose.stderr.rstrip().splitlines()[-1] == one_error_line(quiet)


HANDLERS = """
    import logging

    from taskfleet import TaskParams, task

    log = logging.getLogger("myapp.tasks")


    class Double(TaskParams):
        n: int


    @task("myapp.double", params=Double)
    async def double(params: Double) -> dict:
        log.info("doubling", extra={"order_id": params.n, "step": "double"})
        return {"n": params.n * 2}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder: ``myapp/tasks.py`` with one handler, nothing installed."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(textwrap.dedent(HANDLERS))
    return tmp_path


def test_a_missing_task_module_names_the_path_searched(project: Path) -> None:
    env = clean_env(DATABASE_URL=REFUSED_URL, TASKFLEET_TASK_MODULES="myapp.taskz")
    result = run_taskfleet("worker", env=env, cwd=project)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "'myapp.taskz'" in line and str(project) in line and "PYTHONPATH" in line


async def test_project_modules_import_from_the_current_directory(
    project: Path, database_url: str
) -> None:
    """``taskfleet api`` and ``taskfleet worker`` run from the project folder find
    ``myapp.tasks`` without PYTHONPATH; the worker logs JSON lines with the ``extra=`` fields
    the handler passes."""
    env = clean_env(
        DATABASE_URL=database_url,
        TASKFLEET_TASK_MODULES="myapp.tasks",
        TASKFLEET_API_TOKENS=f"admin:{ADMIN_TOKEN}",
        TASKFLEET_METRICS_HOST="127.0.0.1",
        TASKFLEET_LOG_FORMAT="json",
        TASKFLEET_POLL_INTERVAL="0.5",
    )
    api_port, metrics_port = free_port(), free_port()
    logs = {name: project / f"{name}.log" for name in ("api", "worker")}
    commands = {
        "api": ["api", "--host", "127.0.0.1", "--port", str(api_port)],
        "worker": ["worker", "--metrics-port", str(metrics_port)],
    }
    procs = []
    try:
        for name, args in commands.items():
            procs.append(spawn_taskfleet(*args, env=env, cwd=project, log=logs[name]))
        await wait_http(f"http://127.0.0.1:{api_port}/readyz", timeout=60)
        await wait_http(f"http://127.0.0.1:{metrics_port}/readyz", timeout=60)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        base = f"http://127.0.0.1:{api_port}"
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
            submitted = await client.post(
                "/tasks", json={"type": "myapp.double", "payload": {"n": 21}}
            )
            assert submitted.status_code == 201, submitted.text
            task_id = submitted.json()["id"]
            done = await client.get(f"/tasks/{task_id}/wait", params={"timeout": 30})
            assert done.json()["status"] == "completed", done.text
            assert done.json()["result"] == {"n": 42}

        async def handler_line() -> dict[str, object] | None:
            for line in logs["worker"].read_text().splitlines():
                record = json.loads(line)  # every line is one JSON object
                if record.get("message") == "doubling":
                    return record
            return None

        record = await eventually(handler_line)
        assert record["order_id"] == 21 and record["step"] == "double"
        assert record["logger"] == "myapp.tasks" and record["level"] == "INFO"
        for line in logs["api"].read_text().splitlines():
            json.loads(line)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
