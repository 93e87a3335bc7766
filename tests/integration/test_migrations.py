"""The Alembic migrations: from empty, one head, down and up again, concurrent runs, and the
migrated schema equal to ``taskfleet.shared.schema`` (docs/reference.md#task-states,
CONTRIBUTING.md#add-a-migration).

Migrations run their own event loop, so these tests are synchronous and reach the database
through short ``asyncio.run`` calls.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import CheckConstraint
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from taskfleet.shared import migrations
from taskfleet.shared import queries as q
from taskfleet.shared.db import asyncpg_dsn, sqlalchemy_url
from taskfleet.shared.schema import SCHEMA, TaskStatus, WorkerStatus, metadata
from tests.pg import with_database

REPO = Path(__file__).resolve().parents[2]
TABLES = {
    "tasks",
    "workers",
    "worker_runtime_configs",
    "task_groupings",
    "label_limits",
    "label_limit_releases",
    "schedules",
}


async def _fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    return asyncio.run(_fetch(url, sql, *args))


def tables(url: str) -> set[str]:
    rows = fetch(url, "SELECT tablename FROM pg_tables WHERE schemaname = $1", SCHEMA)
    return {r["tablename"] for r in rows}


def versions(url: str) -> list[str]:
    if "alembic_version" not in tables(url):
        return []
    return [r["version_num"] for r in fetch(url, q.schema_revision.sql)]


@pytest.fixture
def empty_database_url(pg_server_url: str) -> Iterator[str]:
    """A brand-new database with nothing in it (not the migrated template's clone)."""
    name = f"tf_empty_{uuid.uuid4().hex[:12]}"
    fetch(with_database(pg_server_url, "postgres"), f'CREATE DATABASE "{name}"')
    url = with_database(pg_server_url, name)
    try:
        yield url
    finally:
        fetch(with_database(pg_server_url, "postgres"), f'DROP DATABASE "{name}" WITH (FORCE)')


def schema_differences(url: str) -> list[Any]:
    """What autogenerate would change to match ``taskfleet.shared.schema.metadata``."""

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        if type_ == "schema":
            return name == SCHEMA
        if type_ == "table":
            return name != migrations.VERSION_TABLE
        return True

    def compare(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                "include_name": include_name,
                "compare_type": True,
                "compare_server_default": True,
                "version_table_schema": SCHEMA,
            },
        )
        return list(compare_metadata(context, metadata))

    async def run() -> list[Any]:
        engine = create_async_engine(sqlalchemy_url(url))
        try:
            async with engine.connect() as connection:
                return await connection.run_sync(compare)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def test_the_migrations_have_exactly_one_head() -> None:
    script = ScriptDirectory(migrations.script_location())
    heads = script.get_heads()
    assert heads == [migrations.head_revision()]
    # Every revision is on the one line from base to head.
    chain = [rev.revision for rev in script.walk_revisions("base", "heads")]
    assert len(chain) == len(list(script.walk_revisions()))
    assert chain[0] == heads[0]
    assert script.get_revision(chain[-1]).down_revision is None


def test_upgrade_from_an_empty_database_reaches_head(empty_database_url: str) -> None:
    assert tables(empty_database_url) == set()
    migrations.upgrade(empty_database_url)
    assert versions(empty_database_url) == [migrations.head_revision()]
    assert tables(empty_database_url) == TABLES | {migrations.VERSION_TABLE}
    # Upgrading a database at head is a no-op.
    again = migrations.upgrade(empty_database_url)
    assert versions(empty_database_url) == [migrations.head_revision()]
    assert not again.changed and again.functions == ()


def test_upgrade_creates_the_server_side_functions_once(empty_database_url: str) -> None:
    names = tuple(q.server_function_name(query) for query in q.SERVER_FUNCTIONS)
    assert migrations.upgrade(empty_database_url).functions == names
    for name in names:
        assert fetch(empty_database_url, f"SELECT to_regproc('{name}') IS NOT NULL AS ok")[0]["ok"]
    # One dropped (a database migrated by other code): the next run creates just that one.
    fetch(empty_database_url, f"DROP FUNCTION {names[0]}")
    assert migrations.upgrade(empty_database_url).functions == names[:1]
    assert migrations.upgrade(empty_database_url).functions == ()
    # One whose stamp differs (as when a migration changed a column type it returns, so the
    # statement's described types no longer give the same CREATE): dropped and created again.
    fetch(empty_database_url, f"COMMENT ON FUNCTION {names[1]} IS 'taskfleet stale'")
    assert migrations.upgrade(empty_database_url).functions == names[1:2]
    stamp = fetch(
        empty_database_url, f"SELECT obj_description(to_regproc('{names[1]}'), 'pg_proc') AS s"
    )[0]["s"]
    assert stamp.startswith("taskfleet ") and stamp != "taskfleet stale"
    assert migrations.upgrade(empty_database_url).functions == ()


