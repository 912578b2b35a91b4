"""What every route shares: the API-key check, the JSON content type of a POST, the error format,
metrics, and what happens when the client goes away.

A client gone mid-request (a reset while it sends the body, or before the answer) is no error of
the gateway's: no traceback, no 500, counted as status 499. While a handler waits for Triton, the
connection (protocol.py) calls back when its client disconnects: the handler's task is cancelled,
which cancels the request's calls to Triton (rose_client stops sending its chunks and cancels its
streams). A handler cancelled because the gateway is stopping (its drain timeout ran out)
answers 503. direct_endpoint() is the same for POST /v1/embeddings served without the app (direct.py).
tei=True: every error in text-embeddings-inference's format and codes (errors.tei_body).
"""
from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
import logging
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from rose_gateway import stages
from rose_gateway.direct import JSON, ClientGone
from rose_gateway.errors import ApiError, tei_body, tei_response, tei_status
from rose_gateway.metrics import GatewayMetrics
from rose_gateway.protocol import ANSWERED, DISCONNECT

log = logging.getLogger("rose_gateway")
GONE = 499                      # the status a request whose client went away is counted with


def endpoint(name: str, handler, metrics: GatewayMetrics, key: str | None, auth: bool = True,
             json_body: bool = False, retry_after: int = 1, tei: bool = False):
    """Wrap a handler: API key, content type, error format, metrics, disconnects. Unexpected
    errors answer 500 without a trace (the log has it)."""
    answer = tei_response if tei else ApiError.response

    async def run(request: Request) -> Response:
        t0 = time.perf_counter()
        gone, forget = cancel_when_gone(request.scope)
        try:
            if auth and key is not None:
                check_key(request.headers.get("authorization"), key)
            if json_body:
                check_json(request.headers.get("content-type"))
            response = await handler(request)
        except ApiError as e:
            response = answer(e)
            log_refusal(name, e)
        except ClientDisconnect:
            response = Response(status_code=GONE)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            response = Response(status_code=GONE) if gone else answer(stopping(retry_after))
        except Exception:
            log.exception("%s failed", name)
            response = answer(INTERNAL)
        finally:
            forget()
        if ANSWERED not in request.scope:            # else the connection answered (408) and counted it
            metrics.observe(name, response.status_code, time.perf_counter() - t0)
        return response
    return run


def direct_endpoint(name: str, handler, metrics: GatewayMetrics, key: str | None, max_body_bytes: int,
                    retry_after: int = 1, tei: bool = False):
    """endpoint() for a DirectCycle (direct.py): the same checks, answers and metrics, on the
    connection's own header list. handler: async (raw body bytes) -> JSON body bytes."""
    status_of, body_of = (tei_status, tei_body) if tei else (lambda e: e.status, ApiError.body)

    async def run(cycle) -> tuple[int, bytes, list]:
        t0 = time.perf_counter()
        stages.begin()
        gone, forget = cancel_when_gone(cycle.scope)
        status, headers = 200, []
        try:
            if key is not None:
                auth = cycle.header(b"authorization")
                check_key(None if auth is None else auth.decode("latin-1"), key)
            ctype = cycle.header(b"content-type")
            if ctype != JSON:
                check_json(None if ctype is None else ctype.decode("latin-1"))
            raw = await cycle.read_body(max_body_bytes)
            stages.mark("body_read")
            body = await handler(raw)
        except ApiError as e:
            status, body = status_of(e), body_of(e)
            if e.retry_after is not None:
                headers = [(b"retry-after", str(e.retry_after).encode("ascii"))]
            log_refusal(name, e)
        except ClientGone:
            status, body = GONE, b""
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            if gone:
                status, body = GONE, b""
            else:
                e = stopping(retry_after)
                status, body, headers = status_of(e), body_of(e), [(b"retry-after", str(retry_after).encode("ascii"))]
        except Exception:
            log.exception("%s failed", name)
            status, body = status_of(INTERNAL), body_of(INTERNAL)
        finally:
            forget()
        if ANSWERED not in cycle.scope:              # else the connection answered (408) and counted it
            metrics.observe(name, status, time.perf_counter() - t0)
        return status, body, headers
    return run


def cancel_when_gone(scope: dict) -> tuple[list, Callable[[], None]]:
    """While the handler runs, the connection's disconnect (protocol.py) cancels its task and
    appends to `gone`; forget() (in the handler's finally) stops that. Returns (gone, forget)."""
    task = asyncio.current_task()
    gone: list = []
    callbacks = scope.get(DISCONNECT)

    def client_gone():
        gone.append(True)
        task.cancel()

    def forget():
        if callbacks is not None and client_gone in callbacks:
            callbacks.remove(client_gone)

    if callbacks is not None:
        callbacks.append(client_gone)
    return gone, forget


INTERNAL = ApiError(500, "internal error in the gateway (see its log)", code="internal_error")


def stopping(retry_after: int) -> ApiError:
    """The answer of a handler cancelled because the gateway is stopping (its drain time is over)."""
    return ApiError(503, "the gateway is shutting down; retry later", code="service_unavailable",
                    retry_after=retry_after)


def log_refusal(name: str, e: ApiError) -> None:
    if e.status >= 500 or e.code == "server_refused":
        log.warning("%s: %d %s", name, e.status, e.message)


def check_key(auth: str | None, key: str) -> None:
    """`auth`: the request's Authorization header, if any."""
    auth = auth or ""
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'" if auth else
                       "this gateway needs an API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")


def check_json(declared: str | None) -> None:
    """415 naming the header unless the body is declared JSON (a cross-origin form post cannot be).
    `declared`: the request's Content-Type header, if any."""
    if declared is None or declared.split(";", 1)[0].strip().lower() != "application/json":
        got = "none" if declared is None else repr(declared if len(declared) <= 60 else declared[:57] + "...")
        raise ApiError(415, f"the request body must be sent with the header 'Content-Type: application/json' "
                            f"(got {got})", param="Content-Type", code="unsupported_media_type")
