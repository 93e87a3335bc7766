"""A claim costs what it claims, never what is queued: with 1,000,000 pending rows in two groups,
claiming k tasks of the small group (or of an empty group, the strict lane, the control lane)
reads a bounded number of buffers, measured by ``EXPLAIN (ANALYZE, BUFFERS)`` of the real
statement; and the same after a ``labelWeights`` change has re-grouped what is pending."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from taskfleet.shared import queries as q
from taskfleet.shared.policy.lanes import RUNTIME_CONFIG_TASK_TYPE
from tests.integration.sql import (
    PLAN_MODES,
    connected,
    ensure_grouping,
    explain_prepared,
    outcome_params,
    plan_as,
)

BIG = 990_000  # group a, the oldest rows: every claim in claim order would walk them first
SMALL = 10_000  # labelled {b, m}: group b while b is configured, m after the change below
ROWS = BIG + SMALL

#: Buffers the claim may *read* to find k = 10 tasks of a group (the group's index range and the
#: probes): measured 5-30. A claim that walked the big group would read thousands.
MAX_READ_BUFFERS = 60
#: The whole statement also writes each claimed row (its new version and index entries, ~20-30
#: buffers a row here): bounded by k, not by the depth.
MAX_BUFFERS_PER_TASK = 60
MAX_STATEMENT_OVERHEAD = 100

SEED = f"""
INSERT INTO taskfleet.tasks (type, labels, group_key, created_at)
SELECT 'demo.echo',
       CASE WHEN g <= {BIG} THEN ARRAY['a'] ELSE ARRAY['b', 'm'] END,
       CASE WHEN g <= {BIG} THEN 'a' ELSE 'b' END,
       now() - interval '1 day' + g * interval '1 millisecond'
