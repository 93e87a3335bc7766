"""Noisy neighbour: a big tenant floods the queue, a small one must still get its share, fast.

    python -m bench.noisy [--a-tasks 1000000] [--b-tasks 10000] [--workers 1] [--concurrency 10]

On a fresh database: the config ``{"labelWeights": {"a": 1, "b": 1}}``, then ``--a-tasks`` no-op
tasks labelled ``a`` queued before ``--b-tasks`` labelled ``b`` (one ``generate_series`` insert
each, as if submitted before the workers started), then the workers. From the database's
``started_at`` stamps:

- **mixed**: starts/s from the first start to the last ``b`` start (both groups have work), and
  ``b``'s share of those starts (weights 1:1: 50%);
- **a alone**: starts/s over the same number of starts right after the last ``b`` start;
- **ratio** mixed / a alone, in the same run (the target: >= 0.8).

The run stops once ``a alone`` is measured: the rest of the backlog is not drained. Prints one JSON
line. ``python -m bench.run --only noisy`` runs it for 1 x 10, 1 x 100 and 4 x 10 slots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass

import asyncpg

from bench import processes
from bench.fairness import _insert_config
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import Taskfleet

#: How often the harness looks at the start count.
POLL = 0.2


@dataclass(frozen=True)
class Noisy:
    mixed_rate: float
    alone_rate: float
    b_share: float
    mixed_starts: int
    seconds_mixed: float
    seconds_alone: float

    @property
    def ratio(self) -> float:
        return self.mixed_rate / self.alone_rate if self.alone_rate else 0.0


async def _seed(conn: asyncpg.Connection, a_tasks: int, b_tasks: int) -> None:
    has_key = await conn.fetchval(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'taskfleet'"
        " AND table_name = 'tasks' AND column_name = 'group_key'"
    )
    for label, n, offset in (("a", a_tasks, 0), ("b", b_tasks, a_tasks)):
        # created_at in submission order: every a is older than every b.
        columns = "type, labels, created_at" + (", group_key" if has_key else "")
        key = f", '{label}'" if has_key else ""
        await conn.execute(
            f"INSERT INTO taskfleet.tasks ({columns})"
            f" SELECT 'demo.echo', ARRAY['{label}'],"
            f" now() - interval '1 hour' + (g + {offset}) * interval '1 microsecond'{key}"
            f" FROM generate_series(1, {n}) AS g"
        )
    await conn.execute("VACUUM ANALYZE taskfleet.tasks")


async def measure_noisy(
    templates: Templates,
    *,
    a_tasks: int,
    b_tasks: int,
    workers: int,
    concurrency: int,
    timeout: float = 900.0,
) -> Noisy:
    system = Taskfleet()
    async with templates.clone(system.template_key, system.install) as url:
        await _insert_config(url, {"labelWeights": {"a": 1, "b": 1}})
        conn = await asyncpg.connect(url)
        try:
            await _seed(conn, a_tasks, b_tasks)
            fleet = await system.start_workers(url, workers, concurrency)
            try:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                while True:
                    row = await conn.fetchrow(
                        "SELECT count(*) FILTER (WHERE labels = ARRAY['b']) AS b,"
                        " count(*) AS n FROM taskfleet.tasks WHERE started_at IS NOT NULL"
                    )
                    mixed = row["n"] - row["b"] if row["b"] >= b_tasks else None
                    # Once every b started: wait for as many a-only starts as the mixed phase had.
                    if mixed is not None:
                        first_b_done = await conn.fetchval(
                            "SELECT count(*) FROM taskfleet.tasks WHERE started_at <="
                            " (SELECT max(started_at) FROM taskfleet.tasks"
                            "  WHERE labels = ARRAY['b'])"
                        )
                        if row["n"] >= 2 * first_b_done + concurrency * workers:
                            break
                    if loop.time() > deadline:
                        raise TimeoutError(f"noisy: not done in {timeout:g}s ({dict(row)})")
                    await asyncio.sleep(POLL)
            finally:
                await processes.stop(fleet)
            return await _window(conn)
        finally:
            await conn.close()


async def _window(conn: asyncpg.Connection) -> Noisy:
    row = await conn.fetchrow(
        """
        WITH starts AS (
            SELECT started_at, labels = ARRAY['b'] AS is_b,
                   row_number() OVER (ORDER BY started_at, id) AS k
            FROM taskfleet.tasks WHERE started_at IS NOT NULL
        ),
        edge AS (SELECT max(k) AS k, max(started_at) AS t FROM starts WHERE is_b),
        first AS (SELECT min(started_at) AS t FROM starts)
        SELECT edge.k AS mixed,
               (SELECT count(*) FROM starts WHERE is_b) AS b,
               EXTRACT(EPOCH FROM edge.t - first.t)::float8 AS seconds_mixed,
               EXTRACT(EPOCH FROM (SELECT started_at FROM starts WHERE starts.k = 2 * edge.k)
                                  - edge.t)::float8 AS seconds_alone
        FROM edge, first
        """
    )
    mixed = int(row["mixed"])
    s_mixed = float(row["seconds_mixed"] or 0.0)
    s_alone = float(row["seconds_alone"] or 0.0)
    return Noisy(
        mixed_rate=mixed / s_mixed if s_mixed else 0.0,
        alone_rate=mixed / s_alone if s_alone else 0.0,
        b_share=int(row["b"]) / mixed if mixed else 0.0,
        mixed_starts=mixed,
        seconds_mixed=round(s_mixed, 3),
        seconds_alone=round(s_alone, 3),
    )


async def _main(args: argparse.Namespace) -> dict[str, object]:
    templates = Templates(args.database_url)
    try:
        result = await measure_noisy(
            templates,
            a_tasks=args.a_tasks,
            b_tasks=args.b_tasks,
            workers=args.workers,
            concurrency=args.concurrency,
        )
    finally:
        await templates.close()
    return {
        "bench": "noisy",
        "a_tasks": args.a_tasks,
        "b_tasks": args.b_tasks,
        "workers": args.workers,
        "concurrency": args.concurrency,
        **asdict(result),
        "ratio": round(result.ratio, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a-tasks", type=int, default=1_000_000)
    parser.add_argument("--b-tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    print(json.dumps(asyncio.run(_main(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
