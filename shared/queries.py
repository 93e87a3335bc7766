"""Every SQL statement taskfleet runs, each under a stable noun-first name.

Statements are written with ``:name`` parameters. The API runs them through SQLAlchemy's
``text()``; the worker's hot path runs them on raw asyncpg connections via :meth:`Query.positional`,
and the API's single statements through a transaction-mode pooler on psycopg via
:meth:`Query.formatted`.
Either way the text below is the only copy. JSON parameters are passed as JSON text and cast in
SQL; jsonb results come back as Python objects (both access paths set that codec).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from taskfleet.shared.policy.lanes import CONTROL_PRIORITY, RUNTIME_CONFIG_TASK_TYPE
from taskfleet.shared.statuses import TaskStatus

# Session-independent advisory lock key of the lease sweep (any worker may sweep, one at a time).
SWEEP_LOCK_KEY = 7_243_118_002
# Advisory lock key serialising the writes of runtime-config versions.
CONFIG_WRITE_LOCK_KEY = 7_243_118_003
# Transaction-level advisory lock key of the pruner: one pruning statement in the fleet at a time.
# Its own key: 7_243_118_004 is the re-grouping's (migration 0003), and sharing it made a prune
# pass stop as if another pruner ran while a re-grouping step was open, and the reverse.
PRUNE_LOCK_KEY = 7_243_118_005

TASK_READY_CHANNEL = "taskfleet_task_ready"

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@dataclass(frozen=True)
class Query:
    """One named SQL statement."""

    name: str
    sql: str
    _positional: tuple[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _formatted: tuple[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        order: list[str] = []

        def number(match: re.Match[str]) -> str:
            param = match.group(1)
            if param not in order:
                order.append(param)
            return f"${order.index(param) + 1}"

        object.__setattr__(self, "_positional", (_PARAM.sub(number, self.sql), tuple(order)))
        # psycopg's form: a literal % doubled, each parameter a %s in order of appearance.
        formatted = _PARAM.sub("%s", self.sql.replace("%", "%%"))
        object.__setattr__(self, "_formatted", (formatted, tuple(_PARAM.findall(self.sql))))

    @property
    def params(self) -> tuple[str, ...]:
        return self._positional[1]

    def positional(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The statement in asyncpg's ``$n`` form and its arguments in order."""
        sql, order = self._positional
        missing = [p for p in order if p not in params]
        if missing:
            raise KeyError(f"query {self.name} is missing parameters {missing}")
        return sql, [params[p] for p in order]

    def formatted(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The statement in psycopg's ``%s`` form and its arguments in order of appearance (a
        parameter used twice is passed twice)."""
        sql, names = self._formatted
        missing = sorted({p for p in names if p not in params})
        if missing:
            raise KeyError(f"query {self.name} is missing parameters {missing}")
        return sql, [params[p] for p in names]


QUERIES: dict[str, Query] = {}


def _query(name: str, sql: str) -> Query:
    if name in QUERIES:
        raise ValueError(f"duplicate query name {name}")
    query = Query(name, sql.strip())
    QUERIES[name] = query
    return query


_TASK_COLUMNS = """
    t.id, t.type, t.payload, t.status, t.priority, t.weight, t.labels, t.attempts,
    t.max_attempts, t.run_after, t.timeout, t.created_at, t.started_at, t.finished_at,
    t.worker_id, t.lease_expires_at, t.result, t.last_error, t.unique_key, t.cancel_requested,
    t.requires
"""

_ALIVE = (
    "(w.status = 'online'"
    " AND w.last_heartbeat > now() - 3 * w.heartbeat_interval * interval '1 second')"
)

# A worker row the pruner may delete: silent for longer than :workers_keep seconds and not
# alive (an offline row, or one whose process stopped heartbeating without saying so).
_WORKER_PRUNABLE = f"""(
    w.last_heartbeat < now() - make_interval(secs => CAST(:workers_keep AS float8))
    AND NOT {_ALIVE}
    -- Never while it holds running tasks: the sweep takes a task whose worker row is gone at
    -- once, and a draining (or late) worker can still be running it. The sweep returns them
    -- when their leases expire; then the row goes.
    AND NOT EXISTS (SELECT 1 FROM taskfleet.tasks t
                    WHERE t.status = 'running' AND t.worker_id = w.id))"""

# The grouping in force: the latest configured label set (one row; task_groupings always has
# version 0, the empty set).
_GROUPING_LATEST = """
    SELECT g.version, g.labels FROM taskfleet.task_groupings g ORDER BY g.version DESC LIMIT 1
"""

# --------------------------------------------------------------------------------------------
# Tasks: submission and queries (API)
# --------------------------------------------------------------------------------------------

# The insert's shared parts (task_insert_batch, task_insert_one): a unique_key that matches an
# unfinished task inserts nothing; the start is run_at, else now + delay; one wake-up per
# submitting statement, not per row, delivered at commit.
_UNIQUE_KEY_CONFLICT = """
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
        DO NOTHING"""


def _run_after(run_at: str, delay: str) -> str:
    # A delay counts from the inserting statement, as created_at does, not from its
    # transaction's start (now()): an application that enqueues late in a long transaction gets
    # the delay it asked for.
    return (
        f"COALESCE({run_at}, statement_timestamp() + make_interval(secs => COALESCE({delay}, 0)))"
    )


_WAKE = f"wake AS (SELECT pg_notify('{TASK_READY_CHANNEL}', CAST(:wake_hint AS text)) AS sent)"

task_insert_batch = _query(
    "task_insert_batch",
    f"""
    WITH
    -- The submitted tasks in order, each with its id drawn up front so the result can be
    -- returned in submission order and deduplicated rows told apart from inserted ones.
    input AS (
        SELECT nextval(pg_get_serial_sequence('taskfleet.tasks', 'id')) AS id, i.*,
               ARRAY(SELECT jsonb_array_elements_text(CAST(i.labels AS jsonb))) AS label_array,
               -- Stored sorted and without duplicates (a set of tags).
               ARRAY(SELECT DISTINCT r.tag
                     FROM jsonb_array_elements_text(CAST(COALESCE(i.requires, '[]') AS jsonb))
                          AS r(tag)
                     ORDER BY r.tag) AS requires_array
        -- Each array behind a scalar subquery: the planner then estimates the same rows for
        -- every call, so a prepared statement settles on one generic plan after its first five
        -- runs instead of being planned again on every call (0.6 ms of a 1.4 ms single-task
        -- insert; docs/benchmarks.md, "Enqueue"). Given the arrays as constants, it sizes each
        -- custom plan exactly and never finds the generic one cheaper.
        FROM unnest(
            (SELECT CAST(:types AS text[])), (SELECT CAST(:payloads AS text[])),
            (SELECT CAST(:priorities AS int[])), (SELECT CAST(:weights AS int[])),
            (SELECT CAST(:labels AS text[])), (SELECT CAST(:max_attempts AS int[])),
            (SELECT CAST(:delays AS float8[])), (SELECT CAST(:run_ats AS timestamptz[])),
            (SELECT CAST(:timeouts AS float8[])), (SELECT CAST(:unique_keys AS text[])),
            (SELECT CAST(:requires AS text[]))
        ) WITH ORDINALITY AS i(type, payload, priority, weight, labels, max_attempts,
                                delay, run_at, timeout, unique_key, requires, ord)
    ),
    -- The current grouping (configured label set), read once per statement: each row's group
    -- key is computed here by the one rule, taskfleet.task_group_key.
    grouping_now AS ({_GROUPING_LATEST}),
    inserted AS (
        INSERT INTO taskfleet.tasks AS t
            (id, type, payload, priority, weight, labels, max_attempts, created_at, run_after,
             timeout, unique_key, group_key, requires)
        SELECT input.id, input.type, CAST(input.payload AS jsonb), input.priority,
               input.weight, input.label_array, input.max_attempts, statement_timestamp(),
               {_run_after("input.run_at", "input.delay")},
               input.timeout, input.unique_key,
               taskfleet.task_group_key(input.label_array, grouping_now.labels),
               input.requires_array
        FROM input CROSS JOIN grouping_now
        -- Inserted in unique_key order, whatever the submission order: concurrent batches
        -- that share keys wait on each other's keys in one order, never in a cycle.
        ORDER BY input.unique_key, input.ord{_UNIQUE_KEY_CONFLICT}
        RETURNING {_TASK_COLUMNS}
    ),
    {_WAKE}
    SELECT input.ord, input.unique_key AS input_unique_key, (inserted.id IS NULL) AS deduplicated,
           inserted.*
    FROM input
    LEFT JOIN inserted ON inserted.id = input.id
    CROSS JOIN wake
    ORDER BY input.ord
    """,
)

# One task: task_insert_batch's insert and answer (the same columns, ord 1) without the unnest
# of eleven arrays and the join back to the input, about a quarter of its server time for a
# single task (docs/benchmarks.md, "Enqueue"). Its labels and requires come as arrays.
task_insert_one = _query(
    "task_insert_one",
    f"""
    WITH
    grouping_now AS ({_GROUPING_LATEST}),
    inserted AS (
        INSERT INTO taskfleet.tasks AS t
            (type, payload, priority, weight, labels, max_attempts, created_at, run_after,
             timeout, unique_key, group_key, requires)
        SELECT CAST(:type AS text), CAST(:payload AS jsonb), CAST(:priority AS int),
               CAST(:weight AS int), CAST(:labels AS text[]), CAST(:max_attempts AS int),
               statement_timestamp(),
               {_run_after("CAST(:run_at AS timestamptz)", "CAST(:delay AS float8)")},
               CAST(:timeout AS float8), CAST(:unique_key AS text),
               taskfleet.task_group_key(CAST(:labels AS text[]), grouping_now.labels),
               -- Stored sorted and without duplicates (a set of tags), as the batch does.
               ARRAY(SELECT DISTINCT r.tag FROM unnest(CAST(:requires AS text[])) AS r(tag)
                     ORDER BY r.tag)
        FROM grouping_now{_UNIQUE_KEY_CONFLICT}
        RETURNING {_TASK_COLUMNS}
    ),
    {_WAKE}
    SELECT CAST(1 AS bigint) AS ord, CAST(:unique_key AS text) AS input_unique_key,
           (inserted.id IS NULL) AS deduplicated, inserted.*
    FROM wake LEFT JOIN inserted ON true
    """,
)

task_get_unfinished_by_unique_key = _query(
    "task_get_unfinished_by_unique_key",
    f"""
    SELECT {_TASK_COLUMNS} FROM taskfleet.tasks t
    WHERE t.unique_key = CAST(:unique_key AS text) AND t.status IN ('pending', 'running')
    """,
)

# Undoes an insert whose batch is refused after part of it was written (unique_key contention),
# in the same transaction: the rows are that transaction's own, seen by no one else yet.
task_delete_own_inserts = _query(
    "task_delete_own_inserts",
    """
    DELETE FROM taskfleet.tasks WHERE id = ANY(CAST(:ids AS bigint[])) AND status = 'pending'
    RETURNING id
    """,
)

task_get = _query(
    "task_get",
    f"SELECT {_TASK_COLUMNS} FROM taskfleet.tasks t WHERE t.id = CAST(:id AS bigint)",
)

# Without the bodies (:bodies false) the payload and result are not even read (no TOAST fetch):
# the console's list shows neither, and a page of large ones weighed tens of megabytes.
_TASK_LIST_COLUMNS = _TASK_COLUMNS.replace(
    "t.payload,", "CASE WHEN CAST(:bodies AS boolean) THEN t.payload END AS payload,"
).replace("t.result,", "CASE WHEN CAST(:bodies AS boolean) THEN t.result END AS result,")
assert _TASK_LIST_COLUMNS.count("CAST(:bodies AS boolean)") == 2

task_list = _query(
    "task_list",
    f"""
    SELECT {_TASK_LIST_COLUMNS} FROM taskfleet.tasks t
    WHERE (CAST(:status AS text) IS NULL OR t.status = CAST(:status AS text))
      AND (CAST(:type AS text) IS NULL OR t.type = CAST(:type AS text))
      AND (CAST(:label AS text) IS NULL OR t.labels @> ARRAY[CAST(:label AS text)])
      AND (CAST(:worker AS text) IS NULL OR t.worker_id = CAST(:worker AS text))
      AND (CAST(:before_id AS bigint) IS NULL OR t.id < CAST(:before_id AS bigint))
    ORDER BY t.id DESC
    LIMIT CAST(:limit AS int)
    """,
)

# The cancel rule, shared by one task and many: pending is cancelled at once; running is flagged
# and the worker's heartbeat picks the flag up.
_CANCEL_SET = """
    SET status = CASE WHEN t.status = 'pending' THEN 'cancelled' ELSE t.status END,
        finished_at = CASE WHEN t.status = 'pending' THEN now() ELSE t.finished_at END,
        last_error = CASE WHEN t.status = 'pending' THEN 'cancelled before it started'
                          ELSE t.last_error END,
        cancel_requested = true
