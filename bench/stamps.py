"""Handler-start stamps on the wall clock, for the pickup benchmark's end-to-end figure.

Every system's handler appends ``<job id> <time.time()>`` to the file named by
``BENCH_STAMP_FILE`` as its first act: the same write, on the same clock as the submitter's
stamp before its enqueue call, whichever system runs it. For taskfleet the handler is the task
type :data:`STAMP_TYPE` (:mod:`bench.stamp_task`, ``TASKFLEET_TASK_MODULES=bench.stamp_task``);
the peers' no-op handlers in :mod:`bench.peer_worker` call :func:`stamp`. Nothing here imports
taskfleet, so a peer's worker process loads none of it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO

#: The environment variable naming the stamp file (unset: nothing is written).
STAMP_FILE_ENV = "BENCH_STAMP_FILE"
#: taskfleet's stamping task type.
STAMP_TYPE = "bench.stamp"

#: The open stamp file; False once BENCH_STAMP_FILE was found unset (looked up once: the peers'
#: drains call stamp() for every job).
_file: IO[str] | bool | None = None


def stamp(job_id: int) -> None:
    """Append the handler start of ``job_id`` (a no-op without BENCH_STAMP_FILE)."""
    global _file
    now = time.time()
    if _file is None:
        path = os.environ.get(STAMP_FILE_ENV)
        _file = open(path, "a", buffering=1) if path else False  # noqa: SIM115 - kept open
    if not isinstance(_file, bool):
        _file.write(f"{job_id} {now!r}\n")


def read_stamps(path: Path) -> dict[int, float]:
    """The stamps written so far: job id -> handler start (seconds since the epoch)."""
    stamps: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            job, _, at = line.partition(" ")
            stamps[int(job)] = float(at)
    return stamps
