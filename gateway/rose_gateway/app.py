"""The Starlette app: routes, body limit, the bound on work per request, and the calls to Triton
(endpoint.py: what every route shares; protocol.py: the HTTP connections' own limits).

    app = create_app(GatewaySettings(["127.0.0.1:8001"]))      # then: uvicorn.run(app, ...) (__main__.py)

Work per request is bounded by max_request_tokens (tokens summed over its inputs, as embedded:
truncated at max_seq_length), refused with 413 before anything is sent. A request that is being
answered chunk by chunk is never timed out as a whole: 503 comes only when Triton has answered
none of its chunks for `timeout` seconds (rose_client's progress_timeout and chunk_timeout).
"""
from __future__ import annotations

import asyncio
import contextlib
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
from rose_gateway.endpoint import endpoint
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
        # backoff doubling), and a replica that comes back is tried again within a second; a call
        # fails only once Triton has answered none of its chunks for `timeout` seconds
        self.client = AsyncEmbeddingClient(s.triton_urls, timeout=None, progress_timeout=s.timeout, retries=3,
                                           backoff=0.05, max_backoff=1.0, chunk_timeout=s.timeout, api_key=s.api_key)
        self.state = TritonState(s.triton_urls, api_key=s.api_key, admin_key=s.admin_key)
        self.reranker = Reranker(s.triton_urls, s.timeout, s.retry_after, api_key=s.api_key)
        try:
            yield
        finally:
            await self.state.close()
            self.reranker.close()
            await self.client.close()

    # ------------------------------------------------------------------------- request plumbing
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
            token_lists = self.model.cut_token_lists(req.token_lists, req.truncate)
            counts = [len(t) for t in token_lists]
            self.check_work(sum(counts))
            call = asyncio.ensure_future(self.client.embed_tokens(token_lists))
        else:
            await self._learn_server_settings()
            self.model.check_task(req.task)
            counts_first = not req.truncate or len(req.texts) > COUNT_INLINE or \
                self.model.most_tokens(req.texts, req.task) > self.settings.max_request_tokens
            counts = await self._count(req) if counts_first else None
            if counts is not None:
                self.check_work(sum(counts))
            call = asyncio.ensure_future(self._embed_texts(req))
        try:
            if counts is None:
                await asyncio.sleep(0)               # let the call go out, then count while it runs
                counts = self.model.count_texts(req.texts, req.task, True)
            emb = await call
        except Exception as e:
            call.cancel()
            if isinstance(e, ApiError):
                raise
            raise from_triton(e, self.settings.triton_urls, self.settings.retry_after) from None
        except BaseException:                        # cancelled: the client is gone, or the gateway stops
            call.cancel()
            raise
        if req.texts is None:
            emb = cut_dimensions(emb, req.dimensions, self.model.normalizes)
        tokens = sum(counts)
        self.metrics.inputs.inc(req.count)
        self.metrics.tokens.inc(tokens)
        return Response(embedding_response(emb, req.encoding_format, self.name, tokens),
                        media_type="application/json")

    def check_work(self, tokens: int) -> None:
        limit = self.settings.max_request_tokens
        if tokens > limit:
            raise too_large("input", f"the request has {tokens} tokens to embed; this gateway takes at most {limit} "
                                     "per request (max_request_tokens): split it")

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
            raise ApiError(404, "this deployment serves no reranker (no replica has a ready `rerank` model); "
                                "serve a reranker folder to use /v1/rerank", code="model_not_found")
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


async def _http_error(_request: Request, exc: HTTPException) -> Response:
    msg = {404: "no such route; this gateway serves POST /v1/embeddings, POST /v1/rerank, GET /v1/models, "
                "GET /health and GET /metrics",
           405: "method not allowed on this route"}.get(exc.status_code, str(exc.detail))
    return ApiError(exc.status_code, msg).response()


def create_app(settings: GatewaySettings) -> Starlette:
    gw = Gateway(settings)

    def route(path, name, handler, method, auth=True):
        return Route(path, endpoint(name, handler, gw.metrics, settings.api_key, auth=auth, json_body=method == "POST",
                                    retry_after=settings.retry_after), methods=[method])

    routes = [
        route("/v1/embeddings", "embeddings", gw.embeddings, "POST"),
        route("/embeddings", "embeddings", gw.embeddings, "POST"),
        route("/v1/rerank", "rerank", gw.rerank, "POST"),
        route("/rerank", "rerank", gw.rerank, "POST"),
        route("/v1/models", "models", gw.models, "GET"),
        route("/health", "health", gw.health, "GET", auth=False),
        route("/metrics", "metrics", gw.metrics_page, "GET", auth=False),
    ]
    app = Starlette(routes=routes, lifespan=gw.lifespan, exception_handlers={HTTPException: _http_error})
    app.state.gateway = gw
    return app