FROM generate_series(1, {ROWS}) AS g
"""


@pytest.fixture(scope="module")
def seeded_url(test_databases: Any) -> Iterator[str]:
    url = test_databases.create()
    try:
        asyncio.run(_seed(url))
        yield url
    finally:
        test_databases.drop(url)


async def _seed(url: str) -> None:
    async with connected(url) as conn:
        await ensure_grouping(conn, ["a", "b"])
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'taskfleet' "
            "AND tablename = 'tasks' AND indexname <> 'tasks_pkey'"
        )
        await conn.execute("SET maintenance_work_mem = '256MB'")
        for row in indexes:
            await conn.execute(f"DROP INDEX taskfleet.{row['indexname']}")
        await conn.execute(SEED)
        for row in indexes:
            await conn.execute(row["indexdef"])
        await conn.execute("VACUUM ANALYZE taskfleet.tasks")
        groups = dict(
            await conn.fetch(
                "SELECT group_key, count(*) FROM taskfleet.tasks WHERE status = 'pending' "
                "GROUP BY group_key"
            )
        )
        assert groups == {"a": BIG, "b": SMALL}


# Both plans stay bounded: the generic one is what a worker runs (with the statistics autovacuum
# keeps, Postgres would otherwise plan the claim again on every call), the custom one what a
# claim gets on a connection without that setting.
@pytest.fixture(params=sorted(PLAN_MODES))
async def conn(
    seeded_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[asyncpg.Connection]:
    async with connected(seeded_url) as conn:
        await plan_as(conn, request.param)
        yield conn


def _buffers(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


async def explain_claim(
    conn: asyncpg.Connection, query: q.Query = q.task_claim, **params: Any
) -> dict[str, Any]:
    """The plan of one real claim (``query``, nothing asked unless ``params`` say so) run by
    ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction rolled back (the seed stays as it is)."""
    sql, args = query.positional(
        {
            **outcome_params([]),
            "control_limit": 0,
            "strict_limit": 0,
            "group_keys": [],
            "group_limits": [],
            "probe_strict": False,
            "probe_normal": False,
            "worker_id": "w-depth",
            "lease_ttl": 30.0,
            "tags": [],
            "paused_labels": [],
            "types": ["demo.echo", RUNTIME_CONFIG_TASK_TYPE],
            **params,
        }
    )
    transaction = conn.transaction()
    await transaction.start()
    try:
        raw = await explain_prepared(conn, "ANALYZE, BUFFERS, FORMAT JSON", sql, args)
    finally:
        await transaction.rollback()
    (doc,) = json.loads(raw) if isinstance(raw, str) else raw
    plan: dict[str, Any] = doc["Plan"]
    return plan


async def claim_buffers(
    conn: asyncpg.Connection, query: q.Query = q.task_claim, **params: Any
) -> tuple[int, int, int]:
    """One real claim (:func:`explain_claim`): buffers of the whole statement (shared hit +
    read), buffers of its reads (everything but the writes of the claimed and finished rows),
    rows returned."""
    plan = await explain_claim(conn, query, **params)
    writes = sum(
        _buffers(node)
        for node in plan_nodes(plan)
        if node.get("Subplan Name") in ("CTE claimed", "CTE finished")
    )
    total = _buffers(plan)
    return total, total - writes, int(plan["Actual Rows"])


def assert_bounded(total: int, reads: int, claimed: int) -> None:
    assert reads <= MAX_READ_BUFFERS
    assert total <= MAX_STATEMENT_OVERHEAD + MAX_BUFFERS_PER_TASK * claimed


async def test_claiming_the_small_group_reads_a_bounded_number_of_buffers(
    conn: asyncpg.Connection,
) -> None:
    total, reads, rows = await claim_buffers(conn, group_keys=["b"], group_limits=[10])
    assert rows == 10
    assert_bounded(total, reads, rows)


@pytest.mark.parametrize("query", [q.task_claim_steady, q.task_claim_normal], ids=lambda q: q.name)
async def test_the_steady_claim_of_either_group_reads_as_few(
    conn: asyncpg.Connection, query: q.Query
) -> None:
    # The claim a worker sends while its claims come back full (no probes), and the same of the
    # normal lane alone: the same bounds. Its picks are planned inside the claimed rows' update
    # (a CTE referenced once is inlined), so claim_buffers() counts them as writes: the reads
    # are the lane index's own buffers.
    for group in ("a", "b"):
        total, _, rows = await claim_buffers(conn, query, group_keys=[group], group_limits=[10])
        assert rows == 10
        plan = await explain_claim(conn, query, group_keys=[group], group_limits=[10])
        scans = [n for n in plan_nodes(plan) if n.get("Index Name") == "tasks_claim_normal_idx"]
        reads = sum(_buffers(n) for n in scans)
        assert 0 < reads <= MAX_READ_BUFFERS
        assert_bounded(total, reads, rows)


async def test_claiming_the_big_group_reads_as_few(conn: asyncpg.Connection) -> None:
    total, reads, rows = await claim_buffers(conn, group_keys=["a"], group_limits=[10])
    assert rows == 10
    assert_bounded(total, reads, rows)


async def test_both_groups_in_one_claim_read_as_few(conn: asyncpg.Connection) -> None:
    total, reads, rows = await claim_buffers(conn, group_keys=["a", "b"], group_limits=[5, 5])
    assert rows == 10
    assert_bounded(total, reads, rows)


async def test_an_empty_group_the_strict_and_the_control_lane_cost_almost_nothing(
    conn: asyncpg.Connection,
) -> None:
    # Asked of and found empty: the default group (every row is labelled), strict, control.
    total, _, rows = await claim_buffers(
        conn, control_limit=1, strict_limit=5, group_keys=[None], group_limits=[5]
    )
    assert rows == 1  # the statement's one row: nothing claimed
    assert total <= 30


async def test_a_probe_of_the_normal_lane_is_one_index_probe(conn: asyncpg.Connection) -> None:
    total, _, _ = await claim_buffers(conn, strict_limit=5, probe_normal=True)
    assert total <= 30


@pytest.mark.parametrize("plan", sorted(PLAN_MODES))
async def test_after_a_label_weights_change_the_moved_group_is_claimed_as_cheaply(
    seeded_url: str, plan: str
) -> None:
    # Runs last (file order): b is no longer configured, m is; the 10,000 small rows move from
    # group b to group m, the 990,000 rows of a stay where they are (and are not rewritten).
    async with connected(seeded_url) as conn:
        await plan_as(conn, plan)
        await ensure_grouping(conn, ["a", "m"])
        groups = dict(
            await conn.fetch(
                "SELECT group_key, count(*) FROM taskfleet.tasks WHERE status = 'pending' "
                "GROUP BY group_key"
            )
        )
        assert groups == {"a": BIG, "m": SMALL}
        total, reads, rows = await claim_buffers(conn, group_keys=["m"], group_limits=[10])
        assert rows == 10
        assert_bounded(total, reads, rows)
        # b is empty now. Its range still holds the index entries of the moved rows' old
        # versions until (auto)vacuum removes them, as after any update in Postgres: asking it
        # reads those (10,000 here: a few hundred pages), never the 990,000 entries of a's
        # range (over 5,000 leaf pages of the claim index alone).
        total, _, rows = await claim_buffers(conn, group_keys=["b"], group_limits=[10])
        assert rows == 1
        a_pages = await conn.fetchval(
            "SELECT relpages FROM pg_class WHERE relname = 'tasks_claim_normal_idx'"
        )
        assert total <= 1000 < a_pages
