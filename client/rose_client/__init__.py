"""rose_client: Python client of the rose embedding server (no torch, nothing of the server side).

    from rose_client import EmbeddingClient
    client = EmbeddingClient("127.0.0.1:8001,127.0.0.1:8011")
    emb = client.embed(["hello world"], task="query")     # float32 [1, D]
    r = client.encode(["hello world"], sparse=True, colbert=True)   # BGE-M3: r.dense, r.sparse, r.colbert
    EmbeddingClient("host:8001", api_key=key)     # a deployment started with API_KEY
"""
from rose_client.async_client import AsyncEmbeddingClient
from rose_client.client import EmbeddingClient
from rose_client.dispatch import AllReplicasDown
from rose_client.encoded import Encoded
from rose_client.transport import AccessDenied, Channel, ConnectionLost, ServerError, StreamConnection

__all__ = ["EmbeddingClient", "AsyncEmbeddingClient", "Encoded", "AllReplicasDown", "StreamConnection", "Channel",
           "ServerError", "ConnectionLost", "AccessDenied"]
