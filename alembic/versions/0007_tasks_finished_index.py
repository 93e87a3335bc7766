"""An index on (status, finished_at) of finished tasks: recent outcomes without a table scan.

``GET /tasks/stats`` counts the tasks finished in the last minute per status and the tasks failed
in the last hour; with this index each is a short range scan however many finished rows the
table holds. It is the index a retention pruner needs too (finished tasks of one status older
than a cut-off). Pending and running rows have no ``finished_at`` and stay out of it, so the
submit and claim paths do not maintain it; a finish writes one entry.

On an existing table the build takes a share lock on ``taskfleet.tasks`` (writes wait) for as
long as it reads the finished rows: about a second per million on a small machine.

Revision ID: 0007_tasks_finished_index
Revises: 0004_enqueue_function
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007_tasks_finished_index"
down_revision: str | None = "0004_enqueue_function"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX tasks_finished_idx ON taskfleet.tasks (status, finished_at) "
        "WHERE finished_at IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX taskfleet.tasks_finished_idx")
