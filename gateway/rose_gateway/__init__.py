"""rose_gateway: an OpenAI-compatible HTTP gateway in front of rose's Triton servers.

    python -m rose_gateway --triton-urls 127.0.0.1:8001 --port 8080

Endpoints: POST /v1/embeddings (OpenAI's format), POST /v1/rerank (Cohere / Jina / vLLM shape, when a
`rerank` model is served), GET /v1/models, GET /health, GET /metrics (Prometheus). It tokenizes texts itself (rose_ensemble's
tokenizer, the deployment's prompts and limits) and sends their ids to `rose` over gRPC through
rose_client's AsyncEmbeddingClient (chunking, balancing, failover over replicas). Starlette on
uvicorn, in --workers processes on one port, POST /v1/embeddings past the ASGI app (direct.py);
nothing of the engine (no torch) is imported.
"""
