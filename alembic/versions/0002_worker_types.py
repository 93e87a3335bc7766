"""Worker task types; a task whose cancel was requested is never pending.

- ``workers.task_types``: the task types each worker has handlers for. A worker claims only
  those, so a type no alive worker knows stays pending (during a rolling deploy, old workers
  leave the new version's work alone); ``GET /workers`` shows them and the API counts pending
  tasks nobody can run.
- ``tasks_cancel_never_pending``: a task whose cancel was requested ends ``cancelled`` at its
  next transition (retry, lease rescue, drain release), so it can never be claimed again. Rows
  left pending with a cancel request by earlier versions are cancelled first.

Revision ID: 0002_worker_types
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002_worker_types"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE taskfleet.workers ADD COLUMN task_types text[] NOT NULL DEFAULT '{}'")
    op.execute(
        """
        UPDATE taskfleet.tasks
        SET status = 'cancelled', finished_at = now(), worker_id = NULL,
            last_error = 'cancelled: requested before a retry put it back in the queue'
        WHERE status = 'pending' AND cancel_requested
        """
    )
    op.execute(
        "ALTER TABLE taskfleet.tasks ADD CONSTRAINT tasks_cancel_never_pending "
        "CHECK (NOT (status = 'pending' AND cancel_requested))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE taskfleet.tasks DROP CONSTRAINT tasks_cancel_never_pending")
    op.execute("ALTER TABLE taskfleet.workers DROP COLUMN task_types")
