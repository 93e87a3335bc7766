"""How fast pending tasks are re-grouped after a change of the configured labels.

    python -m bench.regroup [--tasks 200000]

On a fresh database with ``labelWeights {a, b}`` and ``--tasks`` pending tasks (99% labelled
``a``, 1% ``b``), three changes in turn, each stepped to the end as the config writer does
(``taskfleet.task_regroup_step`` in batches of 2,000):

- add ``c`` (no task carries it): nothing to walk;
- add ``0`` (sorts before every label): every labelled group is walked, nobody moves;
- remove ``a``: the ``a`` group is walked and every one of its tasks moves to the default group.

Prints one JSON line per change: rows walked, rows moved, seconds, rows walked/s, moved/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from bench.fairness import _insert_config
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import Taskfleet
from taskfleet.shared import db
from taskfleet.worker.regroup import regroup_pending

CHANGES = (
    ("add c (carried by no task)", {"a": 1, "b": 1, "c": 1}),
    ("add 0 (sorts first: every group walked)", {"0": 1, "a": 1, "b": 1, "c": 1}),
    ("remove a (its tasks move to default)", {"0": 1, "b": 1, "c": 1}),
)


async def measure(templates: Templates, tasks: int) -> list[dict[str, object]]:
    system = Taskfleet()
    results = []
    async with templates.clone(system.template_key, system.install) as url:
        await _insert_config(url, {"labelWeights": {"a": 1, "b": 1}})
        conn = await db.connect(url)
        try:
            await regroup_pending(conn)
            await conn.execute(
                "INSERT INTO taskfleet.tasks (type, labels, group_key)"
                " SELECT 'demo.echo', CASE WHEN g % 100 = 0 THEN ARRAY['b'] ELSE ARRAY['a'] END,"
                " CASE WHEN g % 100 = 0 THEN 'b' ELSE 'a' END"
                f" FROM generate_series(1, {int(tasks)}) AS g"
            )
            await conn.execute("VACUUM ANALYZE taskfleet.tasks")
            for name, weights in CHANGES:
                await _insert_config(url, {"labelWeights": weights})
                started = time.perf_counter()
                walked, moved, state = await regroup_pending(conn, budget=600)
                seconds = time.perf_counter() - started
                results.append(
                    {
                        "bench": "regroup",
                        "change": name,
                        "pending": tasks,
                        "walked": walked,
                        "moved": moved,
                        "state": state,
                        "seconds": round(seconds, 3),
                        "walked_per_s": round(walked / seconds) if seconds else None,
                        "moved_per_s": round(moved / seconds) if seconds and moved else None,
                        "load_average": [round(x, 2) for x in os.getloadavg()],
                    }
                )
        finally:
            await conn.close()
    return results


async def _main(args: argparse.Namespace) -> None:
    templates = Templates(args.database_url)
    try:
        for line in await measure(templates, args.tasks):
            print(json.dumps(line), flush=True)
    finally:
        await templates.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
