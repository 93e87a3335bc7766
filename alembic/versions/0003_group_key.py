"""Store each task's normal-lane group, so a group's claim is an index range of exactly its rows.

Revision ID: 0003_group_key
Revises: 0002_worker_types
Create Date: 2026-12-01

- ``task_groupings``: the configured label sets, one row per change of the *set* (weights alone
  re-group nothing), keyed by the runtime-config version that introduced it. Kept by a trigger on
  ``worker_runtime_configs``, so every writer of a config version keeps it, serialised by an
  advisory lock so concurrent writers cannot leave it behind the latest version.
- ``task_group_key(labels, configured)``: the one rule (the smallest configured label by code
  point, else '' for the default group). ``task_group_key(labels)`` applies the current grouping.
- ``tasks.group_key``: the key under the grouping in force when the row was written. The named
  insert query writes it; a trigger fills it for any other insert (and recomputes it when a task
  returns to pending), so no insert path can forget the rule.
- ``task_regroup_step(batch)``: after a change of the set, one bounded step of re-grouping: it
  waits for the transactions that began before the change (an insert that read the old set), then
  walks only the groups a changed label can move rows in or out of, writing only rows whose key
  changes, with a cursor kept on the grouping row (any worker can resume it).
- ``tasks_claim_normal_idx`` becomes ``(group_key, weight DESC, created_at, id)``: a group's claim
  reads its own rows only. ``tasks_group_labelled_idx`` ``(group_key, id)`` over labelled pending
  rows is the re-grouping walk's path (unlabelled rows are always in the default group).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003_group_key"
down_revision: str | None = "0002_worker_types"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Serialise the grouping trigger across concurrent config writers, and re-grouping steppers.
GROUPING_LOCK_KEY = 7_243_118_003
REGROUP_LOCK_KEY = 7_243_118_004


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE taskfleet.task_groupings (
            version    bigint      PRIMARY KEY,
            labels     text[]      NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            -- Re-grouping after this change is complete (every pending row has its key under
            -- these labels). The walk's progress: the transactions it waits for, its cursor.
            settled    boolean     NOT NULL DEFAULT false,
            waits_for  text[],
            cursor_key text,
            cursor_id  bigint
        )
        """
    )
    op.execute(
        """
        CREATE FUNCTION taskfleet.task_group_key(labels text[], configured text[])
        RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT COALESCE(
                (SELECT min(l COLLATE "C") FROM unnest(labels) AS l WHERE l = ANY(configured)),
                '')
        $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION taskfleet.runtime_config_labels(payload jsonb)
        RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT COALESCE(array_agg(k ORDER BY k COLLATE "C"), '{}')
            FROM jsonb_object_keys(
                CASE WHEN jsonb_typeof(payload -> 'labelWeights') = 'object'
                     THEN payload -> 'labelWeights' ELSE '{}'::jsonb END) AS k
        $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION taskfleet.task_group_key(labels text[])
        RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
            -- $1, not "labels": inside this query an unqualified "labels" is the column
            -- g.labels (a column wins over a parameter of the same name in SQL functions).
            SELECT taskfleet.task_group_key($1, g.labels)
            FROM taskfleet.task_groupings g ORDER BY g.version DESC LIMIT 1
        $$
        """
    )
    op.execute(
        """
        INSERT INTO taskfleet.task_groupings (version, labels, settled)
        SELECT 0, '{}', true
        UNION ALL
        SELECT c.version, taskfleet.runtime_config_labels(c.payload), true
        FROM (SELECT version, payload FROM taskfleet.worker_runtime_configs
              ORDER BY version DESC LIMIT 1) AS c
        WHERE taskfleet.runtime_config_labels(c.payload) <> '{}'
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION taskfleet.task_groupings_follow_config()
        RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            latest_version bigint;
            latest_labels text[];
            current_labels text[];
        BEGIN
            -- One writer at a time; each statement below then sees the others' committed rows.
            PERFORM pg_advisory_xact_lock({GROUPING_LOCK_KEY});
            SELECT c.version, taskfleet.runtime_config_labels(c.payload)
              INTO latest_version, latest_labels
              FROM taskfleet.worker_runtime_configs c ORDER BY c.version DESC LIMIT 1;
            SELECT g.labels INTO current_labels
              FROM taskfleet.task_groupings g ORDER BY g.version DESC LIMIT 1;
            IF latest_labels IS DISTINCT FROM current_labels THEN
                INSERT INTO taskfleet.task_groupings (version, labels)
                VALUES (latest_version, latest_labels)
                ON CONFLICT (version) DO NOTHING;
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER worker_runtime_configs_grouping
        AFTER INSERT ON taskfleet.worker_runtime_configs
        FOR EACH ROW EXECUTE FUNCTION taskfleet.task_groupings_follow_config()
        """
    )
    op.execute("ALTER TABLE taskfleet.tasks ADD COLUMN group_key text NOT NULL DEFAULT ''")
    op.execute(
        """
        UPDATE taskfleet.tasks t
        SET group_key = taskfleet.task_group_key(t.labels, g.labels)
        FROM (SELECT labels FROM taskfleet.task_groupings
              ORDER BY version DESC LIMIT 1) AS g
        WHERE t.status IN ('pending', 'running') AND t.labels <> '{}'
        """
    )
    # No default from here on: the insert query writes it, the trigger fills it otherwise.
    op.execute("ALTER TABLE taskfleet.tasks ALTER COLUMN group_key DROP DEFAULT")
    op.execute(
        """
        CREATE FUNCTION taskfleet.tasks_set_group()
        RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.group_key := taskfleet.task_group_key(NEW.labels);
            RETURN NEW;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER tasks_group_on_insert
        BEFORE INSERT ON taskfleet.tasks
        FOR EACH ROW WHEN (NEW.group_key IS NULL)
        EXECUTE FUNCTION taskfleet.tasks_set_group()
        """
    )
    op.execute(
        """
        CREATE TRIGGER tasks_group_on_pending
        BEFORE UPDATE OF status ON taskfleet.tasks
        FOR EACH ROW WHEN (NEW.status = 'pending' AND OLD.status <> 'pending')
        EXECUTE FUNCTION taskfleet.tasks_set_group()
        """
    )
    op.execute("DROP INDEX taskfleet.tasks_claim_normal_idx")
    op.execute(
        "CREATE INDEX tasks_claim_normal_idx ON taskfleet.tasks "
        "(group_key, weight DESC, created_at, id) WHERE status = 'pending' AND priority = 0"
    )
    op.execute(
        "CREATE INDEX tasks_group_labelled_idx ON taskfleet.tasks (group_key, id) "
        "WHERE status = 'pending' AND priority = 0 AND labels <> '{}'"
    )
    op.execute(REGROUP_STEP)


