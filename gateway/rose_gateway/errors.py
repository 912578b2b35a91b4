"""Errors in OpenAI's JSON format, and what each failure of the Triton side becomes.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input", "code": null}}

400 bad input (naming the field in `param` and in the message), 401 missing / wrong API key,
404 unknown model or route, 408 a request not sent in time, 413 a request over the limits, 415 a
body that is not declared JSON, 431 headers over the limits, 503 (with Retry-After) when Triton is
overloaded, no replica answers, or the connection cap is reached. Messages never carry a stack
trace, a key, or an internal address: replicas are named "replica 0", "replica 1", ... in the order
of --triton-urls (the gateway's log keeps their addresses).

Text-embeddings-inference's routes (tei.py) answer the same failures in TEI's format and codes
(tei_status, tei_body): {"error": "...", "error_type": "Validation"}; bad input 422, an empty batch
400, too large a batch or body 413, a route the served model has no use for 424, overload 429, no
replica answering 503.
"""
from __future__ import annotations

import http
import json
import re

from starlette.responses import Response

from rose_client import AccessDenied, AllReplicasDown, ConnectionLost, ServerError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "request_too_large",
          415: "invalid_request_error", 431: "request_too_large", 500: "server_error", 503: "service_unavailable"}
# what is left of an address once the replicas' own urls are replaced: host:port, ipv4:/ipv6: forms
_ADDRESS = re.compile(r"(?:ipv[46]:)?(?:\[[0-9a-fA-F:.%\w]*\]|[\w.-]+):\d{2,5}\b")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after

    def body(self) -> bytes:
        return json.dumps(error_body(self.status, self.message, self.param, self.code)).encode()

    def response(self) -> Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return Response(self.body(), self.status, headers, media_type="application/json")


def raw_error_response(status: int, message: str, code: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 error response, for the connection to write itself (protocol.py)."""
    body = json.dumps(error_body(status, message, None, code)).encode()
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


# TEI's error types (its router's ErrorType, serialised by name) and the status each answers with here
TEI_TYPES = {400: "Empty", 413: "Validation", 422: "Validation", 424: "Backend", 429: "Overloaded",
             500: "Backend", 503: "Unhealthy"}


def tei_status(e: ApiError) -> int:
    """The status of `e` on a TEI route: bad input is 422 there (400 only for an empty batch),
    an overloaded server 429 (TEI's), the rest as on the OpenAI routes."""
    if e.status == 400:
        return 400 if e.code == "empty" else 422
    if e.status == 503 and e.code == "overloaded":
        return 429
    return e.status


def tei_body(e: ApiError) -> bytes:
    """TEI's error body: {"error": message, "error_type": one of TEI's ErrorType names}."""
    return json.dumps({"error": e.message, "error_type": TEI_TYPES.get(tei_status(e), "Validation")}).encode()


def tei_response(e: ApiError) -> Response:
    headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
    return Response(tei_body(e), tei_status(e), headers, media_type="application/json")


def empty_batch(param: str) -> ApiError:
    """TEI's 400 "Empty": a batch with nothing in it (on the OpenAI routes, a 400 as any bad input)."""
    return ApiError(400, f"`{param}` cannot be empty", param=param, code="empty")


def not_for_this_model(message: str) -> ApiError:
    """TEI's 424 "Backend": the route has no use for the served model (embed on a reranker, ...)."""
    return ApiError(424, message, code="model_kind")


def bad_request(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def too_large(param: str | None, message: str) -> ApiError:
    return ApiError(413, message, param=param, code="request_too_large")


def unavailable(message: str, retry_after: int = 1) -> ApiError:
    return ApiError(503, message, code="service_unavailable", retry_after=retry_after)


def redact(text: str, urls: list[str]) -> str:
    """`text` with each replica's url as "replica i", and any other host:port as "<address>"."""
    for i, url in enumerate(urls):
        text = text.replace(url, f"replica {i}")
    return _ADDRESS.sub("<address>", text)


def from_triton(exc: BaseException, urls: list[str], retry_after: int = 1) -> ApiError:
    """What a failure of rose_client becomes, its message without internal addresses."""
    if isinstance(exc, AccessDenied):
        return unavailable("the embedding server refused the gateway's API key (the gateway's API_KEY must be "
                           "the deployment's)", retry_after)
    if isinstance(exc, ServerError) and not exc.retryable:
        param = "dimensions" if "DIMENSIONS" in str(exc) else "input"
        return ApiError(400, f"the server refused the input: {redact(str(exc), urls)}", param=param,
                        code="server_refused")
    if isinstance(exc, ServerError) and not exc.server_leaving:
        # the server said it is overloaded (its queue is full): TEI's 429 on the TEI routes
        return ApiError(503, f"the embedding server is unavailable or overloaded, retry later "
                             f"({redact(str(exc), urls)})", code="overloaded", retry_after=retry_after)
    if isinstance(exc, (ServerError, AllReplicasDown, ConnectionLost, ConnectionError, TimeoutError)):
        return unavailable(f"the embedding server is unavailable or overloaded, retry later ({redact(str(exc), urls)})",
                           retry_after)
    return ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error")
