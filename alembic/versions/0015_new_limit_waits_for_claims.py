"""A config version that sets a new label limit waits for the claims in flight.

Revision ID: 0015_new_limit_waits_for_claims
Revises: 0014_worker_lease_ttl
Create Date: 2026-12-04

``taskfleet.label_limits_follow_config`` (0010_controls) counts and marks the running tasks of a
newly limited label, reading its own snapshot. A plain claim in flight at that moment (its
snapshot taken before the limit row existed) saw no active limit, took the label's tasks
uncounted, and the marking, which could not see them running yet, missed them too: the limit was
exceeded while they ran. When a version limits a label that had no active limit, the function
now takes ``label_limits`` in ACCESS EXCLUSIVE mode first: every claim holds that table's
ACCESS SHARE lock from its start (the guard reads it), so the version waits for the claims in
flight to commit (then sees and marks their tasks) and claims that start meanwhile wait for the
version to commit (then see the limit). Changing or removing a limit takes no lock: the limited
claim reads the locked, newest row. The wait is bounded (``lock_timeout`` 5 s, then the write
fails and the update task is retried); only a long transaction reading ``label_limits`` can make
it last. Only that part of the function changes: its definition is read from the database and
written back with the lock inserted.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015_new_limit_waits_for_claims"
down_revision: str | None = "0014_worker_lease_ttl"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ANCHOR = """    -- New or changed limits. A new row starts"""

_LOCK = """    -- A label limited now that was not: wait for the claims in flight (each holds this
    -- table's ACCESS SHARE lock from its start), whose snapshot predates the limit, so that the
    -- marking below sees their tasks running; claims starting meanwhile wait, then see it.
    IF EXISTS (SELECT 1 FROM jsonb_object_keys(limits) AS k(label)
               WHERE NOT EXISTS (SELECT 1 FROM taskfleet.label_limits l
                                 WHERE l.label = k.label
                                   AND (l.max_in_flight IS NOT NULL
                                        OR l.rate_per_second IS NOT NULL))) THEN
        DECLARE
            previous_lock_timeout text := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '5s', true);
            LOCK TABLE taskfleet.label_limits IN ACCESS EXCLUSIVE MODE;
            PERFORM set_config('lock_timeout', previous_lock_timeout, true);
        END;
    END IF;
"""


def _rewrite(old: str, new: str) -> None:
    op.execute(
        """
        DO $migration$
        DECLARE
            definition text := pg_get_functiondef(
                'taskfleet.label_limits_follow_config()'::regprocedure);
            old_text text := $old$"""
        + old
        + """$old$;
            new_text text := $new$"""
        + new
        + """$new$;
        BEGIN
            IF position(old_text IN definition) = 0 THEN
                RAISE EXCEPTION 'taskfleet.label_limits_follow_config: the part to replace is not there';
            END IF;
            EXECUTE replace(definition, old_text, new_text);
        END
        $migration$
        """
    )


def upgrade() -> None:
    _rewrite(_ANCHOR, _LOCK + _ANCHOR)


def downgrade() -> None:
    _rewrite(_LOCK + _ANCHOR, _ANCHOR)