# One bounded step of re-grouping after a change of the configured label set; called again until
# it says 'settled'. Returns its state: 'settled' (nothing to do), 'busy' (another session is
# stepping), 'waiting' (a transaction that began before the change is still open: an insert in it
# may have read the old set), 'regrouping' (a batch done, more to come).
REGROUP_STEP = f"""
CREATE FUNCTION taskfleet.task_regroup_step(batch integer)
RETURNS TABLE (state text, scanned bigint, moved bigint)
LANGUAGE plpgsql AS $$
DECLARE
    g taskfleet.task_groupings%ROWTYPE;
    base_version bigint;
    since_base bigint;
    ever text[];
    changed text[];
    added text[];
    ranges text[];
    range_key text;
    remaining integer := batch;
    step_scanned bigint := 0;
    step_moved bigint := 0;
    n_scanned bigint;
    n_moved bigint;
    last_id bigint;
BEGIN
    SELECT * INTO g FROM taskfleet.task_groupings ORDER BY version DESC LIMIT 1;
    IF g.settled THEN
        RETURN QUERY SELECT 'settled'::text, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock({REGROUP_LOCK_KEY}) THEN
        RETURN QUERY SELECT 'busy'::text, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    -- Read again under the lock: another session may have moved the cursor meanwhile.
    SELECT * INTO g FROM taskfleet.task_groupings ORDER BY version DESC LIMIT 1;
    IF g.settled THEN
        RETURN QUERY SELECT 'settled'::text, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    -- Wait for every transaction open when the change was first seen here (after its commit):
    -- an insert in one of them may have read the old set. Their virtual transaction ids are
    -- unique, so a later transaction on the same connection is not waited for.
    IF g.waits_for IS NULL THEN
        SELECT COALESCE(array_agg(l.virtualxid), '{{}}') INTO g.waits_for
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
          AND l.pid <> pg_backend_pid() AND a.datname = current_database();
        UPDATE taskfleet.task_groupings SET waits_for = g.waits_for WHERE version = g.version;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'virtualxid' AND l.virtualxid = ANY(g.waits_for)) THEN
        RETURN QUERY SELECT 'waiting'::text, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    -- The labels whose membership changed since the last settled grouping (in some of the sets
    -- since then, not in all). Keys rows can hold are in those sets, or ''.
    SELECT max(s.version) INTO base_version
    FROM taskfleet.task_groupings s WHERE s.settled AND s.version < g.version;
    SELECT count(*) INTO since_base FROM taskfleet.task_groupings s
    WHERE s.version >= base_version;
    SELECT array_agg(x.l ORDER BY x.l COLLATE "C"),
           array_agg(x.l ORDER BY x.l COLLATE "C") FILTER (WHERE x.n < since_base)
      INTO ever, changed
    FROM (SELECT l, count(*) AS n
          FROM taskfleet.task_groupings s, unnest(s.labels) AS l
          WHERE s.version >= base_version GROUP BY l) AS x;
    added := ARRAY(SELECT c FROM unnest(changed) AS c WHERE c = ANY(g.labels));
    -- The groups a changed label can move rows out of: a removed label's own group; for an
    -- added label, the default group and every group sorting after it (a row there carrying
    -- the added label now belongs to it).
    ranges := ARRAY(
        SELECT DISTINCT r FROM (
            SELECT c AS r FROM unnest(changed) AS c WHERE NOT c = ANY(g.labels)
            UNION ALL
            SELECT '' WHERE cardinality(added) > 0
            UNION ALL
            SELECT e FROM unnest(ever) AS e
            WHERE cardinality(added) > 0
              AND e COLLATE "C" > (SELECT min(a COLLATE "C") FROM unnest(added) AS a)
        ) AS rr);
    FOR range_key IN
        SELECT r FROM unnest(ranges) AS r
        WHERE g.cursor_key IS NULL OR r COLLATE "C" >= g.cursor_key COLLATE "C"
        ORDER BY r COLLATE "C"
    LOOP
        WITH walked AS (
            SELECT t.id FROM taskfleet.tasks t
            WHERE t.status = 'pending' AND t.priority = 0 AND t.labels <> '{{}}'
              AND t.group_key = range_key
              AND t.id > CASE WHEN range_key = g.cursor_key THEN g.cursor_id ELSE 0 END
            ORDER BY t.id
            LIMIT remaining
            FOR UPDATE SKIP LOCKED
        ),
        rewritten AS (
            UPDATE taskfleet.tasks t
            SET group_key = taskfleet.task_group_key(t.labels, g.labels)
            WHERE t.id = ANY(ARRAY(SELECT walked.id FROM walked))
              AND t.group_key <> taskfleet.task_group_key(t.labels, g.labels)
            RETURNING t.id
        )
        SELECT (SELECT count(*) FROM walked), (SELECT count(*) FROM rewritten),
               (SELECT max(walked.id) FROM walked)
          INTO n_scanned, n_moved, last_id;
        step_scanned := step_scanned + n_scanned;
        step_moved := step_moved + n_moved;
        remaining := remaining - n_scanned;
        IF remaining <= 0 THEN
            UPDATE taskfleet.task_groupings SET cursor_key = range_key, cursor_id = last_id
            WHERE version = g.version;
            RETURN QUERY SELECT 'regrouping'::text, step_scanned, step_moved;
            RETURN;
        END IF;
    END LOOP;
    UPDATE taskfleet.task_groupings
    SET settled = true, cursor_key = NULL, cursor_id = NULL, waits_for = NULL
    WHERE version = g.version;
    RETURN QUERY SELECT 'settled'::text, step_scanned, step_moved;
END
$$
"""


