"""An index of the pending tasks by type, for the unknown-type count of ``/metrics``.

Revision ID: 0016_pending_type_index
Revises: 0015_new_limit_waits_for_claims
Create Date: 2026-12-04

``taskfleet_tasks_unrunnable{reason="unknown_type"}`` counts the pending tasks of each type no
alive worker has a handler for. It found them through ``(type, id)``, filtering status row by
row: a type the fleet no longer runs, with a million finished rows kept by retention and none
pending, cost every scrape a walk of those million rows (136 ms at 1M rows on the test
machine). ``tasks_pending_type_idx`` holds only the pending rows, so the count reads at most
its limit of entries per type, and the distinct pending types are found by a skip scan of it.
Its key is ``type COLLATE "C"``: only that metric's statement asks for it, so the claims,
which filter pending rows by type too, keep their ordered claim indexes (a plan that swapped
them for this one would read the whole backlog). One more index entry per enqueue (nothing
measurable for single inserts, 3 % on batches of 1,000: docs/benchmarks.md, "Metrics at
depth"); a claim or a finish adds none (the row it writes is not pending).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016_pending_type_index"
down_revision: str | None = "0015_new_limit_waits_for_claims"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        'CREATE INDEX tasks_pending_type_idx ON taskfleet.tasks ((type COLLATE "C")) '
        "WHERE status = 'pending'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX taskfleet.tasks_pending_type_idx")
