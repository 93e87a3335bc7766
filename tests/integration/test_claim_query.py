"""The claim statement on a real Postgres: contention, lane order, strict cap, groups, run_after
(docs/reference.md#scheduling: claiming, lanes, groups)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg
import pytest

from taskfleet.shared import queries as q
from taskfleet.shared.policy.groups import GroupKey, group_for_labels
from taskfleet.shared.policy.lanes import CONTROL_PRIORITY
from tests.integration.sql import (
    LEASE_TTL,
    NewTask,
    claim,
    claim_ids,
    connected,
    control_task,
    ensure_grouping,
    insert_task,
    insert_tasks,
    outcome_params,
    register_worker,
    run,
)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with connected(database_url) as conn:
        yield conn


async def set_created_at(conn: asyncpg.Connection, offsets: dict[int, int]) -> None:
    """created_at = a fixed instant + offset seconds, per task id (ties on purpose)."""
    await conn.execute(
        "UPDATE taskfleet.tasks t SET created_at = '2030-01-01T00:00:00Z'::timestamptz "
        "+ make_interval(secs => o.offset_s), run_after = '2000-01-01T00:00:00Z' "
        "FROM unnest($1::bigint[], $2::int[]) AS o(id, offset_s) WHERE t.id = o.id",
        list(offsets),
        list(offsets.values()),
    )


# --------------------------------------------------------------------------------------------
# Contention
# --------------------------------------------------------------------------------------------


@dataclass
class ClaimGate:
    """Lets one claimer stop new claims and wait until none is in flight.

    A claim that comes back empty is checked against the table only once every claim that was in
    flight alongside it has committed: what is still ``pending`` then was neither locked by a
    concurrent claimer nor taken by one, so it was eligible and skipped. No timing involved.
    """

    in_flight: int = 0
    open: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    checking: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.open.set()

    async def enter(self) -> None:
        while not self.open.is_set():
            await self.open.wait()
        self.in_flight += 1

    async def leave(self) -> None:
        async with self.changed:
            self.in_flight -= 1
            self.changed.notify_all()

    async def quiesced_count(self, conn: asyncpg.Connection, sql: str) -> int:
        async with self.checking:
            self.open.clear()
            try:
                async with self.changed:
                    await self.changed.wait_for(lambda: self.in_flight == 0)
                return int(await conn.fetchval(sql))
            finally:
                self.open.set()


async def test_concurrent_claimers_take_every_task_exactly_once(database_url: str) -> None:
    n_tasks, n_claimers = 2000, 8
    async with connected(database_url) as seed:
        task_ids = await insert_tasks(
            seed, [NewTask(weight=1 + i % 3, payload={"i": i}) for i in range(n_tasks)]
        )
    gate = ClaimGate()
    # Pending rows right after each empty claim (once no claim is in flight): must be 0.
    pending_after_empty: list[int] = []

    async def claimer(index: int) -> list[int]:
        rng = random.Random(index)
        taken: list[int] = []
        async with connected(database_url, f"claimer-{index}") as conn:
            while True:
                await gate.enter()
                try:
                    got = await claim_ids(
                        conn, worker_id=f"w{index}", groups=[(None, rng.randint(1, 10))]
                    )
                finally:
                    await gate.leave()
                if got:
                    taken.extend(got)
                    continue
                pending = await gate.quiesced_count(
                    conn, "SELECT count(*) FROM taskfleet.tasks WHERE status = 'pending'"
                )
                pending_after_empty.append(pending)
                if pending == 0:
                    return taken

    results = await asyncio.gather(*(claimer(i) for i in range(n_claimers)))

    claimed = [task_id for taken in results for task_id in taken]
    twice = [task_id for task_id, n in Counter(claimed).items() if n > 1]
    assert twice == []
    assert sorted(claimed) == sorted(task_ids)
    assert pending_after_empty == [0] * len(pending_after_empty)
    assert len(pending_after_empty) >= n_claimers
    # Contention really happened: more than one claimer got work.
    assert sum(1 for taken in results if taken) > 1
    async with connected(database_url) as check:
        rows = await check.fetch("SELECT id, status, worker_id, attempts FROM taskfleet.tasks")
    owner = {task_id: f"w{i}" for i, taken in enumerate(results) for task_id in taken}
    assert {r["id"]: (r["status"], r["worker_id"], r["attempts"]) for r in rows} == {
        task_id: ("running", owner[task_id], 1) for task_id in task_ids
    }


async def test_concurrent_claims_across_lanes_and_groups_take_every_task_once(
    database_url: str,
) -> None:
    """As above, with every lane and group in each claim (strict, control, three groups), and
    each claim carrying the outcomes of the previous batch, as the worker sends them."""
    configured = ["a", "b"]
    rng = random.Random(99)
    specs = [
        NewTask(
            priority=rng.choice([0, 0, 0, 2, 5]),
            labels=rng.choice([[], ["a"], ["b"], ["b", "a"], ["x"]]),
            weight=rng.randint(1, 3),
        )
        for _ in range(1500)
    ] + [control_task() for _ in range(20)]
    async with connected(database_url) as seed:
        task_ids = await insert_tasks(seed, specs)
    gate = ClaimGate()
    pending_after_empty: list[int] = []

    async def claimer(index: int) -> list[int]:
        rng = random.Random(1000 + index)
        taken: list[int] = []
        previous: list[int] = []
        async with connected(database_url, f"claimer-{index}") as conn:
            while True:
                await gate.enter()
                try:
                    got = await claim(
                        conn,
                        worker_id=f"w{index}",
                        outcomes=[(task_id, "completed") for task_id in previous],
                        control=1,
                        strict=rng.randint(1, 3),
                        configured=configured,
                        groups=[(g, rng.randint(1, 2)) for g in ("a", "b", None)],
                    )
                finally:
                    await gate.leave()
                assert got.finished_ids == sorted(previous)
                previous = got.ids
                if got.ids:
                    taken.extend(got.ids)
                    continue
                pending = await gate.quiesced_count(
                    conn, "SELECT count(*) FROM taskfleet.tasks WHERE status = 'pending'"
                )
                pending_after_empty.append(pending)
                if pending == 0:
                    return taken

    results = await asyncio.gather(*(claimer(i) for i in range(8)))
    claimed = [task_id for taken in results for task_id in taken]
    assert [task_id for task_id, n in Counter(claimed).items() if n > 1] == []
    assert sorted(claimed) == sorted(task_ids)
    assert pending_after_empty == [0] * len(pending_after_empty)
    async with connected(database_url) as check:
        rows = await check.fetch("SELECT id, status, worker_id FROM taskfleet.tasks")
    owner = {task_id: f"w{i}" for i, taken in enumerate(results) for task_id in taken}
    assert {r["id"]: (r["status"], r["worker_id"]) for r in rows} == {
        task_id: ("completed", owner[task_id]) for task_id in task_ids
    }


# --------------------------------------------------------------------------------------------
# Lanes and the strict cap
# --------------------------------------------------------------------------------------------


async def test_claim_marks_tasks_running_leased_and_counts_the_attempt(
    conn: asyncpg.Connection,
) -> None:
    task_id = await insert_task(conn, NewTask(payload={"x": [1, 2]}, labels=["a"], weight=2))
    result = await claim(conn, worker_id="w-9", groups=[("a", 1)], configured=["a"])
    (row,) = result.rows
    assert row["id"] == task_id
    assert row["payload"] == {"x": [1, 2]}
    assert row["labels"] == ["a"]
    assert (row["attempts"], row["weight"], row["priority"]) == (1, 2, 0)
    assert row["wait_seconds"] >= 0
    stored = await conn.fetchrow(
        "SELECT status, worker_id, attempts, started_at IS NOT NULL AS started, "
        "lease_expires_at = started_at + make_interval(secs => $2) AS leased "
        "FROM taskfleet.tasks WHERE id = $1",
        task_id,
        LEASE_TTL,
    )
    assert dict(stored) == {
        "status": "running",
        "worker_id": "w-9",
        "attempts": 1,
        "started": True,
        "leased": True,
    }


async def test_control_then_strict_then_normal(conn: asyncpg.Connection) -> None:
    normal_light = await insert_task(conn, NewTask(weight=1))
    strict_low = await insert_task(conn, NewTask(priority=5))
    strict_high = await insert_task(conn, NewTask(priority=9))
    control = await insert_task(conn, control_task())
    normal_heavy = await insert_task(conn, NewTask(weight=3))

    first = await claim_ids(conn, control=1, strict=1, groups=[(None, 1)])
    assert sorted(first) == sorted([control, strict_high, normal_heavy])
    second = await claim_ids(conn, control=1, strict=1, groups=[(None, 1)])
    assert sorted(second) == sorted([strict_low, normal_light])
    assert await claim_ids(conn, control=1, strict=1, groups=[(None, 1)]) == []


async def test_control_is_claimed_outside_the_strict_cap(conn: asyncpg.Connection) -> None:
    await insert_tasks(conn, [NewTask(priority=3)] * 3)
    control = await insert_task(conn, control_task())
    # The strict lane never takes the control task, however much room it has.
    strict_only = await claim(conn, strict=10)
    assert len(strict_only.ids) == 3
    assert control not in strict_only.ids
    # A strict cap of 0 (maxStrictPercentage = 0) still lets the control task through.
    assert await claim_ids(conn, control=1, strict=0) == [control]


async def test_control_is_not_claimed_without_a_control_slot(conn: asyncpg.Connection) -> None:
    await insert_task(conn, control_task())
    assert await claim_ids(conn, control=0, strict=5, groups=[(None, 5)]) == []


async def test_strict_limit_caps_strict_claims(conn: asyncpg.Connection) -> None:
    strict = await insert_tasks(conn, [NewTask(priority=p) for p in (1, 2, 3, 4, 5)])
    normal = await insert_tasks(conn, [NewTask()] * 5)
    got = await claim_ids(conn, strict=2, groups=[(None, 10)])
    # The two highest-priority strict tasks, and the normal lane never takes strict work.
    assert sorted(got) == sorted([strict[4], strict[3], *normal])
    assert await claim_ids(conn, strict=0, groups=[(None, 10)]) == []
    assert sorted(await claim_ids(conn, strict=10)) == sorted(strict[:3])


async def test_strict_lane_order_is_priority_then_created_at_then_id(
    conn: asyncpg.Connection,
) -> None:
    rng = random.Random(20261129)
    priorities = [rng.choice([1, 2, 7, CONTROL_PRIORITY - 1]) for _ in range(60)]
    # Weight must not matter in the strict lane; created_at ties leave the order to the id.
    ids = await insert_tasks(
        conn, [NewTask(priority=p, weight=rng.randint(1, 9)) for p in priorities]
    )
    offsets = {task_id: rng.randint(0, 4) for task_id in ids}
    await set_created_at(conn, offsets)
    priority_of = dict(zip(ids, priorities, strict=True))
    expected = sorted(ids, key=lambda i: (-priority_of[i], offsets[i], i))

    taken: list[int] = []
    while len(taken) < len(ids):
        k = rng.randint(1, 5)
        got = await claim_ids(conn, strict=k)
        # Each batch is exactly the next k of the lane order.
        assert sorted(got) == sorted(expected[len(taken) : len(taken) + k])
        taken.extend(sorted(got, key=expected.index))
    assert taken == expected
    assert await claim_ids(conn, strict=5) == []


async def test_probe_reports_strict_work_waiting_when_the_cap_is_full(
    conn: asyncpg.Connection,
) -> None:
    normal = await insert_task(conn)
    empty = await claim(conn, strict=0, probe_strict=True)
    assert (empty.strict_waiting, empty.ids) == (False, [])

    delayed = await insert_task(conn, NewTask(priority=4, delay=3600))
    assert (await claim(conn, probe_strict=True)).strict_waiting is False
    await conn.execute(
        "UPDATE taskfleet.tasks SET run_after = now() - interval '1 second' WHERE id = $1", delayed
    )
    probed = await claim(conn, strict=0, probe_strict=True, groups=[(None, 1)])
    assert (probed.strict_waiting, probed.ids) == (True, [normal])
    # Without the probe the flag stays false, and the strict task is still there.
    assert (await claim(conn, probe_strict=False)).strict_waiting is False
    assert await claim_ids(conn, strict=1) == [delayed]


async def test_probe_reports_normal_work_waiting_when_every_slot_went_strict(
    conn: asyncpg.Connection,
) -> None:
    strict = await insert_task(conn, NewTask(priority=2))
    delayed = await insert_task(conn, NewTask(delay=3600))
    got = await claim(conn, strict=1, probe_normal=True)
    assert (got.ids, got.normal_waiting, got.strict_waiting) == ([strict], False, False)

    ready = await insert_task(conn, NewTask(labels=["a"]))
    got = await claim(conn, strict=1, probe_normal=True)
    assert (got.ids, got.normal_waiting) == ([], True)
    assert (await claim(conn, strict=1, probe_normal=False)).normal_waiting is False
    # The probe takes nothing: the task is still there for the next claim.
    assert await claim_ids(conn, configured=["a"], groups=[("a", 5), (None, 5)]) == [ready]
    assert (await claim(conn, probe_normal=True)).normal_waiting is False
    assert (await conn.fetchval("SELECT status FROM taskfleet.tasks WHERE id = $1", delayed)) == (
        "pending"
    )


# --------------------------------------------------------------------------------------------
# run_after and weights
# --------------------------------------------------------------------------------------------


async def test_tasks_whose_run_after_is_in_the_future_are_not_claimed(
    conn: asyncpg.Connection,
) -> None:
    later = await insert_tasks(
        conn,
        [
            NewTask(delay=3600),
            NewTask(priority=3, delay=3600),
            NewTask(labels=["a"], delay=3600),
            replace(control_task(), delay=3600),
        ],
    )
    now = await insert_task(conn, NewTask(delay=0))
    everything = {"control": 1, "strict": 10, "groups": [("a", 10), (None, 10)]}
    assert await claim_ids(conn, configured=["a"], **everything) == [now]
    assert await claim_ids(conn, configured=["a"], **everything) == []
    await conn.execute(
        "UPDATE taskfleet.tasks SET run_after = now() - interval '1 second' "
        "WHERE id = ANY($1::bigint[])",
        later,
    )
    assert sorted(await claim_ids(conn, configured=["a"], **everything)) == sorted(later)


async def test_normal_lane_order_is_weight_then_created_at_then_id(
    conn: asyncpg.Connection,
) -> None:
    rng = random.Random(7)
    weights = [rng.randint(1, 4) for _ in range(40)]
    ids = await insert_tasks(conn, [NewTask(weight=w) for w in weights])
    offsets = {task_id: rng.randint(0, 3) for task_id in ids}
    await set_created_at(conn, offsets)
    weight_of = dict(zip(ids, weights, strict=True))
    expected = sorted(ids, key=lambda i: (-weight_of[i], offsets[i], i))
    taken: list[int] = []
    while len(taken) < len(ids):
        got = await claim_ids(conn, groups=[(None, 1)])
        assert len(got) == 1
        taken.extend(got)
    assert taken == expected


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


async def test_task_with_several_configured_labels_is_claimed_only_by_its_smallest(
    conn: asyncpg.Connection,
) -> None:
    configured = ["a", "b", "c"]
    task_id = await insert_task(conn, NewTask(labels=["c", "a"]))
    for group in ("c", "b", None):
        assert await claim_ids(conn, configured=configured, groups=[(group, 10)]) == []
    # Asking for every group at once still claims it once, under "a".
    got = await claim(conn, configured=configured, groups=[("c", 5), ("a", 5), (None, 5)])
    assert got.ids == [task_id]
    assert await claim_ids(conn, configured=configured, groups=[("a", 10)]) == []


async def test_default_group_is_tasks_without_a_configured_label(
    conn: asyncpg.Connection,
) -> None:
    unlabelled, unconfigured, configured_only, mixed = await insert_tasks(
        conn,
        [NewTask(), NewTask(labels=["x"]), NewTask(labels=["a"]), NewTask(labels=["x", "a"])],
    )
    got = await claim_ids(conn, configured=["a"], groups=[(None, 10)])
    assert sorted(got) == sorted([unlabelled, unconfigured])
    got = await claim_ids(conn, configured=["a"], groups=[("a", 10)])
    assert sorted(got) == sorted([configured_only, mixed])


async def test_group_is_decided_by_code_point_order(conn: asyncpg.Connection) -> None:
    # "B" < "a" < "z" < "é" by code point (COLLATE "C"), whatever the database's locale says.
    configured = ["a", "B", "z", "é"]
    upper, plain, accented = await insert_tasks(
        conn,
        [NewTask(labels=["a", "B"]), NewTask(labels=["é", "a"]), NewTask(labels=["é", "z"])],
    )
    assert await claim_ids(conn, configured=configured, groups=[("a", 10)]) == [plain]
    assert await claim_ids(conn, configured=configured, groups=[("B", 10)]) == [upper]
    assert await claim_ids(conn, configured=configured, groups=[("é", 10)]) == []
    assert await claim_ids(conn, configured=configured, groups=[("z", 10)]) == [accented]


ALPHABET = ["a", "b", "c", "B", "ab", "a-b", "a_b", "é", "z", "x y", "Ω"]
UNCONFIGURABLE = ["q", "r"]


@pytest.mark.parametrize("seed", range(6))
async def test_sql_groups_and_quotas_match_the_pure_policy(
    conn: asyncpg.Connection, seed: int
) -> None:
    """Random label sets and configurations: each group claim returns exactly the next tasks of
    that group (by ``group_for_labels``) in (weight DESC, created_at, id) order, never another
    group's task or a strict one, and every normal task is claimed exactly once."""
    rng = random.Random(seed)
    configured = sorted(rng.sample(ALPHABET, rng.randint(0, 5)))
    specs = [
        NewTask(
            labels=rng.sample(ALPHABET + UNCONFIGURABLE, rng.randint(0, 4)),
            weight=rng.randint(1, 3),
            priority=rng.choice([0, 0, 0, 0, 6]),
        )
        for _ in range(150)
    ]
    ids = await insert_tasks(conn, specs)
    offsets = {task_id: rng.randint(0, 2) for task_id in ids}
    await set_created_at(conn, offsets)

    spec_of = dict(zip(ids, specs, strict=True))
    queues: dict[GroupKey, list[int]] = {}
    for task_id in sorted(
        (i for i in ids if spec_of[i].priority == 0),
        key=lambda i: (-spec_of[i].weight, offsets[i], i),
    ):
        queues.setdefault(group_for_labels(spec_of[task_id].labels, configured), []).append(task_id)
    keys: list[GroupKey] = [*configured, None]

    claimed: list[int] = []
    for _ in range(500):
        quotas = [(g, rng.randint(0, 6)) for g in rng.sample(keys, rng.randint(1, len(keys)))]
        got = await claim_ids(conn, configured=configured, groups=quotas)
        by_group: dict[GroupKey, set[int]] = {}
        for task_id in got:
            assert spec_of[task_id].priority == 0
            group = group_for_labels(spec_of[task_id].labels, configured)
            by_group.setdefault(group, set()).add(task_id)
        expected: dict[GroupKey, set[int]] = {}
        for group, n in quotas:
            head, queues[group] = queues.get(group, [])[:n], queues.get(group, [])[n:]
            if head:
                expected[group] = set(head)
        assert by_group == expected, (configured, quotas)
        claimed.extend(got)
        if not any(queues.values()):
            break

    assert not any(queues.values())
    assert sorted(claimed) == sorted(i for i in ids if spec_of[i].priority == 0)
    assert await claim_ids(conn, configured=configured, groups=[(g, 50) for g in keys]) == []
    strict_left = await conn.fetchval(
        "SELECT count(*) FROM taskfleet.tasks WHERE status = 'pending' AND priority > 0"
    )
    assert strict_left == sum(1 for s in specs if s.priority > 0)


