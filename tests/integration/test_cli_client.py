"""The client commands against a real HTTP server on an ephemeral port.

The server is a small Starlette app under uvicorn in a thread, serving canned documents and
streaming canned NDJSON events with small gaps: it stands in for the API so these tests prove the
client's side of the wire contract (docs/reference.md#config-events): it really reads the stream
line by line, maps each outcome to its exit code, sends the token and the Accept header, and reports
API and connection errors without a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import queue
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

import taskfleet.cli.client  # noqa: F401  (registers the client commands on the app)
from taskfleet import _calls
from taskfleet.cli.main import app

TOKEN = "canned-admin-token-0123"
REPO = Path(__file__).resolve().parents[2]
#: Bound on every wait for the client or the server; generous, CI shares two cores.
PATIENCE = 30.0

ENQUEUED = {"event": "enqueued", "task_id": 41, "request_id": "REQ"}
VERSION = {"event": "version", "version": 7}
HALF = {
    "event": "progress",
    "version": 7,
    "alive_workers": 2,
    "applied_workers": 1,
    "lagging": ["w-2"],
}
ALL = {"event": "progress", "version": 7, "alive_workers": 2, "applied_workers": 2, "lagging": []}
#: Scenario (the request's requestID) -> the lines the stream sends.
STREAMS: dict[str, list[Any]] = {
    "converged": [
        ENQUEUED,
        VERSION,
        HALF,
        ALL,
        {"event": "converged", "version": 7, "seconds": 0.4},
    ],
    "superseded": [
        ENQUEUED,
        VERSION,
        HALF,
        {"event": "superseded", "version": 7, "superseded_by": 8},
    ],
    "timeout": [ENQUEUED, VERSION, HALF, {"event": "timeout", "version": 7, "lagging": ["w-2"]}],
    "failed": [ENQUEUED, VERSION, HALF, {"event": "failed", "error": "the config task crashed"}],
    "truncated": [ENQUEUED, VERSION, HALF],
    "truncated-for-good": [ENQUEUED, VERSION, HALF],
    "garbage": [
        ENQUEUED,
        "this is not json",
        {"event": "mystery"},
        "",
        VERSION,
        ALL,
        {"event": "converged", "version": 7, "seconds": 0.1},
    ],
}


@dataclass
class CannedApi:
    """The stand-in API: what it was asked, and a gate that holds the gated stream's end."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    final_sent: threading.Event = field(default_factory=threading.Event)
    tasks: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: PUTs received per scenario.
    puts: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.puts.clear()
        self.requests.clear()
        self.gate = threading.Event()
        self.final_sent = threading.Event()
        self.tasks.clear()

    async def _record(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        entry = {
            "method": request.method,
            "path": request.url.path,
            "query": dict(request.query_params),
            "accept": request.headers.get("accept"),
            "authorization": request.headers.get("authorization"),
            "body": json.loads(raw) if raw else None,
        }
        self.requests.append(entry)
        return entry

    def _unauthorized(self, entry: dict[str, Any]) -> Response | None:
        if entry["authorization"] != f"Bearer {TOKEN}":
            return JSONResponse({"detail": "missing or unknown bearer token"}, status_code=401)
        return None

    async def put_runtime_config(self, request: Request) -> Response:
        entry = await self._record(request)
        if denied := self._unauthorized(entry):
            return denied
        scenario = (entry["body"] or {}).get("requestID", "converged")
        if scenario not in STREAMS and scenario not in ("gated", "broken", "rejected"):
            scenario = "converged"  # a generated request id
        if scenario == "rejected":
            msg = "weight must be at most 1000000"
            detail = [{"loc": ["body", "labelWeights", "x"], "msg": msg, "type": "value_error"}]
            return JSONResponse({"detail": detail}, status_code=422)
        return StreamingResponse(self._events(scenario), media_type="application/x-ndjson")

    async def _events(self, scenario: str) -> AsyncIterator[bytes]:
        if scenario == "gated":
            for event in (ENQUEUED, VERSION, HALF):
                yield (json.dumps(event) + "\n").encode()
            # Hold the outcome back until the test has seen the client print the progress line.
            released = await asyncio.to_thread(self.gate.wait, PATIENCE)
            if released:
                self.final_sent.set()
                yield b'{"event": "converged", "version": 7, "seconds": 1.5}\n'
            return
        if scenario in ("broken", "unknown"):
            yield (json.dumps(ENQUEUED) + "\n").encode()
            await asyncio.sleep(0.01)
            raise RuntimeError("the canned server drops the connection mid-stream")
        for item in STREAMS[scenario]:
            yield ((item if isinstance(item, str) else json.dumps(item)) + "\n").encode()
            await asyncio.sleep(0.01)

    async def watch_request(self, request: Request) -> Response:
        """The re-attach after a dropped stream: a broken stream's change converges here."""
        entry = await self._record(request)
        if denied := self._unauthorized(entry):
            return denied
        scenario = request.path_params["request_id"]
        if scenario == "broken":
            scenario = "converged"
        return StreamingResponse(self._events(scenario), media_type="application/x-ndjson")

    async def get_runtime_config(self, request: Request) -> Response:
        entry = await self._record(request)
        if denied := self._unauthorized(entry):
            return denied
        return JSONResponse(
            {
                "version": 7,
                "request_id": "REQ",
                "payload": {
                    "maxStrictPercentage": 40,
                    "defaultWeight": 2,
                    "labelWeights": {"batch": 1, "tenant-a": 5},
                    "notifyInterval": "1s",
                    "listenTimeout": "2s",
                    "requestID": "REQ",
                },
                "created_at": "2026-01-01T12:00:00+00:00",
                "alive_workers": 2,
                "applied_workers": 1,
                "lagging": ["w-2"],
                "workers": [
                    {"id": "w-1", "applied_config_version": 7, "up_to_date": True},
                    {"id": "w-2", "applied_config_version": 6, "up_to_date": False},
                ],
            }
        )

    async def get_workers(self, request: Request) -> Response:
        entry = await self._record(request)
        if denied := self._unauthorized(entry):
            return denied
        now = datetime.now(UTC)
        rows = [
            {
                "id": "w-1",
                "hostname": "h1",
                "pid": 11,
                "concurrency": 10,
                "status": "online",
                "alive": True,
                "inflight": 4,
                "strict_inflight": 1,
                "applied_config_version": 7,
                "last_heartbeat": (now - timedelta(seconds=2)).isoformat(),
                "started_at": (now - timedelta(hours=1)).isoformat(),
                "heartbeat_interval": 3.0,
                "metrics_port": 9100,
            },
            {
                "id": "w-2",
                "hostname": "h2",
                "pid": 12,
                "concurrency": 5,
                "status": "offline",
                "alive": False,
                "inflight": 0,
                "strict_inflight": 0,
                "applied_config_version": 6,
                "last_heartbeat": (now - timedelta(minutes=5)).isoformat(),
                "started_at": (now - timedelta(hours=2)).isoformat(),
                "heartbeat_interval": 3.0,
                "metrics_port": None,
            },
        ]
        return JSONResponse({"workers": rows})

    async def post_task(self, request: Request) -> Response:
        entry = await self._record(request)
        if denied := self._unauthorized(entry):
            return denied
        body = entry["body"]
        if body.get("priority") == 2147483647:
            detail = [
                {
                    "loc": ["body", "priority"],
                    "msg": "2147483647 is reserved",
                    "type": "value_error",
                }
            ]
            return JSONResponse({"detail": detail}, status_code=422)
        task_id = 100 + len(self.tasks)
        task = {
            "id": task_id,
            "type": body["type"],
            "payload": body.get("payload", {}),
            "status": "pending",
            "priority": body.get("priority", 0),
            "weight": body.get("weight", 1),
            "labels": body.get("labels", []),
            "attempts": 0,
            "max_attempts": body.get("max_attempts", 3),
            "run_after": "2026-01-01T12:00:00+00:00",
            "created_at": "2026-01-01T12:00:00+00:00",
            "result": None,
            "last_error": None,
        }
        self.tasks[task_id] = task
        return JSONResponse(task, status_code=201)

    async def wait_task(self, request: Request) -> Response:
        entry = await self._record(request)
        if denied := self._unauthorized(entry):
            return denied
        task = dict(self.tasks[int(request.path_params["task_id"])])
        if task["type"] == "demo.echo":
            task.update(status="completed", attempts=1, result={"value": task["payload"]["value"]})
        elif task["type"] == "demo.fail":
            task.update(status="failed", attempts=3, last_error="RuntimeError: boom")
        elif task["type"] == "demo.cancel":
            task.update(status="cancelled")
        elif task["type"] == "demo.third" and len(self.requests) == 4:  # POST + 3 waits
            task.update(status="completed", attempts=1, result={"calls": 3})
        else:
            task.update(status="running", attempts=1)
        task["finished"] = task["status"] in ("completed", "failed", "cancelled")
        if not task["finished"]:
            # As the API does: an unfinished task is answered once the wait asked for is over
            # (a client asks again at once only after a full wait).
            await asyncio.sleep(float(request.query_params.get("timeout", "0")))
        return JSONResponse(task)

    def starlette(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/runtime-config", self.put_runtime_config, methods=["PUT", "PATCH"]),
                Route("/runtime-config", self.get_runtime_config, methods=["GET"]),
                Route("/runtime-config/requests/{request_id}", self.watch_request, methods=["GET"]),
                Route("/workers", self.get_workers, methods=["GET"]),
                Route("/tasks", self.post_task, methods=["POST"]),
                Route("/tasks/{task_id:int}/wait", self.wait_task, methods=["GET"]),
            ]
        )