"""
# Never the runtime-config update: a newer config supersedes it instead (the route answers 409).
_CANCELLABLE = f"t.status IN ('pending', 'running') AND t.type <> '{RUNTIME_CONFIG_TASK_TYPE}'"

task_cancel = _query(
    "task_cancel",
    f"""
    UPDATE taskfleet.tasks t
    {_CANCEL_SET}
    WHERE t.id = CAST(:id AS bigint) AND {_CANCELLABLE}
    RETURNING {_TASK_COLUMNS}
    """,
)

# The retry rule, shared by one task and many: a failed or cancelled task back to pending, as if
# new: attempts 0, due now. last_error is kept until the next attempt writes its own outcome, so
# the reason stays readable. The runtime-config task is never retried: a new PUT /runtime-config
# is the way to re-apply.
_RETRY_SET = """
    SET status = 'pending', attempts = 0, run_after = now(), finished_at = NULL,
        started_at = NULL, worker_id = NULL, lease_expires_at = NULL, result = NULL,
        cancel_requested = false
"""
_RETRYABLE = f"t.status IN ('failed', 'cancelled') AND t.type <> '{RUNTIME_CONFIG_TASK_TYPE}'"
_LANE_OF_TASK = f"""CASE WHEN t.priority >= {CONTROL_PRIORITY} THEN 'control'
                    WHEN t.priority > 0 THEN 'strict' ELSE 'normal' END"""

task_retry = _query(
    "task_retry",
    f"""
    WITH retried AS (
        UPDATE taskfleet.tasks t
        {_RETRY_SET}
        WHERE t.id = CAST(:id AS bigint) AND {_RETRYABLE}
        RETURNING t.*
    )
    -- The same wake-up as a submission, naming the task's lane; delivered at commit.
    SELECT {_TASK_COLUMNS},
           pg_notify('{TASK_READY_CHANNEL}', {_LANE_OF_TASK}) AS woke
    FROM retried t
    """,
)

# The filter of the bulk actions (POST /tasks/retry, POST /tasks/cancel), for one status at a
# time: each batch is then a bounded range of the (status, id DESC) index, newest first from the
# cursor down. A NULL parameter means "no filter on this field".
_BULK_CANDIDATES = """
    SELECT t.id, t.unique_key FROM taskfleet.tasks t
    WHERE t.status = CAST(:status AS text)
      AND (CAST(:ids AS bigint[]) IS NULL OR t.id = ANY(CAST(:ids AS bigint[])))
      AND (CAST(:type AS text) IS NULL OR t.type = CAST(:type AS text))
      AND (CAST(:labels AS text[]) IS NULL OR t.labels @> CAST(:labels AS text[]))
      AND (CAST(:created_before AS timestamptz) IS NULL
           OR t.created_at < CAST(:created_before AS timestamptz))
      AND (CAST(:created_after AS timestamptz) IS NULL
           OR t.created_at >= CAST(:created_after AS timestamptz))
      AND (CAST(:before_id AS bigint) IS NULL OR t.id < CAST(:before_id AS bigint))
    ORDER BY t.id DESC
    LIMIT CAST(:batch AS int)
