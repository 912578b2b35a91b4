"""rose_client: Python client of the rose embedding server (no torch, nothing of the server side).

    from rose_client import EmbeddingClient
    client = EmbeddingClient("127.0.0.1:8001,127.0.0.1:8011")
    emb = client.embed(["hello world"], task="query")     # float32 [1, D]
    r = client.encode(["hello world"], sparse=True, colbert=True)   # BGE-M3: r.dense, r.sparse, r.colbert
    EmbeddingClient("host:8001", api_key=key)     # a deployment started with API_KEY
"""
import importlib

_HOMES = {"EmbeddingClient": "client", "AsyncEmbeddingClient": "async_client", "Encoded": "encoded",
          "AllReplicasDown": "dispatch", "StreamConnection": "transport", "Channel": "transport",
          "ServerError": "transport", "ConnectionLost": "transport", "AccessDenied": "transport"}
__all__ = list(_HOMES)


def __getattr__(name: str):
    """The names above, imported on first use: `import rose_client.contract` (or .auth) alone loads
    neither gRPC nor the client, which the server's Python stubs rely on."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rose_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rose_client.{home}"), name)
    globals()[name] = value
    return value
