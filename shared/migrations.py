"""Running the Alembic migrations (``taskfleet migrate``) and checking the schema is at head."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from taskfleet.shared.errors import OperatorError

SCHEMA = "taskfleet"
VERSION_TABLE = "alembic_version"
#: Key of the advisory lock every migration run holds for its transaction.
MIGRATION_LOCK_KEY = 7_243_118_001
#: Where the Alembic environment leaves the revisions it found, in the config's attributes.
REVISIONS_BEFORE = "taskfleet.revisions_before"
#: ... and the server-side functions it created (taskfleet.shared.server_functions).
FUNCTIONS_CREATED = "taskfleet.functions_created"


class UnknownRevision(OperatorError):
    """The database is at a revision this code does not know: a newer taskfleet migrated it."""

    def __init__(self, revisions: Sequence[str], head: str) -> None:
        found = ", ".join(revisions)
        super().__init__(
            f"the database schema is at revision {found}, which this taskfleet "
            f"(schema head {head}) does not know: a newer taskfleet migrated it. Run that newer "
            "taskfleet (its migrate, api and workers), or restore a backup taken before the "
            "upgrade; this version must not downgrade a schema it does not know"
        )
        self.revisions = list(revisions)
        self.head = head


@dataclass(frozen=True)
class UpgradeResult:
    """The schema revisions before and after ``taskfleet migrate``."""

    before: tuple[str, ...]
    after: str
    #: The server-side functions this run created (taskfleet.shared.server_functions).
    functions: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.before != (self.after,) or bool(self.functions)


def script_location() -> str:
    """The migrations folder: ``taskfleet/alembic`` (in a checkout, a link to the repository's
    ``alembic/``; installed, the packaged copy)."""
    return str(Path(__file__).parent.parent / "alembic")


def _config(database_url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", script_location())
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(script_location())
    head = script.get_current_head()
    if head is None:
        raise RuntimeError("no migration head")
    return head


def known_revisions() -> frozenset[str]:
    """Every revision this code's migrations define."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(script_location())
    return frozenset(rev.revision for rev in script.walk_revisions("base", "heads"))


def schema_problem(found: list[str], *, head: str, known: frozenset[str]) -> str | None:
    """Why a database whose ``alembic_version`` holds ``found`` cannot be used by this code
    (which expects ``head``), in one line with what to do; None when it can."""
    if found == [head]:
        return None
    if not found:
        return f"the schema is not migrated (expected revision {head}): run taskfleet migrate"
    shown = ", ".join(found)
    unknown = [r for r in found if r not in known]
    if unknown:
        return (
            f"the schema is at revision {shown}, which this code does not know (a newer "
            f"taskfleet migrated it; this code expects {head}): upgrade this process"
        )
    return f"the schema is at revision {shown}, this code expects {head}: run taskfleet migrate"


def upgrade(database_url: str, revision: str = "head") -> UpgradeResult:
    """``alembic upgrade`` under the advisory lock. Blocking; runs its own event loop.

    Raises :class:`UnknownRevision` when the database is at a revision this code does not know.
    """
    from alembic import command

    config = _config(database_url)
    command.upgrade(config, revision)
    before = tuple(config.attributes.get(REVISIONS_BEFORE, ()))
    after = head_revision() if revision == "head" else revision
    functions = tuple(config.attributes.get(FUNCTIONS_CREATED, ()))
    return UpgradeResult(before=before, after=after, functions=functions)


def downgrade(database_url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(_config(database_url), revision)


async def upgrade_async(database_url: str, revision: str = "head") -> UpgradeResult:
    """:func:`upgrade` from async code (the Alembic env starts its own event loop)."""
    return await asyncio.to_thread(upgrade, database_url, revision)