"""

task_retry_batch = _query(
    "task_retry_batch",
    f"""
    WITH
    -- One batch of matching tasks: at most :batch rows are ever locked by one statement.
    candidates AS ({_BULK_CANDIDATES}),
    -- A unique_key promises one unfinished task per key: retry only the newest candidate of a
    -- key, and none whose key an unfinished task holds already.
    eligible AS (
        SELECT c.id FROM (
            SELECT c.*, row_number() OVER (PARTITION BY c.unique_key ORDER BY c.id DESC) AS nth
            FROM candidates c
        ) c
        WHERE c.unique_key IS NULL
           OR (c.nth = 1 AND NOT EXISTS (
                   SELECT 1 FROM taskfleet.tasks u
                   WHERE u.unique_key = c.unique_key AND u.status IN ('pending', 'running')))
    ),
    -- The single-task rule, re-checked on the locked row (its status may have moved).
    retried AS (
        UPDATE taskfleet.tasks t
        {_RETRY_SET}
        WHERE t.id = ANY(ARRAY(SELECT id FROM eligible)) AND {_RETRYABLE}
          AND t.status = CAST(:status AS text)
        RETURNING {_LANE_OF_TASK} AS lane
    ),
    -- One wake-up per batch, naming the lanes that got work (delivered at commit).
    lanes AS (SELECT string_agg(DISTINCT lane, ',' ORDER BY lane) AS hint FROM retried)
    SELECT (SELECT count(*) FROM candidates) AS scanned,
           (SELECT min(id) FROM candidates) AS last_id,
           (SELECT count(*) FROM retried) AS changed,
           (SELECT pg_notify('{TASK_READY_CHANNEL}', lanes.hint) FROM lanes
            WHERE lanes.hint IS NOT NULL) AS woke
    """,
)

task_cancel_batch = _query(
    "task_cancel_batch",
    f"""
    WITH
    -- One batch of matching tasks: at most :batch rows are ever locked by one statement.
    candidates AS ({_BULK_CANDIDATES}),
    -- The single-task rule, re-checked on the locked row; the runtime-config task is left
    -- alone (cancel it by id if you must).
    cancelled AS (
        UPDATE taskfleet.tasks t
        {_CANCEL_SET}
        WHERE t.id = ANY(ARRAY(SELECT id FROM candidates)) AND {_CANCELLABLE}
          AND t.status = CAST(:status AS text) AND t.type <> '{RUNTIME_CONFIG_TASK_TYPE}'
        RETURNING t.id
    )
    SELECT (SELECT count(*) FROM candidates) AS scanned,
           (SELECT min(id) FROM candidates) AS last_id,
           (SELECT count(*) FROM cancelled) AS changed
    """,
)

# The group of a normal-lane task by its stored key ('' = default); a row not yet re-grouped
# after a change of the configured labels is counted where a claim would find it.
# A normal-lane task's group by name, NULL for the default group. A stored key the latest
# grouping no longer has (its label was taken out of labelWeights; the re-grouping has not
# reached the row yet) is computed by the rule instead: no group the stats do not know, and
# the task counts where it will be claimed from. (Rows of the default group whose label was
# just weighted count there until the re-grouping moves them.)
_GROUP_OF_TASK = """CASE WHEN t.priority = 0 THEN
                    CASE WHEN t.group_key = '' THEN NULL
                         WHEN t.group_key = ANY(grouping_now.labels) THEN t.group_key
                         ELSE NULLIF(taskfleet.task_group_key(t.labels, grouping_now.labels), '')
                    END
               END"""

# --------------------------------------------------------------------------------------------
# Tasks: the API's queue gauges (/metrics). Each statement reads a bounded number of index
# entries or rows, however deep the backlog (docs/operations.md#metrics-at-depth).
# --------------------------------------------------------------------------------------------

metrics_queue_depth = _query(
    "metrics_queue_depth",
    f"""
    -- Pending per series (a lane, and in the normal lane a stored group key), each counted to
    -- at most :limit entries of the lane's claim index; a series at the bound gets the
    -- planner's estimate instead (taskfleet.pending_estimate: EXPLAIN, no row read).
    SELECT c.lane, c.group_key, c.counted,
           CASE WHEN c.counted >= CAST(:limit AS int)
                THEN taskfleet.pending_estimate(c.lane, c.group_key) END AS estimate
    FROM (
        SELECT s.lane, s.group_key,
               CASE s.lane
               WHEN 'control' THEN (
                   SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                                         WHERE t.status = 'pending'
                                           AND t.priority = {CONTROL_PRIORITY}
                                         LIMIT CAST(:limit AS int)) AS capped)
               WHEN 'strict' THEN (
                   SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                                         WHERE t.status = 'pending' AND t.priority > 0
                                           AND t.priority < {CONTROL_PRIORITY}
                                         LIMIT CAST(:limit AS int)) AS capped)
               ELSE (
                   SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                                         WHERE t.status = 'pending' AND t.priority = 0
                                           AND t.group_key = s.group_key
                                         LIMIT CAST(:limit AS int)) AS capped)
               END AS counted
        FROM unnest(CAST(:lanes AS text[]), CAST(:group_keys AS text[])) AS s(lane, group_key)
    ) AS c
    """,
)

metrics_oldest_ready = _query(
    "metrics_oldest_ready",
    f"""
    WITH
    -- The oldest :limit pending tasks by id (the order they were submitted in), through the
    -- (status, id DESC) index: the whole backlog while it is shorter than that.
    sample AS (
        SELECT t.priority, t.group_key, t.created_at, t.run_after,
               -- Paused (runtime config pausedLabels, pausedTypes, pausedLanes): waiting by
               -- decision, which is not starvation.
               (t.priority < {CONTROL_PRIORITY} AND (
                    t.labels && CAST(:paused_labels AS text[])
                    OR t.type = ANY(CAST(:paused_types AS text[]))
                    OR ({_LANE_OF_TASK}) = ANY(CAST(:paused_lanes AS text[])))) AS paused
        FROM taskfleet.tasks t
        WHERE t.status = 'pending'
        ORDER BY t.id
        LIMIT CAST(:limit AS int)
    )
    -- Per lane and group: the longest a due task that is not paused has waited, counted from
    -- the later of its submission and its run_after (a run_at in the past does not make a new
    -- task look old); and the paused tasks among the sample.
    SELECT {_LANE_OF_TASK} AS lane,
           CASE WHEN t.priority = 0 THEN t.group_key ELSE '' END AS group_key,
           CAST(EXTRACT(EPOCH FROM now() - min(GREATEST(t.created_at, t.run_after))
                                           FILTER (WHERE t.run_after <= now()
                                                   AND NOT t.paused)) AS float8)
               AS oldest_ready_seconds,
           count(*) FILTER (WHERE t.paused) AS paused
    FROM sample t
    GROUP BY 1, 2
    """,
)

metrics_unrunnable = _query(
    "metrics_unrunnable",
    f"""
    WITH RECURSIVE
    -- Every type with pending tasks, by a skip scan of tasks_pending_type_idx (pending rows
    -- only, keyed by type COLLATE "C", which nothing else asks for): one probe per distinct
    -- type, however many rows each has, finished ones not at all.
    types AS (
        (SELECT t.type COLLATE "C" AS type FROM taskfleet.tasks t WHERE t.status = 'pending'
         ORDER BY t.type COLLATE "C" LIMIT 1)
        UNION ALL
        SELECT (SELECT t.type COLLATE "C" FROM taskfleet.tasks t
                WHERE t.status = 'pending' AND t.type COLLATE "C" > types.type
                ORDER BY t.type COLLATE "C" LIMIT 1)
        FROM types WHERE types.type IS NOT NULL
    ),
    -- What the alive workers have handlers for (the control task excepted: all have one).
    known AS (
        SELECT COALESCE(array_agg(DISTINCT k), ARRAY[]::text[]) AS types
        FROM taskfleet.workers w, unnest(w.task_types) AS k
        WHERE {_ALIVE}
    )
    -- Pending tasks of the types no alive worker knows, each type counted to :limit.
    SELECT 'unknown_type' AS reason, COALESCE(sum((
               SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                                     WHERE t.type COLLATE "C" = types.type
                                       AND t.status = 'pending'
                                     LIMIT CAST(:limit AS int)) AS capped)), 0) AS tasks
    FROM types, known
    WHERE types.type IS NOT NULL AND types.type <> '{RUNTIME_CONFIG_TASK_TYPE}'
      AND NOT (types.type = ANY(known.types))
    UNION ALL
    -- missing_tags: pending tasks that require tags no alive worker has all of, counted to
    -- :limit through the index of pending tasks with requires (the alive fleet's tag sets are
    -- few).
    SELECT 'missing_tags', count(*)
    FROM (SELECT 1 FROM taskfleet.tasks t
          WHERE t.status = 'pending' AND t.requires <> '{{}}'
            AND NOT EXISTS (
                SELECT 1 FROM (SELECT DISTINCT w.tags FROM taskfleet.workers w
                               WHERE {_ALIVE}) AS f
                WHERE t.requires <@ f.tags)
          LIMIT CAST(:limit AS int)) AS capped
    """,
)

label_limit_stats = _query(
    "label_limit_stats",
    """
    -- The fleet-wide label limits and their state (metrics, at scrape): tasks running under
    -- each (its count less the releases not folded in yet) and the tokens in its bucket now.
    SELECT l.label, l.max_in_flight, l.rate_per_second,
           GREATEST(l.in_flight - (SELECT count(*) FROM taskfleet.label_limit_releases r
                                   WHERE r.label = l.label), 0) AS in_flight,
           CASE WHEN l.rate_per_second IS NOT NULL THEN
               LEAST(GREATEST(l.rate_per_second, 1),
                     l.tokens + GREATEST(l.rate_per_second, 0.000001) * GREATEST(
                         CAST(EXTRACT(EPOCH FROM now() - l.refilled_at) AS float8), 0))
           END AS tokens
    FROM taskfleet.label_limits l
    WHERE l.max_in_flight IS NOT NULL OR l.rate_per_second IS NOT NULL
    ORDER BY l.label
    """,
)

# --------------------------------------------------------------------------------------------
# Tasks: GET /tasks/stats. Every statement here reads a bounded number of index entries or rows
# (docs/operations.md#task-statistics says what each costs).
# --------------------------------------------------------------------------------------------


def _status_count(status: str) -> str:
    return f"""
    SELECT '{status}' AS status,
           (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t WHERE t.status = '{status}'
                                  LIMIT CAST(:limit AS int)) AS capped) AS counted
    WHERE '{status}' = ANY(CAST(:statuses AS text[]))"""


task_stats_status_counts = _query(
    "task_stats_status_counts",
    # Per status, count at most :limit rows. Each status is a literal of its own branch, so the
    # planner weighs it with that status's statistics: a rare one (running, cancelled) is an
    # index range of (status, id DESC); a common one stops at :limit rows whatever it reads.
    # With the status as a parameter, every branch was planned for an average status and, at a
    # million rows not yet vacuumed, read as a sequential scan of the whole table (200-450 ms).
    " UNION ALL ".join(_status_count(status.value) for status in TaskStatus),
)

task_stats_status_estimates = _query(
    "task_stats_status_estimates",
    """
    -- The planner's statistics (ANALYZE, autovacuum): the table's row estimate and the share of
    -- each status among its rows. Reads two catalog rows; no table row.
    SELECT c.reltuples,
           CAST(CAST(s.most_common_vals AS text) AS text[]) AS statuses,
           s.most_common_freqs AS shares
    FROM pg_class c
    LEFT JOIN pg_stats s
           ON s.schemaname = 'taskfleet' AND s.tablename = 'tasks' AND s.attname = 'status'
    WHERE c.oid = CAST('taskfleet.tasks' AS regclass)
    """,
)

task_stats_lanes = _query(
    "task_stats_lanes",
    f"""
    -- Pending per lane, each counted to at most :limit entries of the lane's claim index; running
    -- per lane (no more rows than the fleet has slots, through the running-only index).
    SELECT
        (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                               WHERE t.status = 'pending' AND t.priority = {CONTROL_PRIORITY}
                               LIMIT CAST(:limit AS int)) AS capped) AS control_pending,
        (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                               WHERE t.status = 'pending' AND t.priority > 0
                                 AND t.priority < {CONTROL_PRIORITY}
                               LIMIT CAST(:limit AS int)) AS capped) AS strict_pending,
        (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                               WHERE t.status = 'pending' AND t.priority = 0
                               LIMIT CAST(:limit AS int)) AS capped) AS normal_pending,
        (SELECT count(*) FROM taskfleet.tasks t
         WHERE t.status = 'running' AND t.priority = {CONTROL_PRIORITY}) AS control_running,
        (SELECT count(*) FROM taskfleet.tasks t
         WHERE t.status = 'running' AND t.priority > 0
           AND t.priority < {CONTROL_PRIORITY}) AS strict_running,
        (SELECT count(*) FROM taskfleet.tasks t
         WHERE t.status = 'running' AND t.priority = 0) AS normal_running
    """,
)

task_stats_pending_sample = _query(
    "task_stats_pending_sample",
    f"""
    WITH
    -- The oldest :limit pending tasks (by id, the order they were submitted in), read from the
    -- (status, id DESC) index: the whole backlog while it is shorter than that.
    sample AS (
        SELECT t.priority, t.group_key, t.labels, t.run_after FROM taskfleet.tasks t
        WHERE t.status = 'pending'
        ORDER BY t.id
        LIMIT CAST(:limit AS int)
    ),
    grouping_now AS ({_GROUPING_LATEST})
    -- Per lane and normal-lane group (NULL: the default group): how many, how many are due,
    -- and the longest a due one has waited since it became due.
    SELECT {_LANE_OF_TASK} AS lane, {_GROUP_OF_TASK} AS grp, count(*) AS pending,
           count(*) FILTER (WHERE t.run_after <= now()) AS ready,
           CAST(COALESCE(EXTRACT(EPOCH FROM now() - min(t.run_after)
                                 FILTER (WHERE t.run_after <= now())), 0) AS float8)
               AS oldest_ready_seconds
    FROM sample t LEFT JOIN grouping_now ON true
    GROUP BY 1, 2
    """,
)

task_stats_finished = _query(
    "task_stats_finished",
    """
    -- Finished in the last minute per status, and failed in the last hour: ranges of the
    -- (status, finished_at) index, each counted to at most :limit entries.
    SELECT
        (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                               WHERE t.status = 'completed'
                                 AND t.finished_at > now() - interval '1 minute'
                               LIMIT CAST(:limit AS int)) AS capped) AS completed_last_minute,
        (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                               WHERE t.status = 'failed'
                                 AND t.finished_at > now() - interval '1 minute'
                               LIMIT CAST(:limit AS int)) AS capped) AS failed_last_minute,
        (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                               WHERE t.status = 'cancelled'
                                 AND t.finished_at > now() - interval '1 minute'
                               LIMIT CAST(:limit AS int)) AS capped) AS cancelled_last_minute,
        (SELECT count(*) FROM (SELECT 1 FROM taskfleet.tasks t
                               WHERE t.status = 'failed'
                                 AND t.finished_at > now() - interval '1 hour'
                               LIMIT CAST(:limit AS int)) AS capped) AS failed_last_hour
    """,
)

# --------------------------------------------------------------------------------------------
# Tasks: the worker's hot path
# --------------------------------------------------------------------------------------------

# The outcome columns of a finished attempt; shared by task_finish_batch and task_claim (which
# writes the outcomes gathered since the previous claim in the same round trip). A retry of a
# task whose cancel was requested ends it cancelled instead: a cancel is never lost to a retry.
_RETRY_CANCELLED = "(d.status = 'pending' AND t.cancel_requested)"
_FINAL_STATUS = f"(CASE WHEN {_RETRY_CANCELLED} THEN 'cancelled' ELSE d.status END)"
_FINISH_SET = f"""
    SET status = {_FINAL_STATUS},
        result = CAST(d.result AS jsonb),
        last_error = CASE WHEN {_RETRY_CANCELLED}
                          THEN 'cancelled: requested while attempt ' || t.attempts
                               || ' ran, which then failed: ' || COALESCE(d.error, '?')
                          ELSE d.error END,
        finished_at = CASE WHEN {_FINAL_STATUS} = 'pending' THEN NULL ELSE now() END,
        run_after = CASE WHEN {_FINAL_STATUS} = 'pending'
                         THEN now() + make_interval(secs => d.retry_in) ELSE t.run_after END,
        worker_id = CASE WHEN {_FINAL_STATUS} = 'pending' THEN NULL ELSE t.worker_id END,
        lease_expires_at = NULL
    FROM unnest(CAST(:fin_ids AS bigint[]), CAST(:fin_attempts AS int[]),
                CAST(:fin_statuses AS text[]), CAST(:fin_results AS text[]),
                CAST(:fin_errors AS text[]), CAST(:fin_retry_in AS float8[]))
         AS d(id, attempt, status, result, error, retry_in)
    -- Fenced by (worker_id, status = 'running', attempts = the attempt that ran): a worker that
    -- lost its lease, or runs a later attempt of the same task, changes nothing with this one.
    -- id = ANY(...) gives the planner an index condition on the key.
    WHERE t.id = d.id AND t.id = ANY(CAST(:fin_ids AS bigint[]))
      AND t.worker_id = CAST(:worker_id AS text) AND t.status = 'running'
      AND t.attempts = d.attempt
"""


# What every lane but control asks of a row besides its lane, readiness and order: a type this
# worker has a handler for and that is not paused (:types), every tag the task requires among the
# worker's (:tags), and no label the claim must leave alone (excluded: paused, or limited with
# no room). Filters inside the lane's index range: see docs/operations.md#pause-and-resume.
_CLAIMABLE = """t.run_after <= now() AND t.type = ANY(CAST(:types AS text[]))
              AND t.requires <@ CAST(:tags AS text[])
              AND NOT (t.labels && (SELECT excluded.labels FROM excluded))
              AND (SELECT limits_off.ok FROM limits_off)"""


# Without limits: the labels the claim leaves alone are the paused ones, and a guard stops it
# (every lane but control) when a label limit is active in the database (limits_active): the
# worker's config may not say so yet, and a claim without the accounting must never take a
# limited task. The worker then claims with task_claim_limited.
_NO_LIMIT_HEAD = """
    excluded AS (SELECT CAST(:paused_labels AS text[]) AS labels),
    limits_off AS (
        SELECT NOT EXISTS (SELECT 1 FROM taskfleet.label_limits l
                           WHERE l.max_in_flight IS NOT NULL OR l.rate_per_second IS NOT NULL)
               AS ok
    ),
"""
_NO_LIMIT_TAIL = """
    limit_wait AS (SELECT CAST(NULL AS float8) AS seconds)