async def _random_backlog(
    conn: asyncpg.Connection, rng: random.Random, worker_id: str
) -> tuple[list[GroupKey], list[NewTask], list[int]]:
    """A random table for the claim variants' comparisons (lanes, groups, weights, ties, types,
    future run_after) and a registered worker: the group keys to ask, the specs, the ids."""
    configured = sorted(rng.sample(ALPHABET, rng.randint(0, 4)))
    await ensure_grouping(conn, configured)
    await register_worker(conn, worker_id)
    specs = [
        NewTask(
            type=rng.choice(["demo.echo", "demo.echo", "demo.sleep", "other.type"]),
            labels=rng.sample(ALPHABET + UNCONFIGURABLE, rng.randint(0, 3)),
            weight=rng.randint(1, 3),
            priority=rng.choice([0, 0, 0, 4, 9]),
            delay=rng.choice([None, None, None, 3600.0]),
        )
        for _ in range(120)
    ]
    ids = await insert_tasks(conn, specs)
    await set_created_at(conn, {task_id: rng.randint(0, 3) for task_id in ids})
    return [*configured, None], specs, ids


def _random_plan(
    rng: random.Random, keys: list[GroupKey], worker_id: str, *, strict_limit: int
) -> dict[str, Any]:
    """A claim's parameters but the outcomes: random groups, quotas and paused labels."""
    return {
        "control_limit": 0,
        "strict_limit": strict_limit,
        "group_keys": (picked := rng.sample(keys, rng.randint(1, len(keys)))),
        "group_limits": [rng.randint(0, 5) for _ in picked],
        "probe_strict": False,
        "probe_normal": False,
        "worker_id": worker_id,
        "lease_ttl": LEASE_TTL,
        "types": ["demo.echo", "demo.sleep"],
        "tags": [],
        "paused_labels": rng.sample(ALPHABET, rng.randint(0, 1)),
    }


