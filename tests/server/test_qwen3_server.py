"""A random-weight Qwen3-Embedding-style folder served end to end through tritonserver: text
through the `embed` ensemble (with the "Instruct: ...\\nQuery: " query template from the folder),
and token ids through `rose`, against transformers' Qwen3Model on the same weights."""
import numpy as np
import pytest

from rose_testing.compare import cos_dist
from rose_testing.qwen3 import QUERY_PROMPT
from rose_testing.reference import Reference

pytestmark = pytest.mark.server

TEXTS = ["the cat sat on the mat", "apple", "a river of blue and green passages . " * 6,
         "retrieve relevant passages for a web search query", "Query : what is the model ?"]


@pytest.fixture(scope="module")
def qwen3_server(qwen3_deployment):
    """The session's small Qwen3-Embedding folder and its server (conftest's qwen3_deployment)."""
    return qwen3_deployment


def test_qwen3_served_through_triton_matches_hf(qwen3_server):
    from rose_client import EmbeddingClient
    from tokenizers import Tokenizer

    folder, srv = qwen3_server
    hf = Reference(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))

    def reference(prefix):          # causal Qwen3, last token (the appended <|endoftext|>), normalized
        ids = [e.ids for e in tok.encode_batch([prefix + t for t in TEXTS])]
        return ids, hf.embed(ids)

    client = EmbeddingClient(srv.grpc_url)
    try:
        doc_ids, doc_ref = reference("")
        query_ids, query_ref = reference(QUERY_PROMPT)
        docs, queries = client.embed(TEXTS), client.embed(TEXTS, task="query")
        assert docs.shape == (len(TEXTS), 96) and docs.dtype == np.float32
        assert cos_dist(docs, doc_ref).max() <= 1e-4
        assert cos_dist(queries, query_ref).max() <= 1e-4
        np.testing.assert_allclose(np.linalg.norm(queries, axis=-1), 1.0, rtol=1e-5)
        assert cos_dist(client.embed_tokens(query_ids), query_ref).max() <= 1e-4
    finally:
        client.close()