"""

_LIMIT_HEAD = """
    -- Fleet-wide label limits (runtime config labelLimits, kept in label_limits), as this
    -- statement's snapshot sees them, unlocked: which labels are limited, and which have no
    -- room (running at maxInFlight, counting the releases not folded in yet; or an empty token
    -- bucket, refilled at ratePerSecond up to one second's worth, at least 1). Only a hint
    -- that keeps the walks off exhausted labels: the locked rows below decide.
    limit_hint AS (
        SELECT l.label, l.rate_per_second,
               l.max_in_flight IS NOT NULL
                   AND l.in_flight - (SELECT count(*) FROM taskfleet.label_limit_releases r
                                      WHERE r.label = l.label) >= l.max_in_flight AS full,
               CASE WHEN l.rate_per_second IS NOT NULL THEN
                   LEAST(GREATEST(l.rate_per_second, 1),
                         l.tokens + GREATEST(l.rate_per_second, 0.000001) * GREATEST(
                             CAST(EXTRACT(EPOCH FROM now() - l.refilled_at) AS float8), 0))
               END AS bucket
        FROM taskfleet.label_limits l
        WHERE l.max_in_flight IS NOT NULL OR l.rate_per_second IS NOT NULL
    ),
    -- The labels this claim leaves alone: paused ones, and limited ones without room.
    excluded AS (
        SELECT CAST(:paused_labels AS text[])
               || ARRAY(SELECT h.label FROM limit_hint h WHERE h.full OR h.bucket < 1)
               AS labels
    ),
    limits_off AS (SELECT true AS ok),
"""
_LIMIT_MID = """
    -- The limited labels among the picks. Only their limit rows are locked: a claim that took
    -- no limited task touches no limit row.
    picked_limited AS (
        SELECT DISTINCT u.label
        FROM (SELECT strict.labels FROM strict UNION ALL SELECT normal.labels FROM normal) AS p
        CROSS JOIN LATERAL unnest(p.labels) AS u(label)
        WHERE u.label = ANY(ARRAY(SELECT limit_hint.label FROM limit_hint))
    ),
    -- Their rows, locked in label order for this transaction and never waited for (SKIP
    -- LOCKED: a row another claim holds right now means this claim leaves that label's picks
    -- for the next one). As locked, a row is its latest committed version, whatever this
    -- statement's snapshot: the count and bucket below are exact.
    limit_rows AS (
        SELECT l.label, l.max_in_flight, l.rate_per_second, l.in_flight, l.tokens, l.refilled_at
        FROM taskfleet.label_limits l
        WHERE l.label = ANY(ARRAY(SELECT picked_limited.label FROM picked_limited))
          AND (l.max_in_flight IS NOT NULL OR l.rate_per_second IS NOT NULL)
        ORDER BY l.label
        FOR UPDATE SKIP LOCKED
    ),
    -- Counted tasks of those labels that left running since (written by a trigger without
    -- touching the limit row): folded into the count here, each exactly once.
    released AS (
        DELETE FROM taskfleet.label_limit_releases r
        WHERE r.label = ANY(ARRAY(SELECT limit_rows.label FROM limit_rows))
        RETURNING r.label
    ),
    -- Each locked label: tasks running, tokens now, and the room this claim has. The bucket
    -- runs on the clock read after the lock (not the transaction's start, which may be older
    -- than the last refill), the clock the claimed rows' started_at is read from.
    limit_state AS (
        SELECT s.*,
               LEAST(COALESCE(s.max_in_flight - s.running, 2147483647),
                     COALESCE(floor(s.bucket), 2147483647)) AS room
        FROM (
            SELECT lr.label, lr.max_in_flight, lr.rate_per_second,
                   GREATEST(lr.in_flight - (SELECT count(*) FROM released
                                            WHERE released.label = lr.label), 0) AS running,
                   (SELECT count(*) FROM released WHERE released.label = lr.label) AS freed,
                   CASE WHEN lr.rate_per_second IS NOT NULL THEN
                       LEAST(GREATEST(lr.rate_per_second, 1),
                             lr.tokens + GREATEST(lr.rate_per_second, 0.000001) * GREATEST(
                                 CAST(EXTRACT(EPOCH FROM clock_timestamp() - lr.refilled_at)
                                      AS float8), 0))
                   END AS bucket
            FROM limit_rows lr
        ) AS s
    ),
    -- Picks left out (they stay pending): those of a limited label whose row another claim
    -- holds, and those beyond a label's room (strict picks first, then each lane in its claim
    -- order). A task with several limited labels must fit in the room of each.
    over_limit AS (
        SELECT p.id
        FROM (SELECT strict.id, strict.labels FROM strict
              UNION ALL SELECT normal.id, normal.labels FROM normal) AS p
        WHERE p.labels && ARRAY(SELECT picked_limited.label FROM picked_limited
                                EXCEPT SELECT limit_rows.label FROM limit_rows)
        UNION
        SELECT ranked.id FROM (
            SELECT p.id, ls.room,
                   row_number() OVER (PARTITION BY ls.label
                                      ORDER BY p.lane, p.priority DESC, p.weight DESC,
                                               p.created_at, p.id) AS nth
            FROM (SELECT strict.id, strict.labels, 1 AS lane, strict.priority, 1 AS weight,
                         strict.created_at FROM strict
                  UNION ALL
                  SELECT normal.id, normal.labels, 2, 0, normal.weight, normal.created_at
                  FROM normal) AS p
            JOIN limit_state ls ON ls.label = ANY(p.labels)
        ) AS ranked
        WHERE ranked.nth > ranked.room
    ),
"""
_LIMIT_TAIL = """
    -- The locked limit rows that changed: what this claim started and the releases it folded
    -- in (the bucket is refilled lazily: an untouched row stays as it is).
    limits_charged AS (
        UPDATE taskfleet.label_limits l
        SET in_flight = ls.running + COALESCE(taken.n, 0),
            tokens = CASE WHEN ls.rate_per_second IS NULL THEN l.tokens
                          ELSE ls.bucket - COALESCE(taken.n, 0) END,
            refilled_at = CASE WHEN ls.rate_per_second IS NULL THEN l.refilled_at
                               ELSE GREATEST(l.refilled_at, clock_timestamp()) END
        FROM limit_state ls
        LEFT JOIN (SELECT u.label, count(*) AS n
                   FROM claimed CROSS JOIN LATERAL unnest(claimed.limit_labels) AS u(label)
                   GROUP BY u.label) AS taken ON taken.label = ls.label
        WHERE l.label = ls.label AND (taken.n IS NOT NULL OR ls.freed > 0)
        RETURNING l.label
    ),
    -- When a limit held picks back: the seconds until a rate-limited label's next token (the
    -- worker asks again then instead of at its poll interval); a row another claim held, or a
    -- room smaller than the picks: soon. A rate is read as at least MIN_RATE_PER_SECOND
    -- (policy/runtime_config.py) everywhere here: a smaller one stored by an older version
    -- would overflow float8 and fail every claim.
    limit_wait AS (
        SELECT LEAST(
                   (SELECT min((1 - h.bucket) / GREATEST(h.rate_per_second, 0.000001))
                    FROM limit_hint h WHERE h.bucket < 1),
                   (SELECT 0.05 FROM over_limit LIMIT 1)
               ) AS seconds
    )
"""


# What a claim answers besides its rows, about each lane and group that came back short (and the
# lanes it did not ask of): were ready rows skipped because another worker holds them, or is it
# empty? The worker marks an empty lane or group dry, and asks a contended one again soon. A
# claim that expects to get all it asks leaves these out (task_claim_steady): their subqueries
# cost about a tenth of the claim's round trip even when their CASE is false (docs/benchmarks.md,
# "Where the claim statement's time goes").
_PROBES = f"""
    -- A group that came back short: were rows skipped because another worker holds them
    -- (contended: ask again soon) or is it empty (dry until a hint)? One index probe for the
    -- first ready row this claim did not take, only for a short group (CASE evaluates lazily).
    contended AS (
        SELECT COALESCE(array_agg(s.grp), ARRAY[]::text[]) AS groups
        FROM (
            SELECT quota.grp, quota.n,
                   (SELECT count(*) FROM normal WHERE normal.grp = quota.grp) AS got
            FROM quota
        ) AS s
        -- CASE, not AND: the planner may order AND's operands by cost; CASE probes only a
        -- group that really came back short.
        WHERE CASE WHEN s.got < s.n THEN (
            SELECT t.id FROM taskfleet.tasks t
            WHERE t.status = 'pending' AND t.priority = 0 AND t.group_key = s.grp
              AND {_CLAIMABLE}
              AND t.id <> ALL(ARRAY(SELECT normal.id FROM normal WHERE normal.grp = s.grp))
            ORDER BY t.weight DESC, t.created_at, t.id
            LIMIT 1
        ) IS NOT NULL ELSE false END
    ),
    -- The strict lane's one probe, "the first ready strict row this claim did not take", asked
    -- when the cap is full (is strict work waiting?) or when the lane came back short (was it
    -- contention?): one subquery for both questions (each reference to the table costs planning
    -- time on every claim).
    strict_probe AS (
        SELECT (SELECT count(*) FROM strict) AS got,
               CASE WHEN CAST(:probe_strict AS boolean)
                         OR CAST(:strict_limit AS int) > (SELECT count(*) FROM strict) THEN (
                   SELECT t.id FROM taskfleet.tasks t
                   WHERE t.status = 'pending' AND t.priority > 0
                     AND t.priority < {CONTROL_PRIORITY} AND {_CLAIMABLE}
                     AND t.id <> ALL(ARRAY(SELECT id FROM strict))
                   ORDER BY t.priority DESC, t.created_at, t.id
                   LIMIT 1
               ) IS NOT NULL ELSE false END AS found
    ),
    -- Lanes this claim did not ask of: is ready work waiting there? (Index probes, no locks.)
    -- strict: the cap is full (the saturation counter); normal: every slot went to the strict
    -- lane, and an empty answer lets an idle worker sleep after one statement, not two.
    waiting AS (
        -- Written as "the first row in claim order, LIMIT 1", not EXISTS: an EXISTS without an
        -- index condition was planned as a sequential scan of the whole table (175 ms at 1M
        -- rows); ordering by the claim index's own key keeps it a one-row index probe.
        SELECT CAST(:probe_strict AS boolean) AND strict_probe.found AS strict_waiting,
               CAST(:strict_limit AS int) > strict_probe.got AND strict_probe.found
                   AS strict_contended,
               CAST(:probe_normal AS boolean) AND (
                   SELECT t.id FROM taskfleet.tasks t
                   WHERE t.status = 'pending' AND t.priority = 0 AND {_CLAIMABLE}
                   ORDER BY t.group_key, t.weight DESC, t.created_at, t.id
                   LIMIT 1
               ) IS NOT NULL AS normal_waiting
        FROM strict_probe
    ),
"""


# The claim's parts that the normal-only claim (task_claim_normal) leaves out: the outcomes it
# carries, the control and strict lanes, and the outcomes' answer.
_FINISHED_CTE = f"""
    -- Outcomes of attempts finished since the last claim: written in this same round trip.
    finished AS (
        UPDATE taskfleet.tasks t
        {_FINISH_SET}
        RETURNING t.id, t.status, t.attempts AS attempt
    ),
