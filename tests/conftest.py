from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.pg import TestDatabases


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """The Postgres server the tests use: DATABASE_URL when set."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.fail("DATABASE_URL is not set: run the suite with the README's test command")
    yield url


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
