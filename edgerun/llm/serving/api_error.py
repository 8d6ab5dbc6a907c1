"""OpenAI's error form: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

The `openai` client turns the status into its exception class (401 AuthenticationError, 404 NotFoundError,
413/400 BadRequestError-like APIStatusError, 429 RateLimitError, 503 InternalServerError) and the JSON into
`exc.body`.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.headers = headers or {}

    def payload(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.payload(), status_code=self.status, headers=self.headers)

    def body(self) -> bytes:
        return json.dumps(self.payload()).encode()


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than this server's limit of {limit} bytes",
                    "invalid_request_error", "request_too_large")


def queue_full(limit: int) -> ApiError:
    return ApiError(429, f"the server is busy: {limit} requests are already waiting; retry later",
                    "rate_limit_error", "queue_full", headers={"Retry-After": "1"})


def token_budget(limit: int) -> ApiError:
    return ApiError(503, f"the server is overloaded: the admitted requests already reserve its {limit} new "
                         "tokens; retry later", "server_error", "overloaded", headers={"Retry-After": "1"})
