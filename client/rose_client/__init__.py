"""rose_client: Python client of the rose embedding server (no torch, nothing of the server side)."""
from rose_client.client import EmbeddingClient
from rose_client.transport import ConnectionLost, ServerError, StreamConnection

__all__ = ["EmbeddingClient", "StreamConnection", "ServerError", "ConnectionLost"]
