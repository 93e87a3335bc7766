"""Garbage on every NOTIFY channel a worker hears (docs/reference.md#notify-channels: "a malformed
one is logged and ignored, never fatal").

A real worker runs in the test's event loop against a real Postgres; hypothesis draws the
garbage (deterministically): text up to ~7,900 bytes, JSON of the wrong shape, versions that are
negative, fractional, boolean or absurdly large, NaN literals, duplicate keys. After it, the
worker must still be ready on the same LISTEN connection, must still run a task submitted
afterwards, and must have counted each malformed payload as malformed.

Nothing waits on time: every wait polls an outcome (a counter, a row, a log record) under
``workerkit.DEADLINE``. Counters are read after a well-formed sentinel sent last on the same
channel has been counted: notifications reach a listener in commit order, so by then every
garbage payload before it has been delivered too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from taskfleet.shared import protocol, queries
from taskfleet.shared.registry import load_registry
from taskfleet.shared.settings import WorkerSettings
from taskfleet.worker.worker import Worker
from tests.integration import workerkit as kit

#: Garbage payloads per channel. Each costs one pg_notify round trip.
EXAMPLES = 120
#: Postgres refuses a NOTIFY payload of 8000 bytes or more; stay clear of the edge.
MAX_PAYLOAD_BYTES = 7900
#: A log line about a bad payload quotes at most a short prefix of it.
MAX_LOG_LINE = 1000

TASK_READY = queries.TASK_READY_CHANNEL
CONFIG = protocol.CONFIG_CHANNEL
CONFIG_ACK = protocol.CONFIG_ACK_CHANNEL


# --------------------------------------------------------------------------------------------
# Garbage, drawn by hypothesis


def _storable(text: str) -> str:
    """What pg_notify can carry: no NUL, at most MAX_PAYLOAD_BYTES of UTF-8."""
    data = text.replace("\x00", "").encode("utf-8")[:MAX_PAYLOAD_BYTES]
    return data.decode("utf-8", errors="ignore")


def draw_many(strategy: st.SearchStrategy[str], n: int = EXAMPLES) -> list[str]:
    """``n`` examples of ``strategy``, the same ones every run, without duplicates."""
    drawn: dict[str, None] = {}

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: str) -> None:
        drawn[_storable(value)] = None

    collect()
    return list(drawn)


_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)

#: Versions a well-formed message can never carry.
_bad_versions = st.one_of(
    st.integers(max_value=-1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.lists(st.integers(min_value=0), max_size=2),
)
_request_ids = st.text(max_size=40)
_bad_request_ids = st.one_of(st.none(), st.integers(), st.booleans(), st.lists(st.text()))
#: Text with a NUL or a lone surrogate in it somewhere.
_unstorable_text = st.builds(
    lambda head, bad, tail: head + bad + tail,
    st.text(max_size=10),
    st.sampled_from(["\x00", "\ud800", "\udfff", "\udc80"]),
    st.text(max_size=10),
)


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return True
    return False


#: Text that does not parse as JSON, from a few bytes to ~7,900.
not_json = st.one_of(
    st.text(max_size=200),
    st.text(min_size=2000, max_size=MAX_PAYLOAD_BYTES).map(lambda t: "{" + t),
    st.integers(min_value=1, max_value=MAX_PAYLOAD_BYTES).map(lambda n: "[" * n),
    st.sampled_from(["", " ", "{", '{"op":', "up_config", "ack", "\ufeff{}"]),
).filter(lambda t: _not_json(_storable(t)))


def malformed_messages(op: str, version_key: str, extra: dict[str, Any]) -> st.SearchStrategy[str]:
    """Payloads of a ``{"op", "params"}`` channel that must never parse
    (docs/reference.md#notify-channels shapes)."""
    wrong_top = _json.filter(
        lambda v: not isinstance(v, dict) or not isinstance(v.get("params"), dict)
    ).map(_dumps)
    wrong_op = st.builds(
        lambda o, r, v: _dumps({"op": o, "params": {"request_id": r, version_key: v, **extra}}),
        st.one_of(st.text(max_size=10), _json_scalars).filter(lambda o: o != op),
        _request_ids,
        st.integers(min_value=0, max_value=2**62),
    )
    wrong_version = st.builds(
        lambda r, v: _dumps({"op": op, "params": {"request_id": r, version_key: v, **extra}}),
        _request_ids,
        _bad_versions,
    )
    missing_version = st.builds(
        lambda r: _dumps({"op": op, "params": {"request_id": r, **extra}}), _request_ids
    )
    wrong_request_id = st.builds(
        lambda r: _dumps({"op": op, "params": {"request_id": r, version_key: 1, **extra}}),
        _bad_request_ids,
    )
    # NUL and lone surrogates, as JSON escapes (a payload cannot carry them raw): no such id
    # can exist in Postgres, so no such message is well formed.
    unstorable_ids = st.builds(
        lambda r, w: _dumps({"op": op, "params": {"request_id": r, version_key: 1, **extra, **w}}),
        _unstorable_text,
        st.just({}),
    )
    unstorable_worker_ids = st.builds(
        lambda w: _dumps(
            {"op": op, "params": {"request_id": "r", version_key: 1, **extra, "worker_id": w}}
        ),
        _unstorable_text,
    )
    nan_literal = st.sampled_from(
        [
            f'{{"op":"{op}","params":{{"request_id":"r","{version_key}":NaN}}}}',
            f'{{"op":"{op}","params":{{"request_id":"r","{version_key}":-Infinity}}}}',
            # Duplicate keys: the last one wins, and it is wrong.
            f'{{"op":"{op}","params":{{"request_id":"r","{version_key}":1,"{version_key}":-1}}}}',
            f'{{"op":"{op}","params":{{"request_id":"r","{version_key}":1}},"params":[]}}',
        ]
    )
    kinds = [not_json, wrong_top, wrong_op, wrong_version, missing_version, wrong_request_id]
    kinds += [nan_literal, unstorable_ids]
    if "worker_id" in extra:
        kinds.append(unstorable_worker_ids)
    return st.one_of(*kinds)


CONFIG_GARBAGE = malformed_messages("up_config", "version", {})
ACK_GARBAGE = malformed_messages("ack", "applied_version", {"worker_id": "w9"})

#: A wake-up carries nothing, or the lanes it concerns ("control", "strict,normal", ...).
LANES = frozenset({"control", "strict", "normal"})


def is_wake_up(payload: str) -> bool:
    lanes = {part.strip() for part in payload.split(",") if part.strip()}
    return not lanes or lanes <= LANES


READY_GARBAGE = st.one_of(not_json, _json.map(_dumps), st.text(max_size=MAX_PAYLOAD_BYTES)).filter(
    lambda t: not is_wake_up(_storable(t))
)


# --------------------------------------------------------------------------------------------
# The worker


def build_worker(database_url: str) -> Worker:
    settings_ = WorkerSettings(
        database_url=database_url,
        worker_id="w1",
        metrics_port=0,
        concurrency=2,
        poll_interval=0.2,
        heartbeat_interval=0.2,
        lease_ttl=1.0,
        sweep_interval=0.5,
        runtime_config_poll_interval=0.5,
        drain_timeout=2.0,
    )
    return Worker(settings_, load_registry([]))


@pytest.fixture
async def worker(database_url: str) -> AsyncIterator[Worker]:
    w = build_worker(database_url)
    run = asyncio.create_task(w.run(), name="worker-w1")
    try:
        await kit.wait_event(w.ready, "worker ready")
        yield w
    finally:
        w.request_stop()
        await asyncio.wait_for(run, kit.DEADLINE)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with kit.connect(database_url) as connection:
        yield connection


def received(worker: Worker, channel: str) -> float:
    return kit.notifications(worker, channel, "ok") + kit.notifications(
        worker, channel, "malformed"
    )


async def send_all(conn: asyncpg.Connection, channel: str, payloads: list[str]) -> None:
    for payload in payloads:
        await conn.execute("SELECT pg_notify($1, $2)", channel, payload)


async def assert_still_working(
    worker: Worker, conn: asyncpg.Connection, listen_pid: int | None, value: str
) -> None:
    """Ready on the same LISTEN connection, and a task submitted now runs to completion."""
    assert worker.ready.is_set()
    assert worker.status == "running"
    assert worker.listener.connected.is_set()
    assert worker.listener.backend_pid == listen_pid
    assert worker.listener.reconnects == 0
    (task_id,) = await kit.submit(conn, "demo.echo", [{"value": value}])
    row = await kit.wait_task(conn, task_id)
    assert (row["status"], row["result"]) == ("completed", {"value": value})


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def assert_log_lines_are_short(records: list[logging.LogRecord]) -> None:
    longest = max((len(r.getMessage()) for r in records), default=0)
    assert longest <= MAX_LOG_LINE, f"a bad payload was logged at length {longest}"


# --------------------------------------------------------------------------------------------
# Tests


async def test_garbage_on_the_config_channel_is_counted_logged_and_ignored(
    worker: Worker, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    garbage = draw_many(CONFIG_GARBAGE)
    # Well formed but lying: versions that do not exist (one past any bigint). Parsed, checked
    # against the database, and dropped: nothing is applied.
    lies = [protocol.config_updated_payload("nope", v) for v in (10**6, 2**63, 2**70)]
    sentinel = protocol.config_updated_payload("sentinel", 0)
    listen_pid = worker.listener.backend_pid

    await send_all(conn, CONFIG, [*garbage, *lies, sentinel])
    await kit.wait_until(
        lambda: received(worker, CONFIG) >= len(garbage) + len(lies) + 1,
        "every config notification received",
    )

    assert worker.applied_version == 0
    await assert_still_working(worker, conn, listen_pid, "after config garbage")
    assert kit.notifications(worker, CONFIG, "malformed") == len(garbage)
    assert kit.notifications(worker, CONFIG, "ok") == len(lies) + 1
    logged = warnings_about(caplog, f"ignored malformed notification on {CONFIG}")
    assert len(logged) == len(garbage)
    assert_log_lines_are_short(logged)
    # And a real version still gets through.
    worker.config_applied.clear()
    version = await kit.insert_config(conn, "after-garbage", maxStrictPercentage=50)
    await kit.wait_event(worker.config_applied, "a real version applied after the garbage")
    assert worker.applied_version == version


async def test_garbage_on_the_task_ready_channel_is_counted_as_malformed_and_harmless(
    worker: Worker, conn: asyncpg.Connection
) -> None:
    garbage = draw_many(READY_GARBAGE)
    listen_pid = worker.listener.backend_pid
    before = received(worker, TASK_READY)

    await send_all(conn, TASK_READY, garbage)
    # The sentinel: a real submission's own wake-up (empty payload), sent last.
    await assert_still_working(worker, conn, listen_pid, "after wake-up garbage")
    await kit.wait_until(
        lambda: received(worker, TASK_READY) >= before + len(garbage) + 1,
        "every wake-up notification received",
    )

    assert worker.listener.reconnects == 0
    # A wake-up is empty or names lanes; anything else is not the protocol. Waking up anyway
    # is a safe fallback, but docs/reference.md#notify-channels wants a malformed payload seen:
    # counted as malformed.
    malformed = kit.notifications(worker, TASK_READY, "malformed")
    assert malformed == len(garbage), (
        f"{len(garbage)} wake-ups naming no lane were taken as well formed ({malformed} "
        f"counted as malformed): protocol.parse accepts any payload on {TASK_READY}"
    )


# A worker in the fleet that never applies anything, alive for an hour without beating: it holds
# convergence up, so the update task stays in its ACK-waiting loop while the garbage arrives.
_LAGGARD = """
    INSERT INTO taskfleet.workers (id, hostname, pid, concurrency, status, started_at,
                                   last_heartbeat, heartbeat_interval, applied_config_version)
    VALUES ('laggard', 'nowhere', 0, 1, 'online', now(), now(), 3600, 0)
"""


async def test_garbage_acks_are_counted_logged_and_ignored_by_the_config_writer(
    worker: Worker, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    garbage = draw_many(ACK_GARBAGE)
    listen_pid = worker.listener.backend_pid
    await conn.execute(_LAGGARD)
    task_id = await kit.submit_config_task(
        conn,
        {
            "requestID": "fuzz-acks",
            "maxStrictPercentage": 50,
            "notifyInterval": "100ms",
            "listenTimeout": "100ms",
        },
    )

    # The writer LISTENs for ACKs before it inserts its version: once the row exists, it hears.
    async def version_written() -> bool:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM taskfleet.worker_runtime_configs WHERE request_id = $1",
                "fuzz-acks",
            )
        )

    await kit.wait_until(version_written, "the update task wrote its version")
    # Well formed but lying: an ACK for a version nobody has; only hurries the next check.
    lie = protocol.config_ack_payload("fuzz-acks", "laggard", 2**70)
    await send_all(conn, CONFIG_ACK, [*garbage, lie])
    await kit.wait_until(
        lambda: len(warnings_about(caplog, "ignored malformed ACK")) >= len(garbage),
        "every garbage ACK received by the writer",
    )

    # The lie changed nothing: convergence is decided by the database, where the laggard lags.
    row = await kit.task_rows(conn, [task_id])
    assert row[task_id]["status"] == "running"
    version = int(
        await conn.fetchval(
            "SELECT version FROM taskfleet.worker_runtime_configs WHERE request_id = 'fuzz-acks'"
        )
    )
    await conn.execute(
        "UPDATE taskfleet.workers SET applied_config_version = $1 WHERE id = 'laggard'", version
    )
    done = await kit.wait_task(conn, task_id)
    assert done["status"] == "completed"
    assert done["result"]["outcome"] == "converged"
    await assert_still_working(worker, conn, listen_pid, "after ACK garbage")
    logged = warnings_about(caplog, "ignored malformed ACK")
    assert len(logged) == len(garbage)
    assert_log_lines_are_short(logged)
    # Counted, like every other malformed notification (taskfleet_worker_notifications_total).
    counted = kit.notifications(worker, CONFIG_ACK, "malformed")
    assert counted == len(garbage), (
        f"{len(garbage)} malformed ACKs were logged by the config writer but {counted} counted "
        f"in taskfleet_worker_notifications_total{{channel={CONFIG_ACK!r}, result='malformed'}}"
    )