@pytest.fixture(scope="module")
def canned_server() -> Iterator[CannedApi]:
    api = CannedApi()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    api.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(api.starlette(), log_level="critical", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + PATIENCE
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield api
    server.should_exit = True
    thread.join(PATIENCE)
    sock.close()


@pytest.fixture
def api(canned_server: CannedApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[CannedApi]:
    monkeypatch.setattr(_calls, "retry_delay", lambda attempt: 0.0)
    canned_server.reset()
    yield canned_server
    canned_server.gate.set()  # never leave a gated stream waiting


def run(api: CannedApi, *args: str, token: str | None = TOKEN) -> Any:
    env = {"COLUMNS": "200", "TASKFLEET_URL": api.url, "TASKFLEET_TOKEN": token}
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert TOKEN not in result.output
    assert "Traceback" not in result.output
    return result


# ------------------------------------------------------------------------------------------
# config set: outcome -> exit code, request shape, errors


@pytest.mark.parametrize(
    ("scenario", "code", "outcome"),
    [
        ("converged", 0, "converged: version 7 applied by every alive worker in 0.40s"),
        ("superseded", 0, "superseded: version 7 was replaced by version 8"),
        ("timeout", 1, "timeout: version 7 is not applied by every alive worker yet; lagging: w-2"),
        ("failed", 1, "failed: the config task crashed"),
    ],
)
def test_config_set_maps_each_outcome_to_its_exit_code(
    api: CannedApi, scenario: str, code: int, outcome: str
) -> None:
    result = run(api, "config", "set", "--request-id", scenario)
    assert result.exit_code == code, result.output
    assert outcome in result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == "enqueued config task 41 (request REQ)"
    assert "version 7: applied 1/2 workers, lagging: w-2" in lines


def test_config_set_sends_the_body_accept_header_timeout_and_token(api: CannedApi) -> None:
    result = run(
        api,
        "config",
        "set",
        "--max-strict-percentage",
        "40",
        "--default-weight",
        "2",
        "--weight",
        "tenant-a=5",
        "--weight",
        "batch=1",
        "--weight",
        "tenant-a=6",
        "--timeout",
        "15",
    )
    assert result.exit_code == 0, result.output
    [request] = api.requests
    assert request["method"] == "PUT"
    assert request["accept"] == "application/x-ndjson"
    assert request["authorization"] == f"Bearer {TOKEN}"
    assert request["query"] == {"timeout": "15"}
    body = dict(request["body"])
    # A request id always: the command re-attaches to its own change after a dropped stream.
    assert uuid.UUID(body.pop("requestID"))
    assert body == {
        "maxStrictPercentage": 40,
        "defaultWeight": 2,
        "labelWeights": {"tenant-a": 6, "batch": 1},
    }
    assert result.stdout.splitlines() == [
        "enqueued config task 41 (request REQ)",
        "version 7 written, waiting for the workers",
        "version 7: applied 1/2 workers, lagging: w-2",
        "version 7: applied 2/2 workers",
        "converged: version 7 applied by every alive worker in 0.40s",
    ]


def test_config_set_sends_pauses_and_limits(api: CannedApi) -> None:
    result = run(
        api,
        "config",
        "set",
        "--pause-label",
        "tenant-a",
        "--pause-type",
        "demo.cpu",
        "--pause-lane",
        "strict",
        "--limit",
        "hot=in_flight:3,rate:4",
        "--patch",
    )
    assert result.exit_code == 0, result.output
    [request] = api.requests
    assert request["method"] == "PATCH"
    body = dict(request["body"])
    body.pop("requestID")
    assert body == {
        "pausedLabels": ["tenant-a"],
        "pausedTypes": ["demo.cpu"],
        "pausedLanes": ["strict"],
        "labelLimits": {"hot": {"maxInFlight": 3, "ratePerSecond": 4.0}},
    }


def test_config_set_resume_all_and_clear_limits_send_empty_fields(api: CannedApi) -> None:
    result = run(api, "config", "set", "--patch", "--resume-all", "--clear-limits")
    assert result.exit_code == 0, result.output
    [request] = api.requests
    body = dict(request["body"])
    body.pop("requestID")
    assert body == {"pausedLabels": [], "pausedTypes": [], "pausedLanes": [], "labelLimits": {}}


def test_config_set_refuses_a_bad_limit(api: CannedApi) -> None:
    result = run(api, "config", "set", "--limit", "hot=in_flight:0")
    assert result.exit_code == 2
    assert "must be LABEL=in_flight:N,rate:R" in result.output
    assert api.requests == []


def test_config_set_tolerates_bad_lines_in_the_stream(api: CannedApi) -> None:
    result = run(api, "config", "set", "--request-id", "garbage")
    assert result.exit_code == 0, result.output
    assert "skipped a bad line from the server (not JSON" in result.stderr
    assert "unknown event 'mystery'" in result.stderr
    assert result.stdout.splitlines()[-1].startswith("converged: version 7")


def test_config_set_reports_the_api_detail_of_a_4xx(api: CannedApi) -> None:
    result = run(api, "config", "set", "--request-id", "rejected")
    assert result.exit_code == 1
    assert "HTTP 422: labelWeights.x: weight must be at most 1000000" in result.stderr


def test_config_set_without_a_valid_token_says_so(api: CannedApi) -> None:
    result = run(api, "config", "set", token="wrong-token-xyz")
    assert result.exit_code == 1
    assert "HTTP 401: missing or unknown bearer token (set TASKFLEET_TOKEN" in result.stderr
    assert "wrong-token-xyz" not in result.output


def test_a_connection_broken_mid_stream_re_attaches_to_the_same_request(api: CannedApi) -> None:
    result = run(api, "config", "set", "--request-id", "broken")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith("converged: version 7")
    assert [(r["method"], r["path"]) for r in api.requests] == [
        ("PUT", "/runtime-config"),
        ("GET", "/runtime-config/requests/broken"),
    ]
    assert api.requests[1]["query"]["watch"] == "true"


def test_a_stream_that_never_reaches_an_outcome_is_lost_not_a_traceback(api: CannedApi) -> None:
    result = run(api, "config", "set", "--request-id", "truncated")
    assert result.exit_code == 1
    assert "the stream ended before an outcome" in result.stdout
    assert "request REQ" in result.stdout
    assert {r["method"] for r in api.requests[1:]} == {"GET"}  # re-attached, never re-sent


def test_an_unreachable_api_is_one_clear_line_and_exit_1() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"TASKFLEET_TOKEN": TOKEN}
    for args in (["config", "set"], ["config", "show"], ["workers"], ["submit", "demo.echo"]):
        result = CliRunner().invoke(app, [*args, "--url", f"http://127.0.0.1:{port}"], env=env)
        assert result.exit_code == 1, (args, result.output)
        assert f"cannot connect to the taskfleet API at http://127.0.0.1:{port}" in result.stderr
        assert "Traceback" not in result.output
        assert TOKEN not in result.output


def _client_process(api: CannedApi, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update(TASKFLEET_URL=api.url, TASKFLEET_TOKEN=TOKEN, COLUMNS="120")
    code = "from taskfleet.cli.main import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, **popen)


def test_config_set_prints_each_event_as_it_arrives(api: CannedApi) -> None:
    """The server holds the outcome back until the client has printed the progress line, so
    a client that buffered the body (or its output) would never print it: this would time out."""
    proc = _client_process(
        api,
        "config",
        "set",
        "--request-id",
        "gated",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def read_stdout() -> None:
        for raw in proc.stdout or []:
            lines.put(raw.decode())

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        seen: list[str] = []
        while not seen or "applied 1/2 workers" not in seen[-1]:
            seen.append(lines.get(timeout=PATIENCE).rstrip("\n"))
        assert not api.final_sent.is_set()
        assert proc.poll() is None
        assert seen == [
            "enqueued config task 41 (request REQ)",
            "version 7 written, waiting for the workers",
            "version 7: applied 1/2 workers, lagging: w-2",
        ]
        api.gate.set()
        assert proc.wait(PATIENCE) == 0
        reader.join(PATIENCE)
        rest = []
        while not lines.empty():
            rest.append(lines.get_nowait().rstrip("\n"))
        assert rest == ["converged: version 7 applied by every alive worker in 1.50s"]
    finally:
        api.gate.set()
        if proc.poll() is None:
            proc.kill()
        proc.wait(PATIENCE)
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()


def test_config_set_on_a_terminal_shows_the_live_display(api: CannedApi) -> None:
    primary, secondary = pty.openpty()
    proc = _client_process(
        api,
        "config",
        "set",
        "--request-id",
        "superseded",
        stdout=secondary,
        stderr=subprocess.PIPE,
    )
    os.close(secondary)
    output = b""
    try:
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the client closed the terminal
                break
            if not chunk:
                break
            output += chunk
        assert proc.wait(PATIENCE) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(PATIENCE)
        os.close(primary)
        assert proc.stderr is not None
        proc.stderr.close()
    text = output.decode(errors="replace")
    assert "\x1b[" in text  # rich drew on the terminal
    assert "version 7: applied 1/2 workers, lagging: w-2" in text
    assert "superseded: version 7 was replaced by version 8" in text
    # The live display draws one line; the plain per-event lines are not printed.
    assert "enqueued config task" not in text


# ------------------------------------------------------------------------------------------
# config show, workers, submit


def test_config_show_renders_the_config_and_each_alive_workers_version(api: CannedApi) -> None:
    result = run(api, "config", "show")
    assert result.exit_code == 0, result.output
    rows = {" ".join(line.replace("│", " ").split()) for line in result.stdout.splitlines()}
    assert "version 7" in rows
    assert "maxStrictPercentage 40" in rows
    assert "defaultWeight 2" in rows
    assert "labelWeights batch=1, tenant-a=5" in rows
    assert "w-1 7 yes" in rows
    assert "w-2 6 no" in rows
    assert api.requests[0]["authorization"] == f"Bearer {TOKEN}"


def test_workers_renders_every_worker_with_its_heartbeat_age(api: CannedApi) -> None:
    result = run(api, "workers")
    assert result.exit_code == 0, result.output
    rows = [" ".join(line.replace("│", " ").split()) for line in result.stdout.splitlines()]
    w1 = next(row for row in rows if row.startswith("w-1 "))
    w2 = next(row for row in rows if row.startswith("w-2 "))
    assert w1.startswith("w-1 online 4/10 1 7 ")
    assert w1.endswith("s ago") and "m" not in w1.split()[-2]
    assert w2.startswith("w-2 offline 0/5 0 6 5m")


def test_submit_sends_only_the_given_fields_and_prints_id_and_status(api: CannedApi) -> None:
    result = run(
        api,
        "submit",
        "demo.sleep",
        "--payload",
        '{"seconds": 1}',
        "--priority",
        "5",
        "--label",
        "tenant-a",
        "--label",
        "batch",
        "--delay",
        "2.5",
        "--unique-key",
        "k1",
        "--max-attempts",
        "4",
        "--timeout",
        "9",
        "--requires",
        "gpu",
        "--requires",
        "eu",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["task 100 demo.sleep: pending"]
    [request] = api.requests
    assert request["body"] == {
        "type": "demo.sleep",
        "payload": {"seconds": 1},
        "priority": 5,
        "labels": ["tenant-a", "batch"],
        "delay_seconds": 2.5,
        "unique_key": "k1",
        "max_attempts": 4,
        "timeout_seconds": 9.0,
        "requires": ["gpu", "eu"],
    }


@pytest.mark.parametrize(
    ("task_type", "code", "last_line"),
    [
        ("demo.echo", 0, 'result: {"value": 3}'),
        ("demo.fail", 1, "task 100 failed after 3 attempts: RuntimeError: boom"),
        ("demo.cancel", 1, "task 100 cancelled"),
        ("demo.slow", 1, "task 100 is still running after waiting 1s"),
    ],
)
def test_submit_wait_exits_by_how_the_task_finished(
    api: CannedApi, task_type: str, code: int, last_line: str
) -> None:
    result = run(
        api, "submit", task_type, "--payload", '{"value": 3}', "--wait", "--wait-timeout", "1"
    )
    assert result.exit_code == code, result.output
    assert result.stdout.splitlines()[0] == f"task 100 {task_type}: pending"
    assert result.stdout.splitlines()[-1] == last_line
    assert [r["path"] for r in api.requests] == ["/tasks", "/tasks/100/wait"]
    assert api.requests[1]["query"] == {"timeout": "1"}


def test_submit_reports_the_api_validation_error(api: CannedApi) -> None:
    result = run(api, "submit", "demo.echo", "--priority", "2147483647")
    assert result.exit_code == 1
    assert "HTTP 422: priority: 2147483647 is reserved" in result.stderr


def test_submit_wait_longer_than_one_wait_call_makes_several(
    api: CannedApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_calls, "WAIT_CHUNK", 0.25)
    result = run(api, "submit", "demo.third", "--wait", "--wait-timeout", "60")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == 'result: {"calls": 3}'
    waits = [r for r in api.requests if r["path"] == "/tasks/100/wait"]
    assert [w["query"] for w in waits] == [{"timeout": "0.25"}] * 3
