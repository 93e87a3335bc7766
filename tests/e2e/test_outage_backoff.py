"""A database outage with a real worker process: every loop backs off for real.

With the database refusing connections (ALLOW_CONNECTIONS false, every session terminated), a
worker hammered it: a failed sweep tick left the next sweep time in the past, so the heartbeat
retried at once, some 300 new connections a second, logging a backoff it never slept. Here the
worker reaches Postgres through a counting proxy, so the test sees every connection attempt,
and reads the delays the worker logged:

- every attempt during the outage shows up as a logged failure (nothing hammers unlogged);
- each loop's next failure comes no sooner than the delay it logged (sleeping only ever takes
  longer than asked, so this holds however slow the machine is);
- after the outage the worker recovers on its own and runs a task.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import defaultdict
from datetime import datetime
from urllib.parse import urlsplit

import asyncpg

from tests import pg
from tests.e2e.fleet import Fleet, Proc, wait_tasks_terminal
from tests.e2e.tcp_proxy import CountingProxy

OUTAGE_SECONDS = 6.0
#: One failed attempt, as every worker loop logs it.
RETRY = re.compile(
    r"^(?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING \S+: "
    r"(?P<what>.+?) \(.*\); retrying in (?P<delay>\d+\.\d+)s$"
)


def _loop_of(what: str) -> str:
    for name in ("heartbeat", "claim", "outcome", "listener", "start-up"):
        if name in what:
            return name
    return what


def _retries(proc: Proc, start: float, end: float) -> dict[str, list[tuple[float, float]]]:
    """(when, delay) of every logged retry between ``start`` and ``end``, per loop."""
    found: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for line in proc.log().splitlines():
        match = RETRY.match(line)
        if match is None:
            continue
        when = datetime.strptime(match["when"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if start <= when <= end:
            found[_loop_of(match["what"])].append((when, float(match["delay"])))
    return found


async def test_every_loop_backs_off_as_it_logs_during_an_outage(database_url: str) -> None:
    proxy = CountingProxy.for_url(database_url)
    await proxy.start()
    name = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(pg.with_database(database_url, "postgres"))
    try:
        async with Fleet(database_url) as fleet:
            await fleet.start_api()
            worker = await fleet.start_worker(
                "w1", extra_env={"DATABASE_URL": proxy.url_for(database_url)}
            )
            # The outage: no new connections, and every worker session terminated.
            start = time.time()
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = $1 AND application_name LIKE 'taskfleet-worker%'",
                name,
            )
            await asyncio.sleep(OUTAGE_SECONDS)  # the outage lasts; nothing is asserted on it
            end = time.time()
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

            attempts = proxy.opened_between(start, end)
            retries = _retries(worker, start, end)
            logged = sum(len(r) for r in retries.values())
            assert retries.keys() >= {"heartbeat", "claim", "listener"}, retries.keys()
            # Every attempt is a logged failure (the last of each loop may still be in flight).
            assert attempts <= logged + len(retries) + 1, (attempts, logged, dict(retries))
            # The backoff it logs is the backoff it does.
            for loop, seen in retries.items():
                for (when, delay), (after, _) in itertools.pairwise(seen):
                    assert after - when >= delay - 0.01, (loop, when, delay, after)
            assert attempts < 10 * OUTAGE_SECONDS, f"{attempts} connections in {OUTAGE_SECONDS}s"

            # And it recovers by itself.
            conn = await fleet.connect()
            try:
                async with fleet.client() as client:
                    task = (await client.post("/tasks", json={"type": "demo.echo"})).json()
                done = await wait_tasks_terminal(conn, [task["id"]], timeout=60)
                assert done[task["id"]]["status"] == "completed"
            finally:
                await conn.close()
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await admin.close()
        await proxy.stop()
