"""The client's retry and re-attach rules, against scripted answers (httpx.MockTransport): which
calls are retried on a 503 or a dropped connection, and how a config stream re-attaches."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import taskfleet
from taskfleet import _calls
from taskfleet.client import Client
from taskfleet.config_change import ConfigStreamLost
from taskfleet.config_events import Converged, Enqueued, FleetProgress, VersionWritten

TASK = {
    "id": 7,
    "type": "demo.echo",
    "payload": {},
    "status": "pending",
    "priority": 0,
    "weight": 1,
    "labels": [],
    "attempts": 0,
    "max_attempts": 3,
    "run_after": "2026-01-01T00:00:00+00:00",
    "created_at": "2026-01-01T00:00:00+00:00",
}


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calls, "retry_delay", lambda attempt: 0.0)


class Script:
    """Answers requests in order from a list; records what was asked."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def client(self) -> Client:
        return Client("http://api", token="t", transport=httpx.MockTransport(self))


def unavailable() -> httpx.Response:
    return httpx.Response(503, json={"detail": "database unavailable"})


def test_a_get_is_retried_on_503_and_on_a_dropped_connection() -> None:
    script = Script(unavailable(), httpx.ReadError("reset"), httpx.Response(200, json=TASK))
    assert script.client().get(7).id == 7
    assert len(script.requests) == 3


def test_a_submit_without_unique_key_is_not_retried_after_sending() -> None:
    script = Script(unavailable())
    with pytest.raises(taskfleet.Unavailable):
        script.client().submit("demo.echo")
    script = Script(httpx.ReadError("reset"))
    with pytest.raises(httpx.ReadError):
        script.client().submit("demo.echo")
    assert len(script.requests) == 1


def test_a_submit_that_could_not_connect_is_retried_nothing_was_sent() -> None:
    script = Script(httpx.ConnectError("refused"), httpx.Response(201, json=TASK))
    assert script.client().submit("demo.echo").id == 7
    assert len(script.requests) == 2


def test_a_submit_with_unique_key_is_retried_on_503() -> None:
    script = Script(unavailable(), httpx.Response(200, json={**TASK, "deduplicated": True}))
    assert script.client().submit("demo.echo", unique_key="k").deduplicated is True
    assert [json.loads(r.content)["unique_key"] for r in script.requests] == ["k", "k"]


def test_cancel_and_retry_are_never_retried_on_503() -> None:
    for method in ("cancel", "retry"):
        script = Script(unavailable())
        with pytest.raises(taskfleet.Unavailable):
            getattr(script.client(), method)(7)
        assert len(script.requests) == 1


def test_retries_stop_after_the_limit() -> None:
    script = Script(*(unavailable() for _ in range(_calls.RETRIES + 1)))
    with pytest.raises(taskfleet.Unavailable):
        script.client().get(7)
    assert len(script.requests) == _calls.RETRIES + 1


def test_error_classes_carry_message_and_field() -> None:
    detail = [{"loc": ["body", "payload", "to"], "msg": "Field required", "type": "missing"}]
    script = Script(httpx.Response(422, json={"detail": detail}))
    with pytest.raises(taskfleet.InvalidRequest) as caught:
        script.client().submit("email.send")
    assert (caught.value.status, caught.value.field) == (422, "payload.to")
    assert caught.value.message == "Field required"
    assert str(caught.value) == "HTTP 422: payload.to: Field required"


class BrokenStream(httpx.SyncByteStream):
    """Sends some lines, then the connection drops."""

    def __init__(self, lines: list[dict[str, Any]]) -> None:
        self.lines = lines

    def __iter__(self) -> Iterator[bytes]:
        for line in self.lines:
            yield (json.dumps(line) + "\n").encode()
        raise httpx.ReadError("connection reset")


def ndjson(*lines: dict[str, Any]) -> httpx.Response:
    body = "".join(json.dumps(line) + "\n" for line in lines)
    return httpx.Response(200, content=body, headers={"Content-Type": "application/x-ndjson"})


ENQUEUED = {"event": "enqueued", "task_id": 3, "request_id": "r1", "deduplicated": False}
VERSION = {"event": "version", "version": 4}
PROGRESS = {
    "event": "progress",
    "version": 4,
    "alive_workers": 2,
    "applied_workers": 1,
    "lagging": ["w2"],
}
CONVERGED = {"event": "converged", "version": 4, "seconds": 0.5}


def test_a_dropped_config_stream_re_attaches_instead_of_making_a_new_version() -> None:
    script = Script(
        httpx.Response(200, stream=BrokenStream([ENQUEUED, VERSION])),
        ndjson({**ENQUEUED, "deduplicated": True}, VERSION, PROGRESS, CONVERGED),
    )
    change = script.client().change_config(max_strict_percentage=50, request_id="r1")
    events = list(change)

    assert [type(e) for e in events] == [Enqueued, VersionWritten, FleetProgress, Converged]
    assert change.result() == Converged(4, 0.5)
    put, watch = script.requests
    assert (put.method, json.loads(put.content)) == (
        "PUT",
        {"maxStrictPercentage": 50, "requestID": "r1"},
    )
    assert (watch.method, watch.url.path) == ("GET", "/runtime-config/requests/r1")
    assert watch.url.params["watch"] == "true"


