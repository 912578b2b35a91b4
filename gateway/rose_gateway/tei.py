"""Hugging Face text-embeddings-inference's HTTP API (TEI's router, http/server.rs and types.rs),
on the gateway's port, key, limits and metrics: a TEI user's code runs with only its URL changed.

    POST /embed         {"inputs": "text" | ["text", [101, 102], ...], "truncate", "truncation_direction",
                         "prompt_name", "normalize", "dimensions"}                -> [[float, ...], ...]
    POST /embed_sparse  as /embed without normalize / dimensions (BGE-M3's sparse head)
                                                             -> [[{"index": token id, "value": weight}, ...], ...]
    POST /embed_all     as /embed_sparse                     -> [[[float] per token], ...] (last hidden states)
    POST /similarity    {"inputs": {"source_sentence", "sentences"}, "parameters"}  -> [cosine, ...]
    POST /rerank        {"query", "texts", "return_text", "raw_scores", "truncate"} -> [{"index", "score", "text"?}]
    POST /              /embed for an embedding model, /rerank for a reranker (TEI's dispatch by kind);
                        a body with "query" and "texts" is a rerank, one whose inputs are a
                        {"source_sentence", "sentences"} object a similarity, whatever the kind
    POST /tokenize      {"inputs", "add_special_tokens", "prompt_name"} -> [[{"id", "text", "special", "start", "stop"}]]
    POST /decode        {"ids", "skip_special_tokens"}            -> ["text", ...]
    GET  /info          the served model and the limits, in TEI's Info shape

Errors: {"error": "...", "error_type": "..."} with TEI's codes (errors.tei_status). A field of TEI's
that rose cannot honour is refused by name (422), never ignored: raw_scores, truncate=false and
truncation_direction=left on /rerank (rose's reranker returns CrossEncoder.predict's activated
score of each pair, cut longest-first). normalize=false on a model whose folder normalises returns
the model's output as sentence-transformers gives it (unit length): rose serves the Normalize
module as part of the model. docs/TEI.md lists every route.

Texts are tokenized here (tokens.py, under the deployment's settings) and go to `rose` as ids, as
POST /v1/embeddings sends them: /embed is served past Starlette like it (direct.py).
"""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import numpy as np
import orjson

from rose_client.async_client import drive
from rose_client.encoded import Ask
from rose_client.token_requests import ragged_chunks
from rose_gateway import stages
from rose_gateway import tei_model
from rose_gateway.embeddings import _kind, lane_of, loads
from rose_gateway.tei_requests import TeiInputs, dimensions, direction, dumps, flag, parse_inputs, tei_order, unit_rows
from rose_gateway.errors import ApiError, bad_request, empty_batch, not_for_this_model, too_large, unavailable
from rose_gateway.rerank import RerankRequest

SPARSE_HEADS = ("sparse_linear.pt", "sparse_linear.safetensors")
INFO_CACHE_S = 30.0
_INPUT_INDEX = re.compile(r"input\[(\d+)\]")     # how the shared tokenizer names a text
MAX_REQUEST_SEQS = 4096         # `rose`'s default, while no replica has reported its own


