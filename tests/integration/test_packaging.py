"""What ``pip install taskfleet`` puts on a machine: one import name, and a cheap import.

The wheel is built here, from a copy of the checkout, offline (the build backend comes from the
test extra), and its file list is read: every importable name must live under ``taskfleet``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".taskfleet"
)


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    shutil.copytree(REPO, source, symlinks=True, ignore=SKIP)
    out = tmp_path / "dist"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = out.glob("taskfleet-*.whl")
    return wheel


def test_the_wheel_installs_only_taskfleet_names(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = {name.split("/", 1)[0] for name in names}
        dist_info = next(n for n in top_level if n.endswith(".dist-info"))
        declared = (
            archive.read(f"{dist_info}/top_level.txt").decode().split()
            if (f"{dist_info}/top_level.txt" in names)
            else []
        )
    assert top_level == {"taskfleet", dist_info}, sorted(top_level)
    assert all(name.startswith("taskfleet") for name in declared), declared
    # The mapped folders are real files in the wheel, under the one name.
    for path in (
        "taskfleet/__init__.py",
        "taskfleet/py.typed",
        "taskfleet/client.py",
        "taskfleet/enqueuing.py",
        "taskfleet/testing.py",
        "taskfleet/shared/submission.py",
        "taskfleet/api/app.py",
        "taskfleet/worker/worker.py",
        "taskfleet/cli/main.py",
        "taskfleet/alembic/versions/0004_enqueue_function.py",
    ):
        assert path in names, path
    # The console ships as it is served: every file of services/api/ui is in the wheel.
    ui = Path(__file__).resolve().parents[2] / "services" / "api" / "ui"
    shipped = {
        f"taskfleet/api/ui/{p.relative_to(ui).as_posix()}" for p in ui.rglob("*") if p.is_file()
    }
    assert shipped <= set(names), sorted(shipped - set(names))


def test_import_taskfleet_loads_no_http_or_database_library() -> None:
    code = (
        "import sys, taskfleet\n"
        "heavy = [m for m in ('httpx', 'asyncpg', 'sqlalchemy', 'fastapi', 'uvicorn')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
        "from taskfleet import Client, enqueue\n"
        "print(Client.__module__, enqueue.__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    first, second = done.stdout.splitlines()
    assert first == ""
    assert second == "taskfleet.client taskfleet.enqueuing"


def test_the_public_names_are_exactly_the_documented_ones() -> None:
    import taskfleet

    assert sorted(taskfleet.__all__) == sorted(
        [
            "ApiError",
            "AsyncClient",
            "Client",
            "Conflict",
            "Forbidden",
            "InvalidRequest",
            "NotFound",
            "PayloadTooLarge",
            "PermanentError",
            "Task",
            "TaskContext",
            "TaskParams",
            "TaskStatus",
            "Unauthorized",
            "Unavailable",
            "WaitTimeout",
            "__version__",
            "enqueue",
            "enqueue_many",
            "enqueue_many_sync",
            "enqueue_sync",
            "task",
        ]
    )
    for name in taskfleet.__all__:
        value = getattr(taskfleet, name)
        if name != "__version__":
            assert value.__doc__, f"taskfleet.{name} has no docstring"


def test_no_public_name_is_also_a_submodule_name() -> None:
    # The enqueue functions lived in taskfleet/enqueue.py: importing that module (`from
    # taskfleet.enqueue import enqueue_many`) bound the package attribute `enqueue` to the module,
    # and `taskfleet.enqueue(conn, ...)` then raised "'module' object is not callable".
    import pkgutil

    import taskfleet

    submodules = {m.name for m in pkgutil.iter_modules(taskfleet.__path__)}
    assert submodules & set(taskfleet.__all__) == set()
    code = (
        "import taskfleet\n"
        "import taskfleet.enqueuing, taskfleet.client, taskfleet.errors, taskfleet.models\n"
        "print(callable(taskfleet.enqueue), taskfleet.enqueue.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "enqueue"]
