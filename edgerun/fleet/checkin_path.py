"""The check-in hot path as pure ASGI: `POST /v1/devices/{id}/checkin` answered before FastAPI's router.

A fleet's steady load is up-to-date check-ins. Profiled under the simulator (py-spy on the server process),
FastAPI's routing, dependency solving, exception and exit-stack middleware and response wrappers took about
half of such a check-in's CPU, more than the answer itself. This middleware recognises the check-in path and
answers it with the same function the documented route uses (`CheckinAnswerer`), so the OpenAPI schema and
the behaviour stay one; every other request goes on to FastAPI. It sits inside the rate limit and the body
limit (which have checked the token against the path and bound the body before a byte is read).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException

from edgerun.stream.body_limit import bearer

# (device id from the path, bearer token or None, body, identity the body limit found for the token, if any)
# -> (HTTP status, JSON body, extra headers)
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]
Answerer = Callable[[str, str | None, bytes, Any], Awaitable[Answer]]

PREFIX, SUFFIX = "/v1/devices/", "/checkin"
IDENTITY = "edgerun.identity"  # scope key: the device identity the body limit looked up for the bearer token


def error(status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    """An error answer shaped as FastAPI shapes its own: {"detail": ...}."""
    return status, json.dumps({"detail": detail}).encode(), headers or []


class CheckinPath:
    def __init__(self, app: Any, answer: Answerer) -> None:
        self.app, self.answer = app, answer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        device_id = path[len(PREFIX):-len(SUFFIX)] if path.startswith(PREFIX) and path.endswith(SUFFIX) else ""
        if not device_id or "/" in device_id or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_body(receive)
        except HTTPException as exc:  # the body limit's 413, raised while reading
            status, payload, headers = error(exc.status_code, str(exc.detail))
        else:
            status, payload, headers = await self.answer(device_id, bearer(scope), body, scope.get(IDENTITY))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()), *headers]})
        await send({"type": "http.response.body", "body": payload})


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
