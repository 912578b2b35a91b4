"""The Starlette app: routes, body limit, the bound on work per request, and the calls to Triton
(endpoint.py: what every route shares; protocol.py: the HTTP connections' own limits).

    app = create_app(GatewaySettings(["127.0.0.1:8001"]))      # then served by uvicorn (__main__.py)
    app.state.direct                                           # POST /v1/embeddings without the app

POST /v1/embeddings is the hot path: the connection hands it to app.state.direct (direct.py), which
reads the body, calls Gateway.embed_raw and writes the answer, past Starlette; TEI's POST /embed
and POST / (tei.py) go the same way; every other route (and these under any other server) is the
Starlette app's. Text-embeddings-inference's routes (tei.py) answer in TEI's shapes and error
format; /rerank takes both TEI's body ({"query", "texts"}) and the Cohere one ({"query", "documents"}).

Texts are tokenized here, once each (tokens.py: rose_ensemble's tokenizer under the deployment's
`tokenize` settings), and their ids go straight to `rose` over gRPC streams (rose_client's
embed_ragged: chunks on a token budget, least-loaded replica first); `usage.prompt_tokens` is the
count of those ids. Until a replica has reported the `tokenize` settings, texts go through `embed`.
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

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rose_client import AsyncEmbeddingClient
from rose_gateway import stages
from rose_gateway.embeddings import (check_dimensions, cut_dimensions, embedding_response, loads,
                                     parse_embedding_request)
from rose_gateway.endpoint import direct_endpoint, endpoint
from rose_gateway.errors import ApiError, from_triton, tei_response, too_large, unavailable
from rose_gateway.metrics import GatewayMetrics
from rose_gateway.rerank import Reranker, parse_rerank_request, rerank_response
from rose_gateway.settings import GatewaySettings
from rose_gateway.tei import Tei
from rose_gateway.tokens import ModelInfo
from rose_gateway.triton_state import TritonState
from rose_gateway.workers import STATE, serving_count, worker_of

log = logging.getLogger("rose_gateway")
CLOSE_S = 1.0               # at shutdown, the most closing the connections to Triton may take
TOKENIZE_INLINE_CHARS = 4096     # requests of up to this many characters are tokenized on the event loop


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
        self.tei = Tei(self)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app):
        s = self.settings
        # a replica set that is down answers 503 within a few tenths of a second (3 tries, 0.05 s
        # backoff doubling), and a replica that comes back is tried again within a second; a call
        # fails only once Triton has answered none of its chunks for `timeout` seconds
        # grpc.aio streams on this worker's loop: an answer resolves its request's future here, with
        # no reader thread to hand it over (rose_client/aio_transport.py)
        self.client = AsyncEmbeddingClient(s.triton_urls, asyncio_streams=True, on_sent=stages.sent,
                                           timeout=None, progress_timeout=s.timeout, retries=3, backoff=0.05,
                                           max_backoff=1.0, chunk_timeout=s.timeout, api_key=s.api_key)
        self.state = TritonState(s.triton_urls, api_key=s.api_key)
        self.reranker = Reranker(s.triton_urls, s.timeout, s.retry_after, api_key=s.api_key)
        learn = asyncio.ensure_future(self._learn_server_settings())     # before the first request, if it can
        try:
            yield
        finally:
            learn.cancel()
            # uvicorn cancels the handlers still running when the drain time is over, then shuts the
            # app down at once: their 503 answers get a moment to be written before the loop ends
            await asyncio.sleep(0.1)
            self.reranker.close()
            try:                                 # the connections to Triton: bounded, the worker's stop is
                await asyncio.wait_for(asyncio.gather(self.state.close(), self.client.close()), CLOSE_S)
            except asyncio.TimeoutError:
                log.warning("the connections to Triton were not closed within %g s; exiting without them", CLOSE_S)
            stages.write()

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
        return loads(b"".join(chunks))

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.accepted_names:
            raise ApiError(404, f"model {model!r} is not served here; GET /v1/models lists {self.name!r}",
                           param="model", code="model_not_found")

    # ------------------------------------------------------------------------- endpoints
    async def embeddings(self, request: Request) -> Response:
        return Response(await self.embed(await self.read_json(request)), media_type="application/json")

    async def embed_raw(self, raw: bytes) -> bytes:
        """POST /v1/embeddings served without the app (direct.py): the body's bytes -> the answer's."""
        return await self.embed(loads(raw))

    async def embed(self, body: object) -> bytes:
        req = parse_embedding_request(body, self.settings.max_inputs)
        stages.mark("parsed")
        self.check_model(req.model)
        truncated = None
        if req.texts is None:                        # token ids: Matryoshka cut here (see embeddings.py)
            check_dimensions(req.dimensions, self.model.normalizes)
            token_lists = self.model.cut_token_lists(req.token_lists, req.truncate)
            truncated = np.fromiter((len(t) > self.model.max_seq_length for t in req.token_lists), bool)
            tokens = sum(len(t) for t in token_lists)
            self.check_work(tokens)
            emb = await self._call(self.client.embed_tokens(token_lists, lane=req.lane))
            emb = cut_dimensions(emb, req.dimensions, self.model.normalizes)
        else:
            if not self.model.server_answered:
                await self._learn_server_settings()
            if req.late_chunking:
                emb, tokens = await self._late_chunks(req)
            else:
                toks = await self._tokenize(req)
                stages.mark("tokenized")
                tokens = toks.total
                self.check_work(tokens)
                truncated = toks.truncated
                if self.model.server_settings_known:     # the ids straight to `rose`
                    emb = await self._call(self.client.embed_ragged(toks.ids, toks.lens, req.dimensions, lane=req.lane))
                else:                                    # the deployment's prompts are not known here yet
                    emb = await self._call(self._embed_texts(req))
        stages.mark("answered")
        self.metrics.inputs.inc(req.count)
        self.metrics.tokens.inc(tokens)
        out = embedding_response(emb, req.encoding_format, self.name, tokens, truncated)
        stages.mark("response_built")
        return out

    async def _call(self, work):
        """Await a rose_client call; its failures as the gateway's errors. A cancelled handler (the
        client went away) cancels the call, which cancels its requests at the server."""
        try:
            return await work
        except ApiError:
            raise
        except Exception as e:
            raise from_triton(e, self.settings.triton_urls, self.settings.retry_after) from None

    async def _tokenize(self, req):
        """Short requests on the event loop (a thread hop costs more than the Rust call), long ones in
        a thread (encode_batch releases the GIL)."""
        if sum(map(len, req.texts)) <= TOKENIZE_INLINE_CHARS:
            return self.model.tokenize(req.texts, req.task, req.truncate)
        return await asyncio.get_running_loop().run_in_executor(
            None, self.model.tokenize, req.texts, req.task, req.truncate)

    async def _late_chunks(self, req):
        if not self.model.server_settings_known:
            raise unavailable("late chunking waits for the deployment's tokenize settings, which no replica has "
                              "reported yet; retry later", self.settings.retry_after)
        plan = await asyncio.get_running_loop().run_in_executor(
            None, self.model.plan_late_chunks, req.texts, req.task)
        tokens = int(plan.seq_lens.sum(dtype=np.int64))
        self.check_work(tokens)
        emb = await self._call(self.client.embed_token_chunks(plan.input_ids, plan.seq_lens, plan.token_chunks,
                                                              dimensions=req.dimensions, lane=req.lane))
        return emb, tokens

    def check_work(self, tokens: int) -> None:
        limit = self.settings.max_request_tokens
        if tokens > limit:
            raise too_large("input", f"the request has {tokens} tokens to embed; this gateway takes at most {limit} "
                                     "per request (max_request_tokens): split it")

    async def _embed_texts(self, req):
        """Texts through `embed`; `dimensions` goes to the server's DIMENSIONS input (first d values,
        normalised again when the model normalises)."""
        if req.dimensions is None:
            return await self.client.embed(req.texts, task=req.task, lane=req.lane)
        return (await self.client.encode(req.texts, dimensions=req.dimensions, task=req.task, lane=req.lane)).dense

    async def _learn_server_settings(self) -> None:
        """The deployment's `tokenize` settings, asked of Triton until one replica answers (at most
        every 5 s, so a set of replicas that is down costs requests nothing)."""
        if self.model.server_answered or time.monotonic() < self._settings_retry_at:
            return
        self._settings_retry_at = time.monotonic() + 5.0
        config = await self.state.tokenize_config()
        if config is not None:
            self.model.use_server_settings(config)

    async def rerank(self, request: Request) -> Response:
        return await self._rerank(await self.read_json(request))

    async def _rerank(self, body: object) -> Response:
        if not await self.state.serves_rerank():
            raise ApiError(404, "this deployment serves no reranker (no replica has a ready `rerank` model); "
                                "serve a reranker folder to use /v1/rerank", code="model_not_found")
        req = parse_rerank_request(body, self.settings.max_inputs)
        scores = await self.reranker.scores(req)
        return JSONResponse(rerank_response(req, scores, req.model or "rerank"))

    async def rerank_either(self, request: Request) -> Response:
        """POST /rerank: TEI's body ({"query", "texts"}: TEI's answer and errors) or the Cohere one."""
        body = await self.read_json(request)
        if isinstance(body, dict) and "texts" in body and "documents" not in body:
            try:
                return Response(await self.tei.rerank(body), media_type="application/json")
            except ApiError as e:
                return tei_response(e)
        return await self._rerank(body)

    async def models(self, _request: Request) -> Response:
        data = [{"id": self.name, "object": "model", "created": 0, "owned_by": "rose"}]
        if await self.state.serves_rerank():
            data.append({"id": "rerank", "object": "model", "created": 0, "owned_by": "rose"})
        return JSONResponse({"object": "list", "data": data})

    async def health(self, _request: Request) -> Response:
        replicas = await self.state.health()
        if any(s == "ready" for s in replicas.values()):
            await self._learn_server_settings()
            # tokenizes_texts: this worker has the deployment's tokenize settings (else texts go through embed)
            return JSONResponse({"status": "ready", "replicas": replicas, "workers": self.workers(),
                                 "tokenizes_texts": self.model.server_settings_known})
        e = unavailable("no Triton replica has its models ready", self.settings.retry_after)
        return JSONResponse({"status": "unavailable", "replicas": replicas, "error": e.message}, 503,
                            headers={"Retry-After": str(self.settings.retry_after)})

    def workers(self) -> dict[str, int]:
        """Gateway processes on this port: serving now, and started (workers.py)."""
        of = worker_of()
        return {"serving": serving_count(STATE.get()) if of else 1, "started": of[1] if of else 1}

    async def metrics_page(self, _request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)


TEI_POSTS = ("/embed", "/embed_sparse", "/embed_all", "/similarity", "/tokenize", "/decode")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    msg = {404: "no such route; this gateway serves POST /v1/embeddings, POST /v1/rerank, GET /v1/models, "
                "GET /health and GET /metrics, and text-embeddings-inference's POST /embed, /embed_sparse, "
                "/embed_all, /similarity, /rerank, /tokenize, /decode and /, and GET /info",
           405: "method not allowed on this route"}.get(exc.status_code, str(exc.detail))
    e = ApiError(exc.status_code, msg)
    return tei_response(e) if request.url.path in TEI_POSTS or request.url.path == "/info" else e.response()


def _tei_post(gw: Gateway, handler):
    """A Starlette handler for a TEI route: the JSON body to `handler` (async or not), its bytes back."""
    async def run(request: Request) -> Response:
        out = handler(await gw.read_json(request))
        if not isinstance(out, bytes):
            out = await out
        return Response(out, media_type="application/json")
    return run


def create_app(settings: GatewaySettings) -> Starlette:
    gw = Gateway(settings)

    def route(path, name, handler, method, auth=True, tei=False):
        return Route(path, endpoint(name, handler, gw.metrics, settings.api_key, auth=auth, json_body=method == "POST",
                                    retry_after=settings.retry_after, tei=tei), methods=[method])

    tei = gw.tei

    async def tei_info(_request: Request) -> Response:
        return Response(await tei.info(), media_type="application/json")

    routes = [
        route("/v1/embeddings", "embeddings", gw.embeddings, "POST"),
        route("/embeddings", "embeddings", gw.embeddings, "POST"),
        route("/v1/rerank", "rerank", gw.rerank, "POST"),
        route("/rerank", "rerank", gw.rerank_either, "POST"),
        route("/v1/models", "models", gw.models, "GET"),
        route("/health", "health", gw.health, "GET", auth=False),
        route("/metrics", "metrics", gw.metrics_page, "GET", auth=False),
        # text-embeddings-inference's routes (tei.py)
        route("/embed", "tei_embed", _tei_post(gw, tei.embed), "POST", tei=True),
        route("/", "tei_root", _tei_post(gw, tei.root), "POST", tei=True),
        route("/", "health", gw.health, "GET", auth=False),
        route("/embed_sparse", "tei_embed_sparse", _tei_post(gw, tei.embed_sparse), "POST", tei=True),
        route("/embed_all", "tei_embed_all", _tei_post(gw, tei.embed_all), "POST", tei=True),
        route("/similarity", "tei_similarity", _tei_post(gw, tei.similarity), "POST", tei=True),
        route("/tokenize", "tei_tokenize", _tei_post(gw, tei.tokenize), "POST", tei=True),
        route("/decode", "tei_decode", _tei_post(gw, tei.decode), "POST", tei=True),
        route("/info", "tei_info", tei_info, "GET", tei=True),
    ]
    app = Starlette(routes=routes, lifespan=gw.lifespan, exception_handlers={HTTPException: _http_error})
    app.state.gateway = gw
    # what the connections serve POST /v1/embeddings, /embed and / with, without the app (protocol.py,
    # direct.py: DIRECT_PATHS)
    openai_embed = direct_endpoint("embeddings", gw.embed_raw, gw.metrics, settings.api_key,
                                   settings.max_body_bytes, settings.retry_after)
    by_path = {"/v1/embeddings": openai_embed, "/embeddings": openai_embed,
               "/embed": direct_endpoint("tei_embed", tei.embed_raw, gw.metrics, settings.api_key,
                                         settings.max_body_bytes, settings.retry_after, tei=True),
               "/": direct_endpoint("tei_root", tei.root_raw, gw.metrics, settings.api_key,
                                    settings.max_body_bytes, settings.retry_after, tei=True)}

    def direct(cycle):
        return by_path[cycle.scope["path"]](cycle)
    app.state.direct = direct
    return app
