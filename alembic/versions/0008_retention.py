"""Months of uptime: cheap queue gauges at depth, and fewer writes per running task.

- ``taskfleet.pending_estimate(lane, group_key)``: ``/metrics`` counts each lane's and group's pending tasks exactly up to a bound (a range of the
lane's claim index); past it, it reports this function's answer: the row estimate the planner
makes for the same predicate from the table's statistics (``EXPLAIN``, no row read). It is as
fresh as the last ``ANALYZE`` (autovacuum runs them as the table changes).
- ``tasks_running_lease_idx`` is dropped: a running task's lease is now its worker's heartbeat
  (the heartbeat writes no task row), and the lease sweep reads the running rows (no more than
  the fleet's slots) through ``tasks_running_worker_idx``. One index entry fewer per claim.

Dropping the index takes an exclusive lock on ``taskfleet.tasks`` for a moment (no scan).

Revision ID: 0008_retention
Revises: 0007_tasks_finished_index
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008_retention"
down_revision: str | None = "0007_tasks_finished_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = r"""
CREATE FUNCTION taskfleet.pending_estimate(lane text, group_key text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    plan json;
BEGIN
    EXECUTE format(
        'EXPLAIN (FORMAT JSON) SELECT 1 FROM taskfleet.tasks WHERE status = %L AND %s',
        'pending',
        CASE lane
            WHEN 'control' THEN 'priority = 2147483647'
            WHEN 'strict' THEN 'priority > 0 AND priority < 2147483647'
            ELSE format('priority = 0 AND group_key = %L', group_key)
        END
    ) INTO plan;
    RETURN round((plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint;
END
$$
"""
_COMMENT = r"""
COMMENT ON FUNCTION taskfleet.pending_estimate(text, text) IS
    'The planner''s estimate of the pending tasks of a lane (control, strict, normal) and, in '
    'the normal lane, a group key; used by /metrics past its exact-count bound.'
"""


def upgrade() -> None:
    op.execute(_FUNCTION)
    op.execute(_COMMENT)
    op.execute("DROP INDEX taskfleet.tasks_running_lease_idx")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX tasks_running_lease_idx ON taskfleet.tasks (lease_expires_at) "
        "WHERE status = 'running'"
    )
    op.execute("DROP FUNCTION taskfleet.pending_estimate(text, text)")