"""


def _control_and_strict(strict_columns: str) -> str:
    return f"""
    -- Control lane: the runtime-config task. Claimed before anything else, outside the strict
    -- cap, into the worker's extra control slot (control_limit is 0 or 1). Never paused, never
    -- limited, never routed.
    control AS (
        SELECT t.id FROM taskfleet.tasks t
        WHERE t.status = 'pending' AND t.priority = {CONTROL_PRIORITY} AND t.run_after <= now()
          AND t.type = ANY(CAST(:types AS text[]))
        ORDER BY t.priority DESC, t.created_at, t.id
        LIMIT CAST(:control_limit AS int)
        FOR UPDATE SKIP LOCKED
    ),
    -- Strict lane: priority > 0, up to the free strict slots (cap minus strict in flight).
    -- Every lane takes only the types this worker has handlers for (:types): a type it does
    -- not know stays pending for a worker that does (a rolling deploy's new types).
    strict AS (
        SELECT t.id{strict_columns} FROM taskfleet.tasks t
        WHERE t.status = 'pending' AND t.priority > 0 AND t.priority < {CONTROL_PRIORITY}
          AND {_CLAIMABLE}
        ORDER BY t.priority DESC, t.created_at, t.id
        LIMIT CAST(:strict_limit AS int)
        FOR UPDATE SKIP LOCKED
    ),
"""


_FINISHED_ARRAYS = """ARRAY(SELECT finished.id FROM finished ORDER BY finished.id) AS finished_ids,
           -- The status each was given (the outcome counters count what was written).
           ARRAY(SELECT finished.status FROM finished ORDER BY finished.id)
               AS finished_statuses,
           -- And for which attempt (the same task can be written for one of two).
           ARRAY(SELECT finished.attempt FROM finished ORDER BY finished.id)
               AS finished_attempts,"""


def _claim_sql(*, limited: bool, probes: bool = True, normal_only: bool = False) -> str:
    """The claim statement; ``limited``: with the fleet-wide label limits' accounting;
    ``probes``: with the answers about what came back short (see :data:`_PROBES`);
    ``normal_only``: the normal lane alone, carrying no outcomes (see
    :data:`task_claim_normal`)."""
    if limited and not probes:
        raise ValueError("the limited claim always probes")
    if normal_only and (limited or probes):
        raise ValueError("the normal-only claim neither probes nor keeps the limits")
    if probes:
        waiting = "waiting.strict_waiting, waiting.normal_waiting"
        contended = "contended.groups AS contended_groups, waiting.strict_contended"
        answered_by = "waiting CROSS JOIN contended CROSS JOIN "
    else:
        # Nothing asked, nothing answered: a shortfall of this claim is not known to be dryness
        # or contention (the worker asks again with the probes).
        waiting = "false AS strict_waiting, false AS normal_waiting"
        contended = "ARRAY[]::text[] AS contended_groups, false AS strict_contended"
        answered_by = ""
    probe_ctes = _PROBES if probes else ""
    limit_head = _LIMIT_HEAD if limited else _NO_LIMIT_HEAD
    limit_mid = _LIMIT_MID if limited else ""
    limit_tail = _LIMIT_TAIL if limited else _NO_LIMIT_TAIL
    limit_labels = (
        "ARRAY(SELECT ls.label FROM limit_state ls\n"
        "                                 WHERE ls.label = ANY(t.labels) ORDER BY ls.label)"
        if limited
        # Never a stale list from an earlier limited claim: it would be released twice.
        else "'{}'"
    )
    taken_at = "clock_timestamp()" if limited else "now()"
    limit_except = (
        "\n                               EXCEPT SELECT id FROM over_limit" if limited else ""
    )
    # The limits' accounting ranks the picks by label: it needs their labels and claim order.
    strict_columns = ", t.labels, t.priority, t.weight, t.created_at" if limited else ""
    normal_columns = ", t.labels, t.weight, t.created_at" if limited else ""
    if normal_only:
        finished_cte = control_and_strict = ""
        picks = "SELECT id FROM normal"
        finished_arrays = (
            "ARRAY[]::bigint[] AS finished_ids, ARRAY[]::text[] AS finished_statuses,\n"
            "           ARRAY[]::int[] AS finished_attempts,"
        )
    else:
        finished_cte = _FINISHED_CTE
        control_and_strict = _control_and_strict(strict_columns)
        picks = (
            "SELECT id FROM control UNION ALL SELECT id FROM strict\n"
            "                               UNION ALL SELECT id FROM normal"
        )
        finished_arrays = _FINISHED_ARRAYS
    return f"""
    WITH
{finished_cte}{limit_head}{control_and_strict}
    -- Normal-lane quotas from the worker's weighted rotation: one row per group, its key as
    -- stored in tasks.group_key (NULL, the default group, is ''). A group whose key is an
    -- excluded label holds only excluded tasks: skipped without reading a row.
    quota AS (
        SELECT COALESCE(q.grp, '') AS grp, q.n
        FROM unnest(CAST(:group_keys AS text[]), CAST(:group_limits AS int[])) AS q(grp, n)
        WHERE q.n > 0
          AND NOT (ARRAY[COALESCE(q.grp, '')] && (SELECT excluded.labels FROM excluded))
    ),
    -- Normal lane: per group, its quota of tasks in (weight DESC, created_at, id) order: an
    -- index range of the group's own rows, whatever the other groups hold.
    normal AS (
        SELECT quota.grp, picked.*
        FROM quota
        CROSS JOIN LATERAL (
            SELECT t.id{normal_columns} FROM taskfleet.tasks t
            WHERE t.status = 'pending' AND t.priority = 0 AND t.group_key = quota.grp
              AND {_CLAIMABLE}
            ORDER BY t.weight DESC, t.created_at, t.id
            LIMIT quota.n
            FOR UPDATE OF t SKIP LOCKED
        ) AS picked
    ),
{limit_mid}{probe_ctes}
    -- Take them all: running, leased, attempt counted, and the limited labels it counts under.
    claimed AS (
        UPDATE taskfleet.tasks t
        SET status = 'running',
            worker_id = CAST(:worker_id AS text),
            attempts = t.attempts + 1,
            -- When the claim began (see taken_at below).
            started_at = taken_at.now,
            lease_expires_at = taken_at.now + make_interval(secs => CAST(:lease_ttl AS float8)),
            limit_labels = {limit_labels}
        -- The limited claim stamps the clock when the rows are taken, after its snapshot and its
        -- limit locks: later than the finished_at of any finish whose freed slot (label limit)
        -- it used, so a label's [started_at, finished_at] intervals never overlap beyond its
        -- limit. Without limits nothing needs the later clock, and the claim stamps when it
        -- began, as a peer's dequeue does (docs/benchmarks.md, "Pickup").
        FROM (SELECT {taken_at} AS now) AS taken_at
        -- = ANY(ARRAY(...)) makes this a primary-key lookup; a join against the picks is
        -- planned as a hash join over the whole table once it grows (measured: 15 ms at 20k).
        WHERE t.id = ANY(ARRAY({picks}{limit_except}))
        RETURNING t.id, t.type, t.payload, t.priority, t.weight, t.labels, t.attempts,
                  t.max_attempts, t.timeout, t.cancel_requested, t.group_key, t.limit_labels,
                  CAST(EXTRACT(EPOCH FROM now() - GREATEST(t.created_at, t.run_after))
                       AS float8) AS wait_seconds
    ),
{limit_tail}
    -- Always one row at least, so the probe result and the written outcomes come back when
    -- nothing was claimed.
    SELECT {waiting},
           {finished_arrays}
           {contended},
           CAST(limit_wait.seconds AS float8) AS limit_wait_seconds,
           NOT (SELECT limits_off.ok FROM limits_off) AS limits_active,
           claimed.*
    FROM {answered_by}limit_wait LEFT JOIN claimed ON true
"""


task_claim = _query("task_claim", _claim_sql(limited=False))
# The same claim without the probes, for a claim expected to get all it asks (the previous one
# did): what it returns short is asked again with task_claim (ClaimPlan.probes).
task_claim_steady = _query("task_claim_steady", _claim_sql(limited=False, probes=False))
# The steady claim of the normal lane alone, carrying no outcomes: what a lone worker draining a
# backlog sends (outcomes written at once, the strict lane dry, the control slot idle). Every
# part of a statement costs executor set-up at each call, run or not: without the finished,
# control and strict parts the claim's round trip is about a tenth shorter (docs/benchmarks.md,
# "The normal-only claim").
task_claim_normal = _query(
    "task_claim_normal", _claim_sql(limited=False, probes=False, normal_only=True)
)
# The same claim with the accounting of the active label limits (docs/architecture.md).
task_claim_limited = _query("task_claim_limited", _claim_sql(limited=True))

task_finish_batch = _query(
    "task_finish_batch",
    f"""
    -- Several outcomes in one statement. Each row written says for which attempt (the same
    -- task can be here twice: an attempt whose lease was lost, and the next one).
    UPDATE taskfleet.tasks t
    {_FINISH_SET}
    RETURNING t.id, t.status, t.attempts AS attempt
    """,
)

task_release = _query(
    "task_release",
    f"""
    -- Graceful shutdown: give unfinished tasks back (the interrupted attempt is not counted),
    -- except those whose cancel was requested: they end cancelled. Fenced like a finish.
    WITH released AS (
        UPDATE taskfleet.tasks t
        SET status = CASE WHEN t.cancel_requested THEN 'cancelled' ELSE 'pending' END,
            worker_id = CASE WHEN t.cancel_requested THEN t.worker_id END,
            finished_at = CASE WHEN t.cancel_requested THEN now() END,
            lease_expires_at = NULL, run_after = now(),
            attempts = CASE WHEN t.cancel_requested THEN t.attempts
                            ELSE GREATEST(t.attempts - 1, 0) END,
            last_error = CASE WHEN t.cancel_requested
                              THEN 'cancelled: requested while attempt ' || t.attempts
                                   || ' ran; the worker shut down before it ended'
                              ELSE CAST(:reason AS text) END
        FROM unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[])) AS r(id, attempt)
        WHERE t.id = r.id AND t.id = ANY(CAST(:ids AS bigint[]))
          AND t.worker_id = CAST(:worker_id AS text) AND t.status = 'running'
          AND t.attempts = r.attempt
        RETURNING t.id, t.status, r.attempt
    )
    SELECT released.id, released.status, released.attempt FROM released
    CROSS JOIN (SELECT pg_notify('{TASK_READY_CHANNEL}', '')) AS wake
    """,
)

task_regroup_step = _query(
    "task_regroup_step",
    """
    -- One bounded step of re-grouping pending rows after a change of the configured label set
    -- (the database function holds the rule and the walk; see migration 0003_group_key).
    SELECT s.state, s.scanned, s.moved FROM taskfleet.task_regroup_step(CAST(:batch AS int)) AS s
    """,
)

# How many rows the lease sweep walks per tick as the re-grouping safety net (the config writer
# does the bulk right after a change; this finishes what a writer that died or ran out of time
# left).
SWEEP_REGROUP_BATCH = 2000

# --------------------------------------------------------------------------------------------
# Retention: the pruner (services/worker/pruner.py). Each statement is one short transaction
# that first takes the pruner's transaction-level advisory lock (a try: a busy lock means
# another worker prunes right now); no session lock, so a transaction-mode pooler works.
# --------------------------------------------------------------------------------------------

task_prune_batch = _query(
    "task_prune_batch",
    """
    WITH
    -- One pruner in the fleet at a time; released at commit.
    lock AS (SELECT pg_try_advisory_xact_lock(CAST(:lock_key AS bigint)) AS held),
    -- Per pruned status, the :batch rows that finished longest ago, older than the status'
    -- retention: a range of the (status, finished_at) index of finished tasks. Locked and
    -- re-checked, skipping rows someone holds (a retry moving it back to pending): a task
    -- changed meanwhile is not deleted.
    victims AS (
        SELECT v.id
        FROM lock,
             unnest(CAST(:statuses AS text[]), CAST(:keep AS float8[])) AS r(status, keep)
        CROSS JOIN LATERAL (
            SELECT t.id FROM taskfleet.tasks t
            WHERE t.status = r.status AND t.finished_at IS NOT NULL
              AND t.finished_at < now() - make_interval(secs => r.keep)
            ORDER BY t.finished_at
            LIMIT CAST(:batch AS int)
            FOR UPDATE OF t SKIP LOCKED
        ) AS v
        WHERE lock.held
    ),
    deleted AS (
        DELETE FROM taskfleet.tasks t
        WHERE t.id = ANY(ARRAY(SELECT id FROM victims))
          AND t.status = ANY(CAST(:statuses AS text[])) AND t.finished_at IS NOT NULL
        RETURNING t.status
    )
    SELECT (SELECT held FROM lock) AS held, s.status,
           (SELECT count(*) FROM deleted WHERE deleted.status = s.status) AS deleted
    FROM unnest(CAST(:statuses AS text[])) AS s(status)
    """,
)

worker_prune = _query(
    "worker_prune",
    f"""
    -- Rows of workers that are offline, or stopped heartbeating, for longer than the workers'
    -- retention (never an alive one, nor one that still holds running tasks: the sweep
    -- returns those when their leases expire, then the row goes).
    WITH lock AS (SELECT pg_try_advisory_xact_lock(CAST(:lock_key AS bigint)) AS held),
    deleted AS (
        DELETE FROM taskfleet.workers w
        USING lock
        WHERE lock.held AND {_WORKER_PRUNABLE}
        RETURNING w.id
    )
    SELECT (SELECT held FROM lock) AS held, count(*) AS deleted FROM deleted
    """,
)

runtime_config_prune = _query(
    "runtime_config_prune",
    f"""
    -- Config versions older than the newest :kept, at most :batch per statement, except any
    -- version a worker row still reports as applied, and any an unfinished update task (a
    -- request someone may still follow) wrote. The newest versions are never touched: workers
    -- read only the latest.
    WITH lock AS (SELECT pg_try_advisory_xact_lock(CAST(:lock_key AS bigint)) AS held),
    victims AS (
        SELECT c.version FROM taskfleet.worker_runtime_configs c, lock
        WHERE lock.held
          AND c.version <= (SELECT max(l.version) FROM taskfleet.worker_runtime_configs l)
                           - CAST(:kept AS bigint)
          AND NOT EXISTS (SELECT 1 FROM taskfleet.workers w
                          WHERE w.applied_config_version = c.version)
          AND NOT EXISTS (SELECT 1 FROM taskfleet.tasks t
                          WHERE t.type = '{RUNTIME_CONFIG_TASK_TYPE}'
                            AND (t.payload ->> 'requestID') = c.request_id
                            AND t.status IN ('pending', 'running'))
        ORDER BY c.version
        LIMIT CAST(:batch AS int)
        FOR UPDATE OF c SKIP LOCKED
    ),
    deleted AS (
        DELETE FROM taskfleet.worker_runtime_configs c
        WHERE c.version = ANY(ARRAY(SELECT version FROM victims))
        RETURNING c.version
    )
    SELECT (SELECT held FROM lock) AS held, count(*) AS deleted FROM deleted
    """,
)

# --------------------------------------------------------------------------------------------
# The claim index's dead head: a busy worker vacuums the tasks table (services/worker/vacuum.py,
# the rule in shared/policy/vacuum.py).
# --------------------------------------------------------------------------------------------

tasks_vacuum_state = _query(
    "tasks_vacuum_state",
    """
    -- The table's statistics (as of the backends' last report, about a second old) and whether
    -- a vacuum of it runs now (autovacuum's or another worker's).
    SELECT s.n_dead_tup AS dead, s.n_live_tup AS live,
           EXISTS (SELECT 1 FROM pg_stat_progress_vacuum p WHERE p.relid = s.relid) AS running
    FROM pg_stat_user_tables s
    WHERE s.relid = CAST('taskfleet.tasks' AS regclass)
    """,
)

tasks_vacuum_allowed = _query(
    "tasks_vacuum_allowed",
    """
    -- May this session's role vacuum the table? VACUUM by anyone but a superuser, the table's
    -- owner or the database's owner only warns and does nothing.
    SELECT pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE')
           OR COALESCE((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user), false)
           AS allowed
    FROM pg_class c JOIN pg_database d ON d.datname = current_database()
    WHERE c.oid = CAST('taskfleet.tasks' AS regclass)
    """,
)

#: Not a Query: VACUUM takes no parameters and cannot run in a transaction block (so neither in
#: a pooler's SET LOCAL wrapper nor in a server-side function). INDEX_CLEANUP ON: the index
#: entries are what the claims walk (the default may skip the indexes when few heap pages hold
#: dead rows). SKIP_LOCKED: never waits behind another vacuum or a migration's lock.
TASKS_VACUUM = "VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) taskfleet.tasks"

# --------------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------------

# How many other workers are alive (policy/outcome_path.py: a lone worker writes its outcomes
# at once). The workers table holds a few rows per process start; a scan of it is cheap.
_OTHER_LIVE_WORKERS = f"""(SELECT count(*) FROM taskfleet.workers w
                          WHERE w.id <> CAST(:id AS text) AND {_ALIVE})"""

worker_register = _query(
    "worker_register",
    f"""
    INSERT INTO taskfleet.workers AS w
        (id, hostname, pid, concurrency, status, started_at, last_heartbeat, heartbeat_interval,
         lease_ttl, applied_config_version, metrics_port, task_types, tags)
    VALUES (CAST(:id AS text), CAST(:hostname AS text), CAST(:pid AS int),
            CAST(:concurrency AS int), 'online', now(), now(),
            CAST(:heartbeat_interval AS float8), CAST(:lease_ttl AS float8),
            CAST(:applied_config_version AS bigint),
            CAST(:metrics_port AS int), CAST(:task_types AS text[]), CAST(:tags AS text[]))
    ON CONFLICT (id) DO UPDATE SET
        hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, concurrency = EXCLUDED.concurrency,
        status = 'online', started_at = now(), last_heartbeat = now(),
        heartbeat_interval = EXCLUDED.heartbeat_interval, lease_ttl = EXCLUDED.lease_ttl,
        applied_config_version = GREATEST(w.applied_config_version,
                                          EXCLUDED.applied_config_version),
        metrics_port = EXCLUDED.metrics_port, inflight = 0, strict_inflight = 0,
        task_types = EXCLUDED.task_types, tags = EXCLUDED.tags
    -- Not over a live row of another process (a second worker with the same id): then nothing
    -- is returned, and the caller refuses to start. A dead process's row is taken over.
    WHERE NOT (w.status IN ('online', 'draining')
               AND w.last_heartbeat > now() - 3 * w.heartbeat_interval * interval '1 second'
               AND (w.hostname, w.pid) <> (EXCLUDED.hostname, EXCLUDED.pid))
    RETURNING w.id, {_OTHER_LIVE_WORKERS} AS other_live_workers
    """,
)

worker_get = _query(
    "worker_get",
    """
    SELECT w.id, w.hostname, w.pid, w.status, w.last_heartbeat, w.heartbeat_interval,
           CAST(EXTRACT(EPOCH FROM now() - w.last_heartbeat) AS float8) AS heartbeat_age
    FROM taskfleet.workers w WHERE w.id = CAST(:id AS text)
    """,
)

worker_tick = _query(
    "worker_tick",
    f"""
    WITH
    -- Heartbeat: the worker row.
    heartbeat AS (
        UPDATE taskfleet.workers w
        SET last_heartbeat = now(), inflight = CAST(:inflight AS int),
            strict_inflight = CAST(:strict_inflight AS int),
            -- Re-asserted every beat: a lost write of the applied version heals itself, and so
            -- does a row someone else marked offline while this process runs.
            status = CAST(:status AS text),
            applied_config_version = GREATEST(w.applied_config_version,
                                              CAST(:applied_version AS bigint))
        -- Only its own row: a row another process took over (same id) is not this one's.
        WHERE w.id = CAST(:worker_id AS text) AND w.hostname = CAST(:hostname AS text)
          AND w.pid = CAST(:pid AS int)
        RETURNING w.id
    ),
    -- The tasks it holds, fenced by attempt: their cancel flags. Read, never written: a
    -- running task's lease is its worker's heartbeat (the row above), so a heartbeat writes no
    -- task row at all, however many tasks run.
    held AS (
        SELECT t.id, t.cancel_requested
        FROM taskfleet.tasks t
        JOIN unnest(CAST(:held AS bigint[]), CAST(:held_attempts AS int[])) AS h(id, attempt)
          ON t.id = h.id AND t.attempts = h.attempt
        WHERE t.status = 'running' AND t.worker_id = CAST(:worker_id AS text)
          AND t.id = ANY(CAST(:held AS bigint[]))
    ),
    -- The sweep, when due, by one worker at a time (try-lock: a busy lock means someone sweeps).
    sweep_lock AS (
        SELECT CAST(:sweep AS boolean)
               AND pg_try_advisory_xact_lock(CAST(:sweep_lock_key AS bigint)) AS held
    ),
    -- Expired: past the lease the claim gave it (claimed more than a lease ago), and no live
    -- process vouches for it: its worker stopped heartbeating a lease ago, by that worker's own
    -- lease setting, not the sweeper's (or its row is gone),
    -- or it is this worker's own row that this process does not hold (left by an earlier
    -- process under the same id, or a claim whose reply was lost). A live worker's tasks never
    -- expire, however long they run; a killed worker's expire a lease after its last beat.
    -- The running rows are few (no more than the fleet's slots): read through
    -- tasks_running_worker_idx.
    expired AS (
        SELECT t.id
        FROM taskfleet.tasks t
        CROSS JOIN sweep_lock
        LEFT JOIN taskfleet.workers w ON w.id = t.worker_id
        WHERE sweep_lock.held AND t.status = 'running' AND t.lease_expires_at < now()
          AND NOT EXISTS (SELECT 1 FROM held WHERE held.id = t.id)  -- at the attempt it runs
          AND (t.worker_id = CAST(:worker_id AS text)
               OR w.id IS NULL
               OR w.last_heartbeat < now() - make_interval(secs => w.lease_ttl))
        FOR UPDATE OF t SKIP LOCKED
    ),
    -- Expired leases: back to pending (the attempt stays counted), or failed when exhausted,
    -- or cancelled when a cancel was requested (never pending again: it would be run again).
    rescued AS (
        UPDATE taskfleet.tasks t
        SET status = CASE WHEN t.cancel_requested THEN 'cancelled'
                          WHEN t.attempts >= t.max_attempts THEN 'failed'
                          ELSE 'pending' END,
            finished_at = CASE WHEN t.cancel_requested OR t.attempts >= t.max_attempts
                               THEN now() END,
            last_error = CASE WHEN t.cancel_requested THEN 'cancelled as requested; ' ELSE '' END
                         || 'lease expired: worker ' || COALESCE(t.worker_id, '?')
                         || ' stopped heartbeating during attempt ' || t.attempts
                         || ' of ' || t.max_attempts,
            worker_id = CASE WHEN t.cancel_requested OR t.attempts >= t.max_attempts
                             THEN t.worker_id END,
            lease_expires_at = NULL,
            run_after = now()
        FROM expired
        WHERE t.id = expired.id
        RETURNING t.id, t.status
    ),
    -- Is anything due for pruning (retention)? Asked only by the sweeping worker: an index probe
    -- of the (status, finished_at) index per pruned status, the workers table (a few rows per
    -- process start), and the config versions' span (two primary-key probes). The pruning
    -- itself runs in bounded batches of its own (task_prune_batch), never in the heartbeat.
    prune_due AS (
        SELECT 1 AS due FROM sweep_lock
        WHERE sweep_lock.held AND (
            EXISTS (
                SELECT 1
                FROM unnest(CAST(:prune_statuses AS text[]), CAST(:prune_keep AS float8[]))
                     AS r(status, keep)
                WHERE EXISTS (
                    SELECT 1 FROM taskfleet.tasks t
                    WHERE t.status = r.status AND t.finished_at IS NOT NULL
                      AND t.finished_at < now() - make_interval(secs => r.keep)))
            OR EXISTS (
                SELECT 1 FROM taskfleet.workers w
                WHERE CAST(:workers_keep AS float8) IS NOT NULL AND {_WORKER_PRUNABLE})
            OR (SELECT max(c.version) - min(c.version) FROM taskfleet.worker_runtime_configs c)
               >= CAST(:configs_kept AS bigint))
    ),
    -- The re-grouping safety net rides on the sweep: one bounded step, when a change of the
    -- configured labels is not settled yet (a settled one costs one index probe).
    regroup AS (
        SELECT s.state, s.moved
        FROM (SELECT 1 FROM sweep_lock WHERE sweep_lock.held) AS due
        CROSS JOIN LATERAL taskfleet.task_regroup_step({SWEEP_REGROUP_BATCH}) AS s
    )
    SELECT 'cancel' AS kind, held.id AS id, NULL AS status FROM held
        WHERE held.cancel_requested
    UNION ALL SELECT 'rescued', rescued.id, rescued.status FROM rescued
    UNION ALL SELECT 'config', (SELECT COALESCE(max(version), 0)
                                FROM taskfleet.worker_runtime_configs), NULL
    UNION ALL SELECT 'registered', count(*), NULL FROM heartbeat
    -- Is a control-lane task waiting? (A fully busy worker still claims it into its spare slot.)
    UNION ALL SELECT 'control_pending', t.id, NULL FROM (
        SELECT c.id FROM taskfleet.tasks c
        WHERE c.status = 'pending' AND c.priority = 2147483647 AND c.run_after <= now()
        ORDER BY c.priority DESC, c.created_at, c.id LIMIT 1) AS t
    UNION ALL SELECT 'wake', NULL, pg_notify('taskfleet_task_ready', '')::text
        FROM (SELECT 1 FROM rescued WHERE rescued.status = 'pending' LIMIT 1) AS any_rescued
    UNION ALL SELECT 'regroup', regroup.moved, regroup.state FROM regroup
    UNION ALL SELECT 'prune_due', NULL, NULL FROM prune_due
    -- Seconds until the earliest schedule's next slot (NULL: no schedule): the scheduler
    -- sleeps until then and looks at the schedules only when one is due (an index probe).
    UNION ALL SELECT 'schedule', NULL,
        CAST((SELECT EXTRACT(EPOCH FROM min(s.next_run_at) - now())
              FROM taskfleet.schedules s) AS text)
    -- How many other workers are alive (policy/outcome_path.py).
    UNION ALL SELECT 'peers', count(*), NULL FROM taskfleet.workers w
        WHERE w.id <> CAST(:worker_id AS text) AND {_ALIVE}
    -- The schema's revision: a worker claims nothing on a schema it was not written for.
    UNION ALL SELECT 'schema', NULL,
        (SELECT string_agg(v.version_num, ',' ORDER BY v.version_num)
         FROM taskfleet.alembic_version v)
    """,
)


worker_set_status = _query(
    "worker_set_status",
    """
    UPDATE taskfleet.workers w
    SET status = CAST(:status AS text), last_heartbeat = now(),
        inflight = CAST(:inflight AS int), strict_inflight = CAST(:strict_inflight AS int)
    WHERE w.id = CAST(:worker_id AS text)
    """,
)

worker_list = _query(
    "worker_list",
    f"""
    SELECT w.id, w.hostname, w.pid, w.concurrency, w.status, w.started_at, w.last_heartbeat,
           w.heartbeat_interval, w.applied_config_version, w.inflight, w.strict_inflight,
           w.metrics_port, w.task_types, w.tags, {_ALIVE} AS alive
    FROM taskfleet.workers w
    ORDER BY {_ALIVE} DESC, w.started_at DESC, w.id
    LIMIT CAST(:limit AS int)
    """,
)

worker_applied_config = _query(
    "worker_applied_config",
    """
    -- Only ever raised: a slow or replayed notification cannot move a worker back. The ACK is
    -- sent in the same statement (delivered at commit, after the row says so).
    WITH applied AS (
        UPDATE taskfleet.workers w
        SET applied_config_version = GREATEST(w.applied_config_version,
                                              CAST(:version AS bigint))
        WHERE w.id = CAST(:worker_id AS text)
        RETURNING w.applied_config_version
    )
    SELECT applied.applied_config_version,
           CAST(pg_notify('anclax_worker_runtime_config_ack', CAST(:ack AS text)) AS text) AS ack
    FROM applied
    """,
)

# --------------------------------------------------------------------------------------------
# Runtime config
# --------------------------------------------------------------------------------------------

runtime_config_latest = _query(
    "runtime_config_latest",
    """
    SELECT c.version, c.request_id, c.payload, c.created_at
    FROM taskfleet.worker_runtime_configs c
    ORDER BY c.version DESC
    LIMIT 1
    """,
)

runtime_config_by_request = _query(
    "runtime_config_by_request",
    """
    SELECT c.version, c.request_id, c.payload, c.created_at
    FROM taskfleet.worker_runtime_configs c
    WHERE c.request_id = CAST(:request_id AS text)
    """,
)

runtime_config_write_lock = _query(
    "runtime_config_write_lock",
    """
    -- Held by the update task from reading the latest version to inserting the next: writes of
    -- versions are serialised, so a PATCH always merges into the version it replaces.
    SELECT pg_advisory_xact_lock(CAST(:lock_key AS bigint))
    """,
)

runtime_config_insert = _query(
    "runtime_config_insert",
    """
    -- One request id = one version, however often the update task is retried.
    WITH inserted AS (
        INSERT INTO taskfleet.worker_runtime_configs (request_id, payload)
        VALUES (CAST(:request_id AS text), CAST(:payload AS jsonb))
        ON CONFLICT (request_id) DO NOTHING
        RETURNING version, created_at
    )
    SELECT version, created_at FROM inserted
    UNION ALL
    SELECT c.version, c.created_at FROM taskfleet.worker_runtime_configs c
    WHERE c.request_id = CAST(:request_id AS text)
    LIMIT 1
    """,
)

runtime_config_convergence = _query(
    "runtime_config_convergence",
    f"""
    -- Decided by the database, not by ACKs: the alive workers and the version each applied;
    -- and the workers left out (alive after the version was written, not alive now, and
    -- behind it), with their status for the reason (policy/convergence.py).
    WITH target AS (
        SELECT c.created_at FROM taskfleet.worker_runtime_configs c
        WHERE c.version = CAST(:version AS bigint)
    ),
    -- Alive, or possibly left out: no other worker row matters.
    fleet AS (
        SELECT w.id, w.status, w.applied_config_version < CAST(:version AS bigint) AS behind,
               {_ALIVE} AS alive,
               w.last_heartbeat + 3 * w.heartbeat_interval * interval '1 second' AS expires_at
        FROM taskfleet.workers w
        WHERE {_ALIVE}
           OR (w.applied_config_version < CAST(:version AS bigint)
               AND CASE WHEN w.status = 'online'
                        -- Silent: alive until its heartbeat expired.
                        THEN w.last_heartbeat + 3 * w.heartbeat_interval * interval '1 second'
                             > (SELECT created_at FROM target)
                        -- Stopped: alive until it said so (that stamps its last heartbeat; a
                        -- worker that went offline before the version was not left out of it).
                        ELSE w.last_heartbeat > (SELECT created_at FROM target)
                   END)
    )
    SELECT (SELECT COALESCE(max(version), 0) FROM taskfleet.worker_runtime_configs) AS latest,
           count(*) FILTER (WHERE f.alive) AS alive_workers,
           count(*) FILTER (WHERE f.alive AND NOT f.behind) AS applied_workers,
           COALESCE(array_agg(f.id ORDER BY f.id) FILTER (WHERE f.alive AND f.behind),
                    ARRAY[]::text[]) AS lagging,
           -- When the first lagging worker stops counting as alive, unless it applies first.
           CAST(EXTRACT(EPOCH FROM min(f.expires_at) FILTER (WHERE f.alive AND f.behind)
                                   - now()) AS float8) AS lagging_expire_in,
           COALESCE(array_agg(f.id ORDER BY f.id) FILTER (WHERE NOT f.alive),
                    ARRAY[]::text[]) AS excluded,
           COALESCE(array_agg(f.status ORDER BY f.id) FILTER (WHERE NOT f.alive),
                    ARRAY[]::text[]) AS excluded_statuses,
           CAST(EXTRACT(EPOCH FROM now() - (SELECT created_at FROM target)) AS float8)
               AS seconds_since_insert
    FROM fleet f
    """,
)

runtime_config_alive_applied = _query(
    "runtime_config_alive_applied",
    f"""
    SELECT w.id, w.applied_config_version FROM taskfleet.workers w
    WHERE {_ALIVE} ORDER BY w.id
    """,
)

runtime_config_request_task = _query(
    "runtime_config_request_task",
    f"""
    SELECT {_TASK_COLUMNS} FROM taskfleet.tasks t
    WHERE t.type = '{RUNTIME_CONFIG_TASK_TYPE}'
      AND (t.payload ->> 'requestID') = CAST(:request_id AS text)
    ORDER BY t.id DESC
    LIMIT 1
    """,
)

# --------------------------------------------------------------------------------------------
# Schedules (periodic tasks)
# --------------------------------------------------------------------------------------------

_SCHEDULE_COLUMNS = """
    s.name, s.type, s.payload, s.cron, s.every, s.timezone, s.priority, s.weight, s.labels,
    s.max_attempts, s.timeout, s.requires, s.source, s.revision, s.next_run_at, s.last_run_at,
    s.last_task_id, s.created_at, s.updated_at
"""

# The definition columns a PUT or a declaration writes, in one order for both.
_SCHEDULE_VALUES = """
    CAST(:name AS text), CAST(:type AS text), CAST(CAST(:payload AS text) AS jsonb),
    CAST(:cron AS text), CAST(:every AS text), CAST(:timezone AS text), CAST(:priority AS int),
    CAST(:weight AS int), CAST(:labels AS text[]), CAST(:max_attempts AS int),
    CAST(:timeout AS float8), CAST(:requires AS text[]), CAST(:source AS text),
    CAST(:next_run_at AS timestamptz)
"""

# On a change of the definition the revision is raised (a firing computed from the old one is
# void); a change of the timing (cron, every, timezone) also moves next_run_at to the new
# timing's next slot, while an unchanged timing keeps its slot, so re-declaring a schedule
# (every worker start does) neither skips nor repeats a run.
_SCHEDULE_UPDATE = """
    type = EXCLUDED.type, payload = EXCLUDED.payload, cron = EXCLUDED.cron,
    every = EXCLUDED.every, timezone = EXCLUDED.timezone, priority = EXCLUDED.priority,
    weight = EXCLUDED.weight, labels = EXCLUDED.labels, max_attempts = EXCLUDED.max_attempts,
    timeout = EXCLUDED.timeout, requires = EXCLUDED.requires, source = EXCLUDED.source,
    revision = s.revision + 1,
    next_run_at = CASE
        WHEN (s.cron, s.every, s.timezone)
             IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every, EXCLUDED.timezone)
        THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
    updated_at = now()
