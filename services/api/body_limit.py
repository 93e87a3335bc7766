"""The total request-body cap (``TASKFLEET_MAX_BODY_BYTES``), as ASGI middleware.

It watches the receive stream, so no route, however it reads its body, can be made to buffer
more than the cap: a declared ``Content-Length`` past it is refused before a byte of the body is
read, and a body sent without one (chunked, or slowly) is refused as soon as the bytes received
pass it. Either way the answer is a 413 naming the limit, before anything is parsed, and memory
stays flat: nothing here holds the body. Routes may have smaller limits of their own
(:mod:`taskfleet.api.routing`).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised from ``receive`` once the body passes the cap (the app stops reading there)."""


def too_large_body(limit: int) -> bytes:
    return json.dumps(
        {
            "detail": [
                {
                    "loc": ["body"],
                    "msg": f"request body is larger than the limit of {limit} bytes",
                    "type": "too_large",
                }
            ]
        }
    ).encode()


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await self._refuse(send)
                return
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                return  # whatever the app makes of the interrupted read, the answer is ours
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = too_large_body(self.limit)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    # The rest of the body is not read: the connection cannot be reused.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
