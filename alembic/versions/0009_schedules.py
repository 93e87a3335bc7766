"""Periodic tasks: the ``schedules`` table, and the schedule and slot a task was enqueued for.

``taskfleet.schedules`` holds one row per schedule (``PUT /schedules/{name}``, or declared in
code with ``@task(..., schedule=...)``): what to enqueue, when (``cron`` in ``timezone``, or
``every``), and ``next_run_at``, the slot it fires next. The workers fire a due schedule by
advancing that row with a conditional UPDATE (only from the slot they read) and inserting its
task in the same statement, so a slot fires once however many workers try.

``tasks.schedule_name`` and ``tasks.schedule_slot`` say which schedule and slot a task was
enqueued for (NULL for every other task), under a unique index: a second task for the same
schedule and slot cannot be written, whatever happens to the schedules row. Adding the two
nullable columns rewrites nothing; the index build reads the table under a share lock (writes
wait) for about a second per million rows, and holds only the scheduled tasks.

Revision ID: 0009_schedules
Revises: 0008_retention
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009_schedules"
down_revision: str | None = "0008_retention"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE taskfleet.schedules (
            name text PRIMARY KEY,
            type text NOT NULL,
            payload jsonb NOT NULL DEFAULT '{}'::jsonb,
            cron text,
            every text,
            timezone text,
            priority integer NOT NULL DEFAULT 0,
            weight integer NOT NULL DEFAULT 1,
            labels text[] NOT NULL DEFAULT '{}'::text[],
            max_attempts integer NOT NULL DEFAULT 3,
            timeout double precision,
            source text NOT NULL DEFAULT 'api',
            revision bigint NOT NULL DEFAULT 1,
            next_run_at timestamptz NOT NULL,
            last_run_at timestamptz,
            last_task_id bigint,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT schedules_cron_or_every CHECK ((cron IS NULL) <> (every IS NULL)),
            CONSTRAINT schedules_source_valid CHECK (source IN ('api', 'code'))
        )
        """
    )
    op.execute("CREATE INDEX schedules_next_run_idx ON taskfleet.schedules (next_run_at)")
    op.execute(
        "ALTER TABLE taskfleet.tasks ADD COLUMN schedule_name text, "
        "ADD COLUMN schedule_slot timestamptz"
    )
    op.execute(
        "CREATE UNIQUE INDEX tasks_schedule_slot_idx ON taskfleet.tasks "
        "(schedule_name, schedule_slot) WHERE schedule_name IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX taskfleet.tasks_schedule_slot_idx")
    op.execute("ALTER TABLE taskfleet.tasks DROP COLUMN schedule_slot, DROP COLUMN schedule_name")
    op.execute("DROP TABLE taskfleet.schedules")