"""

_SCHEDULE_DEFINITION_CHANGED = """
    (s.type, s.payload, s.cron, s.every, s.timezone, s.priority, s.weight, s.labels,
     s.max_attempts, s.timeout, s.requires, s.source)
    IS DISTINCT FROM
    (EXCLUDED.type, EXCLUDED.payload, EXCLUDED.cron, EXCLUDED.every, EXCLUDED.timezone,
     EXCLUDED.priority, EXCLUDED.weight, EXCLUDED.labels, EXCLUDED.max_attempts,
     EXCLUDED.timeout, EXCLUDED.requires, EXCLUDED.source)
"""

_SCHEDULE_INSERT = """
    INSERT INTO taskfleet.schedules AS s
        (name, type, payload, cron, every, timezone, priority, weight, labels, max_attempts,
         timeout, requires, source, next_run_at)
"""

database_now = _query("database_now", "SELECT now() AS now")

schedule_put = _query(
    "schedule_put",
    f"""
    {_SCHEDULE_INSERT}
    VALUES ({_SCHEDULE_VALUES})
    ON CONFLICT (name) DO UPDATE SET {_SCHEDULE_UPDATE}
    RETURNING {_SCHEDULE_COLUMNS}, (xmax = 0) AS created
    """,
)

schedule_declare = _query(
    "schedule_declare",
    # A worker declaring its task modules' schedules at start: a code-declared row follows the
    # code, a row set over the API is left as it is (the operator's definition wins). An
    # unchanged declaration writes nothing (every worker start makes one).
    f"""
    {_SCHEDULE_INSERT}
    VALUES ({_SCHEDULE_VALUES})
    ON CONFLICT (name) DO UPDATE SET {_SCHEDULE_UPDATE}
    WHERE s.source = 'code' AND {_SCHEDULE_DEFINITION_CHANGED}
    RETURNING s.name, (xmax = 0) AS created
    """,
)

schedule_retire_code = _query(
    "schedule_retire_code",
    # A worker starting with task types whose code no longer declares a schedule: the code
    # schedules named after them go (one set over the API stays: the operator's).
    """
    DELETE FROM taskfleet.schedules s
    WHERE s.source = 'code' AND s.name = ANY(CAST(:names AS text[])) AND s.type = s.name
    RETURNING s.name
    """,
)

schedule_get = _query(
    "schedule_get",
    f"SELECT {_SCHEDULE_COLUMNS} FROM taskfleet.schedules s WHERE s.name = CAST(:name AS text)",
)

schedule_list = _query(
    "schedule_list",
    f"""
    SELECT {_SCHEDULE_COLUMNS} FROM taskfleet.schedules s
    WHERE CAST(:after AS text) IS NULL OR s.name > CAST(:after AS text)
    ORDER BY s.name
    LIMIT CAST(:limit AS int)
    """,
)

schedule_delete = _query(
    "schedule_delete",
    "DELETE FROM taskfleet.schedules s WHERE s.name = CAST(:name AS text) RETURNING s.name",
)

# Not a schedule this worker found it cannot fire (its stored timing no longer parses), at the
# revision it found so: those stay due for ever, and would fill every batch ahead of the rest.
_NOT_BROKEN = """NOT EXISTS (
            SELECT 1 FROM unnest(CAST(:broken_names AS text[]),
                                 CAST(:broken_revisions AS bigint[])) AS b(name, revision)
            WHERE b.name = s.name AND b.revision = s.revision)"""

schedule_due = _query(
    "schedule_due",
    # One row always (the database's clock, and the seconds until the earliest next_run_at),
    # joined with the schedules due now, if any, earliest first.
    f"""
    SELECT w.db_now, w.wait_seconds, d.name, d.cron, d.every, d.timezone, d.next_run_at,
           d.revision, d.priority
    FROM (SELECT now() AS db_now,
                 CAST(EXTRACT(EPOCH FROM min(s.next_run_at) - now()) AS float8) AS wait_seconds
          FROM taskfleet.schedules s WHERE {_NOT_BROKEN}) AS w
    LEFT JOIN LATERAL (
        SELECT s.name, s.cron, s.every, s.timezone, s.next_run_at, s.revision, s.priority
        FROM taskfleet.schedules s
        WHERE s.next_run_at <= w.db_now AND {_NOT_BROKEN}
        ORDER BY s.next_run_at, s.name
        LIMIT CAST(:limit AS int)
    ) AS d ON true
    """,
)

schedule_fire = _query(
    "schedule_fire",
    f"""
    WITH
    -- The task's id, drawn up front so the schedule row can name it in the same statement.
    new_task AS (SELECT nextval(pg_get_serial_sequence('taskfleet.tasks', 'id')) AS id),
    -- The conditional UPDATE that makes a slot fire once: only from the slot this worker read
    -- (and the definition it planned with). Under concurrent firings the row lock serialises
    -- them and the later ones see the advanced row: their WHERE no longer matches, and
    -- nothing below runs for them.
    advanced AS (
        UPDATE taskfleet.schedules s
        SET next_run_at = CAST(:next_run_at AS timestamptz),
            last_run_at = CAST(:slot AS timestamptz),
            -- Not an id whose insert the slot's unique key will refuse below.
            last_task_id = CASE WHEN EXISTS (
                                    SELECT 1 FROM taskfleet.tasks t
                                    WHERE t.schedule_name = s.name
                                      AND t.schedule_slot = CAST(:slot AS timestamptz))
                                THEN s.last_task_id
                                ELSE (SELECT new_task.id FROM new_task) END
        WHERE s.name = CAST(:name AS text)
          AND s.next_run_at = CAST(:due AS timestamptz)
          AND s.revision = CAST(:revision AS bigint)
        RETURNING s.name, s.type, s.payload, s.priority, s.weight, s.labels, s.max_attempts,
                  s.timeout, s.requires
    ),
    grouping_now AS ({_GROUPING_LATEST}),
    -- The task, keyed by (schedule, slot) under a unique index as well: a second task for a
    -- slot is never written, whatever happened to the schedules row.
    inserted AS (
        INSERT INTO taskfleet.tasks AS t
            (id, type, payload, priority, weight, labels, max_attempts, timeout, requires,
             group_key, schedule_name, schedule_slot)
        SELECT new_task.id, a.type, a.payload, a.priority, a.weight, a.labels, a.max_attempts,
               a.timeout, a.requires, taskfleet.task_group_key(a.labels, grouping_now.labels),
               a.name, CAST(:slot AS timestamptz)
        FROM advanced a CROSS JOIN new_task CROSS JOIN grouping_now
        ON CONFLICT (schedule_name, schedule_slot) WHERE schedule_name IS NOT NULL DO NOTHING
        RETURNING t.id
    ),
    wake AS (
        SELECT pg_notify('{TASK_READY_CHANNEL}', CAST(:wake_hint AS text)) AS sent
        FROM inserted
    )
    SELECT inserted.id, (SELECT count(*) FROM wake) AS woken FROM inserted
    """,
)

notify = _query(
    "notify",
    "SELECT pg_notify(CAST(:channel AS text), CAST(:payload AS text))",
)

schema_revision = _query(
    "schema_revision",
    "SELECT version_num FROM taskfleet.alembic_version",
)

server_connection_limit = _query(
    "server_connection_limit",
    # What this role may open: max_connections, less the slots reserved for superusers when
    # the role is not one.
    """
    SELECT current_setting('max_connections')::int AS max_connections,
           current_setting('max_connections')::int
             - CASE WHEN r.rolsuper THEN 0
                    ELSE current_setting('superuser_reserved_connections')::int END AS usable
    FROM pg_roles r WHERE r.rolname = current_user
    """,
)


def transaction_begin(settings: Mapping[str, str]) -> str:
    """``BEGIN`` and ``SET LOCAL`` of each setting, in one simple-protocol round trip: how a
    connection through a transaction-mode pooler gets settings that last exactly one
    transaction (a session ``SET`` would stay on a server connection other clients get next).
    Utility statements take no parameters, hence literals, quoted; the names and values come
    from :func:`taskfleet.shared.db.session_settings`, never from input."""
    parts = ["BEGIN"]
    for name, value in settings.items():
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a setting name: {name!r}")
        quoted = value.replace("'", "''")
        parts.append(f"SET LOCAL {name} = '{quoted}'")
    return "; ".join(parts)


TRANSACTION_COMMIT = "COMMIT"
TRANSACTION_ROLLBACK = "ROLLBACK"


def server_max_connections_set(max_connections: int) -> str:
    """``ALTER SYSTEM SET max_connections`` (effective after a restart), for the embedded dev
    server. A utility statement takes no parameters, hence the literal, from an ``int`` only."""
    return f"ALTER SYSTEM SET max_connections = {int(max_connections)}"


# --------------------------------------------------------------------------------------------
# Server-side functions: the hot statements behind a transaction-mode pooler
# --------------------------------------------------------------------------------------------

#: Statements that a worker or the API behind a transaction-mode pooler runs through a PL/pgSQL
#: function of the same text: the insert of submitted tasks, and every statement a worker sends
#: through the pooler per task or per tick (outcomes, releases at shutdown, the heartbeat).
#: Through a pooler nothing stays prepared, so each would be parsed and planned again on every
#: call and run inside BEGIN/SET LOCAL/COMMIT (four round trips); a function's plan is cached on
#: each server connection, which the pooler keeps open, and its call is one statement (two round
#: trips). The claims and the config reads and ACKs need none: behind a pooler they run on the
#: worker's direct LISTEN session, prepared. Direct connections keep every statement prepared
#: and do not use them. Installed by ``taskfleet migrate`` (one per text: a changed statement
#: gets a new function, and workers of the old code keep theirs during a rollout).
SERVER_FUNCTIONS: tuple[Query, ...] = (
    task_insert_batch,
    task_insert_one,
    task_finish_batch,
    task_release,
    worker_tick,
)

_SERVER_FUNCTION_SCHEMA = "taskfleet"
#: The wrapper's own shape (below); part of every function's name with the statement's text.
_SERVER_FUNCTION_FORM = "2: one implicit transaction, synchronous_commit given, lock_timeout"
#: The function's bound on any lock wait (its call runs without the worker's SET LOCAL
#: statement_timeout; the worker's client cancels a call that runs too long).
SERVER_FUNCTION_LOCK_TIMEOUT = "30s"
#: The extra first parameter of every function: the transaction's synchronous_commit.
SYNCHRONOUS_COMMIT_PARAM = "synchronous_commit_setting"


def server_function_name(query: Query) -> str:
    """The function of ``query``'s exact text: its name and a digest of the text."""
    text = f"{_SERVER_FUNCTION_FORM}\n{query.sql}"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{_SERVER_FUNCTION_SCHEMA}.{query.name}_{digest}"


