"""Request bodies bounded while they are read: a pure ASGI middleware for the fleet server and the stream end.

A request is judged before any body byte is read: the route's rule first authenticates it from its headers
(so an unauthenticated client never gets a byte buffered), then a declared Content-Length above the route's
limit is answered 413 at once. A body without a length (chunked) is counted as it arrives and cut off at the
limit. Every refusal carries `Connection: close`, so the server drops the connection instead of reading and
discarding the rest of a huge body.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Refusal = tuple[int, str] | None  # (status, detail) to answer with, or None to let the request in


@dataclass(frozen=True)
class BodyRule:
    """What a route accepts: at most `limit` body bytes, from a caller `authorize` lets in.

    `authorize(scope)` sees only the path and headers; it returns None to let the request in, or the
    (status, detail) to answer with instead. It may be a coroutine function: one that must look a token up in
    a database awaits that lookup off the event loop, so other requests are served meanwhile."""

    limit: int
    authorize: Callable[[Scope], Refusal | Awaitable[Refusal]] | None = None


RuleFor = Callable[[Scope], BodyRule]


class BodyTooLarge(HTTPException):
    """Raised from `receive` when the body passes its route's limit. An HTTPException, so that the framework
    answers 413 with it (FastAPI turns other errors met while reading a body into 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is over this route's {limit} bytes")


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def bearer(scope: Scope) -> str | None:
    auth = header(scope, b"authorization") or b""
    if not auth.lower().startswith(b"bearer "):
        return None
    return auth[7:].strip().decode("latin-1")


async def refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyLimit:
    def __init__(self, app: Any, rule_for: RuleFor) -> None:
        self.app, self.rule_for = app, rule_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = self.rule_for(scope)
        if rule.authorize is not None:
            refused = rule.authorize(scope)
            if inspect.isawaitable(refused):
                refused = await refused
            if refused is not None:
                await refuse(send, *refused)
                return
        declared = header(scope, b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await refuse(send, 400, "bad Content-Length")
                return
            if length > rule.limit:
                await refuse(send, 413, f"request body of {length} bytes is over this route's {rule.limit}")
                return
        received = 0
        started = overflowed = False

        async def counting_receive() -> Message:
            nonlocal received, overflowed
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > rule.limit:
                    overflowed = True
                    raise BodyTooLarge(rule.limit)
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if overflowed:  # close rather than read and discard the rest of an oversized body
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await refuse(send, 413, str(exc.detail))
