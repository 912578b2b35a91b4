"""Errors in OpenAI's JSON format, and what each failure of the Triton side becomes.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input", "code": null}}

400 bad input (naming the field in `param` and in the message), 401 missing / wrong API key,
404 unknown model or route, 413 a request over the limits, 503 (with Retry-After) when Triton is
overloaded or no replica answers. Messages never carry a stack trace.
"""
from __future__ import annotations

import json

from starlette.responses import Response

from rose_client import AllReplicasDown, ConnectionLost, ServerError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "request_too_large", 500: "server_error", 503: "service_unavailable"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after

    def response(self) -> Response:
        body = {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return Response(json.dumps(body), self.status, headers, media_type="application/json")


def bad_request(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def too_large(param: str | None, message: str) -> ApiError:
    return ApiError(413, message, param=param, code="request_too_large")


def unavailable(message: str, retry_after: int = 1) -> ApiError:
    return ApiError(503, message, code="service_unavailable", retry_after=retry_after)


def from_triton(exc: BaseException, retry_after: int = 1) -> ApiError:
    """What a failure of rose_client becomes. Server messages name the replica (host:port); they are
    kept, since the gateway's callers are the operators' own applications."""
    if isinstance(exc, ServerError) and not exc.retryable:
        param = "dimensions" if "DIMENSIONS" in str(exc) else "input"
        return ApiError(400, f"the server refused the input: {exc}", param=param, code="server_refused")
    if isinstance(exc, (ServerError, AllReplicasDown, ConnectionLost, ConnectionError, TimeoutError)):
        return unavailable(f"the embedding server is unavailable or overloaded, retry later ({exc})", retry_after)
    return ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error")
