"""Test databases: one migrated template per session, one fresh clone per test.

Tests can commit and NOTIFY freely: each gets its own database (``CREATE DATABASE ... TEMPLATE``),
never a shared one cleaned with DELETE. The machinery is the one users get in
``taskfleet.testing``, so the recipe in docs/python.md is the one this suite runs on.
"""

from __future__ import annotations

from taskfleet.testing import TemplateDatabases, with_database

__all__ = ["TestDatabases", "with_database"]


class TestDatabases(TemplateDatabases):
    """Creates the template once and clones it per test."""

    __test__ = False  # not a test class, whatever its name
