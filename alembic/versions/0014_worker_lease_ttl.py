"""Each worker row records its own lease; the sweep judges a worker's silence by it.

Revision ID: 0014_worker_lease_ttl
Revises: 0013_regroup_skipped_rows
Create Date: 2026-12-04

The lease sweep took the tasks of a worker whose last heartbeat was older than a lease, and that
lease was the sweeping worker's own ``TASKFLEET_LEASE_TTL``: in a fleet with mixed settings a
worker started with a 30 s lease took the tasks of a live worker configured for 120 s (one GC
pause or a slow network of 40 s) while its code still ran them. A worker now registers its lease
(``workers.lease_ttl``), and the sweep compares each worker's silence with that worker's own.
Rows written before this revision get 30 s, the default setting.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014_worker_lease_ttl"
down_revision: str | None = "0013_regroup_skipped_rows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE taskfleet.workers ADD COLUMN lease_ttl double precision NOT NULL DEFAULT 30"
        " CONSTRAINT workers_lease_ttl_positive CHECK (lease_ttl > 0)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE taskfleet.workers DROP COLUMN lease_ttl")