def server_function_call(query: Query) -> Query:
    """``SELECT * FROM`` the function of ``query``: the same named parameters after
    :data:`SYNCHRONOUS_COMMIT_PARAM` (``on`` or ``off``). Not registered in :data:`QUERIES`:
    it is the statement, called another way. One statement, so one implicit transaction that a
    pooler keeps on one server connection: no ``BEGIN``/``COMMIT`` round trips."""
    args = ", ".join(f":{name}" for name in (SYNCHRONOUS_COMMIT_PARAM, *query.params))
    return Query(f"{query.name}_call", f"SELECT * FROM {server_function_name(query)}({args})")


def server_function_create(
    query: Query, param_types: list[str], columns: list[tuple[str, str]]
) -> str:
    """``CREATE FUNCTION`` of ``query`` with the parameter and result types the server reported
    for it (``param_types`` in :attr:`Query.params` order; ``columns`` as (name, type)). The
    body sets the transaction's ``synchronous_commit`` (what a direct worker sets for its
    session), then runs the statement itself, its parameters renamed ``p_<name>``; column
    names win over the result variables of the same name. Lock waits inside are bounded by
    :data:`SERVER_FUNCTION_LOCK_TIMEOUT`."""
    if len(param_types) != len(query.params):
        raise ValueError(f"{query.name}: {len(query.params)} parameters, {len(param_types)} types")
    sql, order = query._positional
    body = re.sub(r"\$(\d+)\b", lambda m: f"p_{order[int(m.group(1)) - 1]}", sql)
    if "$fn$" in body:
        raise ValueError(f"{query.name}: the statement contains the body's quote")
    args = ", ".join(
        [f"p_{SYNCHRONOUS_COMMIT_PARAM} text"]
        + [f"p_{name} {kind}" for name, kind in zip(order, param_types, strict=True)]
    )
    result = ", ".join(f'"{name}" {kind}' for name, kind in columns)
    return (
        f"CREATE FUNCTION {server_function_name(query)}({args})\n"
        f"RETURNS TABLE ({result}) LANGUAGE plpgsql VOLATILE\n"
        f"SET lock_timeout = '{SERVER_FUNCTION_LOCK_TIMEOUT}' AS $fn$\n"
        "#variable_conflict use_column\n"
        "BEGIN\n"
        f"PERFORM set_config('synchronous_commit', p_{SYNCHRONOUS_COMMIT_PARAM}, true);\n"
        f"RETURN QUERY {body};\nEND\n$fn$"
    )