def test_downgrade_to_base_then_upgrade_again(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url)
    fetch(empty_database_url, "INSERT INTO taskfleet.tasks (type) VALUES ('demo.echo')")

    migrations.downgrade(empty_database_url, "base")
    assert tables(empty_database_url) <= {migrations.VERSION_TABLE}
    assert versions(empty_database_url) == []

    migrations.upgrade(empty_database_url)
    assert versions(empty_database_url) == [migrations.head_revision()]
    assert fetch(empty_database_url, "SELECT count(*) AS n FROM taskfleet.tasks")[0]["n"] == 0
    assert schema_differences(empty_database_url) == []


def test_concurrent_upgrades_of_one_empty_database_all_succeed(empty_database_url: str) -> None:
    # Separate processes, as several containers running `taskfleet migrate` at once would be.
    script = "import sys; from taskfleet.shared.migrations import upgrade; upgrade(sys.argv[1])"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, empty_database_url],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = [(run.wait(timeout=120), run.communicate()[1]) for run in runs]
    assert [code for code, _ in outcomes] == [0, 0, 0, 0], [err for _, err in outcomes]
    assert versions(empty_database_url) == [migrations.head_revision()]
    assert tables(empty_database_url) == TABLES | {migrations.VERSION_TABLE}
    assert schema_differences(empty_database_url) == []


def test_migrated_schema_matches_the_metadata(database_url: str) -> None:
    assert schema_differences(database_url) == []
    # compare_metadata sees neither CHECK constraints nor partial-index predicates: compare
    # those with the catalog.
    rows = fetch(
        database_url,
        "SELECT con.conname, pg_get_constraintdef(con.oid) AS def "
        "FROM pg_constraint con JOIN pg_namespace n ON n.oid = con.connamespace "
        "WHERE n.nspname = $1 AND con.contype = 'c'",
        SCHEMA,
    )
    checks = {r["conname"]: _normalise(r["def"].removeprefix("CHECK ")) for r in rows}
    assert checks == {
        constraint.name: _normalise(str(constraint.sqltext))
        for table in metadata.tables.values()
        for constraint in table.constraints
        if isinstance(constraint, CheckConstraint)
    }

    indexes = fetch(
        database_url,
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1",
        SCHEMA,
    )
    predicates = {
        r["indexname"]: _normalise(r["indexdef"].split(" WHERE ", 1)[1])
        for r in indexes
        if " WHERE " in r["indexdef"]
    }
    assert predicates == {
        index.name: _normalise(str(index.dialect_options["postgresql"]["where"]))
        for table in metadata.tables.values()
        for index in table.indexes
        if index.dialect_options["postgresql"]["where"] is not None
    }


def test_the_schema_comparison_notices_drift(database_url: str) -> None:
    # The check above must be able to fail: drift the database and it reports each change.
    for statement in (
        "DROP INDEX taskfleet.tasks_claim_normal_idx",
        "ALTER TABLE taskfleet.workers ADD COLUMN stray integer",
        "ALTER TABLE taskfleet.tasks ALTER COLUMN timeout TYPE real",
    ):
        fetch(database_url, statement)
    kinds = {
        (diff[0][0] if isinstance(diff, list) else diff[0])
        for diff in schema_differences(database_url)
    }
    assert kinds == {"add_index", "remove_column", "modify_type"}


def _normalise(sql: str) -> str:
    """An expression without Postgres' casts, parentheses and ``= ANY (ARRAY[...])`` spelling."""
    text = re.sub(r"::(double precision|timestamp with time zone|\w+)(\[\])?", "", sql)
    text = re.sub(r"= ANY \(ARRAY\[(.*?)\]\)", r"IN (\1)", text)
    text = text.replace("(", " ").replace(")", " ").replace(",", " ")
    return " ".join(text.split())


def _check_values(url: str, constraint: str) -> set[str]:
    (row,) = fetch(
        url,
        "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conname = $1",
        constraint,
    )
    return set(re.findall(r"'([^']*)'", row["def"]))


def test_status_check_constraints_equal_the_python_enums(database_url: str) -> None:
    assert _check_values(database_url, "tasks_status_valid") == {s.value for s in TaskStatus}
    assert _check_values(database_url, "workers_status_valid") == {s.value for s in WorkerStatus}


@pytest.mark.parametrize(
    ("table", "column", "values"),
    [("tasks", "status", TaskStatus), ("workers", "status", WorkerStatus)],
)
def test_the_database_accepts_every_enum_value_and_nothing_else(
    database_url: str, table: str, column: str, values: type[Any]
) -> None:
    async def attempt() -> tuple[set[str], bool]:
        conn = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            insert = (
                "INSERT INTO taskfleet.tasks (type, status) VALUES ('demo.echo', $1)"
                if table == "tasks"
                else "INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status) "
                "VALUES (gen_random_uuid()::text, 'h', 1, 1, $1)"
            )
            accepted = set()
            for value in values:
                await conn.execute(insert, value.value)
                accepted.add(value.value)
            try:
                await conn.execute(insert, "bogus")
            except asyncpg.CheckViolationError:
                return accepted, True
            return accepted, False
        finally:
            await conn.close()

    accepted, rejected = asyncio.run(attempt())
    assert accepted == {v.value for v in values}
    assert rejected, f"{table}.{column} accepted a value outside the enum"
