"""``taskfleet migrate`` as an operator meets it: a no-op at head that needs no CREATE privilege,
and one line (no traceback) for each way the database can refuse it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from taskfleet.shared import queries
from taskfleet.shared.db import asyncpg_dsn
from taskfleet.shared.migrations import head_revision
from tests.e2e.cli import clean_env, one_error_line, run_taskfleet
from tests.pg import with_database

pytestmark = pytest.mark.e2e


def sql(url: str, *statements: str) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            rows: list[asyncpg.Record] = []
            for statement in statements:
                rows = await conn.fetch(statement)
            return rows
        finally:
            await conn.close()

    return asyncio.run(run())


def as_role(url: str, role: str) -> str:
    parts = urlsplit(asyncpg_dsn(url))
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


def migrate(url: str) -> tuple[int, str, str]:
    result = run_taskfleet("migrate", env=clean_env(DATABASE_URL=url))
    return result.returncode, result.stdout, result.stderr


@pytest.fixture
def role_without_create(database_url: str) -> Iterator[str]:
    """A login role that may read the schema but create nothing (no CREATE on the database)."""
    role = f"tf_nocreate_{uuid.uuid4().hex[:8]}"
    sql(database_url, f'CREATE ROLE "{role}" LOGIN')
    try:
        yield role
    finally:
        sql(database_url, f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"')


def test_migrate_at_head_is_a_no_op_that_needs_no_create_privilege(
    database_url: str, role_without_create: str
) -> None:
    role = role_without_create
    sql(
        database_url,
        f'REVOKE CREATE ON SCHEMA taskfleet FROM "{role}"',
        f'GRANT USAGE ON SCHEMA taskfleet TO "{role}"',
        f'GRANT SELECT ON taskfleet.alembic_version TO "{role}"',
    )
    code, out, err = migrate(as_role(database_url, role))
    assert code == 0, err
    assert out.strip() == f"schema already at {head_revision()}: nothing to do"
    assert err == ""


def test_a_role_without_create_on_an_empty_database_gets_one_line(
    empty_database_url: str,
) -> None:
    role = f"tf_nocreate_{uuid.uuid4().hex[:8]}"
    sql(empty_database_url, f'CREATE ROLE "{role}" LOGIN')
    try:
        result = run_taskfleet(
            "migrate", env=clean_env(DATABASE_URL=as_role(empty_database_url, role))
        )
        assert result.returncode == 1
        line = one_error_line(result)
        assert "permission denied" in line and "GRANT CREATE" in line
    finally:
        sql(empty_database_url, f'DROP ROLE "{role}"')


def test_upgrading_an_empty_database_says_from_what_to_what(empty_database_url: str) -> None:
    code, out, err = migrate(empty_database_url)
    assert code == 0, err
    assert out.strip().splitlines() == [
        f"schema upgraded from none (empty database) to {head_revision()}",
        *(
            f"created function {queries.server_function_name(query)}"
            " (its statement through a pooler)"
            for query in queries.SERVER_FUNCTIONS
        ),
    ]


def test_a_database_at_a_newer_unknown_revision_is_refused_and_left_alone(
    database_url: str,
) -> None:
    sql(database_url, "UPDATE taskfleet.alembic_version SET version_num = '9999_from_the_future'")
    result = run_taskfleet("migrate", env=clean_env(DATABASE_URL=database_url))
    assert result.returncode == 1
    line = one_error_line(result)
    assert "9999_from_the_future" in line and head_revision() in line and "newer" in line
    rows = sql(database_url, "SELECT version_num FROM taskfleet.alembic_version")
    assert [r["version_num"] for r in rows] == ["9999_from_the_future"]


@pytest.mark.parametrize(
    ("change", "exit_code", "says"),
    [
        ("refused_port", 1, "connection refused"),
        ("unknown_role", 2, "does not exist: create the role"),
        ("unknown_database", 2, "does not exist (at"),
    ],
)
def test_unreachable_or_unknown_targets_get_one_line(
    pg_server_url: str, change: str, exit_code: int, says: str
) -> None:
    url = asyncpg_dsn(with_database(pg_server_url, "postgres"))
    if change == "refused_port":
        url = "postgresql://postgres@127.0.0.1:1/postgres"
    elif change == "unknown_role":
        url = as_role(url, "no_such_role_tf")
    else:
        url = with_database(url, "no_such_database_tf")
    result = run_taskfleet("migrate", env=clean_env(DATABASE_URL=url))
    assert result.returncode == exit_code, result.stderr
    assert says in one_error_line(result)


def test_a_database_not_accepting_connections_gets_one_line(database_url: str) -> None:
    name = urlsplit(asyncpg_dsn(database_url)).path.lstrip("/")
    admin = with_database(database_url, "postgres")
    sql(admin, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    try:
        result = run_taskfleet("migrate", env=clean_env(DATABASE_URL=database_url))
        assert result.returncode == 1
        assert "not accepting connections" in one_error_line(result)
    finally:
        sql(admin, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


@pytest.fixture
def empty_database_url(pg_server_url: str) -> Iterator[str]:
    name = f"tf_empty_{uuid.uuid4().hex[:12]}"
    admin = with_database(pg_server_url, "postgres")
    sql(admin, f'CREATE DATABASE "{name}"')
    try:
        yield with_database(pg_server_url, name)
    finally:
        sql(admin, f'DROP DATABASE "{name}" WITH (FORCE)')