class Tei:
    """The TEI routes of one Gateway (app.py): they use its Triton client, model facts and limits."""

    def __init__(self, gw):
        self.gw = gw
        self.version = tei_model.version()
        self._info: tuple[float, dict] | None = None
        self._params: tuple[float, dict] | None = None

    # ------------------------------------------------------------------------- tokens
    async def _ids(self, req: TeiInputs) -> tuple[np.ndarray, np.ndarray]:
        """Every input as token ids, in order: (ids int32 [T], lens int32 [n]); 413 over the gateway's
        token limit. Texts get the prompt and are truncated here (the deployment's tokenize settings)."""
        gw, model = self.gw, self.gw.model
        if not model.server_answered:
            await gw._learn_server_settings()
        if not model.server_settings_known:
            raise unavailable("this route waits for the deployment's tokenize settings, which no replica has "
                              "reported yet; retry later", gw.settings.retry_after)
        texts = [x for x in req.items if isinstance(x, str)]
        toks = None
        if texts:
            toks = await self._tokenize(texts, req)
            stages.mark("tokenized")
        if len(texts) == len(req.items):
            ids, lens = toks.ids, toks.lens
        else:
            m = model.max_seq_length
            for i, x in enumerate(req.items):
                if not req.truncate and not isinstance(x, str) and len(x) > m:
                    raise bad_request(f"inputs[{i}]", f"inputs[{i}] has {len(x)} tokens; this model embeds at most "
                                                      f"{m} (send \"truncate\": true to cut it there)")
            lists = model.cut_token_lists([x for x in req.items if not isinstance(x, str)], True, req.left)
            lists_iter, text_k, starts = iter(lists), 0, None
            if toks is not None:
                starts = np.zeros(len(toks.lens) + 1, np.int64)
                np.cumsum(toks.lens, out=starts[1:])
            parts, lens = [], []
            for x in req.items:
                if isinstance(x, str):
                    parts.append(toks.ids[starts[text_k]:starts[text_k + 1]])
                    text_k += 1
                else:
                    parts.append(np.asarray(next(lists_iter), dtype=np.int32))
                lens.append(len(parts[-1]))
            ids, lens = np.concatenate(parts).astype(np.int32, copy=False), np.asarray(lens, np.int32)
        gw.check_work(int(lens.sum(dtype=np.int64)))
        return ids, lens

    async def _tokenize(self, texts: list[str], req: TeiInputs):
        model = self.gw.model
        try:
            if sum(map(len, texts)) <= 4096:
                return model.tokenize(texts, req.prompt_name, req.truncate, req.left)
            return await asyncio.get_running_loop().run_in_executor(
                None, model.tokenize, texts, req.prompt_name, req.truncate, req.left)
        except ApiError as e:                  # the shared messages name OpenAI's fields: TEI's names
            if e.param == "task":
                raise bad_request("prompt_name", e.message.replace("task / prompt name", "prompt_name")) from None
            m = _INPUT_INDEX.match(e.param or "")
            if m:                              # its index among the texts -> among all the inputs
                where = f"inputs[{[i for i, x in enumerate(req.items) if isinstance(x, str)][int(m.group(1))]}]"
                raise bad_request(where, e.message.replace(m.group(0), where, 1)) from None
            raise

    def _embedder(self, route: str) -> None:
        if not self.gw.model.is_embedding:
            raise not_for_this_model(f"model is not an embedding model: {route} needs one (this deployment's "
                                     "model is a reranker; POST /rerank scores with it)")

    # ------------------------------------------------------------------------- POST /embed
    async def embed_raw(self, raw: bytes) -> bytes:
        return await self.embed(loads(raw))

    async def embed(self, body: object) -> bytes:
        gw = self.gw
        req = parse_inputs(body, gw.settings.max_inputs)
        normalize = flag(body, "normalize", True)
        dims = dimensions(body)
        stages.mark("parsed")
        self._embedder("/embed")
        plain = req.texts_only and not req.left
        if plain and not gw.model.server_answered:
            await gw._learn_server_settings()
        if plain and not gw.model.server_settings_known:      # the server tokenizes (its `embed` model)
            if not req.truncate:
                raise unavailable("truncate=false waits for the deployment's tokenize settings, which no replica "
                                  "has reported yet; retry later", gw.settings.retry_after)
            emb = await gw._call(gw.client.embed(req.items, task=req.prompt_name, lane=req.lane))
            tokens = 0
        else:
            ids, lens = await self._ids(req)
            tokens = int(lens.sum(dtype=np.int64))
            emb = await gw._call(gw.client.embed_ragged(ids, lens, lane=req.lane))
        stages.mark("answered")
        if dims is not None and dims != emb.shape[1]:
            if dims > emb.shape[1]:
                raise bad_request("dimensions", f"`dimensions` is {dims}; it should be at most this model's "
                                                f"embedding dimension, {emb.shape[1]}")
            emb = emb[:, :dims]
            if normalize or gw.model.normalizes:
                emb = unit_rows(emb)
        elif normalize and not gw.model.normalizes:
            emb = unit_rows(emb)
        gw.metrics.inputs.inc(len(req.items))
        gw.metrics.tokens.inc(tokens)
        out = dumps(emb)
        stages.mark("response_built")
        return out

    # ------------------------------------------------------------------------- POST /embed_sparse
    async def embed_sparse(self, body: object) -> bytes:
        gw = self.gw
        req = parse_inputs(body, gw.settings.max_inputs)
        self._embedder("/embed_sparse")
        if not any((Path(gw.model.folder) / f).is_file() for f in SPARSE_HEADS):
            raise not_for_this_model("model has no sparse head: /embed_sparse needs BGE-M3's sparse_linear.pt (or "
                                     ".safetensors) in the model folder")
        ids, lens = await self._ids(req)
        ask = Ask(dense=False, sparse=True)
        sync = gw.client.sync
        out = await gw._call(drive(sync, sync.token_model, ragged_chunks(sync, ids, lens, ask), len(lens), ask,
                                   req.lane, gw.client.on_sent))
        self._count(lens)
        return dumps([[{"index": k, "value": w} for k, w in sorted(d.items())] for d in out.sparse])

    # ------------------------------------------------------------------------- POST /embed_all
    async def embed_all(self, body: object) -> bytes:
        """Each token's last hidden state: rose's late chunking with every token a chunk of its own
        (a chunk's vector is the mean of its tokens' states, normalised when the model normalises)."""
        gw = self.gw
        req = parse_inputs(body, gw.settings.max_inputs)
        self._embedder("/embed_all")
        if gw.model.normalizes:
            raise not_for_this_model(
                "/embed_all is not available for this model: its folder normalises its outputs (a Normalize "
                "module), and rose returns per-token states through late chunking, which normalises each "
                "one; TEI's /embed_all returns them unnormalised")
        ids, lens = await self._ids(req)
        groups, start, total = [], 0, 0
        limit = int((await self._rose_params()).get("max_request_seqs") or MAX_REQUEST_SEQS)
        for i, n in enumerate(lens.tolist()):           # a request's chunks (here: tokens) stay within limit
            if n > limit:
                raise too_large(f"inputs[{i}]", f"inputs[{i}] has {n} tokens; /embed_all takes at most {limit} "
                                                "per input (the server's max_request_seqs)")
            if total + n > limit:
                groups.append((start, i))
                start, total = i, 0
            total += n
        groups.append((start, len(lens)))
        cu = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=cu[1:])

        async def one(a: int, b: int) -> np.ndarray:
            t = int(cu[b] - cu[a])
            return await gw.client.embed_token_chunks(ids[cu[a]:cu[b]], lens[a:b], np.arange(t, dtype=np.int32),
                                                      lane=req.lane)
        rows = np.concatenate(await gw._call(asyncio.gather(*(one(a, b) for a, b in groups))))
        self._count(lens)
        return dumps([rows[cu[i]:cu[i + 1]] for i in range(len(lens))])

    # ------------------------------------------------------------------------- POST /similarity
    async def similarity(self, body: object) -> bytes:
        """TEI's sentence similarity: the cosine of source_sentence with each of sentences."""
        if not isinstance(body, dict):
            raise bad_request("body", "the request body must be a JSON object")
        inputs = body.get("inputs")
        if not isinstance(inputs, dict):
            raise bad_request("inputs", "`inputs` must be an object {\"source_sentence\": ..., \"sentences\": [...]}")
        source, sentences = inputs.get("source_sentence"), inputs.get("sentences")
        if not isinstance(source, str):
            raise bad_request("inputs.source_sentence", "`inputs.source_sentence` must be a string")
        if not isinstance(sentences, list):
            raise bad_request("inputs.sentences", "`inputs.sentences` must be a list of strings")
        if not sentences:
            raise empty_batch("inputs.sentences")
        if any(not isinstance(s, str) for s in sentences):
            raise bad_request("inputs.sentences", "`inputs.sentences` must hold only strings")
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise bad_request("parameters", "`parameters` must be an object")
        embed_body = {"inputs": [source, *sentences], "normalize": True,
                      **{k: params[k] for k in ("truncate", "truncation_direction", "prompt_name") if k in params}}
        if len(sentences) + 1 > self.gw.settings.max_inputs:
            raise too_large("inputs.sentences", f"batch size {len(sentences) + 1} > maximum allowed batch size "
                                                f"{self.gw.settings.max_inputs}")
        emb = np.asarray(orjson.loads(await self.embed(embed_body)), dtype=np.float32)
        return dumps(emb[1:] @ emb[0])

    # ------------------------------------------------------------------------- POST /rerank
    async def rerank(self, body: object) -> bytes:
        gw = self.gw
        if not isinstance(body, dict):
            raise bad_request("body", "the request body must be a JSON object")
        query, texts = body.get("query"), body.get("texts")
        if not isinstance(query, str):
            raise bad_request("query", "missing field `query` (a string)" if query is None else
                              f"`query` must be a string, got {_kind(query)}")
        if not isinstance(texts, list):
            raise bad_request("texts", "missing field `texts` (a list of strings)" if texts is None else
                              f"`texts` must be a list of strings, got {_kind(texts)}")
        if not texts:
            raise empty_batch("texts")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise bad_request(f"texts[{i}]", f"texts[{i}] is {_kind(t)}; `texts` holds strings")
        if len(texts) > gw.settings.max_inputs:
            raise too_large("texts", f"batch size {len(texts)} > maximum allowed batch size {gw.settings.max_inputs}")
        if flag(body, "raw_scores", False):
            raise bad_request("raw_scores", "`raw_scores: true` is not available: rose's reranker returns each "
                                            "pair's activated score (CrossEncoder.predict's), not the raw logit")
        if not flag(body, "truncate", True):
            raise bad_request("truncate", "`truncate: false` is not available on /rerank: rose cuts each pair to "
                                          "the reranker's maximum length (longest first, as CrossEncoder.predict)")
        if direction(body):
            raise bad_request("truncation_direction", "`truncation_direction: left` is not available on /rerank: "
                                                      "rose cuts each pair longest first, at the end")
        return_text = flag(body, "return_text", False)
        lane = lane_of(body)
        if not await gw.state.serves_rerank():
            raise not_for_this_model("model is not a re-ranker model: this deployment serves no `rerank` model")
        scores = await gw.reranker.scores(RerankRequest(query, texts, None, False, None, lane))
        if np.isnan(scores).any():
            raise ApiError(424, "score is NaN", code="backend")
        order = tei_order(scores)
        gw.metrics.inputs.inc(len(texts))
        if return_text:
            return dumps([{"index": i, "text": texts[i], "score": float(scores[i])} for i in order])
        return dumps([{"index": i, "score": float(scores[i])} for i in order])

    # ------------------------------------------------------------------------- POST /
    async def root_raw(self, raw: bytes) -> bytes:
        return await self.root(loads(raw))

    async def root(self, body: object) -> bytes:
        """TEI's POST /: by the body's shape (a rerank or a similarity), else by the model's kind."""
        if isinstance(body, dict):
            if "query" in body and "texts" in body:
                return await self.rerank(body)
            if isinstance(body.get("inputs"), dict):
                return await self.similarity(body)
        if not self.gw.model.is_embedding:
            return await self.rerank(body)
        return await self.embed(body)

    # ------------------------------------------------------------------------- POST /tokenize, /decode
    def tokenize(self, body: object) -> bytes:
        return tei_model.tokenize(self.gw, body)

    def decode(self, body: object) -> bytes:
        return tei_model.decode(self.gw, body)

    # ------------------------------------------------------------------------- GET /info
    async def info(self) -> bytes:
        now = time.monotonic()
        if self._info is None or now - self._info[0] > INFO_CACHE_S:
            self._info = (now, tei_model.info(self.gw, await self._rose_params(), self.version))
        return dumps(self._info[1])

    async def _rose_params(self) -> dict[str, str]:
        """The `rose` model's parameters as Triton reports them ({} while no replica answers), cached."""
        now = time.monotonic()
        if self._params is None or now - self._params[0] > INFO_CACHE_S:
            rose = await self.gw.state.model_config("rose")
            if rose is None:
                return {}
            params = {k: v.get("string_value") for k, v in (rose.get("parameters") or {}).items()}
            self._params = (now, params)
        return self._params[1]

    def _count(self, lens: np.ndarray) -> None:
        self.gw.metrics.inputs.inc(len(lens))
        self.gw.metrics.tokens.inc(int(lens.sum(dtype=np.int64)))
