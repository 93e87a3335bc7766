from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.pg import TestDatabases
from tests.pgbouncer import PgBouncer
from tests.pgbouncer import start as start_pgbouncer


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """The Postgres server the tests use: DATABASE_URL when set, else (or when
    TASKFLEET_TEST_EMBEDDED=1) an embedded server started for this session and stopped after it."""
    url = os.environ.get("DATABASE_URL")
    if url and os.environ.get("TASKFLEET_TEST_EMBEDDED") != "1":
        yield url
        return
    from taskfleet.shared.embedded import default_datadir, start_embedded

    try:
        url, server = start_embedded(default_datadir("pg-test"))
    except RuntimeError as exc:
        pytest.fail(f"no DATABASE_URL and no embedded Postgres: {exc}")
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def test_databases(pg_server_url: str) -> Iterator[TestDatabases]:
    dbs = TestDatabases(pg_server_url)
    dbs.setup()
    yield dbs
    dbs.teardown()


@pytest.fixture
def database_url(test_databases: TestDatabases) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    url = test_databases.create()
    yield url
    test_databases.drop(url)


@pytest.fixture(scope="session")
def pgbouncer(pg_server_url: str) -> Iterator[PgBouncer]:
    """A real PgBouncer in transaction mode in front of the test server (tests/pgbouncer.py)."""
    try:
        bouncer = start_pgbouncer(pg_server_url)
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    try:
        yield bouncer
    finally:
        bouncer.stop()
