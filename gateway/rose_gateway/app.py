"""The Starlette app: routes, API-key check, body limit, error format and metrics.

    app = create_app(GatewaySettings(["127.0.0.1:8001"]))      # then: uvicorn.run(app, ...)
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rose_client import AsyncEmbeddingClient
from rose_gateway.embeddings import check_dimensions, cut_dimensions, embedding_response, parse_embedding_request
from rose_gateway.errors import ApiError, bad_request, from_triton, too_large, unavailable
from rose_gateway.metrics import GatewayMetrics
from rose_gateway.rerank import Reranker, parse_rerank_request, rerank_response
from rose_gateway.settings import GatewaySettings
from rose_gateway.tokens import ModelInfo
from rose_gateway.triton_state import TritonState

log = logging.getLogger("rose_gateway")
COUNT_INLINE = 32          # token-count up to this many texts on the event loop, more in a thread


class Gateway:
    """The state one app serves with: the Triton client, the model's facts, metrics."""

    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        self.model = ModelInfo(settings.model_dir)
        self.name = settings.served_model_name or self.model.name
        self.accepted_names = {self.name, self.model.name, "embed"}
        self.metrics = GatewayMetrics()
        self.client: AsyncEmbeddingClient | None = None
        self.state: TritonState | None = None
        self.reranker: Reranker | None = None
        self._settings_retry_at = 0.0

    @contextlib.asynccontextmanager
    async def lifespan(self, _app):
        s = self.settings
        # a replica set that is down answers 503 within a few tenths of a second (3 tries, 0.05 s
        # backoff doubling), and a replica that comes back is tried again within a second
        self.client = AsyncEmbeddingClient(s.triton_urls, timeout=s.timeout, retries=3, backoff=0.05,
                                           max_backoff=1.0, chunk_timeout=s.timeout)
        self.state = TritonState(s.triton_urls)
        self.reranker = Reranker(s.triton_urls, s.timeout, s.retry_after)
        try:
            yield
        finally:
            await self.state.close()
            self.reranker.close()
            await self.client.close()

    # ------------------------------------------------------------------------- request plumbing
    def endpoint(self, name: str, handler, auth: bool = True):
        """Wrap a handler: API key, error format, metrics. Unexpected errors answer 500 without a trace."""
        key = self.settings.api_key

        async def run(request: Request) -> Response:
            t0 = time.perf_counter()
            try:
                if auth and key is not None:
                    check_key(request, key)
                response = await handler(request)
            except ApiError as e:
                response = e.response()
                if e.status >= 500 or e.code == "server_refused":
                    log.warning("%s: %d %s", name, e.status, e.message)
            except Exception:
                log.exception("%s failed", name)
                response = ApiError(500, "internal error in the gateway (see its log)", code="internal_error").response()
            self.metrics.observe(name, response.status_code, time.perf_counter() - t0)
            return response
        return run

    async def read_json(self, request: Request) -> object:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large(None, f"the request body has {int(declared)} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(None, f"the request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        try:
            return orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError as e:
            raise bad_request("body", f"the request body is not valid JSON ({e})") from None

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.accepted_names:
            raise ApiError(404, f"model {model!r} is not served here; GET /v1/models lists {self.name!r}",
                           param="model", code="model_not_found")

    # ------------------------------------------------------------------------- endpoints
    async def embeddings(self, request: Request) -> Response:
        req = parse_embedding_request(await self.read_json(request), self.settings.max_inputs)
        self.check_model(req.model)
        if req.texts is None:                        # token ids: Matryoshka cut here (see embeddings.py)
            check_dimensions(req.dimensions, self.model.normalizes)
        if req.texts is not None:
            await self._learn_server_settings()
            self.model.check_task(req.task)
            counts_first = not req.truncate or len(req.texts) > COUNT_INLINE
            counts = await self._count(req) if counts_first else None
            call = asyncio.ensure_future(self._embed_texts(req))
            if counts is None:
                await asyncio.sleep(0)               # let the call go out, then count while it runs
                try:
                    counts = self.model.count_texts(req.texts, req.task, True)
                except BaseException:
                    call.cancel()
                    raise
        else:
            token_lists = self.model.cut_token_lists(req.token_lists, req.truncate)
            counts = [len(t) for t in token_lists]
            call = asyncio.ensure_future(self.client.embed_tokens(token_lists))
        try:
            emb = await call
        except Exception as e:
            raise from_triton(e, self.settings.retry_after) from None
        if req.texts is None:
            emb = cut_dimensions(emb, req.dimensions, self.model.normalizes)
        tokens = sum(counts)
        self.metrics.inputs.inc(req.count)
        self.metrics.tokens.inc(tokens)
        return Response(embedding_response(emb, req.encoding_format, self.name, tokens),
                        media_type="application/json")

    async def _embed_texts(self, req):
        """Texts through `embed`; `dimensions` goes to the server's DIMENSIONS input (first d values,
        normalised again when the model normalises)."""
        if req.dimensions is None:
            return await self.client.embed(req.texts, task=req.task)
        return (await self.client.encode(req.texts, dimensions=req.dimensions, task=req.task)).dense

    async def _learn_server_settings(self) -> None:
        """The deployment's `tokenize` settings, asked of Triton until one replica answers (at most
        every 5 s, so a set of replicas that is down costs requests nothing)."""
        if self.model.server_answered or time.monotonic() < self._settings_retry_at:
            return
        self._settings_retry_at = time.monotonic() + 5.0
        config = await self.state.tokenize_config()
        if config is not None:
            self.model.use_server_settings(config)

    async def _count(self, req) -> list[int]:
        if len(req.texts) <= COUNT_INLINE:
            return self.model.count_texts(req.texts, req.task, req.truncate)
        return await asyncio.get_running_loop().run_in_executor(
            None, self.model.count_texts, req.texts, req.task, req.truncate)

    async def rerank(self, request: Request) -> Response:
        body = await self.read_json(request)
        if not await self.state.serves_rerank():
            raise ApiError(404, "this deployment serves no reranker (no ready `rerank` model on "
                                f"{', '.join(self.settings.triton_urls)}); serve a reranker folder to use /v1/rerank",
                           code="model_not_found")
        req = parse_rerank_request(body, self.settings.max_inputs)
        scores = await self.reranker.scores(req)
        return JSONResponse(rerank_response(req, scores, req.model or "rerank"))

    async def models(self, _request: Request) -> Response:
        data = [{"id": self.name, "object": "model", "created": 0, "owned_by": "rose"}]
        if await self.state.serves_rerank():
            data.append({"id": "rerank", "object": "model", "created": 0, "owned_by": "rose"})
        return JSONResponse({"object": "list", "data": data})

    async def health(self, _request: Request) -> Response:
        replicas = await self.state.health()
        if any(s == "ready" for s in replicas.values()):
            return JSONResponse({"status": "ready", "replicas": replicas})
        e = unavailable("no Triton replica has its models ready", self.settings.retry_after)
        return JSONResponse({"status": "unavailable", "replicas": replicas, "error": e.message}, 503,
                            headers={"Retry-After": str(self.settings.retry_after)})

    async def metrics_page(self, _request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)


def check_key(request: Request, key: str) -> None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'" if auth else
                       "this gateway needs an API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")


async def _http_error(_request: Request, exc: HTTPException) -> Response:
    msg = {404: "no such route; this gateway serves POST /v1/embeddings, POST /v1/rerank, GET /v1/models, "
                "GET /health and GET /metrics",
           405: "method not allowed on this route"}.get(exc.status_code, str(exc.detail))
    return ApiError(exc.status_code, msg).response()


def create_app(settings: GatewaySettings) -> Starlette:
    gw = Gateway(settings)
    routes = [
        Route("/v1/embeddings", gw.endpoint("embeddings", gw.embeddings), methods=["POST"]),
        Route("/embeddings", gw.endpoint("embeddings", gw.embeddings), methods=["POST"]),
        Route("/v1/rerank", gw.endpoint("rerank", gw.rerank), methods=["POST"]),
        Route("/rerank", gw.endpoint("rerank", gw.rerank), methods=["POST"]),
        Route("/v1/models", gw.endpoint("models", gw.models), methods=["GET"]),
        Route("/health", gw.endpoint("health", gw.health, auth=False), methods=["GET"]),
        Route("/metrics", gw.endpoint("metrics", gw.metrics_page, auth=False), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=gw.lifespan, exception_handlers={HTTPException: _http_error})
    app.state.gateway = gw
    return app
