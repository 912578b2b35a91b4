"""What the Triton replicas serve right now: readiness for GET /health, and whether a `rerank` model
is there (looked up at most every `cache_s` seconds), through tritonclient's asyncio gRPC client.
Every call carries the API key (Triton serves model configurations to whoever may infer).
Replicas are named "replica 0", "replica 1", ... in what this reports (no internal addresses)."""
from __future__ import annotations

import asyncio
import logging
import time

from tritonclient.grpc.aio import InferenceServerClient

from rose_client.auth import grpc_api_key_headers
from rose_gateway.errors import redact

EMBED_MODELS = ("embed", "tokenize", "rose")
log = logging.getLogger("rose_gateway")


class TritonState:
    def __init__(self, urls: list[str], timeout: float = 2.0, cache_s: float = 5.0, api_key: str | None = None):
        self.urls, self.timeout, self.cache_s = urls, timeout, cache_s
        self._headers = grpc_api_key_headers(api_key)
        self._config_warned: set[str] = set()       # replicas whose model config was refused (logged once)
        self._clients: dict[str, InferenceServerClient] = {}
        self._rerank: tuple[float, bool] = (-1e9, False)

    def _client(self, url: str) -> InferenceServerClient:
        if url not in self._clients:
            # a channel of its own subchannels: a shared one may still be in gRPC's reconnect backoff
            # after the server came back, and would fail the check without trying
            self._clients[url] = InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        return self._clients[url]

    async def replica_status(self, url: str, models: tuple[str, ...] = EMBED_MODELS) -> str:
        """'ready', or why not."""
        try:
            c = self._client(url)
            flags = await asyncio.wait_for(asyncio.gather(
                *(c.is_model_ready(m, headers=self._headers, client_timeout=self.timeout) for m in models)),
                self.timeout + 0.5)
        except Exception as e:                      # unreachable, timeout: the message is enough
            await self._drop(url)                   # a fresh channel next time, not one in gRPC's backoff
            first = str(e).splitlines()[0][:200] if str(e) else ""
            return f"unreachable ({type(e).__name__}: {redact(first, self.urls)})"
        missing = [m for m, ok in zip(models, flags) if not ok]
        return "ready" if not missing else f"models not ready: {', '.join(missing)}"

    async def tokenize_config(self) -> dict | None:
        """The `tokenize` model's configuration (its config.pbtxt parameters: prompts, max_seq_length,
        ...) from the first replica that answers; None when none does."""
        for url in self.urls:
            try:
                cfg = await self._client(url).get_model_config("tokenize", headers=self._headers, as_json=True,
                                                               client_timeout=self.timeout)
            except Exception as e:
                (log.debug if url in self._config_warned else log.warning)(
                    "the tokenize settings of %s are not available (%s)", url,
                    str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
                self._config_warned.add(url)
                await self._drop(url)
                continue
            return cfg.get("config", cfg)
        return None

    async def model_config(self, name: str) -> dict | None:
        """A model's configuration (its parameters: dtype, max_batch_tokens, ...) from the first
        replica that answers; None when none does."""
        for url in self.urls:
            try:
                cfg = await self._client(url).get_model_config(name, headers=self._headers, as_json=True,
                                                               client_timeout=self.timeout)
            except Exception:
                await self._drop(url)
                continue
            return cfg.get("config", cfg)
        return None

    async def health(self) -> dict[str, str]:
        """{"replica 0": "ready" or why not, ...}"""
        states = await asyncio.gather(*(self.replica_status(u) for u in self.urls))
        return {f"replica {i}": state for i, state in enumerate(states)}

    async def serves_rerank(self) -> bool:
        at, ok = self._rerank
        if time.monotonic() - at < self.cache_s:
            return ok
        states = await asyncio.gather(*(self.replica_status(u, ("rerank",)) for u in self.urls))
        ok = any(s == "ready" for s in states)
        self._rerank = (time.monotonic(), ok)
        return ok

    async def _drop(self, url: str) -> None:
        c = self._clients.pop(url, None)
        if c is not None:
            try:
                await c.close()
            except Exception:
                pass

    async def close(self) -> None:
        for c in self._clients.values():
            try:
                await c.close()
            except Exception:
                pass
        self._clients.clear()
