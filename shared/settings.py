"""Typed settings, one class per process, read from ``TASKFLEET_*`` variables
(docs/reference.md#environment)."""

from __future__ import annotations

import socket
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from taskfleet.shared.db import DatabaseURL, libpq_refusal
from taskfleet.shared.logs import LOG_LEVELS, LogFormat
from taskfleet.shared.policy.retention import RetentionPolicy, parse_retention
from taskfleet.shared.policy.vacuum import DEFAULT_MIN_DEAD_ROWS, VacuumPolicy

#: Seconds to keep a kind of row, or None (``never``); read from ``2s``, ``15m``, ``24h``, ``7d``.
Retention = Annotated[float | None, BeforeValidator(parse_retention)]


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class LoggingSettings(BaseSettings):
    """How a process logs; read by every command, the client ones included."""

    model_config = SettingsConfigDict(env_prefix="TASKFLEET_", extra="ignore", frozen=True)

    log_level: str = Field(
        default="INFO",
        description="Lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL (default INFO).",
    )
    log_format: LogFormat = Field(
        default="text",
        description="text (default): one human-readable line per record; json: one JSON object "
        "per line with time, level, logger, message and the fields the log call passed.",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _known_level(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().upper()
            if value not in LOG_LEVELS:
                raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value


class CommonSettings(LoggingSettings):
    """Settings every taskfleet process reads."""

    database_url: DatabaseURL = Field(
        validation_alias=AliasChoices("TASKFLEET_DATABASE_URL", "DATABASE_URL", "database_url"),
        description="postgresql://... or postgresql+asyncpg://... (both accepted).",
    )
    listen_database_url: DatabaseURL | None = Field(
        default=None,
        description="Optional URL for LISTEN connections (PgBouncer in transaction mode in front "
        "of DATABASE_URL cannot LISTEN). Defaults to DATABASE_URL.",
    )
    database_pooler: Literal["none", "transaction"] = Field(
        default="none",
        description="none (default): DATABASE_URL is Postgres itself (or a session-mode pool). "
        "transaction: DATABASE_URL is a transaction-mode pooler such as PgBouncer; no session "
        "state is kept between transactions (no startup parameters, no cached prepared "
        "statements, settings by SET LOCAL; the API speaks psycopg 3 to it, so its URL takes "
        "libpq's parameters). A worker then requires TASKFLEET_LISTEN_DATABASE_URL.",
    )
    task_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated importable modules whose handlers are registered, besides "
        "the built-in demo handlers.",
    )
    default_max_strict_percentage: int = Field(
        default=100, ge=0, le=100, description="maxStrictPercentage when a PUT omits it."
    )

    _split_modules = field_validator("task_modules", mode="before")(_split_csv)

    @property
    def listen_url(self) -> DatabaseURL:
        return self.listen_database_url or self.database_url

    @property
    def pooled(self) -> bool:
        """DATABASE_URL is a transaction-mode pooler: keep no session state on it."""
        return self.database_pooler == "transaction"


class WorkerSettings(CommonSettings):
    """A worker process. Timers are in seconds (floats allowed)."""

    concurrency: int = Field(default=10, ge=1, le=10_000, description="Task slots (default 10).")
    worker_id: str | None = Field(
        default=None, max_length=200, description="Stable id; default hostname-pid-random."
    )
    metrics_host: str = Field(default="0.0.0.0", description="Bind address of /metrics, /healthz.")
    metrics_port: int = Field(default=9100, ge=0, le=65535, description="0 picks a free port.")
    poll_interval: float = Field(default=2.0, gt=0, description="Idle claim poll (default 2 s).")
    heartbeat_interval: float = Field(default=3.0, gt=0, description="Heartbeat (default 3 s).")
    lease_ttl: float = Field(default=30.0, gt=0, description="Task lease (default 30 s).")
    sweep_interval: float = Field(default=5.0, gt=0, description="Lease sweep (default 5 s).")
    runtime_config_poll_interval: float = Field(
        default=5.0, gt=0, description="Fallback config read when NOTIFY is lost (default 5 s)."
    )
    drain_timeout: float = Field(
        default=20.0, ge=0, description="SIGTERM: time running tasks get to finish (default 20 s)."
    )
    listen_enabled: bool = Field(
        default=True,
        description="LISTEN for wake-ups and config notifications. Off only to test the poll "
        "fallback.",
    )
    synchronous_commit: bool = Field(
        default=False,
        description="Wait for the WAL flush on the worker's claim/finish/heartbeat commits "
        "(default off). Off, a Postgres crash can forget the last fraction of a second of "
        "claims and finishes: those tasks run again (at-least-once), none is lost. Task "
        "submission and config versions are always synchronous.",
    )
    runtime_config_deadline: float = Field(
        default=300.0,
        gt=0,
        description="How long a runtime-config update task follows its version before it ends "
        "with a timeout naming the lagging workers and frees the control slot (default 300 s).",
    )
    worker_tags: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated tags, e.g. gpu,eu (default none): the worker claims only "
        "tasks whose requires are all among them (a task without requires runs anywhere).",
    )
    retry_base: float = Field(default=1.0, gt=0, description="Retry backoff base (default 1 s).")
    retry_cap: float = Field(default=300.0, gt=0, description="Retry backoff cap (default 300 s).")
    retention_completed: Retention = Field(
        default="24h",
        validate_default=True,
        description="How long a completed task is kept after it finished, then deleted (default "
        "24h): a duration such as 2s, 15m, 24h or 7d, or never.",
    )
    retention_cancelled: Retention = Field(
        default="24h",
        validate_default=True,
        description="How long a cancelled task is kept after it finished (default 24h), or never.",
    )
    retention_failed: Retention = Field(
        default="7d",
        validate_default=True,
        description="How long a failed task is kept after it finished (default 7d), or never.",
    )
    retention_workers: Retention = Field(
        default="24h",
        validate_default=True,
        description="How long the row of a worker that is offline (or stopped heartbeating) is "
        "kept after its last heartbeat (default 24h), or never.",
    )

    vacuum_dead_rows: int = Field(
        default=DEFAULT_MIN_DEAD_ROWS,
        ge=0,
        description="A busy worker runs VACUUM on taskfleet.tasks once this many dead row "
        "versions (and at least 5% of its live rows) have piled up (default 10000): the claims "
        "walk their index entries, so without it a deep backlog drains slower and slower until "
        "autovacuum comes by. 0 leaves the table to autovacuum alone. Needs the table's or the "
        "database's owner (as the migrations do).",
    )

    @model_validator(mode="after")
    def _pooler_has_a_listen_url(self) -> WorkerSettings:
        if self.database_pooler == "transaction" and self.listen_database_url is None:
            raise ValueError(
                "TASKFLEET_DATABASE_POOLER=transaction needs TASKFLEET_LISTEN_DATABASE_URL for "
                "a worker: a transaction-mode pooler hands each transaction to any server "
                "connection, so LISTEN through it would lose its notifications; point "
                "TASKFLEET_LISTEN_DATABASE_URL at Postgres itself (or a session-mode pool)"
            )
        return self

    @field_validator("worker_tags", mode="before")
    @classmethod
    def _split_tags(cls, value: Any) -> Any:
        return _split_csv(value)

    @field_validator("worker_tags")
    @classmethod
    def _tags_storable(cls, value: list[str]) -> list[str]:
        for tag in value:
            if len(tag) > 128:
                raise ValueError(f"tag {tag[:20]!r}... is longer than 128 characters")
            if "\x00" in tag:
                raise ValueError("a tag must not contain a NUL character")
            try:
                tag.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("a tag must be valid Unicode text") from None
        if len(value) > 100:
            raise ValueError("at most 100 tags")
        return sorted(set(value))

    @model_validator(mode="after")
    def _timers_fit_together(self) -> WorkerSettings:
        if self.lease_ttl <= 2 * self.heartbeat_interval:
            raise ValueError(
                "TASKFLEET_LEASE_TTL must be more than twice TASKFLEET_HEARTBEAT_INTERVAL, or a "
                "live worker's lease could expire between two heartbeats"
            )
        return self

    @property
    def retention(self) -> RetentionPolicy:
        return RetentionPolicy(
            completed=self.retention_completed,
            cancelled=self.retention_cancelled,
            failed=self.retention_failed,
            workers=self.retention_workers,
        )

    @property
    def vacuum(self) -> VacuumPolicy:
        return VacuumPolicy(min_dead_rows=self.vacuum_dead_rows)

    def resolved_worker_id(self) -> str:
        if self.worker_id:
            return self.worker_id
        import os
        import secrets

        return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class ApiSettings(CommonSettings):
    """The HTTP control plane."""

    host: str = Field(default="0.0.0.0", description="Bind address of the API.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port of the API (default 8000).")
    api_tokens: SecretStr | None = Field(
        default=None, description="Comma-separated role:token pairs, roles submit and admin."
    )
    auth_disabled: bool = Field(
        default=False, description="Run with no authentication at all. Explicit opt-in only."
    )
    db_pool_size: int = Field(
        default=10,
        ge=1,
        le=200,
        description="Most database connections one API process holds (default 10).",
    )

    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes (default 16 MiB = 16777216): a "
        "larger one is refused with 413 while it is read, before it is parsed.",
    )

    @model_validator(mode="after")
    def _pooled_url_is_libpq_s(self) -> ApiSettings:
        if self.pooled:
            refusal = libpq_refusal(self.database_url)
            if refusal is not None:
                raise ValueError(
                    "DATABASE_URL: with TASKFLEET_DATABASE_POOLER=transaction the API connects "
                    f"with libpq (psycopg), which refuses this URL ({refusal}); use libpq's "
                    "parameters, e.g. sslmode=require"
                )
        return self

    @model_validator(mode="after")
    def _auth_is_configured(self) -> ApiSettings:
        if not self.auth_disabled:
            parse_tokens(self.api_tokens.get_secret_value() if self.api_tokens else "")
        return self

    def tokens(self) -> dict[str, str]:
        """token -> role."""
        if self.api_tokens is None:
            return {}
        return parse_tokens(self.api_tokens.get_secret_value())


ROLES = ("submit", "admin")


def parse_tokens(raw: str) -> dict[str, str]:
    """Parse ``role:token,role:token``; raise ``ValueError`` naming the rule broken."""
    tokens: dict[str, str] = {}
    for pair in (p.strip() for p in raw.split(",")):
        if not pair:
            continue
        role, sep, token = pair.partition(":")
        if not sep or role not in ROLES or len(token) < 8:
            raise ValueError(
                "TASKFLEET_API_TOKENS must be comma-separated role:token pairs with role "
                "submit or admin and a token of at least 8 characters"
            )
        tokens[token] = role
    if not tokens:
        raise ValueError(
            "no API tokens configured: set TASKFLEET_API_TOKENS (e.g. admin:<secret>) or, to run "
            "without authentication, TASKFLEET_AUTH_DISABLED=true"
        )
    return tokens
