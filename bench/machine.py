"""What the figures were measured on: cores, memory, Postgres, the cost of a flushed commit,
and the versions of the systems compared."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.scratch import Templates

REPO = Path(__file__).resolve().parent.parent


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip()


def versions() -> dict[str, str]:
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "services", "shared")
    commit = _git("rev-parse", "--short", "HEAD")
    return {
        "taskfleet": f"{importlib.metadata.version('taskfleet')} @ {commit}"
        + (" (+ uncommitted changes in services/ or shared/)" if dirty else ""),
        "pgqueuer": importlib.metadata.version("pgqueuer"),
        "procrastinate": importlib.metadata.version("procrastinate"),
        "asyncpg": importlib.metadata.version("asyncpg"),
        "psycopg": importlib.metadata.version("psycopg"),
    }


async def commit_cost(url: str, commits: int = 200) -> dict[str, float]:
    """Mean milliseconds per single-row INSERT commit, flushed (synchronous_commit on) and not."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_loop (id bigserial, v int)")
        out = {}
        for setting in ("on", "off"):
            await conn.execute(f"SET synchronous_commit = {setting}")
            started = time.perf_counter()
            for i in range(commits):
                await conn.execute("INSERT INTO bench_commit_loop (v) VALUES ($1)", i)
            out[f"commit_ms_sync_{setting}"] = round(
                (time.perf_counter() - started) / commits * 1000, 2
            )
        return out
    finally:
        await conn.close()


async def _nothing(url: str) -> None:
    return None


async def sample_commit_cost(templates: Templates, commits: int = 100) -> dict[str, float]:
    """The commit cost now (it drifts with the disk's other users): a scratch database each time."""
    async with templates.clone("machine", _nothing) as url:
        return await commit_cost(url, commits)


async def describe(templates: Templates) -> dict[str, Any]:
    async with templates.clone("machine", _nothing) as url:
        conn = await asyncpg.connect(url)
        try:
            server = await conn.fetchval("SHOW server_version")
            preload = await conn.fetchval("SHOW shared_preload_libraries")
            settings = {
                r["name"]: r["setting"]
                for r in await conn.fetch(
                    "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
                    [
                        "synchronous_commit",
                        "fsync",
                        "wal_sync_method",
                        "shared_buffers",
                        "max_connections",
                    ],
                )
            }
        finally:
            await conn.close()
        costs = await commit_cost(url)
    return {
        "nproc": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "postgres": server,
        "shared_preload_libraries": preload or "(none)",
        "postgres_settings": settings,
        **costs,
        "versions": versions(),
    }
