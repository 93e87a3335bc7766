"""The database schema (Postgres schema ``taskfleet``), as SQLAlchemy Core metadata.

Alembic migrations create it (they are written by hand and do not import this module); a test
checks that the migrated database and this metadata agree, and that the Python enums below match
the database's CHECK constraints.
"""

from __future__ import annotations

import enum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from taskfleet.shared.statuses import FINISHED_STATUSES, TaskStatus, WorkerStatus

__all__ = [
    "FINISHED_STATUSES",
    "SCHEMA",
    "TaskStatus",
    "WorkerStatus",
    "label_limit_releases",
    "label_limits",
    "metadata",
    "schedules",
    "tasks",
    "worker_runtime_configs",
    "workers",
]

SCHEMA = "taskfleet"


def _in(column: str, values: type[enum.StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


metadata = MetaData(schema=SCHEMA)

tasks = Table(
    "tasks",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("type", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("weight", Integer, nullable=False, server_default=text("1")),
    Column("labels", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("3")),
    Column("run_after", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("timeout", Double, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("worker_id", Text, nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("result", JSONB, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("unique_key", Text, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    # The task's normal-lane group ('' = the default group) under the configured labels in force
    # when it was written: by the insert query, else by a trigger applying
    # taskfleet.task_group_key(); re-computed by taskfleet.task_regroup_step() after a change.
    Column("group_key", Text, nullable=False),
    # The schedule and slot a periodic task was enqueued for (NULL for every other task).
    Column("schedule_name", Text, nullable=True),
    Column("schedule_slot", DateTime(timezone=True), nullable=True),
    # The tags a worker must all have to claim the task ('{}': any worker).
    Column("requires", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    # The limited labels the claim counted this attempt under (label_limits); released when the
    # task leaves running.
    Column("limit_labels", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    CheckConstraint(_in("status", TaskStatus), name="tasks_status_valid"),
    CheckConstraint("priority >= 0", name="tasks_priority_nonnegative"),
    CheckConstraint("weight >= 1", name="tasks_weight_positive"),
    CheckConstraint("max_attempts >= 1", name="tasks_max_attempts_positive"),
    CheckConstraint("timeout IS NULL OR timeout > 0", name="tasks_timeout_positive"),
    # A cancel request ends the task at its next transition: it is never queued again.
    CheckConstraint(
        "NOT (status = 'pending' AND cancel_requested)", name="tasks_cancel_never_pending"
    ),
    # Claim paths: one partial index per lane, in exactly the lane's claim order, so a claim is an
    # index scan over pending rows only, however many finished rows the table holds.
    Index(
        "tasks_claim_strict_idx",
        text("priority DESC"),
        "created_at",
        "id",
        postgresql_where=text("status = 'pending' AND priority > 0"),
    ),
    # The normal lane per group: a group's claim is a range of exactly its own rows.
    Index(
        "tasks_claim_normal_idx",
        "group_key",
        text("weight DESC"),
        "created_at",
        "id",
        postgresql_where=text("status = 'pending' AND priority = 0"),
    ),
    # Re-grouping walks labelled pending rows group by group (unlabelled rows are always in the
    # default group, whatever is configured).
    Index(
        "tasks_group_labelled_idx",
        "group_key",
        "id",
        postgresql_where=text("status = 'pending' AND priority = 0 AND labels <> '{}'"),
    ),
    # The running rows (lease sweep, heartbeat, a worker's tasks).
    Index("tasks_running_worker_idx", "worker_id", postgresql_where=text("status = 'running'")),
    # The pending tasks that require worker tags (the missing_tags metric reads only these).
    Index(
        "tasks_pending_requires_idx",
        "id",
        postgresql_where=text("status = 'pending' AND requires <> '{}'"),
    ),
    # unique_key is unique while the task is not finished.
    Index(
        "tasks_unique_key_idx",
        "unique_key",
        unique=True,
        postgresql_where=text("unique_key IS NOT NULL AND status IN ('pending', 'running')"),
    ),
    # Listing filters (newest first, keyset on id).
    # The pending tasks by type, for the unknown-type count of /metrics only. The migration
    # (0016_pending_type_index) keys it by type COLLATE "C", which keeps every other statement
    # off it; reflection reports that as the plain column.
    Index("tasks_pending_type_idx", "type", postgresql_where=text("status = 'pending'")),
    Index("tasks_status_id_idx", "status", text("id DESC")),
    Index("tasks_type_id_idx", "type", text("id DESC")),
    Index("tasks_labels_idx", "labels", postgresql_using="gin"),
    # Recent outcomes (GET /tasks/stats) and age cut-offs of finished tasks.
    Index(
        "tasks_finished_idx",
        "status",
        "finished_at",
        postgresql_where=text("finished_at IS NOT NULL"),
    ),
    # One task per schedule and slot, whatever happens to the schedules row.
    Index(
        "tasks_schedule_slot_idx",
        "schedule_name",
        "schedule_slot",
        unique=True,
        postgresql_where=text("schedule_name IS NOT NULL"),
    ),
    # The runtime-config request of an update task.
    Index(
        "tasks_runtime_config_request_idx",
        text("(payload ->> 'requestID')"),
        postgresql_where=text("type = 'updateWorkerRuntimeConfig'"),
    ),
)

workers = Table(
    "workers",
    metadata,
    Column("id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'online'")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_heartbeat", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("heartbeat_interval", Double, nullable=False, server_default=text("3")),
    # Its TASKFLEET_LEASE_TTL: the sweep takes its tasks once it has been silent that long.
    Column("lease_ttl", Double, nullable=False, server_default=text("30")),
    Column("applied_config_version", BigInteger, nullable=False, server_default=text("0")),
    Column("inflight", Integer, nullable=False, server_default=text("0")),
    Column("strict_inflight", Integer, nullable=False, server_default=text("0")),
    Column("metrics_port", Integer, nullable=True),
    # The task types it has handlers for: it claims only those.
    Column("task_types", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    # Its tags (TASKFLEET_WORKER_TAGS): it claims only tasks whose requires are all among them.
    Column("tags", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    CheckConstraint(_in("status", WorkerStatus), name="workers_status_valid"),
    CheckConstraint("lease_ttl > 0", name="workers_lease_ttl_positive"),
)

worker_runtime_configs = Table(
    "worker_runtime_configs",
    metadata,
    Column("version", BigInteger, Identity(always=False), primary_key=True),
    Column("request_id", Text, nullable=False, unique=True),
    Column("payload", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# The configured label sets, one row per change of the set, keyed by the runtime-config version
# that introduced it (kept by a trigger on worker_runtime_configs; see migration 0003_group_key).
task_groupings = Table(
    "task_groupings",
    metadata,
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("labels", ARRAY(Text), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Re-grouping after this change is complete; until then, its progress.
    Column("settled", Boolean, nullable=False, server_default=text("false")),
    Column("waits_for", ARRAY(Text), nullable=True),
    Column("cursor_key", Text, nullable=True),
    Column("cursor_id", BigInteger, nullable=True),
)

# Periodic tasks (PUT /schedules/{name}, or @task(..., schedule=...) in code): what to enqueue,
# when, and the slot it fires next. Fired by the workers with a conditional UPDATE of the row.
schedules = Table(
    "schedules",
    metadata,
    Column("name", Text, primary_key=True),
    Column("type", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("cron", Text, nullable=True),
    Column("every", Text, nullable=True),
    Column("timezone", Text, nullable=True),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("weight", Integer, nullable=False, server_default=text("1")),
    Column("labels", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("max_attempts", Integer, nullable=False, server_default=text("3")),
    Column("timeout", Double, nullable=True),
    # The worker tags each fired task requires ('{}': any worker).
    Column("requires", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    # api: PUT /schedules; code: declared by a worker's task module (an api row wins).
    Column("source", Text, nullable=False, server_default=text("'api'")),
    # Raised by every change of the definition: a firing computed from an older one is void.
    Column("revision", BigInteger, nullable=False, server_default=text("1")),
    Column("next_run_at", DateTime(timezone=True), nullable=False),
    Column("last_run_at", DateTime(timezone=True), nullable=True),
    Column("last_task_id", BigInteger, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("(cron IS NULL) <> (every IS NULL)", name="schedules_cron_or_every"),
    CheckConstraint("source IN ('api', 'code')", name="schedules_source_valid"),
    Index("schedules_next_run_idx", "next_run_at"),
)

# Fleet-wide limits per label (runtime config labelLimits), kept by a trigger on
# worker_runtime_configs; claims lock the active rows and keep the count and the token bucket
# (see migration 0010_controls).
label_limits = Table(
    "label_limits",
    metadata,
    Column("label", Text, primary_key=True),
    Column("max_in_flight", Integer, nullable=True),
    Column("rate_per_second", Double, nullable=True),
    Column("in_flight", Integer, nullable=False, server_default=text("0")),
    Column("tokens", Double, nullable=False, server_default=text("1")),
    Column("refilled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("config_version", BigInteger, nullable=False, server_default=text("0")),
    CheckConstraint("max_in_flight >= 1", name="label_limits_max_in_flight_check"),
    CheckConstraint("rate_per_second > 0", name="label_limits_rate_per_second_check"),
)

# A counted task that left running, written by a trigger; folded into label_limits.in_flight by
# the next claim that holds the label's row.
label_limit_releases = Table(
    "label_limit_releases",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("label", Text, nullable=False),
    Index("label_limit_releases_label_idx", "label"),
)