async def _answers(
    conn: asyncpg.Connection, queries: Sequence[q.Query], params: dict[str, Any]
) -> list[list[dict[str, Any]]]:
    """What each query answers to ``params``, each run in a transaction rolled back, without
    the clocks of each run."""
    moving = {"started_at", "lease_expires_at", "wait_seconds"}
    answers = []
    for query in queries:
        transaction = conn.transaction()
        await transaction.start()
        try:
            rows = await run(conn, query, **params)
        finally:
            await transaction.rollback()
        answers.append([{k: v for k, v in r.items() if k not in moving} for r in rows])
    return answers


@pytest.mark.parametrize("seed", range(4))
async def test_the_steady_claim_takes_and_writes_exactly_what_the_claim_does(
    conn: asyncpg.Connection, seed: int
) -> None:
    """task_claim_steady is task_claim without the probes (ClaimPlan.probes): on random tables
    (lanes, groups, weights, ties, types, future run_after, running tasks to finish) and random
    plans, both take the same rows in the same order and write the same outcomes; the steady
    one answers no probe (the worker does not trust its shortfalls)."""
    rng = random.Random(seed)
    keys, _, _ = await _random_backlog(conn, rng, "w-steady")
    running = await claim_ids(conn, worker_id="w-steady", strict=5, groups=[(None, 5)])
    taken = finished = 0
    for _ in range(12):
        outcomes = [(i, rng.choice(["completed", "failed", "pending"])) for i in running]
        params = {
            **outcome_params(outcomes, error="boom", attempts=[1] * len(outcomes)),
            **_random_plan(rng, keys, "w-steady", strict_limit=rng.randint(0, 4)),
        }
        full, steady = await _answers(conn, [q.task_claim, q.task_claim_steady], params)
        assert list(full[0].keys()) == list(steady[0].keys())
        assert [{k: v for k, v in r.items() if k not in ANSWERS} for r in full] == [
            {k: v for k, v in r.items() if k not in ANSWERS} for r in steady
        ]
        taken += sum(1 for r in steady if r["id"] is not None)
        finished += len(steady[0]["finished_ids"])
        for row in steady:
            assert (row["strict_waiting"], row["normal_waiting"], row["strict_contended"]) == (
                False,
                False,
                False,
            )
            assert row["contended_groups"] == []
        # Then take them for real (with the full claim) and go on from there.
        rows = await run(conn, q.task_claim, **params)
        running = [r["id"] for r in rows if r["id"] is not None]
    assert taken > 10 and finished > 10  # the comparison compared something