def test_a_config_request_the_server_never_saw_is_sent_again_with_the_same_id() -> None:
    script = Script(
        httpx.Response(200, stream=BrokenStream([])),
        httpx.Response(404, json={"detail": [{"loc": ["path"], "msg": "no", "type": "x"}]}),
        ndjson(ENQUEUED, VERSION, CONVERGED),
    )
    assert script.client().change_config(default_weight=2).result() == Converged(4, 0.5)
    methods = [r.method for r in script.requests]
    assert methods == ["PUT", "GET", "PUT"]
    ids = {json.loads(r.content)["requestID"] for r in script.requests if r.method == "PUT"}
    assert len(ids) == 1


def test_a_stream_that_never_reaches_an_outcome_gives_up() -> None:
    script = Script(*(httpx.Response(200, stream=BrokenStream([ENQUEUED])) for _ in range(10)))
    change = script.client().change_config(default_weight=2)
    with pytest.raises(ConfigStreamLost):
        change.result()


def test_a_refused_config_change_raises_when_sent() -> None:
    script = Script(httpx.Response(409, json={"detail": "requestID r1 was used"}))
    with pytest.raises(taskfleet.Conflict, match="r1 was used"):
        script.client().change_config(default_weight=2, request_id="r1")


def test_unknown_config_fields_are_refused_before_sending() -> None:
    script = Script()
    with pytest.raises(TypeError, match="max_strict"):
        script.client().change_config(max_strict=5)
    assert script.requests == []


def test_a_wait_answered_early_asks_again_until_its_own_deadline() -> None:
    # An API shutting down answers /wait at once with the task unfinished. The client gave up
    # then (saying it had waited the whole time), or, with more than a minute left, asked again
    # in a tight loop (about 150,000 requests in 30 s against a scripted server).
    finished = {**TASK, "status": "completed", "finished_at": "2026-01-01T00:00:01+00:00"}
    script = Script(httpx.Response(200, json=TASK), httpx.Response(200, json=finished))
    assert script.client().wait(7, timeout=30).status == "completed"
    assert len(script.requests) == 2


def test_the_pause_after_an_early_answer_is_short_and_bounded_by_the_deadline() -> None:
    now = time.monotonic()
    # Answered before the 30 s asked for: pause, at most EARLY_ANSWER_PAUSE.
    assert _calls.pause_before_asking_again(now, 30.0, now + 60) == _calls.EARLY_ANSWER_PAUSE
    # Waited as asked: ask again at once.
    assert _calls.pause_before_asking_again(now - 31, 30.0, now + 60) == 0.0
    # The caller's deadline passed: give up.
    assert _calls.pause_before_asking_again(now - 1, 30.0, now - 0.001) is None
    # Never past the deadline.
    pause = _calls.pause_before_asking_again(now, 30.0, now + 0.1)
    assert pause is not None and pause <= 0.1


@pytest.mark.parametrize(
    "kwargs", [{"retries": -1}, {"retries": 1.5}, {"timeout": 0}, {"timeout": float("nan")}]
)
def test_bad_client_settings_are_refused_when_the_client_is_made(kwargs: dict[str, Any]) -> None:
    # retries=-1 sent nothing and raised AssertionError('unreachable') at the first call;
    # timeout=0 failed each call with a misleading ReadError.
    with pytest.raises(ValueError):
        Client("http://api", **kwargs)
    with pytest.raises(ValueError):
        taskfleet.AsyncClient("http://api", **kwargs)


@pytest.mark.parametrize(
    ("send", "field"),
    [
        (lambda c: c.submit("demo.echo", delay_seconds=float("nan")), "delay_seconds"),
        (lambda c: c.submit("demo.echo", {"to": [1, float("inf")]}), "payload.to.1"),
        (
            lambda c: c.submit_many([{"type": "a"}, {"type": "a", "priority": float("-inf")}]),
            "tasks.1.priority",
        ),
    ],
)
def test_a_number_json_cannot_carry_is_an_invalid_request_naming_the_field(
    send: Any, field: str
) -> None:
    # It raised httpx's bare ValueError('Out of range float values are not JSON compliant'),
    # where enqueue() raises InvalidRequest for the same field. Nothing is sent.
    script = Script()
    with pytest.raises(taskfleet.InvalidRequest) as raised:
        send(script.client())
    assert raised.value.field == field
    assert "finite" in raised.value.message
    assert script.requests == []


async def test_the_async_client_refuses_a_non_finite_number_too() -> None:
    script = Script()
    transport = httpx.MockTransport(script)
    async with taskfleet.AsyncClient("http://api", token="t", transport=transport) as client:
        with pytest.raises(taskfleet.InvalidRequest) as raised:
            await client.submit("demo.echo", delay_seconds=float("inf"))
    assert raised.value.field == "delay_seconds"
    assert script.requests == []


@pytest.mark.parametrize("request_id", ["r1?x=1", "r1#frag", "a/../../tasks", "b c%2F"])
def test_a_request_id_is_one_path_segment_when_a_stream_re_attaches(request_id: str) -> None:
    # "r1?x" re-attached to request "r1" (the rest became a query), and "a/../../tasks" to
    # another path: the id was put in the URL as it is.
    request = httpx.Request("GET", "http://api" + _calls.watch_config(request_id, 5.0).path)
    prefix, segment = request.url.raw_path.decode().rsplit("/", 1)
    assert prefix == "/runtime-config/requests"
    assert request.url.query == b""
    assert urllib.parse.unquote(segment) == request_id