def downgrade() -> None:
    op.execute("DROP FUNCTION taskfleet.task_regroup_step(integer)")
    op.execute("DROP INDEX taskfleet.tasks_group_labelled_idx")
    op.execute("DROP INDEX taskfleet.tasks_claim_normal_idx")
    op.execute(
        "CREATE INDEX tasks_claim_normal_idx ON taskfleet.tasks (weight DESC, created_at, id) "
        "WHERE status = 'pending' AND priority = 0"
    )
    op.execute("DROP TRIGGER tasks_group_on_pending ON taskfleet.tasks")
    op.execute("DROP TRIGGER tasks_group_on_insert ON taskfleet.tasks")
    op.execute("DROP FUNCTION taskfleet.tasks_set_group()")
    op.execute("ALTER TABLE taskfleet.tasks DROP COLUMN group_key")
    op.execute("DROP TRIGGER worker_runtime_configs_grouping ON taskfleet.worker_runtime_configs")
    op.execute("DROP FUNCTION taskfleet.task_groupings_follow_config()")
    op.execute("DROP FUNCTION taskfleet.task_group_key(text[])")
    op.execute("DROP FUNCTION taskfleet.runtime_config_labels(jsonb)")
    op.execute("DROP FUNCTION taskfleet.task_group_key(text[], text[])")
    op.execute("DROP TABLE taskfleet.task_groupings")
