"""Database URLs and raw asyncpg connections (codecs set as SQLAlchemy's dialect sets them)."""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import urlsplit

import asyncpg
import psycopg
from pydantic import AfterValidator

_SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in _SCHEMES:
        raise ValueError("must be a postgresql:// or postgresql+asyncpg:// URL")
    # host[:port], several of them comma-separated for libpq-style multi-host URLs.
    for host in parts.netloc.rpartition("@")[2].split(","):
        if host.startswith("["):  # [IPv6]:port
            port = host.partition("]")[2].removeprefix(":")
        else:
            port = host.partition(":")[2]
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"port {port!r} is not a number from 1 to 65535")
    return value


DatabaseURL = Annotated[str, AfterValidator(_check_url)]


def asyncpg_dsn(url: str) -> str:
    """The URL as asyncpg takes it."""
    scheme, rest = url.split("://", 1)
    if scheme not in _SCHEMES:
        raise ValueError(f"unsupported database URL scheme {scheme!r}")
    return f"postgresql://{rest}"


def sqlalchemy_url(url: str, *, driver: str = "asyncpg") -> str:
    """The URL as SQLAlchemy's dialect for ``driver`` (asyncpg, or psycopg) takes it."""
    return f"postgresql+{driver}://" + asyncpg_dsn(url).split("://", 1)[1]


def libpq_refusal(url: str) -> str | None:
    """Why libpq (psycopg, the API's driver behind a pooler) would refuse ``url``, or None: a
    query parameter it does not know (asyncpg takes some libpq does not, and passes unknown ones
    to the server as settings)."""
    try:
        psycopg.pq.Conninfo.parse(asyncpg_dsn(url).encode())
    except psycopg.Error as exc:
        return str(exc).strip()
    return None


def dumps(value: Any) -> str:
    """JSON text for a jsonb parameter (both access paths pass JSON as text)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb in: JSON text (as SQLAlchemy's dialect takes it); jsonb out: Python objects.
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename, encoder=lambda v: v, decoder=json.loads, schema="pg_catalog"
        )


def session_settings(
    *,
    synchronous_commit: bool = True,
    statement_timeout: float | None = None,
    generic_plans: bool = False,
) -> dict[str, str]:
    """The server settings a connection wants besides its application_name, as Postgres spells
    them. ``statement_timeout`` (seconds): the server ends any statement running longer, and with
    it the locks it holds. A client-side timeout alone cannot: the server does not notice that a
    client hung up while the statement waits for a lock.

    ``generic_plans``: the connection's prepared statements always run their generic plan, and
    that plan uses no sequential scan. For the claim: once autovacuum has analysed the tasks
    table, Postgres otherwise finds the claim's custom plan cheaper and plans the whole statement
    again on every call (the drain fell from about 3,800 to 2,000 tasks/s, docs/benchmarks.md).
    A generic plan is built once, with the table as it is then: built on an empty table it read
    the claimed rows by a sequential scan, at every claim however deep the backlog grew (1,300
    tasks/s) until the next ANALYZE. Without sequential scans it takes the claimed rows by their
    key and each lane's order from its own index, at any depth (tests/integration/
    test_claim_depth.py and test_claim_plan_explain.py check both plans at a million rows, and
    the generic one built on an empty table)."""
    settings: dict[str, str] = {}
    if statement_timeout is not None:
        settings["statement_timeout"] = str(max(1, round(statement_timeout * 1000)))
    if not synchronous_commit:
        settings["synchronous_commit"] = "off"
    if generic_plans:
        settings["plan_cache_mode"] = "force_generic_plan"
        settings["enable_seqscan"] = "off"
        # A plan that still needs a sequential scan (a tiny table no index serves) carries the
        # cost that marks it disabled, far above jit_above_cost: the claim would be compiled
        # (1.7 s a claim, seen through PgBouncer). A claim is small work; JIT only costs it.
        settings["jit"] = "off"
    return settings


#: What every connection through a transaction-mode pooler sends at start. PgBouncer tracks
#: these per client and, when it hands a server connection to a client whose values differ
#: from the last one's, first sends a SET, one more transaction each time. So every taskfleet
#: client sends the same application_name, and client_encoding as the server spells it (asyncpg
#: sends 'utf-8', which the server reports back as UTF8: a SET on every hand-out). Measured
#: through PgBouncer 1.18 with one idle worker: 1.8 transactions/s reached Postgres for 0.9
#: from the worker, 0.9 with these.
POOLED_STARTUP_PARAMETERS = {"application_name": "taskfleet", "client_encoding": "UTF8"}

#: Message fragment of a transaction-mode pooler (PgBouncer) refusing a session setting sent at
#: connection start (SQLSTATE 08P01).
_POOLER_REFUSAL = "unsupported startup parameter"


def pooler_refusal(exc: BaseException) -> str | None:
    """When ``exc`` is a connection pooler refusing the session settings a direct connection
    sends, what to do about it in one line; else None."""
    if not isinstance(exc, asyncpg.ProtocolViolationError) or _POOLER_REFUSAL not in str(exc):
        return None
    return (
        f"the server at TASKFLEET_DATABASE_URL refused a connection setting ({exc}): it is a "
        "connection pooler such as PgBouncer. Set TASKFLEET_DATABASE_POOLER=transaction and "
        "TASKFLEET_LISTEN_DATABASE_URL to Postgres itself (docs/operations.md#pgbouncer)"
    )


async def connect(
    url: str,
    *,
    application_name: str = "taskfleet",
    synchronous_commit: bool = True,
    statement_timeout: float | None = None,
    pooled: bool = False,
    generic_plans: bool = False,
) -> asyncpg.Connection:
    """One raw connection, no pool: the worker's hot paths must not pay the pool's reset
    statements (``UNLISTEN *``, ``RESET ALL``, ... on every release).

    ``pooled``: ``url`` is a transaction-mode pooler, where consecutive transactions may run on
    different server connections. Nothing may then live in the session: no settings but
    :data:`POOLED_STARTUP_PARAMETERS` are sent at connection start (``application_name`` is
    theirs; the caller applies its settings with ``SET LOCAL``, see
    :func:`taskfleet.shared.queries.transaction_begin`) and no statement is kept prepared (each
    is prepared unnamed, in the same round trips as it runs, which a pooler keeps together)."""
    server_settings = {"application_name": application_name}
    if pooled:
        server_settings = dict(POOLED_STARTUP_PARAMETERS)
    else:
        server_settings.update(
            session_settings(
                synchronous_commit=synchronous_commit,
                statement_timeout=statement_timeout,
                generic_plans=generic_plans,
            )
        )
    conn = await asyncpg.connect(
        asyncpg_dsn(url),
        server_settings=server_settings,
        statement_cache_size=0 if pooled else 256,
    )
    await _init_connection(conn)
    return conn