@pytest.mark.parametrize("seed", range(3))
async def test_the_normal_only_claim_takes_what_the_steady_claim_takes(
    conn: asyncpg.Connection, seed: int
) -> None:
    """task_claim_normal is task_claim_steady for a plan that asks nothing of the control and
    strict lanes and carries no outcomes (a lone worker draining a backlog): on random tables
    and random quotas, both take the same rows in the same order and answer the same; neither
    takes a strict or control task."""
    rng = random.Random(seed)
    keys, specs, _ = await _random_backlog(conn, rng, "w-normal")
    taken = 0
    for _ in range(12):
        params = {**outcome_params([]), **_random_plan(rng, keys, "w-normal", strict_limit=0)}
        steady, normal = await _answers(conn, [q.task_claim_steady, q.task_claim_normal], params)
        assert list(steady[0].keys()) == list(normal[0].keys())
        assert steady == normal
        got = [r for r in normal if r["id"] is not None]
        assert all(r["priority"] == 0 for r in got)
        taken += len(got)
        await run(conn, q.task_claim_normal, **params)  # take them, and go on from there
    assert taken > 10  # the comparison compared something
    strict_left = await conn.fetchval(
        "SELECT count(*) FROM taskfleet.tasks WHERE status = 'pending' AND priority > 0"
    )
    assert strict_left == sum(1 for s in specs if s.priority > 0)


