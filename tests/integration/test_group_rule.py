"""The group rule has two homes, the database's ``taskfleet.task_group_key`` (the stored key) and
``group_for_labels`` (the worker's bookkeeping): they must agree on every input."""

from __future__ import annotations

import json

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskfleet.shared.policy.groups import group_for_labels

LABELS = st.lists(
    st.sampled_from(["a", "b", "B", "Z", "a0", "ab", "é", "tenant-1", "tenant-10", "x y", "ß"]),
    max_size=6,
)


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(labels=LABELS, configured=LABELS)
async def test_sql_and_python_rules_agree(
    conn: asyncpg.Connection, labels: list[str], configured: list[str]
) -> None:
    key = await conn.fetchval(
        "SELECT taskfleet.task_group_key($1::text[], $2::text[])", labels, configured
    )
    expected = group_for_labels(labels, configured)
    assert key == ("" if expected is None else expected)


async def test_the_current_grouping_applies_to_any_insert(conn: asyncpg.Connection) -> None:
    """A row inserted without a key (another enqueue path, raw SQL) gets it from the trigger,
    under the configured labels in force; so does a task returning to pending."""
    await conn.execute(
        "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)"
        """ VALUES ('r', '{"labelWeights": {"b": 1, "c": 2}}')"""
    )
    task_id = await conn.fetchval(
        "INSERT INTO taskfleet.tasks (type, labels) VALUES ('demo.echo', '{c,b,z}') RETURNING id"
    )
    assert (
        await conn.fetchval("SELECT group_key FROM taskfleet.tasks WHERE id = $1", task_id) == "b"
    )
    await conn.execute(
        "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)"
        """ VALUES ('r2', '{"labelWeights": {"c": 2}}')"""
    )
    await conn.execute("UPDATE taskfleet.tasks SET status = 'running' WHERE id = $1", task_id)
    await conn.execute("UPDATE taskfleet.tasks SET status = 'pending' WHERE id = $1", task_id)
    assert (
        await conn.fetchval("SELECT group_key FROM taskfleet.tasks WHERE id = $1", task_id) == "c"
    )


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(labels=LABELS, configured=LABELS)
async def test_the_trigger_applies_the_rule_to_the_task_s_own_labels(
    conn: asyncpg.Connection, labels: list[str], configured: list[str]
) -> None:
    """The key the trigger writes, on insert and on a return to pending, is the rule applied to
    the task's labels, whatever they are: none configured, none at all, several. (The
    one-argument ``task_group_key`` once read its ``labels`` parameter as the grouping's own
    column, giving every task the smallest configured label; a task carrying a configured label
    hid it.)"""
    async with conn.transaction():
        payload = json.dumps({"labelWeights": dict.fromkeys(configured, 1)})
        await conn.execute(
            "INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)"
            " VALUES (gen_random_uuid()::text, $1::jsonb)",
            payload,
        )
        expected = group_for_labels(labels, configured)
        want = "" if expected is None else expected
        task_id = await conn.fetchval(
            "INSERT INTO taskfleet.tasks (type, labels) VALUES ('demo.echo', $1) RETURNING id",
            labels,
        )
        key = await conn.fetchval("SELECT group_key FROM taskfleet.tasks WHERE id = $1", task_id)
        assert key == want, (labels, configured)
        await conn.execute(
            "UPDATE taskfleet.tasks SET status = 'running', group_key = 'stale' WHERE id = $1",
            task_id,
        )
        await conn.execute("UPDATE taskfleet.tasks SET status = 'pending' WHERE id = $1", task_id)
        key = await conn.fetchval("SELECT group_key FROM taskfleet.tasks WHERE id = $1", task_id)
        assert key == want, (labels, configured)
