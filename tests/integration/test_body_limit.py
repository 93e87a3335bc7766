"""TASKFLEET_MAX_BODY_BYTES against a real uvicorn: a body over the cap is refused with a 413
naming the limit, whether it declares its length up front or arrives in chunks without one."""

from __future__ import annotations

import json
import select
import socket
from urllib.parse import urlsplit

import httpx

from tests.integration.apiserver import running_api
from tests.integration.test_api_tasks import ADMIN, api_settings

CAP = 64 * 1024
PATIENCE = 20.0


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=PATIENCE)
    return sock


def _read_response(sock: socket.socket) -> tuple[int, dict[str, object]]:
    data = b""
    sock.settimeout(PATIENCE)
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, json.loads(body[:length])


def _head(path: str, extra: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {ADMIN}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    ).encode()


def _assert_refused(status: int, body: dict[str, object]) -> None:
    assert status == 413, body
    assert body == {
        "detail": [
            {
                "loc": ["body"],
                "msg": f"request body is larger than the limit of {CAP} bytes",
                "type": "too_large",
            }
        ]
    }


def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_sent(
    database_url: str,
) -> None:
    with running_api(api_settings(database_url, max_body_bytes=CAP)) as api:
        sock = _connect(api.url)
        try:
            # Only the headers: the answer must come without a byte of the body.
            sock.sendall(_head("/tasks/batch", f"Content-Length: {40 * 1024 * 1024}\r\n"))
            _assert_refused(*_read_response(sock))
        finally:
            sock.close()


def test_a_chunked_body_without_a_length_is_refused_once_it_passes_the_cap(
    database_url: str,
) -> None:
    total = 64 * 1024 * 1024  # what the client would send: a thousand times the cap
    piece = b"[" + b"0," * (8 * 1024) + b"0]"
    with running_api(api_settings(database_url, max_body_bytes=CAP)) as api:
        sock = _connect(api.url)
        sent = 0
        try:
            sock.sendall(_head("/tasks/batch", "Transfer-Encoding: chunked\r\n"))
            while sent < total:
                try:
                    sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                except OSError:
                    break  # the server answered and closed: read what it said
                sent += len(piece)
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
            _assert_refused(*_read_response(sock))
            assert sent < total, "the server read the whole body before refusing it"
        finally:
            sock.close()


def test_a_body_under_the_cap_is_served(database_url: str) -> None:
    with running_api(api_settings(database_url, max_body_bytes=CAP)) as api:
        response = httpx.post(
            f"{api.url}/tasks/batch",
            json={"tasks": [{"type": "demo.echo", "payload": {"value": "x" * 1000}}] * 20},
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=PATIENCE,
        )
        assert response.status_code == 201, response.text
        assert len(response.json()["tasks"]) == 20