#: The columns only the probes answer (the steady claim returns them as "nothing asked").
ANSWERS = {"strict_waiting", "normal_waiting", "contended_groups", "strict_contended"}


# --------------------------------------------------------------------------------------------
# Submission (what the claim reads)
# --------------------------------------------------------------------------------------------


async def test_insert_batch_keeps_order_and_deduplicates_unfinished_unique_keys(
    conn: asyncpg.Connection,
) -> None:
    first = await insert_task(conn, NewTask(unique_key="k1", labels=["b", "a"], payload={"n": 1}))
    rows = await run(
        conn,
        q.task_insert_batch,
        types=["demo.echo"] * 4,
        payloads=['{"n": 2}', '{"n": 3}', '{"n": 4}', '{"n": 5}'],
        priorities=[0, 4, 0, 0],
        weights=[1, 1, 2, 1],
        labels=['["x"]', "[]", "[]", "[]"],
        max_attempts=[3] * 4,
        delays=[None] * 4,
        run_ats=[None] * 4,
        timeouts=[None, 2.5, None, None],
        unique_keys=["k1", None, "k2", "k2"],
        requires=["[]"] * 4,
        wake_hint="",
    )
    assert [(r["ord"], r["deduplicated"], r["input_unique_key"]) for r in rows] == [
        (1, True, "k1"),
        (2, False, None),
        (3, False, "k2"),
        (4, True, "k2"),
    ]
    assert [r["payload"] for r in rows] == [None, {"n": 3}, {"n": 4}, None]
    assert (rows[1]["priority"], rows[1]["timeout"]) == (4, 2.5)
    assert (await conn.fetchrow("SELECT labels FROM taskfleet.tasks WHERE id = $1", first))[
        "labels"
    ] == ["b", "a"]

    # Once the task holding a key is finished, the key is free again.
    await conn.execute("UPDATE taskfleet.tasks SET status = 'completed' WHERE id = $1", first)
    again = await insert_task(conn, NewTask(unique_key="k1"))
    assert again != first


