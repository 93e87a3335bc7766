"""The group rule as a PL/pgSQL function: the same rule, a tenth of its cost per call.

Revision ID: 0011_group_key_plpgsql
Revises: 0010_controls
Create Date: 2026-12-04

``taskfleet.task_group_key(labels, configured)`` was a SQL function whose body holds a subquery
and an aggregate, so Postgres cannot inline it: it planned that body again on every statement
that called it, about 0.04 ms, a quarter of a single-task insert's server time (measured with a
scratch loop on ``SELECT taskfleet.task_group_key($1, $2)``: 0.16 ms a call against 0.12 for a
bare ``SELECT``). PL/pgSQL keeps the body's plan for the session, and returns the default group
without any query when the task has no labels or no label is configured (the common case). The
rule itself is unchanged (tests/integration/test_group_rule.py holds it against the Python
rule): the smallest configured label by code point, else '' (the default group).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011_group_key_plpgsql"
down_revision: str | None = "0010_controls"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE OR REPLACE FUNCTION taskfleet.task_group_key(labels text[], configured text[])
        RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        BEGIN
            IF labels IS NULL OR configured IS NULL
               OR cardinality(labels) = 0 OR cardinality(configured) = 0 THEN
                RETURN '';
            END IF;
            RETURN COALESCE(
                (SELECT min(l COLLATE "C") FROM unnest(labels) AS l WHERE l = ANY(configured)),
                '');
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute(
        """
        CREATE OR REPLACE FUNCTION taskfleet.task_group_key(labels text[], configured text[])
        RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT COALESCE(
                (SELECT min(l COLLATE "C") FROM unnest(labels) AS l WHERE l = ANY(configured)),
                '')
        $$
        """
    )
