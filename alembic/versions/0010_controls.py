"""Scheduling controls: routing by worker tags and fleet-wide label limits.

Revision ID: 0010_controls
Revises: 0009_schedules
Create Date: 2026-12-03

- ``tasks.requires``: the tags a worker must all have to claim the task ('{}': any worker).
  ``workers.tags``: the worker's tags (``TASKFLEET_WORKER_TAGS``). Both are added with a constant
  default, which Postgres stores in the catalog: no table rewrite.
- ``tasks.limit_labels``: the limited labels a claim counted the task under (set by the claim,
  read when the task leaves ``running``).
- ``label_limits``: one row per label that has (or had) a fleet-wide limit, with its limits
  (``maxInFlight``, ``ratePerSecond``) and its state: the running count and the token bucket.
  Kept by a trigger on ``worker_runtime_configs`` from the payload's ``labelLimits`` (every
  writer of a version keeps it; the writes are serialised by the config write lock). A claim
  locks the active rows (``FOR UPDATE SKIP LOCKED``, in label order) and updates them in its own
  transaction, so concurrent claims never start more than a limit allows.
- ``label_limit_releases``: one row per counted task that left ``running`` (a trigger writes it,
  whatever the path: finish, retry, lease rescue, shutdown release). Inserting takes no lock on
  the limit row, so finishes never queue behind claims; the next claim that holds the row folds
  the releases into its count.
- ``taskfleet.enqueue(...)`` takes ``requires`` too (a new last argument, default none).
- ``tasks_pending_requires_idx``: the pending tasks that require tags, so the metric of those no
  alive worker can take reads only them.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010_controls"
down_revision: str | None = "0009_schedules"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_SIGNATURE = (
    "taskfleet.enqueue(text, jsonb, integer, integer, text[], double precision, timestamptz, "
    "integer, double precision, text)"
)
_NEW_SIGNATURE = (
    "taskfleet.enqueue(text, jsonb, integer, integer, text[], double precision, timestamptz, "
    "integer, double precision, text, text[])"
)

# Written out here, not imported: a migration must not change when the code does.
_LIMITS_FOLLOW_CONFIG = r"""
CREATE FUNCTION taskfleet.label_limits_follow_config()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    limits jsonb := CASE WHEN jsonb_typeof(NEW.payload -> 'labelLimits') = 'object'
                         THEN NEW.payload -> 'labelLimits' ELSE '{}'::jsonb END;
BEGIN
    -- Versions are written one at a time (the config write lock); a late trigger of an older
    -- version never overwrites a newer one's limits.
    IF EXISTS (SELECT 1 FROM taskfleet.label_limits l WHERE l.config_version > NEW.version) THEN
        RETURN NULL;
    END IF;
    -- New or changed limits. A new row starts with a full bucket (one second's worth, at least
    -- one token) and counts the tasks of the label already running, which it marks so that
    -- their end is released like any other.
    INSERT INTO taskfleet.label_limits AS l
        (label, max_in_flight, rate_per_second, in_flight, tokens, refilled_at, config_version)
    SELECT e.key, CAST(e.value ->> 'maxInFlight' AS integer),
           CAST(e.value ->> 'ratePerSecond' AS double precision), 0,
           GREATEST(1, COALESCE(CAST(e.value ->> 'ratePerSecond' AS double precision), 1)),
           now(), NEW.version
    FROM jsonb_each(limits) AS e
    ORDER BY e.key COLLATE "C"
    ON CONFLICT (label) DO UPDATE SET
        max_in_flight = EXCLUDED.max_in_flight,
        rate_per_second = EXCLUDED.rate_per_second,
        tokens = LEAST(l.tokens, GREATEST(1, COALESCE(EXCLUDED.rate_per_second, 1))),
        config_version = EXCLUDED.config_version;
    -- Limits no longer configured: the row stays (its count is still right) but is inactive.
    UPDATE taskfleet.label_limits l
    SET max_in_flight = NULL, rate_per_second = NULL, config_version = NEW.version
    WHERE NOT (limits ? l.label)
      AND (l.max_in_flight IS NOT NULL OR l.rate_per_second IS NOT NULL);
    -- Running tasks of a newly limited label that no claim counted: count them now.
    WITH marked AS (
        UPDATE taskfleet.tasks t
        SET limit_labels = t.limit_labels || ARRAY[l.label]
        FROM taskfleet.label_limits l
        WHERE (limits ? l.label) AND t.status = 'running' AND t.labels @> ARRAY[l.label]
          AND NOT (t.limit_labels @> ARRAY[l.label])
        RETURNING l.label
    )
    UPDATE taskfleet.label_limits l SET in_flight = l.in_flight + m.n
    FROM (SELECT marked.label, count(*) AS n FROM marked GROUP BY marked.label) AS m
    WHERE l.label = m.label;
    RETURN NULL;
