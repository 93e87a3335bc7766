"""taskfleet.enqueue(type, payload, ...): enqueue from SQL, in the caller's transaction.

Services in any language that share the database insert a task inside their own transaction
without an HTTP hop. The function applies the rules the database can check, the same ones
``POST /tasks`` applies to the envelope (type, priority, weight, labels, timing, attempts,
timeout, unique_key, payload size), deduplicates on ``unique_key`` like it, and sends the same
wake-up NOTIFY (delivered at commit). Validating the payload against a handler's model needs
the Python handler, so it stays with the HTTP API and the Python enqueue functions.

Revision ID: 0004_enqueue_function
Revises: 0003_group_key
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004_enqueue_function"
down_revision: str | None = "0003_group_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out here, not imported: a migration must not change when the code does.
_FUNCTION = r"""
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
    unique_key      text             DEFAULT NULL
) RETURNS bigint
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
             unique_key)
        VALUES (
            enqueue.type, enqueue.payload, enqueue.priority, enqueue.weight, enqueue.labels,
            enqueue.max_attempts,
            COALESCE(enqueue.run_at,
                     now() + make_interval(secs => COALESCE(enqueue.delay_seconds, 0))),
            enqueue.timeout_seconds, enqueue.unique_key)
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

_COMMENT = """
COMMENT ON FUNCTION taskfleet.enqueue(text, jsonb, integer, integer, text[], double precision,
    timestamptz, integer, double precision, text) IS
'Enqueue a task in the current transaction; returns its id (or, for a unique_key held by an '
'unfinished task, that task''s id). Applies the rules of POST /tasks except the payload''s '
'validation against its handler''s model.'
"""


def upgrade() -> None:
    op.execute(_FUNCTION)
    op.execute(_COMMENT)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION taskfleet.enqueue(text, jsonb, integer, integer, text[], double precision,"
        " timestamptz, integer, double precision, text)"
    )
