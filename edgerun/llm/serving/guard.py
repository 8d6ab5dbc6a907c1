"""ASGI middleware in front of every route: the API key, then the body size, both before a route reads the
body (FastAPI parses a body whole before the route runs, so a limit inside a route would come too late).

- Keys: OpenAI's `Authorization: Bearer <key>`, compared in constant time against each configured key.
  `/health` stays open (a load balancer's probe carries no key). A missing or wrong key gets 401.
- Body: a `Content-Length` over the limit is refused with 413 before a byte of the body is read; a chunked
  body is counted as it arrives and refused as soon as it passes the limit.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException

from edgerun.llm.serving.api_error import ApiError, too_large, unauthorized

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})


class BodyTooLarge(HTTPException):
    """Raised inside the app's body read; an HTTPException so FastAPI passes it on rather than turning it into
    its own 400 (the app's HTTPException handler answers it in OpenAI's form)."""

    def __init__(self, limit: int) -> None:
        self.api_error = too_large(limit)
        self.api_error.headers["Connection"] = "close"  # the unread rest must not be taken for a request
        super().__init__(413, self.api_error.message, headers=self.api_error.headers)


class Guard:
    def __init__(self, app: ASGIApp, *, api_keys: frozenset[str], max_body_bytes: int) -> None:
        self.app, self.max_body = app, max_body_bytes
        self.keys = [k.encode() for k in sorted(api_keys)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.keys and scope.get("path") not in OPEN_PATHS and not self._key_ok(headers.get(b"authorization")):
            await _reply(send, unauthorized("a valid API key is needed: send 'Authorization: Bearer <key>'"))
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _reply(send, too_large(self.max_body), close=True)
            return
        started, received = False, 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _reply(send, too_large(self.max_body), close=True)

    def _key_ok(self, header: bytes | None) -> bool:
        if not header or header[:7].lower() != b"bearer ":
            return False
        given = header[7:].strip()
        # Every key is compared (no early exit), each in constant time.
        return any([hmac.compare_digest(given, k) for k in self.keys])


async def _reply(send: Send, error: ApiError, close: bool = False) -> None:
    body = error.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the unread body must not be taken for the next request on this connection
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