END
$$
"""

_RELEASE = r"""
CREATE FUNCTION taskfleet.label_limits_release()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO taskfleet.label_limit_releases (label)
    SELECT unnest(OLD.limit_labels);
    -- A slot under a limit is free again: wake the claimers (delivered at commit; one per
    -- transaction however many tasks it finishes).
    PERFORM pg_notify('taskfleet_task_ready',
                      CASE WHEN OLD.priority > 0 THEN 'strict' ELSE 'normal' END);
    RETURN NULL;
END
$$
"""

_ENQUEUE_COMMON = r"""
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    new_id bigint;
    label  text;
    size   integer;
BEGIN
    -- The envelope rules of POST /tasks; each error names the argument and the rule.
    IF enqueue.type IS NULL OR length(enqueue.type) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: type: must be 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.type = 'updateWorkerRuntimeConfig' THEN
        RAISE EXCEPTION 'taskfleet.enqueue: type: updateWorkerRuntimeConfig is reserved for the '
                        'runtime-config update: use PUT /runtime-config'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.payload IS NULL OR jsonb_typeof(enqueue.payload) <> 'object' THEN
        RAISE EXCEPTION 'taskfleet.enqueue: payload: must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    size := octet_length(enqueue.payload::text);
    IF size > 262144 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: payload: payload is % bytes as JSON; the limit is '
                        '262144 bytes', size
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 0 AND 2147483646 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: priority: must be 0 to 2147483646 (2147483647 is '
                        'reserved for the control lane)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.weight IS NULL OR enqueue.weight < 1 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: weight: must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.labels IS NULL OR cardinality(enqueue.labels) > 32 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: labels: at most 32 labels'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH label IN ARRAY enqueue.labels LOOP
        IF label IS NULL OR length(label) NOT BETWEEN 1 AND 128 THEN
            RAISE EXCEPTION 'taskfleet.enqueue: labels: each label must be 1 to 128 characters'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    @REQUIRES_CHECK@
    IF enqueue.delay_seconds IS NOT NULL AND enqueue.run_at IS NOT NULL THEN
        RAISE EXCEPTION 'taskfleet.enqueue: run_at: give delay_seconds or run_at, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.delay_seconds IS NOT NULL
       AND NOT (enqueue.delay_seconds BETWEEN 0 AND 315360000) THEN
        RAISE EXCEPTION 'taskfleet.enqueue: delay_seconds: must be 0 to 315360000 (10 years)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.run_at IS NOT NULL AND NOT (
        enqueue.run_at BETWEEN timestamptz '1970-01-01 00:00:00+00'
                           AND now() + interval '315360000 seconds') THEN
        RAISE EXCEPTION 'taskfleet.enqueue: run_at: must be after 1970-01-01 and at most 10 '
                        'years from now'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.max_attempts IS NULL OR enqueue.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: max_attempts: must be 1 to 100'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.timeout_seconds IS NOT NULL
       AND NOT (enqueue.timeout_seconds > 0 AND enqueue.timeout_seconds <= 604800) THEN
        RAISE EXCEPTION 'taskfleet.enqueue: timeout_seconds: must be more than 0 and at most '
                        '604800 (7 days)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.unique_key IS NOT NULL AND length(enqueue.unique_key) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: unique_key: must be 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- A unique_key held by an unfinished task returns that task; if the holder finishes
    -- between the insert and the read, the key is free again and the insert is retried.
    FOR attempt IN 1..3 LOOP
        INSERT INTO taskfleet.tasks AS t
            (type, payload, priority, weight, labels, max_attempts, run_after, timeout,
             unique_key@REQUIRES_COLUMN@)
        VALUES (
            enqueue.type, enqueue.payload, enqueue.priority, enqueue.weight, enqueue.labels,
            enqueue.max_attempts,
            COALESCE(enqueue.run_at,
                     now() + make_interval(secs => COALESCE(enqueue.delay_seconds, 0))),
            enqueue.timeout_seconds, enqueue.unique_key@REQUIRES_VALUE@)
        ON CONFLICT (unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
            DO NOTHING
        RETURNING t.id INTO new_id;
        IF new_id IS NOT NULL THEN
            -- The wake-up a submission sends, naming the task's lane; delivered at commit.
            PERFORM pg_notify('taskfleet_task_ready',
                              CASE WHEN enqueue.priority > 0 THEN 'strict' ELSE 'normal' END);
            RETURN new_id;
        END IF;
        SELECT t.id INTO new_id FROM taskfleet.tasks t
        WHERE t.unique_key = enqueue.unique_key AND t.status IN ('pending', 'running');
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'taskfleet.enqueue: unique_key: the task holding this key kept changing '
                    'state; retry'
        USING ERRCODE = 'serialization_failure';
END;
$function$
"""

_ENQUEUE_HEAD = """
CREATE FUNCTION taskfleet.enqueue(
    type            text,
    payload         jsonb            DEFAULT '{}'::jsonb,
    priority        integer          DEFAULT 0,
    weight          integer          DEFAULT 1,
    labels          text[]           DEFAULT '{}'::text[],
    delay_seconds   double precision DEFAULT NULL,
    run_at          timestamptz      DEFAULT NULL,
    max_attempts    integer          DEFAULT 3,
    timeout_seconds double precision DEFAULT NULL,
    unique_key      text             DEFAULT NULL@REQUIRES_ARG@
) RETURNS bigint
"""

_REQUIRES_CHECK = r"""IF enqueue.requires IS NULL OR cardinality(enqueue.requires) > 32 THEN
        RAISE EXCEPTION 'taskfleet.enqueue: requires: at most 32 tags'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH label IN ARRAY enqueue.requires LOOP
        IF label IS NULL OR length(label) NOT BETWEEN 1 AND 128 THEN
            RAISE EXCEPTION 'taskfleet.enqueue: requires: each tag must be 1 to 128 characters'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;"""


def _enqueue_function(with_requires: bool) -> str:
    text = _ENQUEUE_HEAD + _ENQUEUE_COMMON
    parts = {
        "@REQUIRES_ARG@": ",\n    requires        text[]           DEFAULT '{}'::text[]",
        "@REQUIRES_CHECK@": _REQUIRES_CHECK,
        "@REQUIRES_COLUMN@": ", requires",
        "@REQUIRES_VALUE@": ",\n            ARRAY(SELECT DISTINCT r FROM unnest(enqueue.requires) r ORDER BY r)",
    }
    for marker, value in parts.items():
        text = text.replace(marker, value if with_requires else "")
    return text


_COMMENT = """
COMMENT ON FUNCTION {signature} IS
'Enqueue a task in the current transaction; returns its id (or, for a unique_key held by an '
'unfinished task, that task''s id). Applies the rules of POST /tasks except the payload''s '
'validation against its handler''s model.'
"""


def upgrade() -> None:
    op.execute("ALTER TABLE taskfleet.tasks ADD COLUMN requires text[] NOT NULL DEFAULT '{}'")
    op.execute("ALTER TABLE taskfleet.tasks ADD COLUMN limit_labels text[] NOT NULL DEFAULT '{}'")
    op.execute("ALTER TABLE taskfleet.workers ADD COLUMN tags text[] NOT NULL DEFAULT '{}'")
    # A periodic task's worker tags, given to every task it fires.
    op.execute("ALTER TABLE taskfleet.schedules ADD COLUMN requires text[] NOT NULL DEFAULT '{}'")
    op.execute(
        "CREATE INDEX tasks_pending_requires_idx ON taskfleet.tasks (id) "
        "WHERE status = 'pending' AND requires <> '{}'"
    )
    op.execute(
        """
        CREATE TABLE taskfleet.label_limits (
            label           text             PRIMARY KEY,
            -- NULL: no such limit. Both NULL: the row is inactive (kept for its count).
            max_in_flight   integer          CHECK (max_in_flight >= 1),
            rate_per_second double precision CHECK (rate_per_second > 0),
            -- Tasks with this label counted running (less the releases not yet folded in).
            in_flight       integer          NOT NULL DEFAULT 0,
            -- The token bucket: tokens at refilled_at; it refills at rate_per_second up to one
            -- second's worth (at least one token).
            tokens          double precision NOT NULL DEFAULT 1,
            refilled_at     timestamptz      NOT NULL DEFAULT now(),
            config_version  bigint           NOT NULL DEFAULT 0
        )
        """
    )
    op.execute(
        """
        CREATE TABLE taskfleet.label_limit_releases (
            id    bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            label text   NOT NULL
        )
        """
    )
    op.execute("CREATE INDEX label_limit_releases_label_idx ON taskfleet.label_limit_releases (label)")
    op.execute(_LIMITS_FOLLOW_CONFIG)
    op.execute(
        """
        CREATE TRIGGER worker_runtime_configs_label_limits
        AFTER INSERT ON taskfleet.worker_runtime_configs
        FOR EACH ROW EXECUTE FUNCTION taskfleet.label_limits_follow_config()
        """
    )
    op.execute(_RELEASE)
    op.execute(
        """
        CREATE TRIGGER tasks_label_limits_release
        AFTER UPDATE OF status ON taskfleet.tasks
        FOR EACH ROW
        WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND OLD.limit_labels <> '{}')
        EXECUTE FUNCTION taskfleet.label_limits_release()
        """
    )
    op.execute(f"DROP FUNCTION {_OLD_SIGNATURE}")
    op.execute(_enqueue_function(with_requires=True))
    op.execute(_COMMENT.format(signature=_NEW_SIGNATURE))


def downgrade() -> None:
    op.execute("ALTER TABLE taskfleet.schedules DROP COLUMN requires")
    op.execute(f"DROP FUNCTION {_NEW_SIGNATURE}")
    op.execute(_enqueue_function(with_requires=False))
    op.execute(_COMMENT.format(signature=_OLD_SIGNATURE))
    op.execute("DROP TRIGGER tasks_label_limits_release ON taskfleet.tasks")
    op.execute("DROP FUNCTION taskfleet.label_limits_release()")
    op.execute("DROP TRIGGER worker_runtime_configs_label_limits ON taskfleet.worker_runtime_configs")
    op.execute("DROP FUNCTION taskfleet.label_limits_follow_config()")
    op.execute("DROP TABLE taskfleet.label_limit_releases")
    op.execute("DROP TABLE taskfleet.label_limits")
    op.execute("DROP INDEX taskfleet.tasks_pending_requires_idx")
    op.execute("ALTER TABLE taskfleet.workers DROP COLUMN tags")
    op.execute("ALTER TABLE taskfleet.tasks DROP COLUMN limit_labels")
    op.execute("ALTER TABLE taskfleet.tasks DROP COLUMN requires")