async def test_a_claim_takes_only_the_types_the_worker_knows(conn: asyncpg.Connection) -> None:
    known, unknown_strict, unknown_normal = await insert_tasks(
        conn,
        [NewTask(), NewTask(type="new.kind", priority=5), NewTask(type="new.kind")],
    )
    assert await claim_ids(conn, strict=2, groups=[(None, 2)], types=["demo.echo"]) == [known]
    assert await claim_ids(conn, strict=2, groups=[(None, 2)], types=["demo.echo"]) == []
    # Work of unknown types is not "waiting" for this worker either (it would spin on it).
    probe = await claim(conn, probe_strict=True, probe_normal=True, types=["demo.echo"])
    assert (probe.strict_waiting, probe.normal_waiting) == (False, False)
    probe = await claim(conn, probe_strict=True, probe_normal=True, types=["new.kind"])
    assert (probe.strict_waiting, probe.normal_waiting) == (True, True)
    # A worker that knows the type takes them.
    assert sorted(await claim_ids(conn, strict=2, groups=[(None, 2)], types=["new.kind"])) == [
        unknown_strict,
        unknown_normal,
    ]


async def test_unrunnable_counts_pending_tasks_no_alive_worker_knows(
    conn: asyncpg.Connection,
) -> None:
    async def unknown() -> int:
        rows = {
            r["reason"]: int(r["tasks"])
            for r in await run(conn, q.metrics_unrunnable, limit=10_001)
        }
        assert set(rows) == {"unknown_type", "missing_tags"}
        return rows["unknown_type"]

    await insert_tasks(conn, [NewTask(), NewTask(type="new.kind"), NewTask(type="new.kind")])
    assert await unknown() == 3  # no alive worker at all
    await register_worker(conn, "w-old")  # knows the demo types
    assert await unknown() == 2
    await run(
        conn,
        q.worker_register,
        id="w-new",
        hostname="h",
        pid=2,
        concurrency=1,
        heartbeat_interval=3.0,
        lease_ttl=30.0,
        applied_config_version=0,
        metrics_port=None,
        task_types=["new.kind"],
        tags=[],
    )
    assert await unknown() == 0
    await conn.execute("UPDATE taskfleet.workers SET status = 'offline' WHERE id = 'w-new'")
    assert await unknown() == 2