#: Whether a function exists (its name as :func:`server_function_name` gives it).
server_function_exists = _query(
    "server_function_exists",
    "SELECT to_regproc(CAST(:name AS text)) IS NOT NULL AS present",
)

#: Whether it exists, and its stamp (its comment: see :func:`server_function_stamp_of`).
server_function_stamp = _query(
    "server_function_stamp",
    """
    SELECT to_regproc(CAST(:name AS text)) IS NOT NULL AS present,
           obj_description(to_regproc(CAST(:name AS text)), 'pg_proc') AS stamp
    """,
)


def server_function_stamp_of(create: str) -> str:
    """The stamp of a function: a digest of the statement that created it."""
    return "taskfleet " + hashlib.sha256(create.encode()).hexdigest()


def server_function_drop(query: Query) -> str:
    """``DROP FUNCTION`` of ``query``'s function (its name is ours; to_regproc resolves it)."""
    return f"DROP FUNCTION {server_function_name(query)}"


def server_function_comment(query: Query, stamp: str) -> str:
    """``COMMENT ON FUNCTION``: a utility statement, hence the literal (a hex digest)."""
    if not stamp.replace(" ", "").isalnum():
        raise ValueError(f"not a stamp: {stamp!r}")
    return f"COMMENT ON FUNCTION {server_function_name(query)} IS '{stamp}'"


#: A type's name as SQL spells it (``integer[]``, ``timestamp with time zone``).
type_name = _query("type_name", "SELECT format_type(CAST(:oid AS oid), NULL)")
