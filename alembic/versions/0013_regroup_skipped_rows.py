"""Re-grouping walks its ranges again when a row it skipped still has its old group.

Revision ID: 0013_regroup_skipped_rows
Revises: 0012_enqueue_delay_statement
Create Date: 2026-12-04

``taskfleet.task_regroup_step`` walks the groups a change of the configured labels can move rows
out of, locking each batch with ``FOR UPDATE SKIP LOCKED``, and marked the grouping settled at
the end of the walk. A row locked at that moment (a claim's pick that a label limit left pending,
a cancel in flight) was skipped and kept its old group for good: with that group no longer in
any worker's rotation, the task was never claimed. The step now checks, before it settles,
whether a row of those ranges still has a group other than the rule's; if one has, it starts
the walk over (the next step walks again; a row locked for longer is retried step after step).
Only that end of the function changes: its definition is read from the database and written
back with that part replaced, so the rest of it (0003_group_key) is not repeated here.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013_regroup_skipped_rows"
down_revision: str | None = "0012_enqueue_delay_statement"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SETTLE = """    UPDATE taskfleet.task_groupings
    SET settled = true, cursor_key = NULL, cursor_id = NULL, waits_for = NULL
    WHERE version = g.version;"""

_CHECK_THEN_SETTLE = """    -- A row the walk skipped (locked at that moment) still has its old group: walk again.
    IF EXISTS (SELECT 1 FROM unnest(ranges) AS rr(key) CROSS JOIN LATERAL (
                   SELECT 1 FROM taskfleet.tasks t
                   WHERE t.status = 'pending' AND t.priority = 0 AND t.labels <> '{}'
                     AND t.group_key = rr.key
                     AND t.group_key <> taskfleet.task_group_key(t.labels, g.labels)
                   LIMIT 1) AS stale) THEN
        UPDATE taskfleet.task_groupings SET cursor_key = NULL, cursor_id = NULL
        WHERE version = g.version;
        RETURN QUERY SELECT 'regrouping'::text, step_scanned, step_moved;
        RETURN;
    END IF;
""" + _SETTLE


def _rewrite(old: str, new: str) -> None:
    op.execute(
        """
        DO $migration$
        DECLARE
            definition text := pg_get_functiondef('taskfleet.task_regroup_step(integer)'::regprocedure);
            old_text text := $old$"""
        + old
        + """$old$;
            new_text text := $new$"""
        + new
        + """$new$;
        BEGIN
            IF position(old_text IN definition) = 0 THEN
                RAISE EXCEPTION 'taskfleet.task_regroup_step: the part to replace is not there';
            END IF;
            EXECUTE replace(definition, old_text, new_text);
        END
        $migration$
        """
    )


def upgrade() -> None:
    _rewrite(_SETTLE, _CHECK_THEN_SETTLE)


def downgrade() -> None:
    _rewrite(_CHECK_THEN_SETTLE, _SETTLE)
