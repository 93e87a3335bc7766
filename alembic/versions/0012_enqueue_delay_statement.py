"""taskfleet.enqueue(...): a delay counts from the call, not from its transaction's start.

Revision ID: 0012_enqueue_delay_statement
Revises: 0011_group_key_plpgsql
Create Date: 2026-12-04

The function computed ``run_after`` as ``now() + delay_seconds``; ``now()`` is the start of the
caller's transaction, so a task enqueued late in a long transaction was due early (seen: a
transaction that slept 3 s, then enqueued with a 2 s delay, got a task due 1 s before the call).
It now uses ``statement_timestamp()``, as the API's and the Python helpers' insert does. Only
that expression changes: the function's definition is read from the database and written back
with it replaced, so the rest of its body (0010_controls) is not repeated here.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012_enqueue_delay_statement"
down_revision: str | None = "0011_group_key_plpgsql"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FROM_TRANSACTION = "now() + make_interval(secs => COALESCE(enqueue.delay_seconds, 0))"
_FROM_STATEMENT = (
    "statement_timestamp() + make_interval(secs => COALESCE(enqueue.delay_seconds, 0))"
)


def _rewrite(old: str, new: str) -> None:
    # Every overload of taskfleet.enqueue (there is one at head), its text changed in place.
    op.execute(
        f"""
        DO $migration$
        DECLARE
            fn oid;
            definition text;
        BEGIN
            FOR fn IN SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                      WHERE n.nspname = 'taskfleet' AND p.proname = 'enqueue' LOOP
                definition := pg_get_functiondef(fn);
                IF position('{old}' IN definition) = 0 THEN
                    RAISE EXCEPTION 'taskfleet.enqueue: the expression to replace is not there';
                END IF;
                EXECUTE replace(definition, '{old}', '{new}');
            END LOOP;
        END
        $migration$
        """
    )


# created_at too: the enqueue's own time, as the API's insert stores it.
_COLUMNS_BEFORE = "labels, max_attempts, run_after, timeout,"
_COLUMNS_AFTER = "labels, max_attempts, created_at, run_after, timeout,"
_VALUES_BEFORE = "enqueue.max_attempts,\n            COALESCE(enqueue.run_at,"
_VALUES_AFTER = "enqueue.max_attempts, statement_timestamp(),\n            COALESCE(enqueue.run_at,"


def upgrade() -> None:
    _rewrite(_FROM_TRANSACTION, _FROM_STATEMENT)
    _rewrite(_COLUMNS_BEFORE, _COLUMNS_AFTER)
    _rewrite(_VALUES_BEFORE, _VALUES_AFTER)


def downgrade() -> None:
    _rewrite(_VALUES_AFTER, _VALUES_BEFORE)
    _rewrite(_COLUMNS_AFTER, _COLUMNS_BEFORE)
    _rewrite(_FROM_STATEMENT, _FROM_TRANSACTION)
